"""What the engine may ask of a scheduler, and the step plan it gets back.

The engine drives any policy through ``Scheduler`` alone: ``add()`` a sequence, ``schedule()``
a step (a ``StepPlan``: vLLM's ``SchedulerOutput``), time it, ``update()`` it, read the KV
usage and queue lengths. It never reads a policy's queues or writes a sequence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Protocol

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


class StepPlan:
    """One step as planned by ``schedule()``: who computes how many tokens (vLLM's
    ``SchedulerOutput``). ``update()`` completes it with the sequences that sampled."""

    __slots__ = ("seqs", "num_new_tokens", "context_lens", "num_admitted", "preempted", "sampled")

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
        """Filled by ``update()``: the sequences that sampled a token, in plan order."""

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
    def num_scheduled_tokens(self) -> dict[Hashable, int]:
        """``{seq_id: tokens}`` in plan order (the spec's return value of ``schedule()``)."""
        return {s.seq_id: n for s, n in zip(self.seqs, self.num_new_tokens, strict=True)}

    @property
    def total_num_scheduled_tokens(self) -> int:
        """Tokens computed in the step."""
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.seqs)

    def __repr__(self) -> str:
        return f"StepPlan({self.num_scheduled_tokens}, preempted={len(self.preempted)})"


class Scheduler(ABC):
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

    # -- optional fast path for plain decode steps --------------------------------------------

    def decode_step(self) -> tuple[int, int]:
        """Take the next step as a deferred decode of every running sequence if the policy
        would plan exactly that; return ``(sequences, context tokens before the step)``, or
        ``(0, 0)``: the step must go through ``schedule()`` and ``update()``."""
        return 0, 0

    def finish_decode_step(self) -> list[Sequence]:
        """The ``update()`` of a step taken by ``decode_step()``: the sequences that finished."""
        return []

    def decode_batch_ids(self) -> list[Hashable]:
        """The ids of the sequences that deferred decode steps are stepping, in plan order."""
        return []
