"""The ``vllm-v1`` policy: vLLM 0.33's v1 ``Scheduler``, step for step (docs/scheduler.md,
"vllm-v1"), checked against steps recorded from the real scheduler
(tests/data/vllm_v1_scheduler).

Where it differs from the ``spec`` policy:

- no admission in a step that preempted anyone;
- ``reserve_full_isl``: a waiting sequence is admitted only if blocks for all its known tokens
  (prompt + outputs so far) are free, not only for its first chunk;
- ``long_prefill_token_threshold`` caps any sequence's tokens per step, but only when more than
  one sequence is running or waiting as the step starts;
- under ``priority`` the waiting queue is a heap on ``(priority, arrival)`` and the victim is
  the running sequence with the largest such key (dropped from the plan if it was already in
  it; the sequences after it are still tried);
- the prefix cache (on by default) lets an admitted sequence start from its hit.

A plain object with no clock, no randomness and no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable

from simulator.scheduling.block_manager import BlockManager
from simulator.scheduling.decode_run import DecodeRun
from simulator.scheduling.fast_step import FastSteps
from simulator.scheduling.interface import ManySampler, Sampler, Scheduler, StepPlan
from simulator.scheduling.kv_cache_manager import KVCacheManager
from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence, SequenceStatus
from simulator.scheduling.spec import check_sampling, positive


class VllmV1Scheduler(FastSteps, Scheduler):
    """vLLM v1's scheduling policy, exact to the recorded traces."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        sample_fn: Sampler | None = None,
        eos_token_id: int | None = None,
        *,
        priority: bool = False,
        reserve_full_isl: bool = True,
        long_prefill_token_threshold: int = 0,
        enable_prefix_caching: bool = True,
        sample_many: ManySampler | None = None,
        keep_finished: bool = True,
    ) -> None:
        positive("num_blocks", num_blocks)
        positive("block_size", block_size)
        self.caching = enable_prefix_caching
        """Whether admitted sequences start from their prefix-cache hit."""
        self.blocks: BlockManager | KVCacheManager = (
            KVCacheManager(num_blocks, block_size)
            if enable_prefix_caching
            else BlockManager(num_blocks, block_size)
        )
        """The KV blocks."""
        self.max_num_seqs = positive("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = positive("max_num_batched_tokens", max_num_batched_tokens)
        self.priority = priority
        """Serve by ``(priority, arrival)`` instead of first come first served."""
        self.reserve_full_isl = reserve_full_isl
        """Admit only when blocks for all known tokens are free."""
        if long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        self.long_prefill_token_threshold = long_prefill_token_threshold
        """Most tokens of one sequence per step when others wait or run (0: no cap)."""
        check_sampling(sample_fn, eos_token_id)
        self.sample_fn = sample_fn
        """The model's next token of a sequence, or None: tokens are only counted."""
        self.eos_token_id = eos_token_id
        self.sample_many = sample_many
        """The next ``k`` tokens ``sample_fn`` would give, at once (for ``fast_step()``)."""
        self.keep_finished = keep_finished
        self.waiting: FCFSQueue | PriorityQueue = PriorityQueue() if priority else FCFSQueue()
        """Sequences waiting for admission."""
        self._running: list[Sequence] = []
        self.finished: list[Sequence] = []
        """Finished sequences, in finishing order (only with ``keep_finished``)."""
        self._num_preemptions = 0
        self._num_added = 0
        self._known: set[Hashable] = set()
        self._plan: StepPlan | None = None
        self._run: DecodeRun | None = None
        self._finishing: list[Sequence] = []
        self._fast_plan: StepPlan | None = None
        self._sampled: list[Sequence] = []
        self._memo = None

    # -- state -----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """KV blocks in the cache."""
        return self.blocks.num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self.blocks.block_size

    @property
    def num_blocks_used(self) -> int:
        """KV blocks held by running sequences."""
        return self.blocks.num_used

    @property
    def blocks_used(self) -> int:
        """The spec's name for ``num_blocks_used``."""
        return self.blocks.num_used

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return self.blocks.blocks_for(num_tokens)

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks whose contents the prefix cache keeps for reuse."""
        return self.blocks.num_cached_free if isinstance(self.blocks, KVCacheManager) else 0

    @property
    def num_running(self) -> int:
        """Sequences admitted and not finished."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission."""
        return len(self.waiting)

    def _num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far."""
        return self._num_preemptions

    @property
    def running(self) -> list[Sequence]:
        """Running sequences in admission order (settles deferred decode steps)."""
        self._settle()
        return self._running

    # -- admission -------------------------------------------------------------------------

    def rejection_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never fit (its largest KV footprint exceeds the cache), or None."""
        need = self.blocks.blocks_for(seq.max_kv_tokens)
        if need <= self.num_blocks:
            return None
        return (
            f"needs {need} KV blocks for {seq.max_kv_tokens} tokens (prompt {seq.prompt_len} "
            f"+ output {seq.max_tokens} - 1), cache has {self.num_blocks}"
        )

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (behind earlier ones of its priority)."""
        if seq.seq_id in self._known:
            raise ValueError(f"sequence {seq.seq_id!r} was already added")
        if seq.status is not SequenceStatus.WAITING or seq.num_computed or seq.num_output:
            raise ValueError(f"sequence {seq.seq_id!r} is not new (status {seq.status.value})")
        reason = self.rejection_reason(seq)
        if reason is not None:
            raise ValueError(f"sequence {seq.seq_id!r} can never fit: {reason}")
        self._known.add(seq.seq_id)
        seq.arrival_order = self._num_added
        self._num_added += 1
        self.waiting.add(seq)

    # -- the step --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan one step: running sequences first, then admissions unless someone was
        preempted, under one token budget."""
        self._settle()
        self._run = self._memo = None  # the step may change anything: the group starts anew
        cap = self._cap()
        plan = StepPlan([], [], [], 0, [])
        budget = self._schedule_running(plan, cap)
        if not plan.preempted:
            self._admit(plan, budget, cap)
        self._plan = plan
        return plan

    def _cap(self) -> int:
        """``long_prefill_token_threshold`` when more than one sequence runs or waits."""
        if len(self._running) + len(self.waiting) <= 1:
            return 0
        return self.long_prefill_token_threshold

    def _schedule_running(self, plan: StepPlan, cap: int) -> int:
        """Phase 1; returns the budget left."""
        budget = self.max_num_batched_tokens
        running, caching = self._running, self.caching
        limit = self.block_size
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            c = seq.num_computed
            n = seq.num_tokens - c
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            if c + n > seq.num_blocks * limit:
                fits, refund, dropped = self._make_room(seq, n, plan)
                budget += refund
                i -= dropped
                if not fits:
                    continue  # it preempted itself: running got shorter, the index stays
            elif caching and (c + n) // limit > seq.num_cached_blocks:
                self.blocks.cache_full(seq, c + n)  # type: ignore[union-attr]
            plan.seqs.append(seq)
            plan.num_new_tokens.append(n)
            plan.context_lens.append(c)
            budget -= n
            i += 1
        return budget

    def _make_room(self, seq: Sequence, n: int, plan: StepPlan) -> tuple[bool, int, int]:
        """Grow ``seq`` by ``n`` tokens, preempting victims until it fits: ``(fits, tokens
        given back, scheduled sequences dropped)`` (victims already planned leave the plan)."""
        refund = dropped = 0
        while not self.blocks.grow(seq, seq.num_computed + n):
            victim = self._victim()
            self._running.remove(victim)
            if victim in plan.seqs:  # only under priority: fcfs victims come later
                k = plan.seqs.index(victim)
                del plan.seqs[k], plan.context_lens[k]
                refund += plan.num_new_tokens.pop(k)
                dropped += 1
            self._preempt(victim)
            plan.preempted.append(victim)
            if victim is seq:
                return False, refund, dropped
        return True, refund, dropped

    def _victim(self) -> Sequence:
        if not self.priority:
            return self._running[-1]
        return max(self._running, key=lambda s: (s.priority, s.arrival_order))

    def _preempt(self, seq: Sequence) -> None:
        """Recompute preemption: drop the KV, keep the output, back to the waiting queue."""
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._num_preemptions += 1
        self.waiting.prepend(seq)

    def _admit(self, plan: StepPlan, budget: int, cap: int) -> None:
        """Phase 2: admit from the head of ``waiting`` until one does not fit."""
        waiting, running, blocks = self.waiting, self._running, self.blocks
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting.peek()
            hits = self._lookup(seq) if isinstance(blocks, KVCacheManager) else []
            hit = len(hits) * self.block_size
            n = seq.num_tokens - hit
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            if isinstance(blocks, KVCacheManager):
                if self.reserve_full_isl and (
                    blocks.num_needed(seq, seq.num_tokens, hits) > blocks.num_free
                ):
                    break
                if not blocks.admit(seq, hit + n, hits):
                    break
            else:
                if self.reserve_full_isl and not blocks.can_grow(seq, seq.num_tokens):
                    break
                if not blocks.grow(seq, n):
                    break
            waiting.pop()
            running.append(seq)
            seq.status = SequenceStatus.RUNNING
            seq.num_computed = hit
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = hit
            plan.seqs.append(seq)
            plan.num_new_tokens.append(n)
            plan.context_lens.append(hit)
            plan.num_admitted += 1
            budget -= n
