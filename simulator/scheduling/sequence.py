"""A request as the scheduler sees it: prompt, sampled tokens and KV progress."""

from __future__ import annotations

import enum
from collections.abc import Hashable


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life: waiting, running or finished."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request's token state: the scheduler mutates it, nobody else should."""

    __slots__ = (
        "seq_id",
        "prompt_len",
        "max_tokens",
        "output",
        "num_computed",
        "num_blocks",
        "status",
        "num_preemptions",
        "num_tokens",
    )

    def __init__(self, seq_id: Hashable, prompt_len: int, max_tokens: int) -> None:
        if not isinstance(prompt_len, int) or prompt_len <= 0:
            raise ValueError(f"prompt_len must be a positive integer, got {prompt_len!r}")
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.seq_id = seq_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.output: list[int] = []
        self.num_computed = 0
        self.num_blocks = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions = 0
        # prompt_len + len(output), kept as a field because the scheduler reads it for every
        # sequence in every step; only the scheduler appends to ``output`` and keeps it in step.
        self.num_tokens = prompt_len

    @property
    def max_kv_tokens(self) -> int:
        """Most tokens of KV this sequence can ever hold (the last sample never gets KV)."""
        return self.prompt_len + self.max_tokens - 1

    def __repr__(self) -> str:
        return (
            f"Sequence({self.seq_id!r}, {self.status.value}, "
            f"computed={self.num_computed}/{self.num_tokens}, blocks={self.num_blocks}, "
            f"out={len(self.output)}/{self.max_tokens})"
        )
