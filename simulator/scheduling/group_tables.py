"""The block tables of one KV-cache group of a hybrid model in the shared block pool, with the
rules of a full-attention group (vLLM 0.33's ``SingleTypeKVCacheManager`` and
``FullAttentionManager``); the window and Mamba groups change some of them
(``window_group.py``, ``mamba_group.py``). ``hybrid_kv.py`` runs the groups together.

A table lists a sequence's blocks in token order; ``NULL`` stands where a block was given
back (vLLM's null block: the table keeps its length). A group caches a full block under its
content hash and its group id, so a hit in one group says nothing of another.
"""

from __future__ import annotations

from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.sequence import Sequence

NULL = -1
"""A table entry whose block was given back (vLLM's null block)."""


class FullGroup:
    """A full-attention group: a sequence keeps every block until it leaves; a hit is the
    longest run of cached blocks from the first."""

    def __init__(self, gid: int, block_size: int, pool: BlockPool, align: int) -> None:
        self.gid = gid
        """The group's index (vLLM's ``kv_cache_group_id``)."""
        self.block_size = block_size
        """Tokens per block of this group."""
        self.pool = pool
        """The block pool every group shares."""
        self.align = align
        """Tokens a hit is a multiple of (the scheduler's block size)."""
        self.downward_closed = True
        """Whether a hit of ``k`` blocks makes every shorter prefix a hit (full attention:
        the coordinator looks it up once and trims it)."""
        self.tables: dict[Sequence, list[int]] = {}
        """The blocks each sequence holds in this group (``NULL`` for given back ones)."""
        self.num_cached: dict[Sequence, int] = {}
        """How many of a sequence's first table entries are cached or were hit."""

    def key(self, block_hash: int) -> int:
        """The pool's cache key of content ``block_hash`` in this group."""
        return block_hash * 64 + self.gid

    def held(self, seq: Sequence) -> int:
        """Blocks ``seq`` holds in this group (``NULL`` entries are none)."""
        return sum(1 for b in self.tables.get(seq, ()) if b != NULL)

    def skipped(self, num_computed: int) -> int:
        """Leading tokens no later token attends to once ``num_computed`` are computed."""
        return 0

    def capped(self, num_blocks: int) -> int:
        """The blocks an admission reserves for a sequence needing ``num_blocks``."""
        return num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Most blocks a sequence of ``num_tokens`` tokens of KV holds here at once."""
        return self.capped(-(-num_tokens // self.block_size))

    def remove_skipped(self, seq: Sequence, num_computed: int) -> None:
        """Give back the blocks wholly before the tokens still attended to."""
        n = self.skipped(num_computed) // self.block_size
        table = self.tables.get(seq)
        if n <= 0 or not table:
            return
        freed = []
        for i in range(min(n, len(table)) - 1, -1, -1):
            if table[i] == NULL:  # the ones before were given back already
                break
            freed.append(table[i])
            table[i] = NULL
        if freed:
            self.pool.free(freed)

    def num_to_allocate(
        self, seq: Sequence, num_tokens: int, hits: list[int], computed: int, admission: bool
    ) -> int:
        """Free blocks ``seq`` would use to hold ``num_tokens`` tokens, starting from
        ``hits`` (``computed`` tokens known); ``admission``: capped as the full-sequence
        admission check caps it."""
        need = -(-num_tokens // self.block_size)
        if admission:
            need = self.capped(need)
        table = self.tables.get(seq, [])
        if seq in self.num_cached:  # running: no hits
            return max(need - len(table), 0)
        skip = self.skipped(computed) // self.block_size
        new = max(need - max(skip, len(hits) + len(table)), 0)
        ref_cnt = self.pool.ref_cnt
        kept = hits[max(0, skip - len(table)) :]
        return new + sum(1 for b in kept if b != NULL and ref_cnt[b] == 0)

    def add_hits(self, seq: Sequence, hits: list[int], computed: int) -> None:
        """Start the table of a waiting ``seq`` from its ``hits`` (those already out of the
        window as ``NULL``), taking a reference on each."""
        skip = self.skipped(computed) // self.block_size
        kept = hits[skip:]
        self.pool.touch([b for b in kept if b != NULL])
        table = [NULL] * skip + kept
        self.tables[seq] = table
        self.num_cached[seq] = len(table)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """New blocks for ``seq`` up to ``num_tokens`` tokens (counted free by the caller)."""
        table = self.tables.setdefault(seq, [])
        new = -(-num_tokens // self.block_size) - len(table)
        if new > 0:
            table += self.pool.take(new)

    def mask(self, lo: int, hi: int, boundaries: tuple[int, int]) -> list[bool] | None:
        """Which of the newly full blocks ``lo..hi-1`` enter the cache (None: all)."""
        return None

    def cache(
        self, seq: Sequence, num_tokens: int, hashes: list[int], bounds: tuple[int, int]
    ) -> None:
        """Cache the blocks of ``seq`` that are full once it holds ``num_tokens`` tokens (of
        content ``hashes``), those ``mask`` keeps; ``bounds``: where a later sequence may
        resume (its prompt's last token, a shared prefix's end or 0)."""
        done = self.num_cached.get(seq, 0)
        full = num_tokens // self.block_size
        if done >= full:
            return
        mask = self.mask(done, full, bounds)
        table = self.tables[seq]
        for j in range(done, full):
            b = table[j]
            if b != NULL and (mask is None or mask[j - done]):
                self.pool.cache(b, self.key(hashes[j]))
        self.num_cached[seq] = full

    def cached_in(self, block_hash: int, peers: list[FullGroup]) -> list[int] | None:
        """The block of each of ``peers`` cached with content ``block_hash``, if all are."""
        cached = self.pool.cached
        out = []
        for g in peers:
            b = cached.get(g.key(block_hash))
            if b is None:
                return None
            out.append(b)
        return out

    def find_hit(
        self, hashes: list[int], max_tokens: int, peers: list[FullGroup]
    ) -> tuple[list[list[int]], int]:
        """The longest hit of at most ``max_tokens`` tokens valid in every one of ``peers``
        (groups of this spec): per peer its blocks, and the hit's tokens."""
        out: list[list[int]] = [[] for _ in peers]
        for j in range(max_tokens // self.block_size):
            got = self.cached_in(hashes[j], peers)
            if got is None:
                break
            for blocks, b in zip(out, got, strict=True):
                blocks.append(b)
        return out, len(out[0]) * self.block_size

    def free(self, seq: Sequence) -> None:
        """Give back every block of ``seq``, its last first."""
        table = self.tables.pop(seq, None)
        self.num_cached.pop(seq, None)
        if table:
            self.pool.free([b for b in reversed(table) if b != NULL])

    def new_step(self) -> None:
        """A step's scheduling starts."""
