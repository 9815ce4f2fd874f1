"""The KV blocks themselves: ids, reference counts, the prefix cache's hash map and the free
queue in vLLM's eviction order (vLLM v1's ``BlockPool``).

A block is *free* when no sequence references it. A free block that still holds a full
block's hashed content is also *cached*: a later sequence whose tokens chain to the same hash
reuses it (a prefix-cache hit) until it is evicted, i.e. handed out as a new block. Free blocks
without content (never filled, or evicted) are handed out first; cached ones are handed out
least recently freed first. vLLM's null block is not modelled: ``num_blocks`` counts usable
blocks only.

A free block in the eviction queue without a hash holds content nobody can hit (a finished
sequence's own blocks, ``kv_manager.py``): it keeps its place in the eviction order, and
evicting it touches no hash map.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice


class BlockPool:
    """``num_blocks`` blocks with reference counts; the hash -> block map of cached content."""

    __slots__ = (
        "num_blocks",
        "ref_cnt",
        "block_hash",
        "free_blank",
        "lru",
        "head",
        "stale",
        "num_stale",
        "cached",
        "dupes",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        """Blocks in the pool."""
        self.ref_cnt = [0] * num_blocks
        """Per block: how many sequences hold it, as written down (a prompt of its own holds
        its blocks unwritten: ``take(counted=False)``)."""
        self.block_hash: list[int | None] = [None] * num_blocks
        """Per block: the hash of the full block's content it holds in the cache, or None."""
        # Free blocks without content: handed out first, in any order (they are all alike).
        self.free_blank = list(range(num_blocks - 1, -1, -1))
        # Free blocks with cached content, least recently freed first: the eviction order.
        # A hit takes a block out of the middle; rather than search the queue (vLLM uses a
        # linked list), the entry is left behind as stale and skipped when reached: a list
        # appends, and hands out many blocks from its head by one slice, far faster than an
        # OrderedDict, and blocks move through it millions of times in a long run.
        # ``stale[b]`` counts b's stale entries, which always precede its live one; the
        # queue is compacted when half is stale. ``lru[head:]`` is the queue: the entries
        # before ``head`` were handed out, and are dropped once they are half the list.
        self.lru: list[int] = []
        self.head = 0
        self.stale = [0] * num_blocks
        self.num_stale = 0
        # hash -> the earliest cached block with that content (the one a lookup returns) ...
        self.cached: dict[int, int] = {}
        # ... and the later ones, in caching order. vLLM does not merge equal blocks (a block
        # table never changes under a running request), so duplicates are rare but real.
        self.dupes: dict[int, list[int]] = {}

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached or not)."""
        return len(self.free_blank) + len(self.lru) - self.head - self.num_stale

    @property
    def num_free_cached(self) -> int:
        """Free blocks whose content the cache keeps."""
        return len(self.lru) - self.head - self.num_stale

    def free_cached(self) -> Iterator[int]:
        """The free cached blocks, in eviction order (first evicted first)."""
        skip: dict[int, int] = {}
        stale = self.stale
        for b in islice(self.lru, self.head, None):
            seen = skip.get(b, 0)
            if seen < stale[b]:
                skip[b] = seen + 1
                continue
            yield b

    def lookup(self, block_hash: int) -> int | None:
        """The block that serves a hit on ``block_hash``, or None."""
        return self.cached.get(block_hash)

    def touch(self, blocks: list[int]) -> None:
        """Take one more reference on each of ``blocks`` (prefix-cache hits); a free one leaves
        the free queue."""
        ref_cnt, stale = self.ref_cnt, self.stale
        for b in blocks:
            if ref_cnt[b] == 0:
                stale[b] += 1
                self.num_stale += 1
            ref_cnt[b] += 1
        if self.num_stale > 64 and 2 * self.num_stale > len(self.lru) - self.head:
            self._compact()

    def take(self, n: int, counted: bool = True) -> list[int]:
        """``n`` new blocks with one reference each (the caller checked ``num_free``):
        blank ones first, then the least recently freed cached ones, whose content is evicted.
        Not ``counted``: their one holder's reference is not written down (a prompt of its
        own: ``KVManager.references``), which saves a write per block in and out."""
        blank, block_hash, cached = self.free_blank, self.block_hash, self.cached
        k = len(blank)
        if n <= k:  # blank ones, as many pops from the end would give
            out = blank[k - n :]
            del blank[k - n :]
            out.reverse()
        else:
            out = blank[::-1]
            blank.clear()
            got = self._pop_cached(n - k)
            if cached:  # else no free block has a hash: nothing to forget
                for b in got:
                    h = block_hash[b]
                    if h is None:  # content nobody can hit
                        continue
                    if self.dupes or cached[h] != b:
                        self._evict(b)
                    else:  # the usual eviction: the only block with its content
                        block_hash[b] = None
                        del cached[h]
            out += got
        if counted:
            ref_cnt = self.ref_cnt
            for b in out:
                ref_cnt[b] = 1
        return out

    def _pop_cached(self, m: int) -> list[int]:
        """The first ``m`` live entries of the free queue, taken out of it."""
        lru, head = self.lru, self.head
        if self.num_stale:
            stale = self.stale
            got: list[int] = []
            while len(got) < m:
                b = lru[head]
                head += 1
                if stale[b]:  # an entry left behind by a hit
                    stale[b] -= 1
                    self.num_stale -= 1
                else:
                    got.append(b)
        else:
            got = lru[head : head + m]
            head += m
        if head > 4096 and 2 * head > len(lru):
            del lru[:head]
            head = 0
        self.head = head
        return got

    def cache(self, block: int, block_hash: int) -> None:
        """Record that the held ``block`` is full with content ``block_hash``."""
        self.block_hash[block] = block_hash
        first = self.cached.setdefault(block_hash, block)
        if first != block:
            self.dupes.setdefault(block_hash, []).append(block)

    def cache_blocks(self, blocks: list[int], hashes: list[int], lo: int, hi: int) -> None:
        """``cache(blocks[j], hashes[j])`` for ``j`` in ``lo..hi-1``."""
        block_hash, setdefault = self.block_hash, self.cached.setdefault
        for j in range(lo, hi):
            b, h = blocks[j], hashes[j]
            block_hash[b] = h
            if setdefault(h, b) != b:
                self.dupes.setdefault(h, []).append(b)

    def cache_pairs(self, pairs: list[tuple[int, int]]) -> None:
        """``cache(block, block_hash)`` for each pair, in order."""
        block_hash, setdefault = self.block_hash, self.cached.setdefault
        for b, h in pairs:
            block_hash[b] = h
            if setdefault(h, b) != b:
                self.dupes.setdefault(h, []).append(b)

    def free_owned(self, blocks: list[int], num_full: int, num_counted: int) -> None:
        """``free(reversed(blocks))`` for blocks only their one holder references (only the
        first ``num_counted`` references written down), whose first ``num_full`` are full
        (hashed or not) and the others not: the full ones join the eviction queue tail
        first, the others the blank ones."""
        ref_cnt = self.ref_cnt
        for b in blocks[:num_counted]:
            ref_cnt[b] = 0
        self.free_blank.extend(reversed(blocks[num_full:]))
        self.lru.extend(reversed(blocks[:num_full]))

    def free(self, blocks: list[int]) -> None:
        """Drop one reference on each of ``blocks``; cached ones are evicted in the order given."""
        ref_cnt, block_hash = self.ref_cnt, self.block_hash
        blank, append = self.free_blank.append, self.lru.append
        for b in blocks:
            ref_cnt[b] -= 1
            if ref_cnt[b] == 0:
                if block_hash[b] is None:
                    blank(b)
                else:
                    append(b)

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        assert h is not None
        self.block_hash[b] = None
        later = self.dupes.get(h)
        if self.cached[h] == b:
            if later:
                self.cached[h] = later.pop(0)
            else:
                del self.cached[h]
        else:
            assert later is not None
            later.remove(b)
        if later is not None and not later:
            del self.dupes[h]

    def _compact(self) -> None:
        """Drop the stale entries of the free queue (the live order is kept)."""
        self.lru = list(self.free_cached())
        self.head = 0
        self.stale = [0] * self.num_blocks
        self.num_stale = 0
