"""KV-block accounting without identities: how many blocks each sequence holds, and how many
are used in all (the spec's ``blocks_used`` and ``seq.num_blocks``, always kept in step)."""

from __future__ import annotations

from simulator.scheduling.sequence import Sequence


class BlockManager:
    """Counts blocks: a sequence holding ``k`` tokens of KV needs ``ceil(k / block_size)``."""

    __slots__ = ("num_blocks", "block_size", "num_used")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        """Blocks in the cache."""
        self.block_size = block_size
        """Tokens per block."""
        self.num_used = 0
        """Blocks held by sequences (the sum of their ``num_blocks``, outside deferred steps)."""

    @property
    def num_free(self) -> int:
        """Blocks nobody holds."""
        return self.num_blocks - self.num_used

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return -(-num_tokens // self.block_size)

    def num_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks ``seq`` must add to hold ``num_tokens`` tokens (0 if it already can)."""
        return max(0, -(-num_tokens // self.block_size) - seq.num_blocks)

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether the blocks ``seq`` lacks for ``num_tokens`` tokens are free."""
        return self.num_used + self.num_needed(seq, num_tokens) <= self.num_blocks

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Give ``seq`` the blocks for ``num_tokens`` tokens if they are free; else change
        nothing and return False."""
        need = -(-num_tokens // self.block_size) - seq.num_blocks
        if need <= 0:
            return True
        if self.num_used + need > self.num_blocks:
            return False
        seq.num_blocks += need
        self.num_used += need
        return True

    def free(self, seq: Sequence) -> None:
        """Return every block of ``seq``."""
        self.num_used -= seq.num_blocks
        seq.num_blocks = 0

    # -- deferred decode steps ---------------------------------------------------------------
    # A run of deferred decode steps takes blocks for many sequences at once and writes each
    # sequence's count only when the run settles.

    def take(self, n: int) -> None:
        """Count ``n`` more blocks as used, for sequences ``settle()`` will name later."""
        self.num_used += n

    def settle(self, seq: Sequence, num_tokens: int) -> None:
        """Record that ``seq`` holds the blocks for ``num_tokens`` tokens, already counted
        by ``take()``."""
        seq.num_blocks = -(-num_tokens // self.block_size)
