"""Fast steps under async scheduling (docs/scheduler.md, "Async scheduling"): the deferred
decode group when step ``n + 1`` is planned before step ``n`` is applied.

A sequence that samples in a plan decodes exactly one token in the next (its placeholder), so
the group works as without async scheduling on the planning side: a member's fields stay as
when it joined, and each step planned adds one token of KV, one placeholder and one token in
flight; each step applied turns a placeholder into a token. A member whose last token is
sampled in step ``t`` is not planned in step ``t + 1`` (``schedule()`` skips it: its step in
flight reaches ``max_tokens``) but holds its slot and blocks until step ``t`` is applied. The
group takes only steps planned with the same number of steps in flight (none or one) and no
drafts; ``schedule()`` (through ``_settle``) first writes the group's members into the plans
still in flight, as ``schedule()`` would have planned them, and ends the group.
"""

from __future__ import annotations

from collections import deque

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.async_run import async_segments
from simulator.scheduling.decode_run import DecodeRun
from simulator.scheduling.deferred import DeferredDecodes
from simulator.scheduling.interface import DecodeStretch, StepPlan
from simulator.scheduling.sequence import Sequence


@trait  # a part of StepScheduler (mypyc: one of its several bases)
@mypyc_attr(allow_interpreted_subclasses=True)
class AsyncSteps(DeferredDecodes):
    """The deferred decode group's steps with plans in flight (mixed into the fast path)."""

    async_scheduling: bool
    num_speculative_tokens: int
    _token_cap: int
    _in_flight: deque[StepPlan]
    _unreported: bool
    # async: the fast plans in flight, oldest first, each with its members planned for the
    # last time in it; the members of the last step planned (still counted in the group's
    # sums) and those planned no more (out of them, until their last step is applied); the
    # last fast plan (its sequences that sample join the group at the next step); how many
    # joined at the last attempt, and whether it planned the step
    _fast_flight: deque[tuple[StepPlan, list[Sequence]]]
    _in_sums: list[Sequence]
    _dropped: list[Sequence]
    _last_fast: StepPlan | None
    _num_joined: int

    def _plan_fast(self, run: DecodeRun, asyn: bool) -> StepPlan | None:
        """Implemented by the fast path (``fast_step.py``)."""
        raise NotImplementedError

    def _wanted(self, seq: Sequence) -> int:
        """Implemented by ``speculation.py``."""
        raise NotImplementedError

    def _after_schedule(self, plan: StepPlan) -> None:
        """Implemented by ``speculation.py``."""
        raise NotImplementedError

    def _apply_spec(self, plan: StepPlan) -> list[Sequence]:
        """Implemented by ``speculation.py``."""
        raise NotImplementedError

    def update(self) -> list[Sequence]:
        """Implemented by ``step_scheduler.py``."""
        raise NotImplementedError

    # -- planning ----------------------------------------------------------------------------

    def _fast_step_async(self) -> StepPlan | None:
        """``fast_step()`` under async scheduling (the module's docstring)."""
        lag = len(self._in_flight)
        if lag > 1:
            return None
        run = self._run
        self._num_joined = 0
        if run is None:
            if self.num_speculative_tokens or not self._can_defer():
                return None
            run = self._start_run_async(lag)
        elif run.lag != lag:  # the group's blocks are cached a fixed number of steps late
            return None
        else:
            if self._in_sums:  # planned in the last step for the last time: out of the sums
                bs = self.blocks.block_size
                for seq in self._in_sums:
                    run.drop(seq, bs)
                self._dropped += self._in_sums
                self._in_sums = []
            if self._last_fast is not None:
                self._join_async(run, self._last_fast)
        self._last_fast = None
        plan = self._plan_fast(run, True)
        if plan is None:
            return None
        t = run.steps = run.steps + 1
        leaving = run.finish_at.pop(t, []) if run.num_seqs else []
        self._in_sums = leaving
        self._after_schedule(plan)
        self._in_flight.append(plan)
        self._fast_flight.append((plan, leaving))
        self._unreported = False
        self._last_fast = plan
        return plan

    def _member_fits(self, seq: Sequence) -> bool:
        """Whether ``seq``, sampling in the last plan, decodes one token in every step until
        its last (it has one left after those in flight, and no token cap cuts it)."""
        tokens = seq.num_tokens + seq.placeholders  # once the steps in flight are applied
        return (
            tokens - seq.prompt_len < seq.max_tokens
            and seq.prompt_len + seq.max_tokens - 1 <= self._token_cap
        )

    def _start_run_async(self, lag: int) -> DecodeRun:
        """A group of the running sequences, from the head, that sample in the plan in
        flight (or sampled in the last step applied, with none in flight)."""
        bs = self.blocks.block_size
        run = DecodeRun(bs, with_blocks=self.blocks.caching)
        run.lag = lag
        sampling = self._in_flight[-1].sampling if lag else set(self._sampled)
        running = self._running
        n = 0
        for seq in running:
            if seq not in sampling or not self._member_fits(seq):
                break
            n += 1
        run.join_all(running[:n], bs)
        self._num_joined = n
        self._run = run
        self._fast_flight.clear()
        self._in_sums, self._dropped = [], []
        return run

    def _join_async(self, run: DecodeRun, plan: StepPlan) -> None:
        """Let the sequences of ``plan`` (the last fast plan) that sample in it join the
        group, in order, while they come right after it in the running order."""
        bs = self.blocks.block_size
        running, sampling = self._running, plan.sampling
        span = run.num_seqs + len(self._dropped)
        for seq in plan.seqs:
            if span >= len(running) or running[span] is not seq:
                return
            if seq not in sampling or not self._member_fits(seq):
                return
            run.join(seq, bs)
            self._num_joined += 1
            span += 1

    # -- stretches of pure decode steps ------------------------------------------------------

    def _async_stretch(self) -> DecodeStretch | None:
        """``decode_stretch()`` under async scheduling: the steps after the one in flight (a
        fast step of the group alone) in which only the group runs (``async_run.py``); None
        if the next one is not such a step (or, with a prefix cache, a member has prompt
        runs: its blocks are hashed step by step)."""
        run, flight = self._run, self._fast_flight
        if run is None or run.lag != 1 or self.waiting or self._dropped:
            return None
        if len(self._in_flight) != 1 or len(flight) != 1:
            return None
        plan = flight[0][0]
        if plan is not self._in_flight[0] or plan is not self._last_fast or plan.seqs:
            return None
        m = run.num_seqs
        if m != len(self._running) or m > self.max_num_batched_tokens or run.num_shared:
            return None
        blocks = self.blocks
        used, num_blocks = blocks.num_used, blocks.num_blocks
        if not blocks.caching:
            return DecodeStretch(async_segments(run, self._in_sums, used, num_blocks), 0)
        cached = blocks.num_cached_free
        segments = async_segments(run, self._in_sums, used, num_blocks, cached)
        return DecodeStretch(segments, num_blocks)

    def _take_async(self, n: int, hold_last: bool) -> list[tuple[int, list[Sequence]]]:
        """``take_decodes(n)`` under async scheduling: plan the first ``n`` steps of the last
        ``decode_stretch()`` and apply as many, the one in flight first, as ``fast_step()``
        and ``finish_fast_step()`` would one by one; return, per step applied in which
        members finished, (its index, those members). The last step planned is in flight,
        as the plan that was (``update()`` applies it); with ``hold_last`` the one before it
        is too (``last_planned()`` is the last one's plan)."""
        run = self._run
        assert run is not None and n > 0
        bs = self.blocks.block_size
        out: list[tuple[int, list[Sequence]]] = []
        first = t = run.steps  # the step in flight
        end = first + n - hold_last
        leaving = self._in_sums  # planned for the last time in step t
        self._memo = None  # nobody waits: the head's hit is looked up anew
        while t < end:
            if leaving:  # out of the sums for step t + 1; they finish when step t is applied
                for seq in leaving:
                    run.drop(seq, bs)
                u = t + 1
            else:  # nobody leaves before the next finish
                u = min(run.next_finish(), end) if run.num_seqs else end
            self._take_steps(run, t, u)
            run.steps, run.applied = u, t  # steps t + 1 .. u planned, step t applied
            for seq in leaving:
                self._advance_async(seq, run)
                self._cache_known(seq)
            for seq in leaving:
                self._retire(seq)
            if leaving:
                out.append((t - first, leaving))
            run.applied = u - 1  # and the steps before u, in which nobody finished
            t = u
            leaving = run.finish_at.pop(u, []) if run.num_seqs else []
        # the plan in flight (the group alone, nothing sampled into it) stands for the last
        # step planned: whoever holds it applies that one with ``update()``
        plan = self._in_flight[0]
        plan.num_deferred = run.num_seqs
        plan.deferred_context = run.context_before(end)
        self._fast_flight[0] = (plan, leaving)
        self._in_sums = leaving
        self._num_joined = 0
        if end > first:  # a step was applied: the last one sampled nothing of its own
            self._sampled = plan.sampled
            self._unreported = bool(out) and out[-1][0] == end - first - 1
        if hold_last:
            self._plan_held(run)
        return out

    def _plan_held(self, run: DecodeRun) -> None:
        """Plan the group's next step behind the one in flight, as ``fast_step()`` does (the
        stretch said its blocks are free and nobody else runs or waits)."""
        leaving = self._in_sums  # planned for the last time in the step in flight
        for seq in leaving:
            run.drop(seq, self.blocks.block_size)
        self._dropped += leaving
        t = run.steps
        self._take_steps(run, t, t + 1)
        run.steps = t + 1
        self._in_sums = run.finish_at.pop(t + 1, []) if run.num_seqs else []
        plan = StepPlan([], [], [], 0, [])
        plan.num_deferred = run.num_seqs
        plan.deferred_context = run.context_before(t + 1)
        self._in_flight.append(plan)
        self._fast_flight.append((plan, self._in_sums))
        self._last_fast = plan
        self._unreported = False

    def last_planned(self) -> StepPlan | None:
        """Async scheduling: the plan of the step planned last and not applied, or None."""
        return self._in_flight[-1] if self._in_flight else None

    def _take_steps(self, run: DecodeRun, t: int, u: int) -> None:
        """Give the members the blocks of steps ``t + 1`` .. ``u`` (nobody leaving)."""
        blocks = self.blocks
        if blocks.caching:
            self._take_blocks(run, t, u)
        else:
            blocks.take(run.blocks_over(t, u, blocks.block_size))

    def _cache_known(self, seq: Sequence) -> None:
        """A member that sampled its last token: the block it filled caches (known now)."""
        blocks = self.blocks
        if blocks.caching:
            blocks.cache_full(seq, seq.num_computed - seq.in_flight)

    # -- applying ----------------------------------------------------------------------------

    def _finish_async(self) -> list[Sequence]:
        """``finish_fast_step()`` under async scheduling: apply the oldest plan in flight (as
        ``update()`` does when ``_settle`` wrote the group into it)."""
        flight = self._fast_flight
        if not flight or not self._in_flight or flight[0][0] is not self._in_flight[0]:
            return self.update()
        plan, leaving = flight.popleft()
        self._in_flight.popleft()
        run = self._run
        assert run is not None
        run.applied += 1
        blocks = self.blocks
        if leaving:
            if leaving is self._in_sums:
                bs = blocks.block_size
                for seq in leaving:
                    run.drop(seq, bs)
                self._in_sums = []
            else:
                self._dropped = [s for s in self._dropped if s not in leaving]
            for seq in leaving:
                self._advance_async(seq, run)
                self._cache_known(seq)
        done = self._apply_spec(plan) if plan.seqs else []
        if leaving:
            done = leaving + done
        for seq in done:
            self._retire(seq)
        if done:
            self._unreported = True
        self._sampled = plan.sampled
        return done

    def _advance_async(self, seq: Sequence, run: DecodeRun) -> None:
        """Bring member ``seq`` up to the group's steps planned and applied."""
        start = seq.deferred_from
        last = start + seq.max_tokens - (seq.num_tokens + seq.placeholders - seq.prompt_len)
        planned = min(run.steps, last) - start
        applied = max(min(run.applied, last) - start, 0)
        if applied and self.sample_fn is not None:
            assert self.sample_many is not None
            seq.output.extend(self.sample_many(seq, applied))
        seq.num_computed += planned
        seq.num_tokens += applied
        seq.placeholders += planned - applied
        seq.in_flight += planned - applied
        seq.deferred_from += planned
        # a block is cached once its last token is known (``lag`` steps later)
        self.blocks.settle(seq, seq.num_computed, seq.num_computed - run.lag)

    def _settle_async(self) -> None:
        """Write the group's members into the plans in flight (as ``schedule()`` planned
        them: first, one token each), bring them up to date and end the group."""
        run = self._run
        if run is None:
            return
        span = self._running[: run.num_seqs + len(self._dropped)]
        first = run.steps - len(self._fast_flight) + 1  # the group's step of the oldest
        for k, (plan, _) in enumerate(self._fast_flight):
            self._write_members(plan, span, first + k)
        for seq in span:
            self._advance_async(seq, run)
        self._fast_flight.clear()
        self._in_sums, self._dropped = [], []
        self._last_fast = None
        self._run = None

    def _write_members(self, plan: StepPlan, span: list[Sequence], t: int) -> None:
        """Put the members planned in ``plan`` (the group's step ``t``) at its head."""
        members: list[Sequence] = []
        context: list[int] = []
        for seq in span:
            start = seq.deferred_from
            tokens = seq.num_tokens + seq.placeholders - seq.prompt_len
            if start < t <= start + seq.max_tokens - tokens:
                members.append(seq)
                context.append(seq.num_computed + t - 1 - start)
        plan.seqs[:0] = members
        plan.num_new_tokens[:0] = [1] * len(members)
        plan.context_lens[:0] = context
        plan.sampling.update(members)
        plan.num_deferred = plan.deferred_context = 0

    def _async_batch(self) -> list[Sequence]:
        """The group's members planned in its last fast step (after an attempt that planned
        none: in the one before, all of which sampled in the last step applied)."""
        run = self._run
        if run is None:
            return []
        span = self._running[: run.num_seqs + len(self._dropped)]
        if self._last_fast is None:  # the last attempt failed: none of its joiners
            return span[: len(span) - self._num_joined]
        dropped = self._dropped
        return [s for s in span if s not in dropped] if dropped else span
