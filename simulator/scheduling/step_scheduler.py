"""The step scheduler: continuous batching with chunked prefill and preemption (recompute, or
swap: ``preemption.py``) under a token budget, ``max_num_seqs`` and a KV-block budget
(docs/scheduler.md). vLLM has one ``Scheduler`` whose variants are flags; so has this one, and
the policies are presets of them (``presets.py``): ``spec`` (the text of
``shared/spec/scheduler.md``) and ``vllm-v1`` (vLLM 0.33's v1 scheduler, step for step against
recorded traces).

The flags, and what each changes:

- ``admit_after_preemption``: admit in a step that preempted someone (spec: yes; vLLM: no);
- ``reserve_full_isl``: admit only if blocks for all known tokens are free, not only a chunk's;
- ``long_prefill_token_threshold``: most tokens of a sequence per step while more than one
  runs or waits as the step starts (0: no cap);
- ``priority``: the waiting queue is a heap on ``(priority, arrival)`` and the victim is the
  running sequence with the largest such key (dropped from the plan if already in it);
- ``enable_prefix_caching``: an admitted sequence starts from its prefix-cache hit;
- ``num_speculative_tokens``: speculative decoding, ``k`` drafts verified per decode step
  (``speculation.py``; ``accept`` says how many are accepted; none past ``max_model_len``);
- ``async_scheduling``: step ``n + 1`` is planned before step ``n`` is applied
  (``speculation.py``): ``schedule()`` may run again before ``update()`` applies the oldest;
- ``encoder``, ``kv_groups``: images' encoder work (``encoder_inputs.py``), hybrid KV groups.

A plain object with no clock, randomness or I/O: the engine calls ``schedule()``, times the step
with the cost model, then calls ``update()`` (or the fast path of ``fast_step.py``: same steps).
"""

from __future__ import annotations

from typing import Any

from mypy_extensions import mypyc_attr

from simulator.scheduling.encoder_inputs import EncoderInputs
from simulator.scheduling.fast_step import FastSteps
from simulator.scheduling.hybrid_kv import kv_manager_for
from simulator.scheduling.intake import Intake, check_flags, positive
from simulator.scheduling.interface import Acceptor, ManySampler, Sampler, Scheduler, StepPlan
from simulator.scheduling.kv_group import KVGroup
from simulator.scheduling.preemption import Preemption
from simulator.scheduling.presets import PRESETS
from simulator.scheduling.request_queue import FCFSQueue, PriorityQueue
from simulator.scheduling.sequence import Sequence, SequenceStatus
from simulator.scheduling.speculation import Speculation
from simulator.scheduling.swap_space import SwapSpace
from simulator.scheduling.tier_loads import TierLoads


