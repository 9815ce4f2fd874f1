"""Data-parallel ranks of one server stepping together, as vLLM runs an MoE model with
``data_parallel_size > 1``: each rank has its own scheduler and KV cache; a new request goes
to the rank vLLM's DP load balancer picks (``dp_balancer.py``); while any rank has work, every
rank steps, an idle one on a dummy batch (one token, as vLLM's ``execute_dummy_batch``), and
the step lasts as long as the slowest rank's (the MoE layers' collectives wait for all). The
ranks' token counts are padded as vLLM pads them (``dp_padding.py``); a cost model that prices
the MoE layers over all ranks' tokens (``step_time_in_dp``, the ``profiled`` model under expert
parallelism) is given every rank's count, others time each rank's batch alone.

One step row per lockstep step: its duration, and its counts summed over the ranks. Steps go
one by one through ``schedule()`` and ``update()`` (no fast windows)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol, runtime_checkable

import simpy

from simulator.cost.batch import Batch
from simulator.cost.interface import CostModel
from simulator.engine.dp_balancer import DPBalancer
from simulator.engine.dp_padding import DPPadding
from simulator.engine.recorder import Recorder
from simulator.scheduling.interface import Scheduler, StepPlan
from simulator.scheduling.sequence import Sequence

DUMMY_BATCH = Batch((1,), (1,))
"""What an idle rank runs while the others step: one token of no context."""


@runtime_checkable
class DataParallelCost(Protocol):
    """A cost model that times a rank's step from every rank's token count."""

    def step_time_in_dp(self, batch: Batch, tokens_across_dp: list[int], rank: int) -> float:
        """Seconds of rank ``rank``'s ``batch`` when rank ``i`` runs ``tokens_across_dp[i]``."""
        ...


