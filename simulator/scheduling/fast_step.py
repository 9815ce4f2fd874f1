"""Steps planned in O(what changed), shared by the policies (docs/scheduler.md, "Fast steps").

``schedule()`` walks every running sequence. In most steps of a busy server the first of them
(the deferred decode group, ``deferred.py``) simply decode one token each, and only a few
others (a prefill going on, new admissions) need work of their own. ``fast_step()`` plans
such a step in O(1) for the group plus O(1) for each other sequence: it is exactly the plan
``schedule()`` would make whenever the budget covers the whole group (the group comes first
in the running order) and no block is missing (nobody would be preempted); otherwise it
returns None and the step goes through ``schedule()``. Its ``update()``,
``finish_fast_step()``, retires the members that finish (known from the group's sums) and
the others that do, and lets the sequences that sampled join the group when they come right
after it in the running order.

A policy of the user's that overrides a hook the fast path cannot honour (``DECLINED_HOOKS``)
gets no fast steps: ``fast_path_declined`` says which, and every step of it goes through
``schedule()`` and ``update()``.
"""

from __future__ import annotations

from collections import deque

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.decode_run import DecodeRun
from simulator.scheduling.encoder_inputs import EncoderInputs
from simulator.scheduling.fast_async import AsyncSteps
from simulator.scheduling.interface import StepPlan
from simulator.scheduling.sequence import Sequence

DECLINED_HOOKS = (
    "schedule",
    "_plan_running",
    "_make_room",
    "_cap",
    "_admit",
    "update",
    "_apply",
    "_retire",
)
"""The scheduler's methods a policy may override (docs/architecture.md, "Adding things") that
the fast path does not call where ``schedule()`` and ``update()`` do (it plans and applies its
group without them), or calls while its group's fields are deferred: a policy overriding one
takes every step through ``schedule()`` and ``update()``. ``_victim`` and ``_preempt`` are
honoured on both paths: only a step that preempts calls them, and the fast path takes none."""


def declined_by(cls: type, base: type) -> str | None:
    """Why the fast path takes no step of a ``cls`` scheduler: the first hook of ``base`` in
    ``DECLINED_HOOKS`` that a class between them overrides; None if none does."""
    for klass in cls.__mro__:
        if klass is base:
            return None
        for name in DECLINED_HOOKS:
            if name in klass.__dict__:
                return f"{klass.__qualname__} overrides {name}, which the fast path cannot honour"
    return None


