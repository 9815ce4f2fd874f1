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
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
import simpy

from simulator.batch import Batch
from simulator.config import ScenarioConfig
from simulator.cost_model import CostModel
from simulator.metrics import build_requests, build_steps, summarize
from simulator.scheduler import Scheduler, Sequence
from simulator.workload import Workload

_CHECKSUM_MOD = (1 << 61) - 1


def token_for(request_index: int, position: int) -> int:
    """The token a request samples at an output position: fixed per (request, position),
    so outputs cannot depend on batching or preemption (what a seeded model would give)."""
    return ((request_index * 1_000_003 + position * 7_919 + 17) % 32_000) + 1


def _sample(seq: Sequence) -> int:
    return token_for(cast(int, seq.seq_id), len(seq.output))


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
    """Per request, a hash of every token it sampled, in order (0 for rejected)."""
    scenario: ScenarioConfig | None = None
    """The resolved scenario that produced this result."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Room for run metadata (wall time, version)."""


class _Recorder:
    """Per-request timestamps and per-step rows, kept in flat arrays (no per-token objects)."""

    def __init__(self, num_requests: int) -> None:
        nan = float("nan")
        self.first_scheduled = [nan] * num_requests
        self.first_token = [nan] * num_requests
        self.last_token = [nan] * num_requests
        self.finish = [nan] * num_requests
        self.num_preemptions = [0] * num_requests
        self.checksum = [0] * num_requests
        self.itl = array("d")
        self.rejected: list[tuple[int, str]] = []
        self.step_start = array("d")
        self.step_duration = array("d")
        self.step_ints: dict[str, array[int]] = {
            name: array("q")
            for name in (
                "num_seqs",
                "num_tokens",
                "num_prefill_tokens",
                "num_decode_seqs",
                "blocks_used",
                "num_running",
                "num_waiting",
                "num_preemptions",
            )
        }


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
    ) -> None:
        self.workload = workload
        self.cost_model = cost_model
        self.slo = slo
        self.progress = progress
        self.scheduler = Scheduler(
            num_blocks, block_size, max_num_seqs, max_num_batched_tokens, _sample
        )
        self.env = simpy.Environment()
        self._wake: simpy.Event | None = None
        self._rec = _Recorder(len(workload))
        self._seqs: list[Sequence | None] = [None] * len(workload)
        self._arrivals_done = False

    def _arrivals(self) -> simpy.events.ProcessGenerator:
        env, sched, rec = self.env, self.scheduler, self._rec
        arrival = self.workload.arrival_s.tolist()
        prompt = self.workload.prompt_len.tolist()
        output = self.workload.output_len.tolist()
        for i, t in enumerate(arrival):
            if t > env.now:
                yield env.timeout(t - env.now)
            seq = Sequence(i, int(prompt[i]), int(output[i]))
            if sched.can_ever_fit(seq):
                sched.add(seq)
                self._seqs[i] = seq
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
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _server(self) -> simpy.events.ProcessGenerator:
        env, sched, rec, cost = self.env, self.scheduler, self._rec, self.cost_model
        seqs = self._seqs
        ints = rec.step_ints
        first_sched, first_tok, last_tok = rec.first_scheduled, rec.first_token, rec.last_token
        finish, checksum, itl = rec.finish, rec.checksum, rec.itl
        progress = self.progress
        step_start, step_duration = rec.step_start, rec.step_duration
        while True:
            if not sched.has_work():
                if self._arrivals_done:
                    return
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            num_running, num_waiting = len(sched.running), len(sched.waiting)
            preempted_before = sched.num_preemptions
            plan = cast("dict[int, int]", sched.schedule())  # our seq_ids are row indices
            if not plan:  # impossible by the spec (a lone head always fits); never spin
                raise RuntimeError("scheduler produced an empty step with work pending")
            now = env.now
            new_tokens = tuple(plan.values())
            context = []
            prefill_tokens = decode_seqs = 0
            for sid, n in plan.items():
                seq = cast(Sequence, seqs[sid])
                c = seq.num_computed
                context.append(c)
                if n == 1 and c == seq.num_tokens - 1 and seq.output:
                    decode_seqs += 1
                else:
                    prefill_tokens += n
                if first_sched[sid] != first_sched[sid]:  # NaN: first time scheduled
                    first_sched[sid] = now
            duration = cost.step_time(Batch(new_tokens, tuple(context)))
            if not duration > 0:
                raise RuntimeError(f"cost model returned a non-positive step time {duration!r}")
            blocks_used = sched.blocks_used
            yield env.timeout(duration)
            done = sched.update()
            end = env.now
            for seq in sched.sampled:
                i = cast(int, seq.seq_id)
                checksum[i] = (checksum[i] * 31 + seq.output[-1]) % _CHECKSUM_MOD
                prev = last_tok[i]
                if prev == prev:  # not NaN: a later token, so one inter-token gap
                    itl.append(end - prev)
                else:
                    first_tok[i] = end
                last_tok[i] = end
            for seq in done:
                i = cast(int, seq.seq_id)
                finish[i] = end
                rec.num_preemptions[i] = seq.num_preemptions
                seqs[i] = None
                seq.output = []  # memory stays O(requests): no tokens kept after the end
            if done:
                sched.finished.clear()
                if progress is not None:
                    progress(len(done))
            step_start.append(now)
            step_duration.append(duration)
            ints["num_seqs"].append(len(new_tokens))
            ints["num_tokens"].append(sum(new_tokens))
            ints["num_prefill_tokens"].append(prefill_tokens)
            ints["num_decode_seqs"].append(decode_seqs)
            ints["blocks_used"].append(blocks_used)
            ints["num_running"].append(num_running)
            ints["num_waiting"].append(num_waiting)
            ints["num_preemptions"].append(sched.num_preemptions - preempted_before)

    def run(self) -> SimulationResult:
        """Simulate until every request has finished or been rejected."""
        self.env.process(self._arrivals())
        server = self.env.process(self._server())
        self.env.run(until=server)
        rec = self._rec
        requests = build_requests(self.workload, rec)
        steps = build_steps(rec, self.scheduler.num_blocks)
        rejected = pd.DataFrame(
            {
                "request_id": pd.Series([i for i, _ in rec.rejected], dtype="int64"),
                "reason": pd.Series([r for _, r in rec.rejected], dtype="object"),
            }
        )
        summary = summarize(requests, steps, np.frombuffer(rec.itl, dtype=np.float64), self.slo)
        return SimulationResult(
            requests=requests,
            steps=steps,
            summary=summary,
            rejected=rejected,
            checksums=np.array(rec.checksum, dtype=np.int64),
        )


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"servesim: warning: {message}", file=sys.stderr)
