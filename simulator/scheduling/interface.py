"""What the engine may ask of a scheduler, and the step plan it gets back.

The engine drives any policy through ``Scheduler`` alone: ``add()`` a sequence, ``schedule()``
a step (a ``StepPlan``: vLLM's ``SchedulerOutput``), time it, ``update()`` it, read the KV
usage and queue lengths; or, where the policy allows, ``fast_step()`` and
``finish_fast_step()`` instead. It never reads a policy's queues or writes a sequence.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable, Iterator
from typing import Protocol

from mypy_extensions import mypyc_attr, trait

from simulator.scheduling.sequence import Sequence


class Sampler(Protocol):
    """The model's output, as a scheduler sees it: the next token of a sequence."""

    def __call__(self, seq: Sequence) -> int:
        """The token ``seq`` samples at output position ``len(seq.output)``."""
        ...


class ManySampler(Protocol):
    """The next ``k`` tokens a ``Sampler`` would give a sequence, in one call."""

    def __call__(self, seq: Sequence, k: int) -> list[int]:
        """Tokens at output positions ``len(seq.output)`` .. ``len(seq.output) + k - 1``."""
        ...


class Acceptor(Protocol):
    """How many draft tokens a verify step accepts (speculative decoding)."""

    def __call__(self, seq: Sequence, num_drafts: int) -> int:
        """The accepted prefix of ``num_drafts`` drafts of ``seq`` (0 .. ``num_drafts``), drawn
        when ``seq`` has ``seq.num_output`` output tokens."""
        ...


class TierLoad:
    """KV a waiting sequence loads from the tiers below the GPU's before it is scheduled
    (``offload.py``): per tier (cpu, shared), the tokens and the bytes."""

    __slots__ = ("seq", "tokens", "nbytes")

    def __init__(self, seq: Sequence, tokens: list[int], nbytes: list[int]) -> None:
        self.seq = seq
        """The sequence; it holds GPU blocks for the KV and waits until the load ends."""
        self.tokens = tokens
        """Prompt tokens each tier serves (its prefix-cache hit there)."""
        self.nbytes = nbytes
        """Bytes each tier's link carries."""


