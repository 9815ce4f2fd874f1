"""Data-parallel ranks of one server stepping together, as vLLM runs an MoE model with
``data_parallel_size > 1``: each rank has its own scheduler and KV cache; a new request goes
to the rank vLLM's DP load balancer picks (``dp_balancer.py``); while any rank has work, every
rank steps, an idle one on a dummy batch (one token, as vLLM's ``execute_dummy_batch``), and
the step lasts as long as the slowest rank's (the MoE layers' collectives wait for all). The
ranks' token counts are padded as vLLM pads them (``dp_padding.py``); a cost model that prices
the MoE layers over all ranks' tokens (``step_time_in_dp``, the ``profiled`` model under expert
parallelism) is given every rank's count, others time each rank's batch alone.

Speculative decoding (vLLM runs MTP and EAGLE on DP + EP deployments) is applied as a single
server applies it (``server.py``): each rank's scheduler plans ``1 + k`` tokens per decode and
draws its acceptances from its own stream, the drafter's passes (``drafts``, one ``DraftCost``
per rank) are part of that rank's step, and the accepted drafts are recorded per request.

One step row per lockstep step: its duration, and its counts summed over the ranks. Steps go
one by one through ``schedule()`` and ``update()`` (no fast windows)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import simpy

from simulator.cost.batch import Batch
from simulator.cost.interface import CostModel
from simulator.engine.dp_balancer import DPBalancer
from simulator.engine.dp_padding import DPPadding
from simulator.engine.drafts import DraftCost
from simulator.engine.recorder import NO_MOVES, Recorder
from simulator.engine.server_shape import Outcomes, step_counts
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


@dataclass(frozen=True)
class DataParallelRanks:
    """What a simulation runs instead of one server: ``data_parallel_size`` schedulers (one
    per rank) and their cost models, stepping in lockstep."""

    ranks: list[Scheduler]
    """Each rank's scheduler (identical policies, each with its own KV cache)."""
    cost_models: list[CostModel]
    """Each rank's step times."""
    padding: DPPadding = field(default_factory=lambda: DPPadding(None))
    """How the ranks' token counts are padded each step."""
    with_cpu: Callable[[float, int], float] | None = None
    """The CPU's share of a rank's step (its GPU time, its number of sequences), if any."""

    @property
    def num_blocks(self) -> int:
        """KV blocks over all ranks."""
        return sum(r.num_blocks for r in self.ranks)


