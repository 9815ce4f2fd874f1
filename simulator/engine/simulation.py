"""The simulation: simpy arrivals feed the step scheduler; the cost model times each step.

Timing rules (also in docs/metrics.md):

- A step is ``schedule()`` -> cost model -> ``timeout(duration)`` -> ``update()``. Tokens sampled
  in a step exist at the step's END.
- A request arriving while a step runs joins ``waiting`` at once, but ``schedule()`` only runs
  at step boundaries, so it is first seen by the next step. When an arrival and a step's end
  fall on the same instant, simpy runs them in the order they were scheduled (FIFO), which is
  deterministic; the arrival is then either in that step's ``update()`` window (harmless: it is
  not in the plan) or before the next ``schedule()`` -- either way it is seen by the next step.
- An idle server sleeps on an event that the next arrival triggers: no polling, no ticks.
- Plain decode steps (every running sequence decodes one token, nobody can be admitted or
  preempted; some may finish) are taken through ``Scheduler.decode_step()`` in O(1)
  each, back to back under one simpy timeout until the next arrival could change a decision.
  Every step still gets its own row, and the results are identical to stepping one by one
  (``Simulation(fast_decode=False)``; the tests compare the two).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from simulator.config import ScenarioConfig
from simulator.cost.batch import Batch
from simulator.cost.roofline import CostModel
from simulator.metrics import build_requests, build_steps, summarize
from simulator.scheduling.spec import Scheduler, Sequence
from simulator.workload.synthetic import Workload

STEP_INT_FIELDS = (
    "num_seqs",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_seqs",
    "blocks_used",
    "num_running",
    "num_waiting",
    "num_preemptions",
)
"""Integer columns of a step row, in the order the engine records them."""


def token_for(request_index: int, position: int) -> int:
    """The token a request samples at an output position: fixed per (request, position),
    so outputs cannot depend on batching or preemption (what a seeded model would give)."""
    return ((request_index * 1_000_003 + position * 7_919 + 17) % 32_000) + 1


def _index(seq: Sequence) -> int:
    """The engine's sequences are keyed by their request's row index."""
    return seq.seq_id  # type: ignore[return-value]


def _sample(seq: Sequence) -> int:
    # token_for() inlined: called once per generated token outside deferred decode steps
    return (seq.seq_id * 1_000_003 + len(seq.output) * 7_919 + 17) % 32_000 + 1  # type: ignore[operator]


def _sample_many(seq: Sequence, k: int) -> list[int]:
    """The next ``k`` tokens ``_sample`` would give, in one go (for deferred decode steps)."""
    # token_for() inlined, its linear part stepped by range() in C: one of these lists is
    # built per sequence each time deferred steps settle
    first = seq.seq_id * 1_000_003 + 17 + len(seq.output) * 7_919  # type: ignore[operator]
    return [x % 32_000 + 1 for x in range(first, first + k * 7_919, 7_919)]


@dataclass
class SimulationResult:
    """What a run produces: one row per request, one row per step, and a flat summary."""

    requests: pd.DataFrame
    """One row per request (see docs/metrics.md for every column)."""
    steps: pd.DataFrame
    """One row per scheduler step."""
    summary: dict[str, Any]
    """Flat dict of headline figures."""
    rejected: pd.DataFrame
    """``request_id, reason`` for requests that could never fit in the KV cache."""
    checksums: np.ndarray
    """Per request, a hash of its final output tokens (0 for rejected)."""
    scenario: ScenarioConfig | None = None
    """The resolved scenario that produced this result."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Room for run metadata (wall time, version)."""


