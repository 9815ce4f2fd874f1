"""The KV blocks of a scheduler, with prefix caching on or off (vLLM v1's ``KVCacheManager``
and its ``enable_caching``).

Caching off, blocks are only counted: a sequence holding ``k`` tokens of KV needs
``ceil(k / block_size)`` of them (the spec's ``blocks_used`` and ``seq.num_blocks``). Caching
on, every block has an identity in a ``BlockPool`` and the rules are vLLM's:

- only full blocks are cached, identified by the chained hash of their content
  (``block_hash.py``), as soon as the step that computes them is scheduled;
- a hit is the longest run of cached blocks from the start of the sequence, at most
  ``num_tokens - 1`` tokens (the last token is always computed, to sample from);
- a hit block still held by another sequence is shared (one more reference) and costs no
  free block; a hit block sitting free in the cache leaves the free queue;
- a sequence's blocks are freed tail first, so its last blocks are evicted first.

Cost follows what can be hit. A sequence without prompt runs (``prompt_runs`` None: a prompt
of its own) chains every block onto a first block no other sequence can name, so only the
sequence itself can ever hit its blocks, and only after a preemption. Its full blocks are
therefore neither hashed nor entered in the hash map while it runs: they are counted
(``num_cached_blocks``) and registered when it is preempted, before it can look them up. When
it finishes they go to the free queue as content nobody can hit (no hash), keeping their place
in the eviction order, in a few list operations. Nor are its references written down in
the pool (only it can hold them), but for the blocks it hit after a preemption. Every
lookup, eviction and table comes out as with every block hashed at once.
"""

from __future__ import annotations

from itertools import islice

from simulator.scheduling.block_hash import extend_hashes
from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.offload import Offload
from simulator.scheduling.sequence import Sequence, SequenceStatus