@mypyc_attr(allow_interpreted_subclasses=True)  # a policy of the user's may subclass it
class StepScheduler(Intake, Speculation, TierLoads, Preemption, FastSteps, Scheduler):
    """The one scheduler; its policy is the flags it is built with."""

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
        admit_after_preemption: bool = True,
        reserve_full_isl: bool = False,
        long_prefill_token_threshold: int = 0,
        priority: bool = False,
        num_speculative_tokens: int = 0,
        accept: Acceptor | None = None,
        async_scheduling: bool = False,
        max_model_len: int = 0,
        encoder: EncoderInputs | None = None,
        kv_groups: list[KVGroup] | None = None,
    ) -> None:
        self.max_model_len = max_model_len
        size = positive("num_blocks", num_blocks), positive("block_size", block_size)
        self.max_num_seqs = positive("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = positive("max_num_batched_tokens", max_num_batched_tokens)
        chunk = max_num_batched_tokens, long_prefill_token_threshold, num_speculative_tokens
        self.blocks = kv_manager_for(*size, enable_prefix_caching, kv_groups, max_model_len, *chunk)
        """The KV blocks: counted, with identities and a prefix cache, or hybrid groups."""
        self.admit_after_preemption = admit_after_preemption
        """Admit waiting sequences in a step that preempted someone."""
        self.reserve_full_isl = reserve_full_isl
        """Admit only when blocks for all known tokens are free."""
        check_flags(long_prefill_token_threshold, sample_fn, eos_token_id)
        self.long_prefill_token_threshold = long_prefill_token_threshold
        """Most tokens of one sequence per step when others wait or run (0: no cap)."""
        self.priority = priority
        """Serve by ``(priority, arrival)`` instead of first come first served."""
        self._init_speculation(num_speculative_tokens, accept, async_scheduling)
        self.sample_fn = sample_fn
        """The model's next token of a sequence, or None: tokens are only counted."""
        self.eos_token_id = eos_token_id
        self.sample_many = sample_many
        """``sample_many(seq, k)``: the next ``k`` tokens at once (opens ``fast_step()``)."""
        self.keep_finished = keep_finished
        """Keep finished sequences in ``finished`` (False: forget them once returned)."""
        self.waiting: FCFSQueue | PriorityQueue = PriorityQueue() if priority else FCFSQueue()
        """Sequences waiting for admission, in service order."""
        self._running: list[Sequence] = []
        self.finished: list[Sequence] = []
        """Finished sequences, in finishing order (only with ``keep_finished``)."""
        self._num_preemptions = self._num_added = 0
        self._known: set[int] = set()
        self._plan: StepPlan | None = None
        self._init_fast(StepScheduler)
        self._loading: set[Sequence] = set()  # holding blocks while their KV loads from a tier
        self.swap: SwapSpace | None = None  # swap preemption's (``enable_swap``), or None
        self.encoder = encoder  # multimodal items' encoder budget and cache, or None (text)

    @classmethod
    def vllm_v1(cls, *args: Any, **flags: Any) -> StepScheduler:
        """The ``vllm-v1`` preset, ``flags`` overriding its own (arguments: the constructor's)."""
        return cls(*args, **{**PRESETS["vllm-v1"], **flags})

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

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks whose contents the prefix cache keeps for reuse."""
        return self.blocks.num_cached_free

    @property
    def num_running(self) -> int:
        """Sequences admitted and not finished."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission (those whose KV loads or is swapped out included)."""
        return len(self.waiting) + len(self._loading) + self.num_swapped

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far."""
        return self._num_preemptions

    @property
    def running(self) -> list[Sequence]:
        """Running sequences in admission order (settles deferred decode steps)."""
        self._settle()
        return self._running

    def has_work(self) -> bool:
        """Whether any sequence is waiting or running (or, async, a step is in flight)."""
        return bool(self._running or self.waiting or self._in_flight or self.num_swapped)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return self.blocks.blocks_for(num_tokens)

    # -- the step --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan one step: running sequences first, then admissions (unless someone was
        preempted and the policy says wait), under one token budget."""
        self._settle()
        self._run = self._memo = None  # the step may change anything: the group starts anew
        self.blocks.new_step()
        cap = self._cap()
        plan = StepPlan([], [], [], 0, [])
        budget = self._plan_running(plan, cap)
        if self.num_swapped:  # swapped sequences resume first, and new ones wait for them
            budget = self._resume_swapped(plan, budget, cap)
        if (self.admit_after_preemption or not plan.preempted) and not self.num_swapped:
            self._admit(plan, budget, cap)
        if self.encoder is not None:
            self.encoder.end_step(plan)
        if self.async_scheduling:
            self._after_schedule(plan)
            self._in_flight.append(plan)
            self._unreported = False
        else:
            self._plan = plan
        return plan

    def _cap(self) -> int:
        """``long_prefill_token_threshold`` when more than one sequence runs or waits."""
        if len(self._running) + len(self.waiting) <= 1:
            return 0
        return self.long_prefill_token_threshold

    def _plan_running(self, plan: StepPlan, cap: int) -> int:
        """Phase 1: each running sequence in order takes its tokens (capped) while budget
        lasts, preempting from the tail when its blocks are missing; returns the budget left."""
        budget = self.max_num_batched_tokens
        running, blocks = self._running, self.blocks
        limit, caching = blocks.block_size, blocks.caching
        special, prefill, enc = self._special, False, self.encoder
        # an index loop, because preemption shortens ``running`` under our feet
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            c = seq.num_computed
            n = seq.num_tokens - c
            if special:  # drafts and placeholders (speculation.py)
                n = self._wanted(seq)
                if n < 0:
                    i += 1
                    continue
            if 0 < cap < n:
                n = cap
            if n > budget:
                n = budget
            if enc is not None and c < seq.mm_end and not (n := enc.plan_chunk(seq, c, n)):
                i += 1  # an item's encoder output cannot be had: vLLM skips the sequence
                continue
            # the common case, a decode inside its last block, needs no new block: no call
            if c + n > seq.num_blocks * limit:  # hybrid groups: always (num_blocks is 0)
                if not (n := blocks.clip(seq, c, n)):  # Mamba ``align``: chunks on boundaries
                    i += 1
                    continue
                fits, refund, dropped = self._make_room(seq, n, plan)
                budget += refund
                i -= dropped
                if not fits:
                    continue  # it preempted itself: running got shorter, the index stays
            elif caching and (c + n) // limit > blocks.cached.get(seq, 0):
                blocks.cache_full(seq, c + n)  # no new block, but the step fills one
            if enc is not None:
                enc.commit(seq)
            plan.seqs.append(seq)
            plan.num_new_tokens.append(n)
            plan.context_lens.append(c)
            budget -= n
            i += 1
            if special:
                prefill |= self._take_drafts(seq, n, c, plan)
        self._prefill_planned = prefill
        return budget

    def _make_room(self, seq: Sequence, n: int, plan: StepPlan) -> tuple[bool, int, int]:
        """Grow ``seq`` by ``n`` tokens, preempting victims until it fits: ``(fits, tokens
        given back, scheduled sequences dropped)`` (victims already planned leave the plan)."""
        refund = dropped = 0
        while not self.blocks.grow(seq, seq.num_computed + n):
            victim = self._victim()
            if self.priority and victim in plan.seqs:  # fcfs victims come later
                k = plan.seqs.index(victim)
                del plan.seqs[k], plan.context_lens[k]
                plan.drafts.pop(victim, None)
                refund += plan.num_new_tokens.pop(k)
                dropped += 1
            self._preempt(victim)
            plan.preempted.append(victim)
            if victim is seq:
                return False, refund, dropped
        return True, refund, dropped

    def _preempt(self, seq: Sequence) -> None:
        """Preempt a running ``seq`` (``Preemption._swap_or_recompute``): a hook, on the class
        a policy subclasses, since compiled code calling a trait's method misses an override."""
        self._swap_or_recompute(seq)

    def _victim(self) -> Sequence:
        if not self.priority:
            return self._running[-1]
        return max(self._running, key=lambda s: (s.priority, s.arrival_order))

    def _admit(self, plan: StepPlan, budget: int, cap: int) -> None:
        """Phase 2: admit from the head of ``waiting`` until one does not fit (the head
        blocks everybody behind it)."""
        waiting, running, blocks = self.waiting, self._running, self.blocks
        caching, reserve = blocks.caching, self.reserve_full_isl
        k = self.num_speculative_tokens
        # vLLM pads a one-token admission to 1 + k rows unless a prefill chunk runs
        pad = k and not self._prefill_planned
        num_running, skipped = len(plan.seqs), []
        offload, enc = blocks.offload, self.encoder
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting[0]
            if seq.stale:  # async: its output from before the preemption is in flight
                skipped.append(waiting.pop())
                continue
            hits = self._lookup(seq) if caching else []
            if offload is not None:
                held = self._hold_for_load(seq, hits, plan)
                if held is not None:
                    if not held:
                        break
                    continue
            start = len(hits) * blocks.block_size if caching else seq.num_computed
            n = seq.num_tokens - start
            padded = False
            if pad and n == 1 and (num_running or start) and start + 1 + k <= self._token_cap:
                if 1 + k > budget:
                    break
                n, padded = 1 + k, True
            n = min(n, cap, budget) if cap > 0 else min(n, budget)
            if enc is not None and start < seq.mm_end and not (n := enc.plan_chunk(seq, start, n)):
                skipped.append(waiting.pop())  # vLLM 0.33 skips it this step, keeping its place
                continue
            if (
                not (n := blocks.clip(seq, start, n))  # Mamba ``align``: chunks on boundaries
                or (reserve and blocks.num_needed(seq, seq.num_tokens, hits) > blocks.num_free)
                or not (blocks.admit(seq, start + n, hits) if hits else blocks.grow(seq, start + n))
            ):
                if enc is not None and seq.mm_items:  # its cache references go, as in vLLM
                    enc.drop(seq, preempted=True)
                break
            waiting.pop()
            running.append(seq)
            seq.status = SequenceStatus.RUNNING
            seq.num_computed = start
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = start if caching else 0
            plan.seqs.append(seq)
            plan.num_new_tokens.append(n)
            plan.context_lens.append(start)
            plan.num_admitted += 1
            budget -= n
            if enc is not None:
                enc.commit(seq)
            if padded:
                plan.drafts[seq] = k
        for seq in reversed(skipped):
            waiting.prepend(seq)

    # -- applying the step ----------------------------------------------------------------

    def update(self) -> list[Sequence]:
        """Apply the last plan: advance KV, sample completed sequences, retire finished ones
        (in plan order, freeing their blocks tail first)."""
        if self._fast_flight and self._fast_flight[0][0] is self._in_flight[0]:
            return self._finish_async()  # async: planned by fast_step(), with its group
        plan = self._in_flight.popleft() if self._in_flight else self._plan
        if plan is None:
            raise RuntimeError("update() without a schedule()")
        self._plan = None
        done = self._apply_spec(plan) if self._special else self._apply(plan)
        for seq in done:
            self._retire(seq)
        if done:
            self._unreported = True
        self._sampled = plan.sampled
        return done

    def _apply(self, plan: StepPlan) -> list[Sequence]:
        """Advance the KV of ``plan.seqs``, sample those that computed all their tokens (into
        ``plan.sampled``); return those that finished, in plan order."""
        done: list[Sequence] = []
        sampled = plan.sampled
        eos = self.eos_token_id
        sample_fn = self.sample_fn
        for seq, n in zip(plan.seqs, plan.num_new_tokens, strict=True):
            seq.num_computed += n
            if seq.num_computed == seq.num_tokens:
                if sample_fn is not None:
                    tok = sample_fn(seq)
                    seq.output.append(tok)
                    if tok == eos:
                        seq.num_tokens += 1
                        sampled.append(seq)
                        done.append(seq)
                        continue
                seq.num_tokens += 1
                sampled.append(seq)
                if seq.num_tokens - seq.prompt_len >= seq.max_tokens:
                    done.append(seq)
        return done

    def _retire(self, seq: Sequence) -> None:
        waiting = seq.status is SequenceStatus.WAITING  # async: stopped by stale output
        seq.status = SequenceStatus.FINISHED  # before free(): finished KV is never re-hit
        if waiting:
            self.waiting.remove(seq)
        else:
            self._running.remove(seq)
            self.blocks.free(seq)
        if self.encoder is not None and seq.mm_items:
            self.encoder.drop(seq)
        if self.keep_finished:
            self.finished.append(seq)
