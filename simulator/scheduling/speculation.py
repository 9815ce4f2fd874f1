"""Speculative decoding and async scheduling in the step scheduler, as vLLM 0.33's scheduler
does them (tools/vllm_recorder/README.md states the rules with vLLM's file:line references).

Speculative decoding: a sequence that sampled in its last step carries ``k`` drafts
(``spec_drafts``) and asks for ``1 + k`` tokens in its next one, against the one token budget
and with KV slots for all of them; the verify step accepts a prefix of the drafts (the
``Acceptor`` says how many) and the sequence gains the accepted tokens plus one. Rejected
positions roll ``num_computed`` back; their blocks stay with the sequence, as in vLLM.

Async scheduling: step ``n + 1`` is planned before step ``n`` is applied. A sequence that
samples in a planned step gets ``1 + d`` output placeholders (counted in ``num_computed``),
so it is planned again as if every draft were accepted; applying the step rolls back the
rejected ones and retires the placeholders. A sequence preempted while a step holding it is
in flight keeps that step's output (``stale``), and waits for it before it is readmitted.
"""

from __future__ import annotations

from collections import deque

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.interface import Acceptor, Sampler, StepPlan
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence, SequenceStatus


@trait  # a part of StepScheduler (mypyc: one of its several bases)
@mypyc_attr(allow_interpreted_subclasses=True)
class Speculation:
    """The scheduler's steps with drafts or in-flight batches (mixed into ``StepScheduler``)."""

    blocks: KVManager
    max_model_len: int
    sample_fn: Sampler | None
    eos_token_id: int | None
    num_speculative_tokens: int
    accept_fn: Acceptor | None
    async_scheduling: bool
    _in_flight: deque[StepPlan]
    _running: list[Sequence]
    waiting: FCFSQueue | PriorityQueue
    _special: bool
    _unreported: bool
    _prefill_planned: bool

    @property
    def num_in_flight(self) -> int:
        """Async scheduling: steps planned and not yet applied."""
        return len(self._in_flight)

    @property
    def plans_ahead(self) -> bool:
        """Async scheduling plans a step before the last one is applied."""
        return self.async_scheduling

    @property
    def speculates(self) -> bool:
        """Whether decodes verify ``num_speculative_tokens`` drafts."""
        return self.num_speculative_tokens > 0

    def has_requests(self) -> bool:
        """Async scheduling: whether vLLM's engine would call ``schedule()`` (unfinished
        sequences, or some finished since the last call that it has not reported yet)."""
        return bool(self._running or self.waiting or self._unreported)

    def _can_defer(self) -> bool:
        # drafts are per-sequence state the deferred group does not keep (placeholders it
        # does: fast_async.py)
        return not self.num_speculative_tokens and super()._can_defer()  # type: ignore[misc]

    def _wanted(self, seq: Sequence) -> int:
        """Tokens running ``seq`` asks for in the next step with its drafts and placeholders
        (before any cap or budget), or -1 if it is not planned: async, its step in flight
        reaches ``max_tokens`` for sure; no token past ``_token_cap`` (the cache, or
        ``max_model_len``). Phase 1 of ``schedule()`` and the fast path's both ask this."""
        c, p = seq.num_computed, seq.placeholders
        if p and c + 2 - p >= seq.prompt_len + seq.max_tokens:
            return -1
        n = seq.num_tokens - c + seq.spec_drafts + p
        if c + n > self._token_cap:  # drafts cut at the cache or max_model_len
            n = self._token_cap - c
            return n if n > 0 else -1
        return n

    def _take_drafts(self, seq: Sequence, n: int, c: int, plan: StepPlan) -> bool:
        """Record the drafts ``seq`` verifies in its ``n`` tokens and clear its proposal;
        whether it is a prefill chunk (it has no proposal: its last chunk did not sample)."""
        d0 = seq.spec_drafts
        if not d0:
            return bool(self.num_speculative_tokens)
        d = n + c - seq.num_tokens - seq.placeholders
        if d > 0:
            plan.drafts[seq] = min(d, d0)
        seq.spec_drafts = 0
        return False

    def _init_speculation(self, k: int, accept: Acceptor | None, asyn: bool) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {k!r}")
        self.num_speculative_tokens = k
        # vLLM schedules no position past max_model_len - 1, and its cache holds max_model_len
        # tokens; with no limit given the cache is the limit: drafts never outgrow it
        cache = self.blocks.num_blocks * self.blocks.block_size
        limit = self.max_model_len
        self._token_cap = min(limit - 1, cache) if limit else cache
        """Most tokens a sequence may have computed once a step with drafts is applied."""
        """Draft tokens a decoding sequence verifies per step (0: no speculation)."""
        self.accept_fn = accept
        """How many drafts a verify step accepts (None: none)."""
        self.async_scheduling = asyn
        """Plan the next step before the last one is applied."""
        self._special = bool(k) or asyn
        self._in_flight = deque()
        self._unreported = False  # async: sequences finished since the last schedule()
        self._prefill_planned = False  # a running prefill chunk is in the plan being made

    def _after_schedule(self, plan: StepPlan) -> None:
        """Async scheduling: advance ``num_computed`` now (the next plan starts from it) and
        give the sequences that will sample their placeholders and placeholder drafts."""
        k = self.num_speculative_tokens
        drafts, sampling = plan.drafts, plan.sampling
        for seq, n in zip(plan.seqs, plan.num_new_tokens, strict=True):
            seq.num_computed += n
            seq.in_flight += n
            if seq.num_computed >= seq.num_tokens + seq.placeholders:
                seq.placeholders += 1 + drafts.get(seq, 0)
                seq.spec_drafts = k
                sampling.add(seq)

    def _apply_spec(self, plan: StepPlan) -> list[Sequence]:
        """Apply a step with drafts or placeholders: verify, append the accepted tokens plus
        one (cut at a stop), roll back what was rejected; return who finished, in plan order."""
        done: list[Sequence] = []
        k, asyn = self.num_speculative_tokens, self.async_scheduling
        caching = self.blocks.caching
        drafts, accepted, sampled = plan.drafts, plan.accepted, plan.sampled
        admitted = set(plan.admitted)
        for seq, n in zip(plan.seqs, plan.num_new_tokens, strict=True):
            stale = False
            if asyn:
                seq.in_flight -= n
                if seq.stale > 0:
                    stale = True
                    seq.stale -= n
                if seq.status is SequenceStatus.FINISHED or seq not in plan.sampling:
                    continue  # it stopped in the step before: this step's work is void
            else:
                seq.num_computed += n
                if seq.num_computed < seq.num_tokens:
                    seq.spec_drafts = 0  # a prefill chunk: vLLM drops its proposal
                    continue
            d = drafts.get(seq, 0)
            a = 0
            if d:
                # a fresh admission's drafts are vLLM's -1 padding, which nothing accepts
                a = 0 if seq in admitted else self._accept(seq, d)
                accepted[seq] = a
                if not stale:
                    seq.num_computed -= d - a
                    if seq.placeholders > 0:
                        seq.placeholders -= d - a
            m = a + 1
            got, stopped = self._emit(seq, m)
            plan.num_extra_tokens += got - 1
            if not stale:
                seq.num_computed -= m - got
                if seq.placeholders > 0:
                    seq.placeholders -= m
                if caching and seq.status is SequenceStatus.RUNNING:
                    # vLLM caches the blocks the accepted tokens filled when it applies them
                    self.blocks.cache_full(seq, seq.num_computed - seq.in_flight)
            sampled.append(seq)
            if stopped:
                done.append(seq)
            elif not asyn:
                seq.spec_drafts = k  # the drafter's proposal for the next step
        return done

    def _accept(self, seq: Sequence, d: int) -> int:
        fn = self.accept_fn
        if fn is None:
            return 0
        a = fn(seq, d)
        if not 0 <= a <= d:
            raise ValueError(f"acceptor gave {a} accepted of {d} drafts")
        return a

    def _emit(self, seq: Sequence, m: int) -> tuple[int, bool]:
        """Append up to ``m`` tokens to ``seq``, stopping at EOS or ``max_tokens``: (tokens
        appended, whether it stopped)."""
        sample_fn, eos = self.sample_fn, self.eos_token_id
        for j in range(1, m + 1):
            if sample_fn is not None:
                tok = sample_fn(seq)
                seq.output.append(tok)
                seq.num_tokens += 1
                if tok == eos:
                    return j, True
            else:
                seq.num_tokens += 1
            if seq.num_tokens - seq.prompt_len >= seq.max_tokens:
                return j, True
        return m, False
