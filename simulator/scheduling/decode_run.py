"""The running batch frozen at the start of a stretch of deferred decode steps."""

from __future__ import annotations

from simulator.scheduling.sequence import Sequence


class DecodeRun:
    """What deferred decode steps need to take each step in O(1): how many sequences run,
    their KV tokens, who finishes when, and how many cross into a new block each step."""

    __slots__ = ("num_seqs", "context", "finish_at", "crossing", "steps")

    def __init__(
        self,
        num_seqs: int,
        context: int,
        finish_at: dict[int, list[Sequence]],
        crossing: list[int],
    ) -> None:
        self.num_seqs = num_seqs
        """Sequences still in the run."""
        self.context = context
        """Tokens in KV over the batch before the first deferred step."""
        self.finish_at = finish_at
        """``[t]``: the sequences that sample their last token in deferred step ``t``."""
        self.crossing = crossing
        """``[r]``: how many sequences have ``num_computed % block_size == r``."""
        self.steps = 0
        """Deferred steps taken so far."""

    @classmethod
    def start(cls, running: list[Sequence], block_size: int, budget: int) -> DecodeRun | None:
        """Freeze ``running``, or None if the next step cannot decode all of it at once."""
        if not running or len(running) > budget:
            return None
        crossing = [0] * block_size
        context = 0
        finish_at: dict[int, list[Sequence]] = {}
        for seq in running:
            c = seq.num_computed
            context += c
            crossing[c % block_size] += 1
            finish_at.setdefault(seq.max_tokens - len(seq.output), []).append(seq)
        return cls(len(running), context, finish_at, crossing)

    def blocks_to_grow(self, t: int, block_size: int) -> int:
        """Blocks the batch needs for deferred step ``t``: one per sequence whose KV fills
        its last block exactly before that step."""
        return self.crossing[(1 - t) % block_size]

    def drop(self, seq: Sequence, block_size: int) -> None:
        """Take a finished ``seq`` (with ``num_computed`` as at the run's start) out."""
        self.num_seqs -= 1
        self.context -= seq.num_computed
        self.crossing[seq.num_computed % block_size] -= 1


class BlockDecodeRun(DecodeRun):
    """A ``DecodeRun`` over blocks with identities (prefix caching): the sequences grouped by
    ``num_computed % block_size``, so that each deferred step takes new blocks for exactly
    those entering one and caches exactly the blocks that the step fills, as ``schedule()``
    would; and a watch on the head of the waiting queue, whose prefix-cache hit decides
    whether it could be admitted."""

    __slots__ = ("by_residue", "head", "chain", "hits")

    def __init__(
        self,
        num_seqs: int,
        context: int,
        finish_at: dict[int, list[Sequence]],
        crossing: list[int],
        by_residue: list[list[Sequence]],
    ) -> None:
        super().__init__(num_seqs, context, finish_at, crossing)
        self.by_residue = by_residue
        """``[r]``: the sequences with ``num_computed % block_size == r`` at the start."""
        self.head: Sequence | None = None
        """The waiting sequence ``chain`` and ``hits`` are about."""
        self.chain: frozenset[int] = frozenset()
        """Hashes of the head's blocks a hit could cover: while a step evicts or caches none
        of them, the head's hit is unchanged."""
        self.hits: list[int] | None = None
        """The head's hit blocks (None: look again; frees change which ones are free)."""

    @classmethod
    def start(cls, running: list[Sequence], block_size: int, budget: int) -> BlockDecodeRun | None:
        """Freeze ``running``, or None if the next step cannot decode all of it at once."""
        run = DecodeRun.start(running, block_size, budget)
        if run is None:
            return None
        by_residue: list[list[Sequence]] = [[] for _ in range(block_size)]
        for seq in running:
            by_residue[seq.num_computed % block_size].append(seq)
        return cls(run.num_seqs, run.context, run.finish_at, run.crossing, by_residue)

    def growing(self, t: int, block_size: int) -> list[Sequence]:
        """The sequences that need a new block in deferred step ``t``."""
        return self.by_residue[(1 - t) % block_size]

    def filling(self, t: int, block_size: int) -> list[Sequence]:
        """The sequences whose step ``t`` fills their last block."""
        return self.by_residue[-t % block_size]

    def drop(self, seq: Sequence, block_size: int) -> None:
        """Take a finished ``seq`` (with ``num_computed`` as at the run's start) out."""
        super().drop(seq, block_size)
        self.by_residue[seq.num_computed % block_size].remove(seq)
        self.hits = None