class _Recorder:
    """What a run records, in flat arrays: per-request timestamps, one row per step, and one
    small integer per sampled token (which request sampled it), turned into inter-token
    gaps after the run by numpy. No per-token Python objects survive a step."""

    def __init__(self, num_requests: int) -> None:
        nan = float("nan")
        self.first_scheduled = [nan] * num_requests
        self.finish = [nan] * num_requests
        self.num_preemptions = [0] * num_requests
        self.checksum = [0] * num_requests
        self.rejected: list[tuple[int, str]] = []
        self.step_times = array("d")  # start, duration per step
        self.step_ints = array("q")  # STEP_INT_FIELDS per step
        self.sampled_ids = array("i")  # request of each sampled token, in time order
        self.sampled_per_step = array("i")


class Simulation:
    """One run of a workload through a scheduler and a cost model on a simpy clock."""

    def __init__(
        self,
        workload: Workload,
        cost_model: CostModel,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        slo: dict[str, float | None] | None = None,
        progress: Callable[[int], object] | None = None,
        fast_decode: bool = True,
    ) -> None:
        self.workload = workload
        self.cost_model = cost_model
        self.slo = slo
        self.progress = progress
        # Plain decode steps skip the scheduler's per-sequence loops when the cost model can
        # time them from sums; the results are identical either way (tests compare both).
        self._decode_time = getattr(cost_model, "decode_time", None) if fast_decode else None
        self.scheduler = Scheduler(
            num_blocks,
            block_size,
            max_num_seqs,
            max_num_batched_tokens,
            _sample,
            sample_many=_sample_many if self._decode_time is not None else None,
        )
        self.env = simpy.Environment()
        self._wake: simpy.Event | None = None
        self._rec = _Recorder(len(workload))
        self._arrivals_done = False
        self._next_arrival = 0.0  # when the arrival process next wakes up

    def _arrivals(self) -> simpy.events.ProcessGenerator:
        env, sched, rec = self.env, self.scheduler, self._rec
        arrival = self.workload.arrival_s.tolist()
        prompt = self.workload.prompt_len.tolist()
        output = self.workload.output_len.tolist()
        for i, t in enumerate(arrival):
            if t > env.now:
                # the instant simpy will resume us (now + delay), which the server's decode
                # windows must not step past
                self._next_arrival = env.now + (t - env.now)
                yield env.timeout(t - env.now)
            seq = Sequence(i, int(prompt[i]), int(output[i]))
            if sched.can_ever_fit(seq):
                sched.add(seq)
                if self._wake is not None and not self._wake.triggered:
                    self._wake.succeed()
            else:
                blocks = sched.blocks_for(seq.max_kv_tokens)
                rec.rejected.append(
                    (
                        i,
                        f"needs {blocks} KV blocks for {seq.max_kv_tokens} tokens "
                        f"(prompt {seq.prompt_len} + output {seq.max_tokens} - 1), "
                        f"cache has {sched.num_blocks}",
                    )
                )
                if self.progress is not None:
                    self.progress(1)
        self._arrivals_done = True
        self._next_arrival = float("inf")
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _server(self) -> simpy.events.ProcessGenerator:
        env, sched, rec, cost = self.env, self.scheduler, self._rec, self.cost_model
        first_sched = rec.first_scheduled
        step_times, step_ints = rec.step_times, rec.step_ints
        sampled_ids, sampled_per_step = rec.sampled_ids, rec.sampled_per_step
        decode_time = self._decode_time
        while True:
            if not sched.has_work():
                if self._arrivals_done:
                    return
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            num_running, num_waiting = len(sched.running), len(sched.waiting)
            if decode_time is not None:
                num_seqs = yield from self._decode_window(decode_time)
                if num_seqs:
                    continue
            preempted_before = sched.num_preemptions
            plan = sched.schedule()
            if not plan:  # impossible by the spec (a lone head always fits); never spin
                raise RuntimeError("scheduler produced an empty step with work pending")
            now = env.now
            preempted = sched.num_preemptions - preempted_before
            # Survivors of phase 1 keep their place; phase-2 admissions are appended after them.
            for seq in sched.running[num_running - preempted :]:
                i = _index(seq)
                if first_sched[i] != first_sched[i]:  # NaN: scheduled for the first time
                    first_sched[i] = now
            new_tokens = tuple(plan.values())
            context = tuple([seq.num_computed for seq in sched.planned])
            duration = cost.step_time(Batch(new_tokens, context))
            if not duration > 0:
                raise RuntimeError(f"cost model returned a non-positive step time {duration!r}")
            blocks_used = sched.blocks_used
            yield env.timeout(duration)
            done = sched.update()
            sampled = sched.sampled
            sampled_ids.extend([seq.seq_id for seq in sampled])  # type: ignore[misc]
            sampled_per_step.append(len(sampled))
            if done:
                self._retire(done, env.now)
            num_tokens = sum(new_tokens)
            decodes = new_tokens.count(1)
            step_times.extend((now, duration))
            step_ints.extend(
                (
                    len(new_tokens),
                    num_tokens,
                    num_tokens - decodes,
                    decodes,
                    blocks_used,
                    num_running,
                    num_waiting,
                    preempted,
                )
            )

    def _retire(self, done: list[Sequence], end: float) -> None:
        """Record the requests that finished in the step ending at ``end``, and drop their
        tokens: memory stays proportional to requests, not tokens."""
        rec = self._rec
        for seq in done:
            i = _index(seq)
            rec.finish[i] = end
            rec.num_preemptions[i] = seq.num_preemptions
            rec.checksum[i] = hash(tuple(seq.output))
            seq.output = []
        self.scheduler.finished.clear()
        if self.progress is not None:
            self.progress(len(done))

    def _decode_window(
        self, decode_time: Callable[[int, int], float]
    ) -> Generator[simpy.Event, Any, int]:
        """Run the plain decode steps the scheduler accepts, back to back, under as few simpy
        timeouts as exactness allows; return how many steps ran (0: none was plain).

        Only an arrival can change the scheduler's mind between plain decode steps, so every
        step that starts before the next arrival joins the window. The window's end must be
        exactly where step-by-step timeouts would have landed (``start + sum`` in float is not
        always ``start + (end - start)``): when one would not, the window is cut there."""
        env, sched, rec = self.env, self.scheduler, self._rec
        steps = 0
        start = end = env.now
        ids: list[int] = []
        while end < self._next_arrival or not steps:
            num_running, num_waiting = len(sched.running), len(sched.waiting)
            num_seqs, kv_tokens = sched.decode_step()
            if not num_seqs:
                break
            if not ids:
                ids = [_index(seq) for seq in sched.running]
            duration = decode_time(num_seqs, kv_tokens)
            if not duration > 0:
                raise RuntimeError(f"cost model returned a step time of {duration!r}")
            rec.step_times.extend((end, duration))
            rec.step_ints.extend(
                (num_seqs, num_seqs, 0, num_seqs, sched.blocks_used, num_running, num_waiting, 0)
            )
            rec.sampled_ids.extend(ids)
            rec.sampled_per_step.append(num_seqs)
            steps += 1
            new_end = end + duration
            done = sched.finish_decode_step()
            if done:
                self._retire(done, new_end)
                ids = []  # the batch shrank
            if start + (new_end - start) != new_end:
                yield env.timeout(end - start)  # lands exactly on ``end``, checked last round
                start = end
            end = new_end
        if steps:
            yield env.timeout(end - start)
        return steps

    def run(self) -> SimulationResult:
        """Simulate until every request has finished or been rejected."""
        self.env.process(self._arrivals())
        server = self.env.process(self._server())
        self.env.run(until=server)
        rec = self._rec
        n = len(self.workload)
        steps = build_steps(
            np.frombuffer(rec.step_times, dtype=np.float64).reshape(-1, 2),
            np.frombuffer(rec.step_ints, dtype=np.int64).reshape(-1, len(STEP_INT_FIELDS)),
            STEP_INT_FIELDS,
            self.scheduler.num_blocks,
        )
        ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
        ids = np.frombuffer(rec.sampled_ids, dtype=np.int32)
        per_step = np.frombuffer(rec.sampled_per_step, dtype=np.int32)
        first_token, itl = token_times(ids, per_step, ends, n)
        rejected_ids = [i for i, _ in rec.rejected]
        _check_token_counts(ids, self.workload.output_len, rejected_ids)
        requests = build_requests(
            self.workload,
            first_scheduled=np.array(rec.first_scheduled),
            first_token=first_token,
            finish=np.array(rec.finish),
            num_preemptions=np.array(rec.num_preemptions, dtype=np.int64),
            rejected=rejected_ids,
        )
        rejected = pd.DataFrame(
            {
                "request_id": pd.Series(rejected_ids, dtype="int64"),
                "reason": pd.Series([r for _, r in rec.rejected], dtype="object"),
            }
        )
        return SimulationResult(
            requests=requests,
            steps=steps,
            summary=summarize(requests, steps, itl, self.slo),
            rejected=rejected,
            checksums=np.array(rec.checksum, dtype=np.int64),
        )


