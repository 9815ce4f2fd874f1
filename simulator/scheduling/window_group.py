"""A sliding-window group of a hybrid model (vLLM 0.33's ``SlidingWindowManager``): each new
token attends to the last ``sliding_window`` tokens, so the blocks wholly before them are given
back as the sequence advances (``NULL`` in its table).

- Before each allocation the blocks wholly before token ``computed - (window - 1)`` are given
  back, last first (``remove_skipped_blocks``).
- Admission with ``reserve_full_isl`` reserves at most ``ceil((window - 1 + in_flight) / bs)
  + 1`` blocks (``max_admission_blocks_per_request``): no more are ever held at once.
- A hit needs only the last ``ceil((window - 1) / bs)`` blocks before its end cached (found
  from the right); a run from the first block shorter than that is a hit too.
- With vLLM's default ``prefix_cache_retention_interval`` 0, a group caches only the blocks
  such a hit can use: the ``ceil((window - 1) / bs)`` before each point a later request may
  resume at (the prompt's last token, and the end of a shared prefix the full-attention
  groups found longer than this one).
"""

from __future__ import annotations

from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.group_tables import NULL, FullGroup


class WindowGroup(FullGroup):
    """A sliding-window group: blocks out of the window given back, hits found from the right."""

    def __init__(
        self,
        gid: int,
        block_size: int,
        pool: BlockPool,
        align: int,
        window: int,
        max_tokens_in_flight: int,
        max_model_len: int = 0,
    ) -> None:
        super().__init__(gid, block_size, pool, align)
        self.downward_closed = False
        self.window = window
        """Tokens each new token attends to (itself included)."""
        self.need = -(-(window - 1) // block_size)
        """Blocks a hit must have cached right before its end."""
        most = window - 1 + max_tokens_in_flight
        if max_model_len:
            most = min(most, max_model_len)
        self.cap = -(-most // block_size) + 1
        """Most blocks a sequence holds at once (the admission reservation)."""

    def skipped(self, num_computed: int) -> int:
        """Tokens wholly before the window of the next token."""
        return max(0, num_computed - self.window + 1)

    def capped(self, num_blocks: int) -> int:
        """At most ``cap``."""
        return min(num_blocks, self.cap)

    def mask(self, lo: int, hi: int, boundaries: tuple[int, int]) -> list[bool] | None:
        """The ``need`` blocks before each resume point (module docstring)."""
        keep = [False] * (hi - lo)
        for point in boundaries:
            if point <= 0:
                continue
            end = point // self.align * self.align // self.block_size
            for j in range(max(lo, end - self.need), min(hi, end)):
                keep[j - lo] = True
        return keep

    def find_hit(
        self, hashes: list[int], max_tokens: int, peers: list[FullGroup]
    ) -> tuple[list[list[int]], int]:
        """The longest hit whose last ``need`` blocks are cached, searched from the right."""
        n = max_tokens // self.block_size
        out = [[NULL] * n for _ in peers]
        run = 0
        for i in range(n - 1, -1, -1):
            got = self.cached_in(hashes[i], peers)
            if got is None:
                run = 0
                continue
            for blocks, b in zip(out, got, strict=True):
                blocks[i] = b
            run += 1
            if run >= self.need:
                for blocks in out:
                    del blocks[i + run :]
                return out, (i + run) * self.block_size
        for blocks in out:  # no full window: the run from the first block, if any
            del blocks[run:]
        return out, run * self.block_size