class LockstepServer:
    """Data-parallel ranks (``DataParallelRanks``) stepping in lockstep on ``env`` and
    recording into one ``recorder`` (a ``ServerShape``)."""

    def __init__(
        self,
        env: simpy.Environment,
        dp: DataParallelRanks,
        recorder: Recorder,
        *,
        progress: Callable[[int], object] | None = None,
        on_done: Callable[[int, float], object] | None = None,
        async_scheduling: bool = False,
        on_queued: Callable[[int, float], object] | None = None,
        drafts: list[DraftCost | None] | None = None,
    ) -> None:
        self.env, self.ranks, self.cost_models = env, dp.ranks, dp.cost_models
        self.recorder = recorder
        self.padding = dp.padding
        """How the ranks' token counts are padded each step."""
        self._with_cpu = dp.with_cpu
        ranks = dp.ranks
        self.balancer = DPBalancer(len(ranks))
        self.rank_of: dict[int, int] = {}
        """Per request id: the rank it was sent to."""
        self.rank_durations: list[list[float]] = []
        """Per step: each rank's own time (a dummy step's for an idle rank; 0 unstepped)."""
        self._outcomes = Outcomes(recorder, progress, on_done)
        self._closed = False
        self._wake: simpy.Event | None = None
        self._async = async_scheduling
        self._pending: list[tuple[float, int, Sequence]] = []
        """Requests sent while a step runs, not yet taken in: (arrival, rank, seq)."""
        self._on_queued = on_queued
        """Told (request id, time) when a rank's engine takes a request into its queue."""
        self._busy = False
        self._last_start = self._busy_until = 0.0
        self._plans_ahead = all(r.plans_ahead for r in ranks)
        """Whether the ranks' schedulers plan a step before the last one is applied (vLLM's
        async scheduling, exactly: ``scheduler.async_scheduling``)."""
        self._next: list[StepPlan | None] = [None] * len(ranks)
        """Under a plan-ahead scheduler, each rank's plan for the next step."""
        self._num_empty = 0
        self._drafts = drafts or [None] * len(ranks)
        """Per rank: the drafter's time in its steps (None: no drafter, or a free one)."""

    # -- what others may read: sums over the ranks ---------------------------------------

    @property
    def num_running(self) -> int:
        """Sequences running now, over all ranks."""
        return sum(r.num_running for r in self.ranks)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission now, over all ranks."""
        return sum(r.num_waiting for r in self.ranks)

    @property
    def num_blocks_used(self) -> int:
        """KV blocks held now, over all ranks."""
        return sum(r.num_blocks_used for r in self.ranks)

    @property
    def num_blocks(self) -> int:
        """KV blocks over all ranks."""
        return sum(r.num_blocks for r in self.ranks)

    @property
    def block_size(self) -> int:
        """Tokens per KV block (the ranks are identical)."""
        return self.ranks[0].block_size

    @property
    def num_sampled(self) -> int:
        """Tokens sampled so far."""
        return self.recorder.num_tokens

    @property
    def busy_until(self) -> float:
        """End of the step in flight (or of the last one taken)."""
        return self._busy_until

    def has_work(self) -> bool:
        """Whether any rank has a request waiting or running."""
        return any(r.has_work() for r in self.ranks)

    def rejection_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never be served (the ranks are identical), or None."""
        return self.ranks[0].rejection_reason(seq)

    # -- what others may do --------------------------------------------------------------

    def submit(self, seq: Sequence, prefilled: bool = False) -> bool:
        """Send a request to the rank the balancer picks; False (recorded) if it fits none."""
        if prefilled:
            raise NotImplementedError("data-parallel ranks take no prefilled requests")
        reason = self.rejection_reason(seq)
        if reason is not None:
            self._outcomes.refuse(seq, reason)
            return False
        k = self.balancer.choose(self.ranks)
        self.rank_of[seq.seq_id] = k
        if self._busy:
            self._pending.append((self.env.now, k, seq))
        else:
            self._take_in(k, seq, self.env.now)
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
            if not self.has_work():
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
        env = self.env
        now = env.now
        if self._busy:  # under async scheduling this step was planned as the last one began
            late = self._async and not self._plans_ahead
            self._release(self._last_start if late else now)
        self._busy, self._last_start = True, now
        before = [(r.num_running, r.num_waiting) for r in self.ranks]
        plans, batches = self._plan_ranks(now)
        times = self._rank_times(batches, plans)
        duration = max(times)
        self._busy_until = now + duration
        self.rank_durations.append(times)
        row = self._row(plans, before)  # the ranks' counts now, before they update
        if self._plans_ahead:  # vLLM's batch queue: the next step is planned while this runs
            self._next = [r.schedule() if r.has_requests() else None for r in self.ranks]
        yield env.timeout(duration)
        for k, (sched, planned) in enumerate(zip(self.ranks, plans, strict=True)):
            if planned is None:
                continue
            done = sched.update()
            self._outcomes.sampled(planned, env.now)
            if done:
                self.balancer.finished(k, len(done))
                self._outcomes.finished(done, env.now)
        # recorded once the ranks applied the step: how many drafts they accepted is known then
        accepted = sum(sum(p.accepted.values()) for p in plans if p is not None)
        self.recorder.record_step(now, duration, row, NO_MOVES, accepted)

    def _plan_ranks(self, now: float) -> tuple[list[StepPlan | None], list[Batch]]:
        """Each rank's plan for the step starting at ``now`` (under a plan-ahead scheduler,
        the one made as the last step began) and the batch it runs: a rank with nothing to
        run runs the dummy batch (so does vLLM's when its planned batch is empty)."""
        plans: list[StepPlan | None] = []
        batches: list[Batch] = []
        ahead, self._next = self._next, [None] * len(self.ranks)
        for sched, plan in zip(self.ranks, ahead, strict=True):
            if plan is None and sched.has_work():
                if not self._plans_ahead:
                    plan = sched.schedule()
                    if not plan.seqs and not plan.preempted:
                        raise RuntimeError("scheduler produced an empty step with work pending")
                elif sched.has_requests():
                    plan = sched.schedule()  # idle until now: vLLM schedules at once
            if plan is not None and plan.num_admitted:
                self.recorder.record_admitted(plan, now)
            plans.append(plan)
            if plan is None or not plan.num_new_tokens:
                batches.append(DUMMY_BATCH)
            else:
                batches.append(Batch(plan.num_new_tokens, plan.context_lens))
        if self._plans_ahead and all(p is None or not p for p in plans):
            self._num_empty += 1
            if self._num_empty > 4:  # two in flight, both empty, and then more: stuck
                raise RuntimeError("async schedulers planned empty steps with work pending")
        else:
            self._num_empty = 0
        return plans, batches

    def _release(self, seen_by: float) -> None:
        """Hand the ranks the pending requests that arrived by ``seen_by``, taken in at
        ``seen_by``. vLLM's engine loop (``EngineCoreProc.run_busy_loop`` and
        ``DPEngineCoreProc.run_busy_loop``) drains its input queue only between steps,
        where ``Scheduler.add_request`` stamps the request QUEUED: a request arriving
        during step N is taken in as step N ends. Under async scheduling the loop has then
        already planned step N + 1 (``step_with_batch_queue``), so it is first scheduled
        in step N + 2; without it, in step N + 1."""
        if not self._pending:
            return
        keep = []
        for arrival, k, seq in self._pending:
            if arrival <= seen_by:
                self._take_in(k, seq, seen_by)
            else:
                keep.append((arrival, k, seq))
        self._pending = keep

    def _take_in(self, k: int, seq: Sequence, at: float) -> None:
        """Rank ``k``'s engine takes ``seq`` into its waiting queue at time ``at``."""
        self.ranks[k].add(seq)
        if self._on_queued is not None:
            self._on_queued(seq.seq_id, at)

    def _rank_times(self, batches: list[Batch], plans: list[StepPlan | None]) -> list[float]:
        """Each rank's time for its batch, its token count padded with the others', plus its
        drafter's passes (added after the CPU's share, as a single server adds them)."""
        across = self.padding.tokens_across_dp([sum(b.new_tokens) for b in batches])
        times = []
        for k, (cost, batch) in enumerate(zip(self.cost_models, batches, strict=True)):
            if isinstance(cost, DataParallelCost):
                t = cost.step_time_in_dp(batch, across, k)
            else:
                t = cost.step_time(batch)
            if self._with_cpu is not None:
                t = self._with_cpu(t, len(batch.new_tokens))
            drafts, plan = self._drafts[k], plans[k]
            if drafts is not None and plan:
                t += drafts.time(plan)
            times.append(t)
        return times

    def _row(self, plans: list[StepPlan | None], before: list[tuple[int, int]]) -> tuple[int, ...]:
        """The step's row (``STEP_INT_FIELDS`` before the KV moves): counts summed over the
        ranks (a decode verifying ``d`` drafts computes ``1 + d`` tokens and counts as a
        decode, as in a single server's row)."""
        planned = [p for p in plans if p is not None]
        counts = step_counts([n for p in planned for n in p.num_new_tokens], planned)
        preempted = sum(len(p.preempted) for p in planned)
        cached = sum(r.num_cached_blocks for r in self.ranks)
        running = sum(b[0] for b in before)
        waiting = sum(b[1] for b in before)
        return (*counts, self.num_blocks_used, running, waiting, preempted, cached)

    def record_finished(self, done: list[Sequence], end: float) -> None:
        """Record the requests that finished in the step ending at ``end`` (on any rank)."""
        for seq in done:
            self.balancer.finished(self.rank_of[seq.seq_id], 1)
        self._outcomes.finished(done, end)