class StepPlan:
    """One step as planned by ``schedule()``: who computes how many tokens (vLLM's
    ``SchedulerOutput``). ``update()`` completes it with the sequences that sampled.

    A plan from ``fast_step()`` leaves out the sequences of its deferred decode group: they
    are ``num_deferred`` more, each decoding one token on ``deferred_context`` tokens of KV in
    all, ahead of ``seqs`` in the running order, and each samples."""

    __slots__ = (
        "seqs",
        "num_new_tokens",
        "context_lens",
        "num_admitted",
        "preempted",
        "sampled",
        "num_deferred",
        "deferred_context",
        "drafts",
        "accepted",
        "sampling",
        "num_extra_tokens",
        "loads",
        "encoder",
        "encoder_freed",
        "encoder_tokens",
    )

    def __init__(
        self,
        seqs: list[Sequence],
        num_new_tokens: list[int],
        context_lens: list[int],
        num_admitted: int,
        preempted: list[Sequence],
    ) -> None:
        self.seqs = seqs
        """The scheduled sequences in plan order: running ones first, then the admitted."""
        self.num_new_tokens = num_new_tokens
        """Tokens each computes in this step (1 for a decode), aligned with ``seqs``."""
        self.context_lens = context_lens
        """Tokens each holds in KV before the step (prefix-cache hits included)."""
        self.num_admitted = num_admitted
        """How many of ``seqs`` (the last ones) were admitted from waiting in this step."""
        self.preempted = preempted
        """Sequences preempted while planning, in the order they were preempted."""
        self.sampled: list[Sequence] = []
        """Filled by ``update()``: the sequences of ``seqs`` that sampled a token, in plan
        order (the deferred ones all sample and are not listed)."""
        self.num_deferred = 0
        """Sequences of a deferred decode group in the step, not in ``seqs`` (0 from
        ``schedule()``)."""
        self.deferred_context = 0
        """Tokens those ``num_deferred`` sequences hold in KV before the step, in all."""
        self.drafts: dict[Sequence, int] = {}
        """Speculative decoding: the draft tokens each sequence of ``seqs`` verifies in this
        step (counted in its ``num_new_tokens``; only sequences with drafts)."""
        self.accepted: dict[Sequence, int] = {}
        """Filled by ``update()``: the drafts each sequence of ``drafts`` that sampled had
        accepted (before any cut at a stop, as vLLM counts them)."""
        self.sampling: set[Sequence] = set()
        """Async scheduling: the sequences that sample in this step, known when planned."""
        self.num_extra_tokens = 0
        """Filled by ``update()``: tokens sampled beyond one per sequence of ``sampled`` (the
        accepted drafts that were kept)."""
        self.loads: list[TierLoad] | tuple[()] = ()
        """KV loads from the tiers below the GPU's that planning started (their sequences
        are not in ``seqs``: each is scheduled once its load ends, ``finish_load``)."""
        self.encoder: dict[Sequence, list[int]] | None = None
        """Multimodal: the items (indices into ``mm_items``) encoded for each sequence in this
        step (vLLM's ``scheduled_encoder_inputs``), or None if none."""
        self.encoder_freed: list[Hashable] | None = None
        """Multimodal: contents evicted from the encoder cache while planning."""
        self.encoder_tokens = 0
        """Multimodal: placeholder tokens the vision encoder computes in this step."""

    @property
    def admitted(self) -> list[Sequence]:
        """The sequences admitted from waiting in this step, in admission order."""
        return self.seqs[len(self.seqs) - self.num_admitted :]

    @property
    def cached_tokens(self) -> list[int]:
        """Per admitted sequence, the tokens its KV starts with from the prefix cache (its
        context: a waiting sequence holds no KV of its own)."""
        return self.context_lens[len(self.seqs) - self.num_admitted :]

    @property
    def num_scheduled_tokens(self) -> dict[int, int]:
        """``{seq_id: tokens}`` of ``seqs`` in plan order (the spec's return value of
        ``schedule()``)."""
        return {s.seq_id: n for s, n in zip(self.seqs, self.num_new_tokens, strict=True)}

    @property
    def total_num_scheduled_tokens(self) -> int:
        """Tokens computed in the step."""
        return sum(self.num_new_tokens) + self.num_deferred

    def __len__(self) -> int:
        return len(self.seqs) + self.num_deferred

    def __repr__(self) -> str:
        deferred = f", deferred={self.num_deferred}" if self.num_deferred else ""
        return f"StepPlan({self.num_scheduled_tokens}{deferred}, preempted={len(self.preempted)})"


class DecodeStretch:
    """Steps offered by ``decode_stretch()``: in each, the deferred decode group decodes one
    token per member and nothing else runs or waits."""

    __slots__ = ("segments", "num_blocks")

    def __init__(
        self, segments: Iterator[tuple[int, range, Iterator[int], int, int]], num_blocks: int
    ) -> None:
        self.segments = segments
        """The steps in order, in segments of steps with the same sequences: (how many, their
        KV tokens before each step, KV blocks used once each step is planned, how many of
        them sample their last token in the segment's last step, free blocks the prefix
        cache keeps before its first step)."""
        self.num_blocks = num_blocks
        """With a prefix cache, the blocks in all (0 without): a step takes free blocks
        without content first, so after it ``min(kept before, num_blocks - blocks used)`` of
        the free ones keep content."""