@trait  # a part of StepScheduler (mypyc: one of its several bases)
@mypyc_attr(allow_interpreted_subclasses=True)
class FastSteps(AsyncSteps):
    """The fast path of the scheduler, which says how it caps a sequence's tokens in a
    step, how it admits waiting sequences (its phase 2) and how it applies a step."""

    encoder: EncoderInputs | None

    def _cap(self) -> int:
        """Most tokens of one sequence in the next step (0: no cap)."""
        raise NotImplementedError

    def _admit(self, plan: StepPlan, budget: int, cap: int) -> None:
        """Phase 2: admit waiting sequences into ``plan`` with ``budget`` tokens left."""
        raise NotImplementedError

    def _apply(self, plan: StepPlan) -> list[Sequence]:
        """Advance the KV of ``plan.seqs`` and sample; return those that finished."""
        raise NotImplementedError

    def _init_fast(self, base: type) -> None:
        """The fast path's state, empty; ``base`` is the scheduler's own class, whose hooks a
        policy subclassing it may override (``DECLINED_HOOKS``)."""
        self._run = self._memo = self._fast_plan = self._last_fast = None
        self._finishing = []
        self._sampled = []
        self._fast_flight = deque()
        self._in_sums = []
        self._dropped = []
        self._num_joined = 0
        self.fast_path_declined = declined_by(type(self), base) or self.blocks.refuses(
            "the fast path"
        )

    # -- the fast path -----------------------------------------------------------------------

    def fast_step(self) -> StepPlan | None:
        """Plan the next step with the deferred decode group as ``num_deferred`` sequences
        (each decoding one token), if ``schedule()`` would plan exactly that and preempt
        nobody; else None (nothing changed), and the step must go through ``schedule()``
        (always while multimodal items wait for their encoder: ``encoder_inputs.py``)."""
        if self.encoder is not None and self.encoder.pending:
            return None
        if self.async_scheduling:
            return self._fast_step_async()
        if self._fast_plan is not None:  # the caller skipped finish_fast_step(): do it
            self.finish_fast_step()
        run = self._run
        if run is None:
            if not self._can_defer():
                return None
            run = self._start_run()
        plan = self._plan_fast(run, False)
        if plan is None:
            return None
        t = run.steps = run.steps + 1
        self._finishing = run.finish_at.pop(t, []) if run.num_seqs else []
        self._fast_plan = plan
        return plan

    def _plan_fast(self, run: DecodeRun, asyn: bool) -> StepPlan | None:
        """The plan of the group's next step (its members' blocks taken, the others' and the
        admitted sequences' too), or None, with nothing changed, if ``schedule()`` would
        plan another (the budget cuts the group, or a block is missing)."""
        m = run.num_seqs
        budget = self.max_num_batched_tokens - m
        if budget < 0:  # the budget cuts the group
            return None
        blocks = self.blocks
        t = run.steps + 1
        grow = run.blocks_to_grow(blocks.block_size)
        free = blocks.num_blocks - blocks.num_used - grow  # ``num_free``, without the call
        if free < 0:  # a block is missing: preemption
            return None
        plan = StepPlan([], [], [], 0, [])
        cap = self._cap()
        span = m + len(self._dropped)  # async: members planned no more, not yet applied
        if len(self._running) > span:
            left = self._plan_others(plan, span, budget, cap, free, asyn)
            if left is None:  # a block is missing: preemption
                return None
        else:
            left = budget
        if m:
            self._grow_members(run, t, grow, run.lag)
        if plan.seqs:
            self._grow_others(plan)
        if left > 0 and self.waiting:
            self._admit(plan, left, cap)
        if not m and not plan.seqs:  # nothing to do (schedule() would say why)
            return None
        plan.num_deferred = m
        plan.deferred_context = run.context_before(t)
        return plan

    def _plan_others(
        self, plan: StepPlan, m: int, budget: int, cap: int, free: int, asyn: bool
    ) -> int | None:
        """Phase 1 past the group: each running sequence after it takes its tokens, capped,
        in order while budget lasts; the budget left, or None if its blocks are missing
        (``free`` blocks are left after the group's). Async (``asyn``): it asks for them as
        ``schedule()``'s phase 1 does (``_wanted``: with its placeholders, none if its step
        in flight is its last)."""
        running = self._running
        bs = self.blocks.block_size
        seqs, new_tokens, context = plan.seqs, plan.num_new_tokens, plan.context_lens
        for i in range(m, len(running)):
            if budget <= 0:
                break
            seq = running[i]
            c = seq.num_computed
            if asyn:
                n = self._wanted(seq)
                if n < 0:
                    continue
            else:
                n = seq.num_tokens - c
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            need = -(-(c + n) // bs) - seq.num_blocks
            if need > 0:
                if need > free:
                    return None
                free -= need
            seqs.append(seq)
            new_tokens.append(n)
            context.append(c)
            budget -= n
        return budget

    def _grow_others(self, plan: StepPlan) -> None:
        """Give the planned running sequences their blocks (known to be free), caching the
        blocks they fill, as phase 1 of ``schedule()`` does."""
        blocks = self.blocks
        limit = blocks.block_size
        caching = blocks.caching
        for seq, n, c in zip(plan.seqs, plan.num_new_tokens, plan.context_lens, strict=True):
            if c + n > seq.num_blocks * limit:
                grown = blocks.grow(seq, c + n)
                assert grown
            elif caching and (c + n) // limit > blocks.cached.get(seq, 0):
                blocks.cache_full(seq, c + n)
        self._memo = None  # their blocks may have evicted or cached what the head could hit

    def finish_fast_step(self) -> list[Sequence]:
        """The ``update()`` of a step planned by ``fast_step()``: retire the members that
        sampled their last token and the others that finished (in plan order); the others
        that sampled join the group while they follow it in the running order."""
        if self.async_scheduling:
            return self._finish_async()
        plan = self._fast_plan
        if plan is None:
            return []
        self._fast_plan = None
        run = self._run
        assert run is not None
        bs = self.blocks.block_size
        done = self._finishing
        self._finishing = []
        for seq in done:
            run.drop(seq, bs)
            self._advance(seq, run.steps - seq.deferred_from)
        others_done = self._apply(plan) if plan.seqs else []
        if plan.sampled:
            self._join(run, plan)
        if others_done:
            done = done + others_done
        for seq in done:
            self._retire(seq)
        return done

    def _join(self, run: DecodeRun, plan: StepPlan) -> None:
        """Let the planned sequences that sampled (and did not finish) join the group, in
        order, up to the first that did not sample."""
        bs = self.blocks.block_size
        sampled = plan.sampled
        # ``sampled`` is a subsequence of ``seqs``: the joiners are its common prefix
        for seq, did in zip(plan.seqs, sampled, strict=False):
            if did is not seq:
                return
            if seq.num_tokens - seq.prompt_len < seq.max_tokens:
                run.join(seq, bs)
