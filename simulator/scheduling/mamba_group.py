"""A Mamba (or linear-attention) group of a hybrid model (vLLM 0.33's ``MambaManager``): a
fixed state per sequence instead of KV per token.

- Mode ``none`` (prefix caching off): the group's block size is ``max_model_len``, so a
  sequence holds one block for its whole life.
- Mode ``align`` (prefix caching on): the block size is the attention block size; a block holds
  the state at the end of its tokens. A sequence keeps the state of its last block boundary and
  the running one (1-2 blocks), earlier ones are given back (``NULL``); a chunk that crosses
  into a new block takes one new block (at most one per step). Only the state at each point a
  later request may resume at is cached (vLLM's default retention 0: the block ending at the
  prompt's last full block, and at a shared prefix's end). A hit is the last cached state at a
  block boundary, found from the right; a hit on a state cached in this very step is refused
  (the state is not computed yet): the admission waits.
- The scheduler cuts prefill chunks at block boundaries in ``align`` mode (``aligned_chunk``).
"""

from __future__ import annotations

from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.group_tables import NULL, FullGroup
from simulator.scheduling.sequence import Sequence


class MambaGroup(FullGroup):
    """A Mamba group in mode ``none`` (one block) or ``align`` (boundary states)."""

    def __init__(self, gid: int, block_size: int, pool: BlockPool, align: int, mode: str) -> None:
        super().__init__(gid, block_size, pool, align)
        self.downward_closed = False
        self.aligned = mode == "align"
        """Mode ``align``: states kept and cached at block boundaries."""
        self.last_state: dict[Sequence, int] = {}
        """``align``: the table index of a sequence's previous boundary state."""
        self.retired: dict[Sequence, int] = {}
        """``align``: table entries before this index were given back."""
        self.allocated: set[Sequence] = set()
        """``align``: sequences that allocated since they were admitted."""
        self.this_step: set[int] = set()
        """``align``: cache keys of states cached in this step (not computed yet)."""

    def skipped(self, num_computed: int) -> int:
        """Only the state after the last computed token is needed."""
        return num_computed - 1

    def blocks_for(self, num_tokens: int) -> int:
        """One state, or two in ``align`` mode (the boundary's and the running one)."""
        return 2 if self.aligned else 1

    def remove_skipped(self, seq: Sequence, num_computed: int) -> None:
        """Give back the states before the last boundary (``align``); ``none``: nothing
        (its one block spans ``max_model_len``)."""
        if not self.aligned:
            super().remove_skipped(seq, num_computed)
            return
        table = self.tables.get(seq)
        if table is None:
            return
        bs = self.block_size
        if num_computed > 1:
            lo = self.retired.get(seq, 0)
            hi = min((num_computed - 1) // bs, len(table))
            if lo < hi:
                freed = []
                for i in range(hi - 1, lo - 1, -1):
                    if table[i] != NULL:
                        freed.append(table[i])
                        table[i] = NULL
                if freed:
                    self.pool.free(freed)
                self.retired[seq] = hi
        last = self.last_state.get(seq)
        if last is not None and last < -(-num_computed // bs) - 1 and table[last] != NULL:
            self.pool.free([table[last]])
            table[last] = NULL

    def num_to_allocate(
        self, seq: Sequence, num_tokens: int, hits: list[int], computed: int, admission: bool
    ) -> int:
        """``align``: at most one new state block a step, plus the hit's state if free;
        refused (more than the pool) for a hit on a state cached in this step."""
        if not self.aligned:
            return super().num_to_allocate(seq, num_tokens, hits, computed, admission)
        pool = self.pool
        if hits and pool.block_hash[hits[-1]] in self.this_step:
            return pool.num_blocks + 1
        new = -(-num_tokens // self.block_size) - len(hits) - len(self.tables.get(seq, ()))
        if new > 0:
            new = 1
        ref_cnt = pool.ref_cnt
        return new + sum(1 for b in hits if b != NULL and ref_cnt[b] == 0)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """``align``: the running state's block for ``num_tokens`` tokens, the entries
        between it and the previous state ``NULL``."""
        if not self.aligned:
            super().allocate(seq, num_tokens)
            return
        table = self.tables.setdefault(seq, [])
        need = -(-num_tokens // self.block_size)
        if need > len(table):
            prev = len(table)
            if prev:
                self.last_state[seq] = prev - 1
            if prev < need - 1:
                table += [NULL] * (need - 1 - prev)
            table += self.pool.take(need - len(table))
        self.allocated.add(seq)

    def mask(self, lo: int, hi: int, boundaries: tuple[int, int]) -> list[bool] | None:
        """The state block ending at each resume point's last boundary."""
        keep = [False] * (hi - lo)
        for point in boundaries:
            j = point // self.align * self.align // self.block_size - 1
            if point > 0 and lo <= j < hi:
                keep[j - lo] = True
        return keep

    def cache(
        self, seq: Sequence, num_tokens: int, hashes: list[int], bounds: tuple[int, int]
    ) -> None:
        """As a full group caches (through ``mask``), noting the states cached now."""
        before = self.num_cached.get(seq, 0)
        super().cache(seq, num_tokens, hashes, bounds)
        after = self.num_cached.get(seq, 0)
        table, block_hash = self.tables[seq], self.pool.block_hash
        for j in range(before, after):
            h = block_hash[table[j]] if table[j] != NULL else None
            if h is not None:
                self.this_step.add(h)

    def find_hit(
        self, hashes: list[int], max_tokens: int, peers: list[FullGroup]
    ) -> tuple[list[list[int]], int]:
        """The last cached state at a block boundary, searched from the right."""
        for i in range(max_tokens // self.block_size - 1, -1, -1):
            got = self.cached_in(hashes[i], peers)
            if got is not None:
                return [[NULL] * i + [b] for b in got], (i + 1) * self.block_size
        return [[] for _ in peers], 0

    def free(self, seq: Sequence) -> None:
        """Give back every block of ``seq`` and forget its states."""
        super().free(seq)
        self.last_state.pop(seq, None)
        self.retired.pop(seq, None)
        self.allocated.discard(seq)

    def new_step(self) -> None:
        """States cached from now on are this step's."""
        self.this_step.clear()


def aligned_chunk(
    seq: Sequence, start: int, n: int, block_size: int, max_chunk: int, junction: int
) -> int:
    """Tokens of a prefill chunk of ``n`` from ``start`` cut as ``align`` mode cuts them
    (vLLM's ``_mamba_block_aligned_split``): a chunk that does not end the prefill ends on a
    block boundary, when that leaves tokens or a block fits in ``max_chunk``; one starting
    inside a block stops at its end; none runs past the last boundary before the last token,
    or past a shared prefix's ``junction`` (on a block boundary from ``start``)."""
    prefill_end = max(seq.prompt_len, seq.num_tokens - 1)
    if start >= prefill_end:
        return n
    end = start + n
    if end < prefill_end:
        floor = end // block_size * block_size
        if floor > start or block_size <= max_chunk:
            end = floor
    stops = (
        (start // block_size + 1) * block_size if start % block_size else 0,
        (seq.num_tokens - 1) // block_size * block_size,
        start + (junction - start) // block_size * block_size if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