def token_times(
    ids: np.ndarray, per_step: np.ndarray, step_ends: np.ndarray, n: int, chunk: int = 1 << 18
) -> tuple[np.ndarray, np.ndarray]:
    """From the request of every sampled token (in time order) and how many tokens each step
    sampled: each request's first token time (NaN if none) and every gap between a request's
    consecutive tokens (ITL, in no particular order).

    Tokens are the run's largest array, so they are taken ``chunk`` at a time, carrying each
    request's last token time across chunks: memory stays bounded whatever the run's length."""
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    num_gaps = len(ids) - int(np.count_nonzero(token_counts(ids, n, chunk)))
    gaps = np.empty(num_gaps)
    filled = 0
    tokens_through_step = np.cumsum(per_step)
    for lo in range(0, len(ids), chunk):
        hi = min(lo + chunk, len(ids))
        step_of = np.searchsorted(tokens_through_step, np.arange(lo, hi), side="right")
        order = np.argsort(ids[lo:hi], kind="stable")  # stable: time order within a request
        rid, t = ids[lo:hi][order], step_ends[step_of][order]
        del step_of, order
        same = rid[1:] == rid[:-1]
        heads = np.flatnonzero(np.concatenate(([True], ~same)))  # a request's first in chunk
        tails = np.flatnonzero(np.concatenate((~same, [True])))  # and its last
        inner = t[1:][same] - t[:-1][same]
        prev = last[rid[heads]]
        seen = ~np.isnan(prev)
        across = t[heads][seen] - prev[seen]
        for part in (across, inner):
            gaps[filled : filled + len(part)] = part
            filled += len(part)
        fresh = heads[~seen]
        first[rid[fresh]] = t[fresh]
        last[rid[tails]] = t[tails]
    assert filled == num_gaps
    return first, gaps


def token_counts(ids: np.ndarray, n: int, chunk: int = 1 << 18) -> np.ndarray:
    """Tokens sampled per request (bincount a chunk at a time: it would widen all ids at once)."""
    counts = np.zeros(n, dtype=np.int64)
    for lo in range(0, len(ids), chunk):
        counts += np.bincount(ids[lo : lo + chunk], minlength=n)
    return counts


def _check_token_counts(ids: np.ndarray, output_len: np.ndarray, rejected: list[int]) -> None:
    """Every finished request sampled exactly ``output_len`` tokens: a preemption that redid
    a sample (instead of recomputing KV only) would show up here, whatever the tokens."""
    counts = token_counts(ids, len(output_len))
    want = np.asarray(output_len, dtype=np.int64).copy()
    want[rejected] = 0
    bad = np.flatnonzero(counts != want)
    if bad.size:
        i = int(bad[0])
        raise RuntimeError(
            f"request {i} sampled {counts[i]} tokens, expected {want[i]} (scheduler bug)"
        )


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"servesim: warning: {message}", file=sys.stderr)
