"""A request as the scheduler sees it: prompt, sampled tokens and KV progress."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable

PromptRuns = tuple[tuple[Hashable, int], ...]
MMItem = tuple[int, int, Hashable]
"""A multimodal item of a prompt: ``(offset, length, content)``, its placeholder tokens
``[offset, offset + length)`` and the id of its content (vLLM's ``mm_hash``): items with the
same content share one encoder output (docs/multimodal.md)."""
"""A prompt's token identity: ``(segment, tokens)`` runs, each the first ``tokens`` tokens of
its segment. Two prompts share their first ``k`` tokens exactly when their runs, cut after
``k`` tokens, are equal (docs/workloads.md, "Token identity")."""


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life: waiting, running or finished."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request's token state (its KV blocks are the KV manager's; it counts them): the
    scheduler mutates it, nobody else should."""

    __slots__ = (
        "seq_id",
        "prompt_len",
        "max_tokens",
        "priority",
        "prompt_runs",
        "output",
        "num_computed",
        "num_blocks",
        "status",
        "num_preemptions",
        "num_tokens",
        "num_cached_tokens",
        "block_hashes",
        "arrival_order",
        "deferred_from",
        "spec_drafts",
        "placeholders",
        "in_flight",
        "stale",
        "mm_items",
        "mm_end",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_len: int,
        max_tokens: int,
        *,
        priority: int = 0,
        prompt_runs: PromptRuns | None = None,
        output: Iterable[int] = (),
        mm_items: tuple[MMItem, ...] = (),
    ) -> None:
        if not isinstance(prompt_len, int) or prompt_len <= 0:
            raise ValueError(f"prompt_len must be a positive integer, got {prompt_len!r}")
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        _check_runs(seq_id, prompt_runs, prompt_len)
        self.seq_id = seq_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.priority = priority
        """Lower is served first under a priority policy (vLLM's convention)."""
        self.prompt_runs = prompt_runs
        """Token identity of the prompt, or None: a prompt no other request shares."""
        self.output: list[int] = list(output)
        """Sampled tokens; a sequence may start with some sampled elsewhere (the first token of
        a disaggregated prefill: ``Scheduler.add_prefilled``)."""
        if len(self.output) >= max_tokens:
            raise ValueError(f"output of {len(self.output)} tokens leaves none of {max_tokens}")
        self.num_computed = 0
        self.num_blocks = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions = 0
        # prompt_len + tokens sampled, kept as a field because the scheduler reads it for every
        # sequence in every step (and a scheduler without a sampler keeps no ``output``).
        self.num_tokens = prompt_len + len(self.output)
        self.num_cached_tokens = -1
        """Prompt tokens served from the prefix cache when first scheduled (-1 before)."""
        self.block_hashes: list[int] = []
        """Chained content hashes of the sequence's full blocks, computed as needed."""
        self.arrival_order = 0
        """Position in the order of ``add()`` calls (a priority policy's tie-breaker)."""
        self.deferred_from = 0
        """While in a group of deferred decode steps (``decode_run.py``): the group's step count
        when it joined; ``num_computed``, ``num_tokens`` and ``output`` are as of then."""
        # speculative decoding and async scheduling (speculation.py); all 0 without them
        self.spec_drafts = 0
        """Draft tokens proposed for the next step (vLLM's ``spec_token_ids``)."""
        self.placeholders = 0
        """Async scheduling: output tokens of batches in flight, counted in ``num_computed``
        (vLLM's ``num_output_placeholders``)."""
        self.in_flight = 0
        """Async scheduling: tokens scheduled in batches not yet applied."""
        self.stale = 0
        """Async scheduling: in-flight tokens whose output predates a preemption."""
        self.mm_items = _checked_items(seq_id, mm_items, prompt_len)
        """The prompt's multimodal items, in prompt order (``MMItem``; () for text)."""
        self.mm_end = mm_items[-1][0] + mm_items[-1][1] if mm_items else 0
        """Where the last item ends (0: no items): past it no encoder work is left."""

    @property
    def num_output(self) -> int:
        """Tokens sampled so far (``output`` holds them only when the scheduler has a
        sampler; the count is kept either way)."""
        return self.num_tokens - self.prompt_len

    @property
    def max_kv_tokens(self) -> int:
        """Most tokens of KV this sequence can ever hold (the last sample never gets KV)."""
        return self.prompt_len + self.max_tokens - 1

    def __repr__(self) -> str:
        return (
            f"Sequence({self.seq_id!r}, {self.status.value}, "
            f"computed={self.num_computed}/{self.num_tokens}, blocks={self.num_blocks}, "
            f"out={self.num_output}/{self.max_tokens})"
        )


def _check_runs(seq_id: Hashable, runs: PromptRuns | None, prompt_len: int) -> None:
    """A ValueError naming the sequence unless ``runs`` are runs of >= 1 tokens adding up to
    ``prompt_len`` (or None)."""
    if runs is not None and (sum(n for _, n in runs) != prompt_len or min(n for _, n in runs) < 1):
        raise ValueError(
            f"prompt_runs of {seq_id!r} must be runs of >= 1 tokens adding up to "
            f"prompt_len {prompt_len}"
        )


def _checked_items(
    seq_id: Hashable, items: tuple[MMItem, ...], prompt_len: int
) -> tuple[MMItem, ...]:
    """``items`` if they are placeholder runs of >= 1 tokens inside the prompt, in order and
    not overlapping; else a ValueError naming the sequence."""
    end = 0
    for offset, length, _ in items:
        if offset < end or length < 1 or offset + length > prompt_len:
            raise ValueError(
                f"mm_items of {seq_id!r}: item ({offset}, {length}) must start at or after "
                f"{end} (items in prompt order, not overlapping) and end within prompt_len "
                f"{prompt_len}"
            )
        end = offset + length
    return tuple(items)
