"""The ``spec`` policy: the step scheduler of ``shared/spec/scheduler.md`` (docs/scheduler.md),
continuous batching, chunked prefill, recompute preemption under a token budget,
``max_num_seqs`` and a KV-block budget, exact to its text.

A plain object with no clock, no randomness and no I/O: the engine calls ``schedule()``, lets
the cost model time the step, then calls ``update()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from simulator.scheduling.block_manager import BlockManager
from simulator.scheduling.decode_run import DecodeRun
from simulator.scheduling.fast_step import FastSteps
from simulator.scheduling.interface import ManySampler, Sampler, Scheduler, StepPlan
from simulator.scheduling.kv_cache_manager import KVCacheManager
from simulator.scheduling.sequence import Sequence, SequenceStatus

__all__ = ["SpecScheduler", "Sequence", "SequenceStatus"]


def positive(name: str, value: int) -> int:
    """``value`` if it is a positive int, else a ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_sampling(sample_fn: Sampler | None, eos_token_id: int | None) -> None:
    """An EOS token can only be sampled: refuse one without a sampler."""
    if sample_fn is None and eos_token_id is not None:
        raise ValueError("eos_token_id needs a sample_fn (only sampling can reveal an EOS)")


class SpecScheduler(FastSteps, Scheduler):
    """vLLM-v1-style step scheduler, exact to the spec."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        sample_fn: Sampler | None = None,
        eos_token_id: int | None = None,
        *,
        sample_many: ManySampler | None = None,
        keep_finished: bool = True,
        enable_prefix_caching: bool = False,
    ) -> None:
        positive("num_blocks", num_blocks)
        positive("block_size", block_size)
        self.caching = enable_prefix_caching
        """Whether admitted sequences start from their prefix-cache hit (docs/scheduler.md)."""
        self.blocks: BlockManager | KVCacheManager = (
            KVCacheManager(num_blocks, block_size)
            if enable_prefix_caching
            else BlockManager(num_blocks, block_size)
        )
        """The KV blocks: counted, or with identities and a prefix cache."""
        self.max_num_seqs = positive("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = positive("max_num_batched_tokens", max_num_batched_tokens)
        check_sampling(sample_fn, eos_token_id)
        self.sample_fn = sample_fn
        """The model's next token of a sequence, or None: no tokens are kept, only counted
        (``num_output``)."""
        self.eos_token_id = eos_token_id
        self.sample_many = sample_many
        """``sample_many(seq, k)``: the next ``k`` tokens ``sample_fn`` would give, at once;
        with ``sample_fn`` it enables ``fast_step()`` (with no EOS, which only sampling can
        reveal)."""
        self.keep_finished = keep_finished
        """Keep finished sequences in ``finished`` (False: forget them once returned)."""
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self.finished: list[Sequence] = []
        """Finished sequences, in finishing order (only with ``keep_finished``)."""
        self._num_preemptions = 0
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
    def num_cached_blocks(self) -> int:
        """Free blocks whose contents the prefix cache keeps for reuse."""
        return self.blocks.num_cached_free if isinstance(self.blocks, KVCacheManager) else 0

    @property
    def blocks_used(self) -> int:
        """The spec's name for ``num_blocks_used``."""
        return self.blocks.num_used

    @property
    def num_running(self) -> int:
        """Sequences admitted and not finished."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission."""
        return len(self._waiting)

    def _num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far."""
        return self._num_preemptions

    @property
    def running(self) -> list[Sequence]:
        """Running sequences, earliest admitted first (settles deferred decode steps)."""
        self._settle()
        return self._running

    @property
    def waiting(self) -> deque[Sequence]:
        """Waiting sequences, head first."""
        return self._waiting

    def has_work(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self._waiting or self._running)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return self.blocks.blocks_for(num_tokens)

    # -- admission -------------------------------------------------------------------------

    def can_ever_fit(self, seq: Sequence) -> bool:
        """Whether the sequence's largest KV footprint fits in an empty cache."""
        return self.blocks_for(seq.max_kv_tokens) <= self.num_blocks

    def rejection_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never fit, or None."""
        if self.can_ever_fit(seq):
            return None
        return (
            f"needs {self.blocks_for(seq.max_kv_tokens)} KV blocks for {seq.max_kv_tokens} "
            f"tokens (prompt {seq.prompt_len} + output {seq.max_tokens} - 1), cache has "
            f"{self.num_blocks}"
        )

    def add(self, seq: Sequence) -> None:
        """Append a new sequence to the tail of ``waiting``."""
        if seq.output:
            raise ValueError(f"sequence {seq.seq_id!r} is not new (status {seq.status.value})")
        self._enqueue(seq)

    def add_prefilled(self, seq: Sequence) -> None:
        """Append a sequence that arrives with its prompt computed elsewhere (the KV of every
        token but its last sampled one) to the tail of ``waiting``. It is admitted like any
        head, when the blocks for that KV are free, and decodes its next token in that step;
        a later preemption drops the KV as usual and recomputes it here."""
        if not seq.output:
            raise ValueError(f"sequence {seq.seq_id!r} has sampled no token: not prefilled")
        if isinstance(self.blocks, KVCacheManager):
            # admission starts from a cache lookup, which knows nothing of KV that came in
            raise ValueError("prefilled sequences need prefix caching off")
        self._enqueue(seq)
        seq.num_computed = seq.num_tokens - 1

    def _enqueue(self, seq: Sequence) -> None:
        if seq.seq_id in self._known:
            raise ValueError(f"sequence {seq.seq_id!r} was already added")
        if seq.status is not SequenceStatus.WAITING or seq.num_computed:
            raise ValueError(f"sequence {seq.seq_id!r} is not new (status {seq.status.value})")
        reason = self.rejection_reason(seq)
        if reason is not None:
            raise ValueError(f"sequence {seq.seq_id!r} can never fit: {reason}")
        self._known.add(seq.seq_id)
        self._waiting.append(seq)

    # -- preemption ------------------------------------------------------------------------

    def _preempt(self, seq: Sequence) -> None:
        """Recompute preemption: drop the KV, keep the output, back to the head of waiting."""
        self._running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._num_preemptions += 1
        self._waiting.appendleft(seq)

    def _make_room(self, seq: Sequence, n: int, preempted: list[Sequence]) -> bool:
        """Grow ``seq`` by ``n`` tokens, preempting from the tail of ``running`` until it fits;
        False if ``seq`` itself had to be preempted."""
        while not self.blocks.grow(seq, seq.num_computed + n):
            victim = self._running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    # -- the step --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan one step: running first, then FCFS admissions, under one token budget."""
        self._settle()
        self._run = self._memo = None  # the step may change anything: the group starts anew
        budget = self.max_num_batched_tokens
        seqs: list[Sequence] = []
        new_tokens: list[int] = []
        context: list[int] = []
        preempted: list[Sequence] = []
        running = self._running
        limit = self.block_size
        caching = self.caching
        # Phase 1: an index loop, because preemption shortens ``running`` under our feet.
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            c = seq.num_computed
            n = min(seq.num_tokens - c, budget)
            # The common case, a decode inside its last block, needs no new block: skip the call.
            if c + n > seq.num_blocks * limit:
                if not self._make_room(seq, n, preempted):
                    continue  # it preempted itself: running got shorter, so the index stays
            elif (
                caching and (c + n) // limit > seq.num_cached_blocks
            ):  # no new block, but the step may fill one: cache it
                self.blocks.cache_full(seq, c + n)  # type: ignore[union-attr]
            seqs.append(seq)
            new_tokens.append(n)
            context.append(c)
            budget -= n
            i += 1
        self._plan = plan = StepPlan(seqs, new_tokens, context, 0, preempted)
        self._admit(plan, budget, 0)
        return plan

    def _admit(self, plan: StepPlan, budget: int, cap: int) -> None:
        """Phase 2: strictly FCFS; a head that does not fit blocks everybody behind it."""
        waiting = self._waiting
        running = self._running
        blocks = self.blocks
        limit = self.block_size
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting[0]
            if isinstance(blocks, KVCacheManager):  # start from the prefix-cache hit
                hits = self._lookup(seq)
                hit = len(hits) * limit
                n = min(seq.num_tokens - hit, budget)
                if not blocks.admit(seq, hit + n, hits):
                    break
                seq.num_computed = hit
                if seq.num_cached_tokens < 0:
                    seq.num_cached_tokens = hit
            else:
                n = min(seq.num_tokens - seq.num_computed, budget)
                if not blocks.grow(seq, seq.num_computed + n):
                    break
                if seq.num_cached_tokens < 0:
                    seq.num_cached_tokens = 0
            waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            running.append(seq)
            plan.seqs.append(seq)
            plan.num_new_tokens.append(n)
            plan.context_lens.append(seq.num_computed)
            plan.num_admitted += 1
            budget -= n