class LockstepServer:
    """``data_parallel_size`` schedulers (one per rank) and their cost models, stepping in
    lockstep on ``env`` and recording into one ``recorder`` (a ``Server``'s interface)."""

    def __init__(
        self,
        env: simpy.Environment,
        ranks: list[Scheduler],
        cost_models: list[CostModel],
        recorder: Recorder,
        *,
        progress: Callable[[int], object] | None = None,
        on_done: Callable[[int, float], object] | None = None,
        padding: DPPadding | None = None,
        with_cpu: Callable[[float, int], float] | None = None,
        async_scheduling: bool = False,
    ) -> None:
        self.env, self.ranks, self.cost_models = env, ranks, cost_models
        self.recorder = recorder
        self.padding = padding or DPPadding(None)
        """How the ranks' token counts are padded each step."""
        self._with_cpu = with_cpu
        self.balancer = DPBalancer(len(ranks))
        self.rank_of: dict[int, int] = {}
        """Per request id: the rank it was sent to."""
        self.rank_durations: list[list[float]] = []
        """Per step: each rank's own time (a dummy step's for an idle rank; 0 unstepped)."""
        self._progress, self._on_done = progress, on_done
        self._closed = False
        self._wake: simpy.Event | None = None
        self._async = async_scheduling
        self._pending: list[tuple[float, int, Sequence]] = []
        """Under async scheduling, requests sent while a step runs: (arrival, rank, seq)."""
        self._busy = False
        self._last_start = 0.0

    @property
    def num_blocks(self) -> int:
        """KV blocks over all ranks."""
        return sum(r.num_blocks for r in self.ranks)

    def submit(self, seq: Sequence, prefilled: bool = False) -> bool:
        """Send a request to the rank the balancer picks; False (recorded) if it fits none."""
        reason = self.ranks[0].rejection_reason(seq)  # the ranks are identical
        if reason is not None:
            self.recorder.record_rejected(seq.seq_id, reason)  # type: ignore[arg-type]
            if self._progress is not None:
                self._progress(1)
            return False
        k = self.balancer.choose(self.ranks)  # type: ignore[arg-type]
        self.rank_of[seq.seq_id] = k  # type: ignore[index]
        if self._async and self._busy:
            self._pending.append((self.env.now, k, seq))
        else:
            self.ranks[k].add(seq)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        return True

    def close(self) -> None:
        """No more submissions: finish the work in hand, then stop."""
        self._closed = True
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self) -> simpy.events.ProcessGenerator:
        """Step while any rank has work, sleep while none has."""
        while True:
            if not any(r.has_work() for r in self.ranks):
                if self._pending:  # the engine, out of work, schedules again at once
                    self._release(self.env.now)
                    continue
                self._busy = False
                if self._closed:
                    return
                self._wake = self.env.event()
                yield self._wake
                self._wake = None
                continue
            yield from self._step()

    def _step(self) -> Generator[simpy.Event, Any, None]:
        """One lockstep step: every rank plans, the slowest sets the time, every rank updates."""
        env, rec = self.env, self.recorder
        now = env.now
        if self._busy:  # this step was planned as the last one began (async scheduling)
            self._release(self._last_start)
        self._busy, self._last_start = True, now
        before = [(r.num_running, r.num_waiting) for r in self.ranks]
        plans: list[StepPlan | None] = []
        batches: list[Batch] = []
        for sched in self.ranks:
            plan = None
            if sched.has_work():
                plan = sched.schedule()
                if not plan.seqs and not plan.preempted:
                    raise RuntimeError("scheduler produced an empty step with work pending")
                if plan.num_admitted:
                    rec.record_admitted(plan, now)
            plans.append(plan)
            # a rank with nothing to run this step runs the dummy batch
            if plan is None or not plan.num_new_tokens:
                batches.append(DUMMY_BATCH)
            else:
                batches.append(Batch(plan.num_new_tokens, plan.context_lens))
        times = self._rank_times(batches)
        duration = max(times)
        self.rank_durations.append(times)
        self._record_step(now, duration, plans, before)
        yield env.timeout(duration)
        for k, (sched, planned) in enumerate(zip(self.ranks, plans, strict=True)):
            if planned is None:
                continue
            done = sched.update()
            rec.record_samples(planned.sampled, env.now)
            if done:
                self._finish(k, done, env.now)

    def _release(self, seen_by: float) -> None:
        """Hand the ranks the pending requests that arrived by ``seen_by``: under async
        scheduling vLLM plans a step while the one before it runs, so a request arriving
        during step N is first scheduled in step N + 2 (as ``step_with_batch_queue``)."""
        if not self._pending:
            return
        keep = []
        for arrival, k, seq in self._pending:
            if arrival <= seen_by:
                self.ranks[k].add(seq)
            else:
                keep.append((arrival, k, seq))
        self._pending = keep

    def _rank_times(self, batches: list[Batch]) -> list[float]:
        """Each rank's time for its batch, its token count padded with the others'."""
        across = self.padding.tokens_across_dp([sum(b.new_tokens) for b in batches])
        times = []
        for k, (cost, batch) in enumerate(zip(self.cost_models, batches, strict=True)):
            if isinstance(cost, DataParallelCost):
                t = cost.step_time_in_dp(batch, across, k)
            else:
                t = cost.step_time(batch)
            times.append(t if self._with_cpu is None else self._with_cpu(t, len(batch.new_tokens)))
        return times

    def _record_step(
        self,
        now: float,
        duration: float,
        plans: list[StepPlan | None],
        before: list[tuple[int, int]],
    ) -> None:
        """The step's row: counts summed over the ranks."""
        new = [n for p in plans if p is not None for n in p.num_new_tokens]
        tokens, decodes = sum(new), new.count(1)
        preempted = sum(len(p.preempted) for p in plans if p is not None)
        used = sum(r.num_blocks_used for r in self.ranks)
        cached = sum(r.num_cached_blocks for r in self.ranks)
        running = sum(b[0] for b in before)
        waiting = sum(b[1] for b in before)
        ints = (len(new), tokens, tokens - decodes, decodes, used)
        self.recorder.record_step(now, duration, (*ints, running, waiting, preempted, cached))

    def _finish(self, k: int, done: list[Sequence], end: float) -> None:
        """Record the requests rank ``k`` finished in the step ending at ``end``."""
        rec = self.recorder
        for seq in done:
            if seq.num_tokens - seq.prompt_len != seq.max_tokens:
                raise RuntimeError(f"request {seq.seq_id} finished short (scheduler bug)")
            rec.record_finish(seq.seq_id, end, seq.num_preemptions, seq.num_output)  # type: ignore[arg-type]
        self.balancer.finished(k, len(done))
        if self._progress is not None:
            self._progress(len(done))
        if self._on_done is not None:
            self._on_done(len(done), end)
