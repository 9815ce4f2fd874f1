"""KV blocks with identities and a prefix cache (vLLM v1's ``KVCacheManager``): which blocks
each sequence holds, which of them the cache may reuse, and hits for new admissions.

The same calls as the counting ``BlockManager`` (``grow``, ``free``, ``num_needed``), plus
``lookup`` and hit-aware ``admit``, so a policy runs unchanged on either. Rules (vLLM's):

- only full blocks are cached, identified by the chained hash of their content
  (``block_hash.py``), as soon as the step that computes them is scheduled;
- a hit is the longest run of cached blocks from the start of the sequence, at most
  ``num_tokens - 1`` tokens (the last token is always computed, to sample from);
- a hit block still held by another sequence is shared (one more reference) and costs no
  free block; a hit block sitting free in the cache leaves the free queue;
- a sequence's blocks are freed tail first, so its last blocks are evicted first.
"""

from __future__ import annotations

from simulator.scheduling.block_hash import extend_hashes
from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.sequence import Sequence


class KVCacheManager:
    """Block tables over a ``BlockPool``, with prefix caching."""

    __slots__ = ("num_blocks", "block_size", "pool")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        """Blocks in the cache."""
        self.block_size = block_size
        """Tokens per block."""
        self.pool = BlockPool(num_blocks)
        """The blocks, their reference counts and the hash map."""

    @property
    def num_used(self) -> int:
        """Blocks held by sequences."""
        return self.num_blocks - self.pool.num_free

    @property
    def num_free(self) -> int:
        """Blocks nobody holds, cached content included."""
        return self.pool.num_free

    @property
    def num_cached_free(self) -> int:
        """Free blocks whose content the cache keeps for reuse."""
        return self.pool.num_free_cached

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return -(-num_tokens // self.block_size)

    def lookup(self, seq: Sequence) -> list[int]:
        """The cached blocks a waiting ``seq`` would start with (its prefix-cache hit)."""
        n = (seq.num_tokens - 1) // self.block_size
        if n <= 0:
            return []
        cached = self.pool.cached
        # the first block decides most lookups (a new prompt of its own misses at once)
        if extend_hashes(seq, 1, self.block_size)[0] not in cached:
            return []
        hits = []
        for h in extend_hashes(seq, n, self.block_size)[:n]:
            b = cached.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def num_needed(self, seq: Sequence, num_tokens: int, hits: list[int] | tuple = ()) -> int:
        """Free blocks ``seq`` would use to hold ``num_tokens`` tokens, starting from ``hits``
        if it is waiting: new blocks, plus the hit blocks that are now free."""
        need = -(-num_tokens // self.block_size) - len(seq.block_ids) - len(hits)
        if hits:
            ref_cnt = self.pool.ref_cnt
            need += sum(1 for b in hits if ref_cnt[b] == 0)
        return max(need, 0)

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether the blocks ``seq`` lacks for ``num_tokens`` tokens are free."""
        return self.num_needed(seq, num_tokens) <= self.pool.num_free

    def admit(self, seq: Sequence, num_tokens: int, hits: list[int]) -> bool:
        """Give a waiting ``seq`` its ``hits`` and new blocks up to ``num_tokens`` tokens, if
        they are free; else change nothing and return False."""
        if self.num_needed(seq, num_tokens, hits) > self.pool.num_free:
            return False
        if hits:
            self.pool.touch(hits)
            seq.block_ids.extend(hits)
            seq.num_cached_blocks = len(hits)
        self._take(seq, num_tokens)
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Give ``seq`` the blocks for ``num_tokens`` tokens if they are free (else change
        nothing and return False), and cache the blocks that this fills."""
        if -(-num_tokens // self.block_size) - len(seq.block_ids) > self.pool.num_free:
            return False
        self._take(seq, num_tokens)
        return True

    def _take(self, seq: Sequence, num_tokens: int) -> None:
        new = -(-num_tokens // self.block_size) - len(seq.block_ids)
        if new > 0:
            seq.block_ids += self.pool.take(new)
            seq.num_blocks = len(seq.block_ids)
        self.cache_full(seq, num_tokens)

    def cache_full(self, seq: Sequence, num_tokens: int) -> None:
        """Cache the blocks of ``seq`` that are full once it holds ``num_tokens`` tokens of
        KV (only known tokens: never past ``seq.num_tokens``)."""
        full = min(num_tokens, seq.num_tokens) // self.block_size
        done = seq.num_cached_blocks
        if full <= done:
            return
        self.pool.cache_blocks(seq.block_ids, extend_hashes(seq, full, self.block_size), done, full)
        seq.num_cached_blocks = full

    def free(self, seq: Sequence) -> None:
        """Return every block of ``seq``, tail first; cached content stays for reuse."""
        blocks = seq.block_ids
        blocks.reverse()
        self.pool.free(blocks)
        seq.block_ids = []
        seq.num_blocks = 0
        seq.num_cached_blocks = 0