@trait  # mypyc: the first of StepScheduler's bases would otherwise have to be its only class
@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler:
    """A scheduling policy: a plain state machine with no clock, no randomness and no I/O.

    Only a scheduler (and its block manager) writes a sequence's fields."""

    @property
    @abstractmethod
    def num_blocks(self) -> int:
        """KV blocks in the cache."""

    @property
    @abstractmethod
    def block_size(self) -> int:
        """Tokens per KV block."""

    @property
    @abstractmethod
    def num_blocks_used(self) -> int:
        """KV blocks held by unfinished sequences now."""

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks whose contents the prefix cache keeps for reuse (0 without a cache)."""
        return 0

    @property
    @abstractmethod
    def num_running(self) -> int:
        """Sequences admitted and not finished."""

    @property
    @abstractmethod
    def num_waiting(self) -> int:
        """Sequences waiting for admission (new or preempted)."""

    @property
    @abstractmethod
    def num_preemptions(self) -> int:
        """Preemptions so far."""

    def has_work(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self.num_running or self.num_waiting)

    # -- optional async scheduling and speculation ---------------------------------------------

    @property
    def plans_ahead(self) -> bool:
        """Whether the policy plans step ``n + 1`` before step ``n`` is applied (vLLM's async
        scheduling): ``schedule()`` may be called again before ``update()``."""
        return False

    def has_requests(self) -> bool:
        """Whether vLLM's engine would call ``schedule()`` now (a plan-ahead policy may owe
        a report of sequences finished since its last plan even with no work)."""
        return self.has_work()

    @property
    def speculates(self) -> bool:
        """Whether the policy's decodes verify draft tokens (speculative decoding): its
        steps take the plain path."""
        return False

    # -- optional KV tiers below the GPU's ----------------------------------------------------

    @property
    def moves_kv(self) -> bool:
        """Whether the policy has KV tiers below the GPU's: its plans may start loads
        (``StepPlan.loads``) and its steps move bytes (``take_kv_moved``)."""
        return False

    @property
    def num_loading(self) -> int:
        """Sequences waiting for their KV load from a tier to end (in ``num_waiting`` too)."""
        return 0

    def kv_links(self) -> list[tuple[float, float] | None]:
        """Per tier (cpu, shared): (bytes per second, seconds of latency per load) of its
        link to the GPU, or None when there is no such tier."""
        return []

    def take_kv_moved(self) -> tuple[int, ...]:
        """Bytes stored to and loaded from each tier since the last call: (cpu store, cpu
        load, shared store, shared load)."""
        return (0, 0, 0, 0)

    @property
    def swap_bandwidth(self) -> float | None:
        """With swap preemption, bytes per second its copies between GPU and CPU memory take
        (the plans' ``take_swapped``, timed on their steps); None: it recomputes."""
        return None

    def take_swapped(self) -> tuple[int, int]:
        """KV bytes the plans since the last call swapped out to CPU memory and back in."""
        return (0, 0)

    def finish_load(self, seq: Sequence) -> None:
        """The KV load of ``seq`` (a ``TierLoad`` of an earlier plan) ended: it may be
        scheduled from the next step on."""
        raise NotImplementedError(f"{type(self).__name__} loads no KV")

    @abstractmethod
    def rejection_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never be served (its largest KV footprint exceeds an empty
        cache), or None when it can."""

    @abstractmethod
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (ValueError if it can never be served)."""

    def add_prefilled(self, seq: Sequence) -> None:
        """Queue a sequence whose prompt was computed elsewhere (a disaggregated prefill): it
        has sampled ``seq.output`` there and arrives with the KV of every token but the last,
        so it needs blocks for that KV before it decodes, and no prefill (ValueError if it can
        never be served)."""
        raise NotImplementedError(f"{type(self).__name__} cannot take prefilled sequences")

    @abstractmethod
    def schedule(self) -> StepPlan:
        """Plan the next step."""

    @abstractmethod
    def update(self) -> list[Sequence]:
        """Apply the last plan (KV progress, sampling, retiring); return the sequences that
        finished in this step and fill the plan's ``sampled``."""

    # -- optional fast path -----------------------------------------------------------------

    def fast_step(self) -> StepPlan | None:
        """Plan the next step without walking the sequences that just decode, if the policy
        would plan it so (nobody preempted): a ``StepPlan`` whose ``num_deferred`` sequences
        decode in a deferred group and whose ``seqs`` are the others; or None, and the step
        must go through ``schedule()`` and ``update()``."""
        return None

    def decode_stretch(self) -> DecodeStretch | None:
        """The steps ahead in which only the deferred decode group runs, each member decoding
        one token (nobody else runs or waits, no block is missing), if the next step is one;
        they go on while an arrival could change nothing. Nothing changes until
        ``take_decodes()``."""
        return None

    def take_decodes(self, k: int, hold_last: bool = False) -> list[tuple[int, list[Sequence]]]:
        """Take the first ``k`` steps of the last ``decode_stretch()`` (each as
        ``fast_step()`` + ``finish_fast_step()`` would); return, per step in which some
        finished, (its index in the stretch, the sequences that finished in it). With
        ``hold_last`` the last step is only planned, as by ``fast_step()``: its members
        finish at ``finish_fast_step()``."""
        raise NotImplementedError

    def finish_fast_step(self) -> list[Sequence]:
        """The ``update()`` of a step planned by ``fast_step()``: the sequences that finished
        (the plan's ``sampled`` is filled)."""
        return []

    def decode_batch_ids(self) -> list[int]:
        """The ids of the sequences in the deferred decode group now, in running order (each
        sampled in the last step)."""
        return []