class KVManager:
    """Which blocks each sequence holds (counted, or with identities and a prefix cache): the
    block tables are here (vLLM's ``req_to_blocks``); a sequence counts its blocks only."""

    __slots__ = (
        "num_blocks",
        "block_size",
        "caching",
        "pool",
        "num_used",
        "tables",
        "cached",
        "offload",
        "counted",
    )

    def __init__(self, num_blocks: int, block_size: int, *, caching: bool) -> None:
        self.num_blocks = num_blocks
        """Blocks in the cache."""
        self.block_size = block_size
        """Tokens per block."""
        self.caching = caching
        """Whether blocks have identities and full ones are cached for reuse."""
        self.pool = BlockPool(num_blocks) if caching else None
        """With caching: the blocks, their reference counts and the hash map."""
        self.num_used = 0
        """Blocks held by sequences (a field, not worked out: it is read in every step)."""
        self.tables: dict[Sequence, list[int]] = {}
        """With caching: the blocks each sequence holds, in token order."""
        self.cached: dict[Sequence, int] = {}
        """With caching: how many of a sequence's blocks are in the prefix cache (hit, or
        hashed once full; 0 when missing)."""
        self.offload: Offload | None = None
        """With caching: the KV tiers below the GPU's (``offload.py``), or None."""
        self.counted: dict[Sequence, int] = {}
        """With caching, for a sequence without prompt runs that hit its own blocks: how many
        of its first blocks (its hit) have their reference written down in the pool (its
        others have not: only it can hold them)."""

    # -- what hybrid KV-cache groups (``hybrid_kv.py``) change; one group: nothing ----------

    def refuses(self, feature: str) -> str | None:
        """Why ``feature`` (the fast path, KV tiers, swap preemption) cannot run on these
        blocks, or None."""
        return None

    def new_step(self) -> None:
        """A step's scheduling starts."""

    def clip(self, seq: Sequence, start: int, n: int) -> int:
        """The tokens of a chunk of ``n`` from ``start`` the blocks allow (all of them)."""
        return n

    def held(self) -> dict[Sequence, list[int]]:
        """Per sequence holding blocks, the blocks it holds in each KV-cache group (only
        hybrid groups say: one group's are ``seq.num_blocks``)."""
        return {}

    def block_ids(self, seq: Sequence) -> list[int]:
        """The blocks ``seq`` holds, in token order (with caching; else none have ids)."""
        return self.tables.get(seq, [])

    def references(self) -> list[int]:
        """Per block, how many sequences hold it: the pool's written references and the
        blocks sequences without prompt runs hold alone (with caching; a check, not fast)."""
        assert self.pool is not None
        refs = list(self.pool.ref_cnt)
        for seq, table in self.tables.items():
            if seq.prompt_runs is None:
                for b in table[self.counted.get(seq, 0) :]:
                    refs[b] += 1
        return refs

    def num_cached_blocks(self, seq: Sequence) -> int:
        """How many of ``block_ids(seq)`` are in the prefix cache."""
        return self.cached.get(seq, 0)

    @property
    def num_free(self) -> int:
        """Blocks nobody holds, cached content included."""
        return self.num_blocks - self.num_used

    def pool_changed(self) -> None:
        """Count the blocks held again after the pool handed out or took back blocks."""
        pool = self.pool
        assert pool is not None
        # ``pool.num_free`` written out: this runs after every take and free of a step
        free = len(pool.free_blank) + len(pool.lru) - pool.head - pool.num_stale
        self.num_used = self.num_blocks - free

    @property
    def num_cached_free(self) -> int:
        """Free blocks whose content the cache keeps for reuse (0 without caching)."""
        return 0 if self.pool is None else self.pool.num_free_cached

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return -(-num_tokens // self.block_size)

    def lookup(self, seq: Sequence) -> list[int]:
        """The cached blocks a waiting ``seq`` would start with (its prefix-cache hit)."""
        n = (seq.num_tokens - 1) // self.block_size
        pool = self.pool
        if n <= 0 or pool is None:
            return []
        if seq.prompt_runs is None and not seq.num_preemptions:
            return []  # nobody else can name its blocks, and it never held any
        cached = pool.cached
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
        need = -(-num_tokens // self.block_size) - seq.num_blocks - len(hits)
        if hits:
            ref_cnt = self.pool.ref_cnt  # type: ignore[union-attr]
            need += sum(1 for b in hits if ref_cnt[b] == 0)
        return max(need, 0)

    def admit(self, seq: Sequence, num_tokens: int, hits: list[int]) -> bool:
        """Give a waiting ``seq`` its ``hits`` and new blocks up to ``num_tokens`` tokens, if
        they are free; else change nothing and return False."""
        if not hits:
            return self.grow(seq, num_tokens)
        if self.num_needed(seq, num_tokens, hits) > self.num_free:
            return False
        pool = self.pool
        assert pool is not None
        pool.touch(hits)
        if seq.prompt_runs is None:
            self.counted[seq] = len(hits)
        self.tables[seq] = list(hits)
        seq.num_blocks = self.cached[seq] = len(hits)
        self._take(pool, seq, num_tokens)
        self.pool_changed()
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Give ``seq`` the blocks for ``num_tokens`` tokens if they are free (else change
        nothing and return False); with caching, cache the blocks this fills."""
        need = -(-num_tokens // self.block_size) - seq.num_blocks
        pool = self.pool
        if pool is None:
            if need <= 0:
                return True
            if self.num_used + need > self.num_blocks:
                return False
            seq.num_blocks += need
            self.num_used += need
            return True
        if need > pool.num_free:
            return False
        self._take(pool, seq, num_tokens)
        self.pool_changed()
        return True

    def _take(self, pool: BlockPool, seq: Sequence, num_tokens: int) -> None:
        new = -(-num_tokens // self.block_size) - seq.num_blocks
        if new > 0:
            table = self.tables.setdefault(seq, [])
            table += pool.take(new, seq.prompt_runs is not None)
            seq.num_blocks = len(table)
        self.cache_full(seq, num_tokens)

    def cache_full(self, seq: Sequence, num_tokens: int) -> None:
        """Cache the blocks of ``seq`` that are full once it holds ``num_tokens`` tokens of
        KV (only known tokens: never past ``seq.num_tokens``)."""
        full = min(num_tokens, seq.num_tokens) // self.block_size
        done = self.cached.get(seq, 0)
        if full <= done:
            return
        if seq.prompt_runs is not None:  # others may hit these blocks from now on
            hashes = extend_hashes(seq, full, self.block_size)
            self.pool.cache_blocks(self.tables[seq], hashes, done, full)  # type: ignore[union-attr]
        self.cached[seq] = full
        if self.offload is not None:  # the tiers get every block a step computes
            self.offload.store(seq, extend_hashes(seq, full, self.block_size), full)

    def fill_hashes(self, fills: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int, int]]:
        """``(seq, j, hash)`` for each ``(seq, j)`` of ``fills`` (``seq`` fills its block
        ``j`` in this step) whose block another sequence could hit (the module's docstring);
        ``cache_filled()`` caches them once the step's blocks are taken."""
        bs = self.block_size
        return [
            (seq, j, extend_hashes(seq, j + 1, bs)[j])
            for seq, j in fills
            if seq.prompt_runs is not None
        ]

    def cache_filled(
        self, fills: list[tuple[Sequence, int]], keyed: list[tuple[Sequence, int, int]]
    ) -> None:
        """Count every fill's block as cached and cache those ``fill_hashes()`` keyed."""
        cached = self.cached
        for seq, j in fills:
            cached[seq] = j + 1
        if keyed:
            tables = self.tables
            self.pool.cache_pairs([(tables[seq][j], h) for seq, j, h in keyed])  # type: ignore[union-attr]

    def free(self, seq: Sequence) -> None:
        """Return every block of ``seq`` (with caching: tail first, cached content stays)."""
        pool = self.pool
        if pool is None:
            self.num_used -= seq.num_blocks
        elif seq.prompt_runs is None:
            full = self.cached.pop(seq, 0)
            blocks = self.tables.pop(seq, [])
            if full and seq.status is not SequenceStatus.FINISHED:  # preempted: may re-hit
                self._register(pool, seq, blocks[:full])
            pool.free_owned(blocks, full, self.counted.pop(seq, 0))
            self.pool_changed()
        else:
            blocks = self.tables.pop(seq, [])
            blocks.reverse()
            pool.free(blocks)
            self.cached.pop(seq, None)
            self.pool_changed()
        if self.offload is not None and seq.status is SequenceStatus.FINISHED:
            self.offload.forget(seq)
        seq.num_blocks = 0

    # -- KV tiers below the GPU's (``offload.py``) ----------------------------------------------

    def tier_hits(self, seq: Sequence, num_gpu_hits: int) -> list[int]:
        """Per tier, the blocks a waiting ``seq`` would load after its ``num_gpu_hits`` GPU
        hits (at most ``num_tokens - 1`` tokens in all, as on the GPU)."""
        n = (seq.num_tokens - 1) // self.block_size
        if self.offload is None or n <= num_gpu_hits:
            return []
        if seq.prompt_runs is None and not seq.num_preemptions:
            return []  # nobody else can name its blocks, and it never computed any
        return self.offload.lookup(extend_hashes(seq, n, self.block_size)[:n], num_gpu_hits)

    def hold(self, seq: Sequence, hits: list[int], num_loaded: int) -> bool:
        """Give a waiting ``seq`` its GPU ``hits`` and ``num_loaded`` new blocks for the KV
        it loads from the tiers, if they are free (else change nothing and return False);
        the new blocks are cached once the load ends (``loaded``), as vLLM delays it."""
        pool = self.pool
        assert pool is not None
        if self.num_needed(seq, (len(hits) + num_loaded) * self.block_size, hits) > self.num_free:
            return False
        pool.touch(hits)
        own = seq.prompt_runs is None  # its references unwritten but for its hits, as admit()
        if own:
            self.counted[seq] = len(hits)
        self.tables[seq] = list(hits) + pool.take(num_loaded, not own)
        seq.num_blocks = len(self.tables[seq])
        self.cached[seq] = len(hits)
        self.pool_changed()
        return True

    def loaded(self, seq: Sequence) -> None:
        """The load of a held ``seq`` ended: its blocks are all full; cache them and let them
        go, to the tail of the eviction queue, where its lookup finds them (so no waiting
        sequence holds blocks, and none can wait for blocks one behind it holds)."""
        assert self.offload is not None
        self.offload.loaded(seq, self.cached.get(seq, 0), seq.num_blocks)
        self.cache_full(seq, seq.num_blocks * self.block_size)
        self.free(seq)

    def _register(self, pool: BlockPool, seq: Sequence, full: list[int]) -> None:
        """Enter the ``full`` blocks of ``seq`` (no prompt runs) in the hash map, as they
        would have been when filled; those it hit or registered before are there already."""
        hashes = extend_hashes(seq, len(full), self.block_size)
        block_hash, cache = pool.block_hash, pool.cache
        for j, b in enumerate(full):
            if block_hash[b] is None:
                cache(b, hashes[j])

    # -- deferred decode steps without caching -------------------------------------------------
    # A run of deferred decode steps takes blocks for many sequences at once and writes each
    # sequence's count only when the run settles.

    def take(self, n: int) -> None:
        """Count ``n`` more blocks as used, for sequences ``settle()`` will name later."""
        self.num_used += n

    def settle(self, seq: Sequence, num_tokens: int, num_known: int = -1) -> None:
        """Record that ``seq`` holds the blocks for ``num_tokens`` tokens, already counted
        by ``take()`` (with caching: in its table, ``grow_group``, ``grow_each``); with
        caching, its full blocks count as cached: those of ``num_tokens`` tokens, or (async)
        at least those of its ``num_known`` known ones."""
        if self.pool is None:
            seq.num_blocks = -(-num_tokens // self.block_size)
            return
        seq.num_blocks = len(self.tables[seq])
        if num_known < 0:
            self.cached[seq] = num_tokens // self.block_size
        elif num_known // self.block_size > self.cached.get(seq, 0):
            self.cached[seq] = num_known // self.block_size

    def grow_group(
        self, by_residue: list[list[Sequence]], num_seqs: int, t: int, u: int, n: int
    ) -> None:
        """With caching: give the decode group's ``num_seqs`` members the ``n`` blocks
        (checked free) they enter in steps ``t + 1`` .. ``u`` (nobody leaving), taken at
        once in the order step by step takes them: at step ``s`` the members of
        ``by_residue[(1 - s) % block_size]`` enter one each. Their own: no references kept."""
        pool = self.pool
        assert pool is not None
        got = pool.take(n, False)
        if not got:
            return
        bs, tables, i = self.block_size, self.tables, 0
        if u - t < 3 * bs:  # step by step
            for s in range(t + 1, u + 1):
                for seq in by_residue[(1 - s) % bs]:
                    tables[seq].append(got[i])
                    i += 1
        else:  # long: the members are the same in every period of ``bs`` steps, which
            # takes ``num_seqs`` blocks, so a member's blocks are every ``num_seqs``-th
            # from its place in the first period (measured: one slice each beats one append
            # per block from about three periods on)
            r = -t % bs
            for j in range(bs):
                for seq in by_residue[(r - j) % bs]:
                    tables[seq] += got[i::num_seqs]
                    i += 1
        self.pool_changed()

    def evicts(self, n: int, hashes: frozenset[int]) -> bool:
        """With caching: whether taking ``n`` new blocks evicts cached content in ``hashes``."""
        pool = self.pool
        assert pool is not None
        evicted = islice(pool.free_cached(), max(0, n - len(pool.free_blank)))
        return any(pool.block_hash[b] in hashes for b in evicted)

    def grow_each(self, growing: list[Sequence], written: bool) -> None:
        """With caching: one new block for each of ``growing``, in order (checked free);
        ``written``: those with prompt runs have its reference written down."""
        pool = self.pool
        assert pool is not None
        got = pool.take(len(growing), False)
        tables = self.tables
        for seq, b in zip(growing, got, strict=True):
            tables[seq].append(b)
            seq.num_blocks += 1
        if written:
            ref_cnt = pool.ref_cnt
            for seq, b in zip(growing, got, strict=True):
                if seq.prompt_runs is not None:
                    ref_cnt[b] = 1
        self.pool_changed()
