"""The KV blocks of a hybrid model: several KV-cache groups sharing one block pool, run as
vLLM 0.33's ``HybridKVCacheCoordinator`` runs them (docs/scheduler.md, "Hybrid KV-cache
groups"). The scheduler sees the one ``KVManager`` interface; each group keeps its tables
by its kind's rules (``group_tables.py``, ``window_group.py``, ``mamba_group.py``).

- Every allocation first gives back what each group no longer needs (window blocks, old Mamba
  states), then takes new blocks in every group if the pool has them all, else none.
- The scheduler's block size is the lcm of the groups' (a hit is a multiple of it); content is
  hashed per ``hash_block_size`` (the gcd of the caching groups', or the scheduler's).
- A prefix hit is a fixed point over the group kinds (full attention first, its hit trimmed):
  each kind takes the candidate length or lowers it, until all agree. Where full attention
  found more than the others, the longer length is a shared prefix's end: the sequence caches
  the other kinds' blocks there too, and ``align`` Mamba chunks stop at it.
"""

from __future__ import annotations

from math import gcd, lcm

from simulator.scheduling.block_hash import extend_hashes
from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.group_tables import FullGroup
from simulator.scheduling.kv_group import KVGroup, caching_refusal
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.mamba_group import MambaGroup, aligned_chunk
from simulator.scheduling.sequence import Sequence
from simulator.scheduling.window_group import WindowGroup


def kv_manager_for(
    num_blocks: int,
    block_size: int,
    caching: bool,
    kv_groups: list[KVGroup] | None,
    max_model_len: int,
    max_num_batched_tokens: int,
    long_prefill_token_threshold: int,
    num_speculative_tokens: int = 0,
) -> KVManager:
    """The KV manager of ``kv_groups``: one full group (or None) is the plain ``KVManager``
    of its block size; any other list a ``HybridKV`` (a scheduler's budgets: window groups
    reserve for a step's tokens, ``align`` Mamba chunks are cut inside a chunk's)."""
    if kv_groups is None:
        return KVManager(num_blocks, block_size, caching=caching)
    if not kv_groups:
        raise ValueError("kv_groups: empty (omit it for one full-attention group)")
    if len(kv_groups) == 1 and kv_groups[0].kind == "full":
        return KVManager(num_blocks, kv_groups[0].block_size, caching=caching)
    if num_speculative_tokens:
        raise ValueError("kv_groups: hybrid KV-cache groups take no speculative decoding")
    chunk = max_num_batched_tokens
    if long_prefill_token_threshold > 0:
        chunk = min(chunk, long_prefill_token_threshold)
    return HybridKV(num_blocks, kv_groups, caching, max_model_len, max_num_batched_tokens, chunk)


class HybridKV(KVManager):
    """Hybrid KV-cache groups in one pool (the module docstring)."""

    def __init__(
        self,
        num_blocks: int,
        kv_groups: list[KVGroup],
        caching: bool,
        max_model_len: int,
        in_flight: int,
        max_chunk: int,
    ) -> None:
        sizes = [g.block_size for g in kv_groups]
        super().__init__(num_blocks, lcm(*sizes), caching=caching)
        refusal = caching_refusal(kv_groups, caching)
        if refusal is not None:
            raise ValueError(f"kv_groups: {refusal}")
        self.hash_block_size = gcd(*sizes) if caching else self.block_size
        """Tokens per content hash."""
        self.pool = BlockPool(num_blocks)  # identities even without caching: NULL entries
        self.max_chunk = max_chunk
        """Most tokens of one prefill chunk (``align`` Mamba chunks are cut inside it)."""
        sbs = self.block_size
        self.groups: list[FullGroup] = [
            _group(i, g, self.pool, sbs, in_flight, max_model_len) for i, g in enumerate(kv_groups)
        ]
        """The groups, in vLLM's order."""
        by_spec: dict[tuple[str, int, int, str], list[FullGroup]] = {}
        for g, spec in zip(self.groups, kv_groups, strict=True):
            key = (
                spec.kind,
                spec.block_size,
                spec.sliding_window or 0,
                spec.mamba_cache_mode or "",
            )
            by_spec.setdefault(key, []).append(g)
        # groups of one spec share a lookup; full attention first
        self.lookups = sorted(by_spec.values(), key=lambda peers: not peers[0].downward_closed)
        self.aligned = any(isinstance(g, MambaGroup) and g.aligned for g in self.groups)
        """Whether prefill chunks are cut at block boundaries (a Mamba group in ``align``)."""
        self.junction: dict[Sequence, int] = {}
        """Per sequence, the end of a shared prefix its last lookup found (vLLM's
        ``shared_prefix_boundary``), or 0."""
        self.found: tuple[Sequence, list[list[int]], int] | None = None
        """The last lookup: the sequence, its hit blocks per group and its hit tokens."""

    def refuses(self, feature: str) -> str | None:
        """Why ``feature`` cannot run on these blocks: none of them is simulated with hybrid
        groups yet (the fast path declines: every step goes through ``schedule()``)."""
        return f"{feature} is not simulated with hybrid KV-cache groups"

    def blocks_for(self, num_tokens: int) -> int:
        """Most blocks a sequence of ``num_tokens`` tokens of KV holds at once, all groups."""
        return sum(g.blocks_for(num_tokens) for g in self.groups)

    def held(self) -> dict[Sequence, list[int]]:
        """Per sequence holding a table in any group, the blocks it holds in each."""
        seqs: dict[Sequence, None] = {}
        for g in self.groups:
            seqs.update((s, None) for s, table in g.tables.items() if table)
        return {s: [g.held(s) for g in self.groups] for s in seqs}

    def new_step(self) -> None:
        """A step's scheduling starts."""
        for g in self.groups:
            g.new_step()

    def clip(self, seq: Sequence, start: int, n: int) -> int:
        """The tokens of a chunk of ``n`` from ``start`` the groups allow (``aligned_chunk``)."""
        if not self.aligned:
            return n
        junction = self.junction.get(seq, 0)
        return aligned_chunk(seq, start, n, self.block_size, self.max_chunk, junction)

    # -- lookup and allocation -----------------------------------------------------------------

    def lookup(self, seq: Sequence) -> list[int]:
        """The prefix-cache hit of a waiting ``seq``: one entry per ``block_size`` tokens (the
        blocks per group are kept for ``admit``)."""
        hit, per_group, longest = self._find(seq, seq.num_tokens - 1)
        self.found = (seq, per_group, hit)
        self.junction[seq] = longest if longest > hit else 0
        return [0] * (hit // self.block_size)

    def _find(self, seq: Sequence, max_tokens: int) -> tuple[int, list[list[int]], int]:
        """The hit's tokens, its blocks per group and the longest hit of any kind."""
        hashes = extend_hashes(
            seq, max(max_tokens, 0) // self.hash_block_size, self.hash_block_size
        )
        per_group: list[list[int] | None] = [None] * len(self.groups)
        lengths = [0] * len(self.groups)
        hit, longest = max_tokens, 0
        while True:
            cur = hit
            for peers in self.lookups:
                first = peers[0]
                if first.downward_closed and per_group[first.gid] is not None:
                    cur = min(cur, lengths[first.gid])
                    continue
                blocks, cur = first.find_hit(hashes, cur, peers)
                for g, b in zip(peers, blocks, strict=True):
                    per_group[g.gid], lengths[g.gid] = b, cur
                longest = max(longest, cur)
            done = cur >= hit or len(self.lookups) == 2 and self.lookups[0][0].downward_closed
            hit = min(hit, cur)
            if done:
                break
        out = [b if b is not None else [] for b in per_group]
        for g in self.groups:
            if g.downward_closed:
                del out[g.gid][-(-hit // g.block_size) :]
        return hit, out, longest

    def num_needed(self, seq: Sequence, num_tokens: int, hits: list[int] | tuple = ()) -> int:
        """Free blocks a waiting ``seq`` would reserve for ``num_tokens`` tokens from its
        hit (the full-sequence admission check: window groups capped)."""
        per_group, hit = self._hits(seq, hits)
        return sum(
            g.num_to_allocate(seq, num_tokens, per_group[g.gid], hit, True) for g in self.groups
        )

    def admit(self, seq: Sequence, num_tokens: int, hits: list[int]) -> bool:
        """Give a waiting ``seq`` its hit and new blocks up to ``num_tokens`` tokens, if free."""
        per_group, hit = self._hits(seq, hits)
        return self._allocate(seq, num_tokens, per_group, hit)

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Give ``seq`` the blocks for ``num_tokens`` tokens if free (after giving back what
        it no longer needs); else take none and return False."""
        return self._allocate(seq, num_tokens, None, seq.num_computed)

    def _hits(self, seq: Sequence, hits: list[int] | tuple) -> tuple[list[list[int]], int]:
        found = self.found
        if hits and found is not None and found[0] is seq:
            return found[1], found[2]
        return [[] for _ in self.groups], 0

    def _allocate(
        self, seq: Sequence, num_tokens: int, per_group: list[list[int]] | None, computed: int
    ) -> bool:
        groups = self.groups
        for g in groups:
            g.remove_skipped(seq, computed)
        hits = per_group or [[] for _ in groups]
        need = sum(g.num_to_allocate(seq, num_tokens, hits[g.gid], computed, False) for g in groups)
        self.pool_changed()  # the blocks given back are free now
        if need > self.num_blocks - self.num_used:
            return False
        if per_group is not None:
            for g in groups:
                g.add_hits(seq, per_group[g.gid], computed)
        for g in groups:
            g.allocate(seq, num_tokens)
        if self.caching:
            upto = min(num_tokens, seq.num_tokens) // self.block_size * self.block_size
            hashes = extend_hashes(seq, upto // self.hash_block_size, self.hash_block_size)
            bounds = (seq.prompt_len - 1, self.junction.get(seq, 0))
            for g in groups:
                g.cache(seq, upto, hashes, bounds)
        self.pool_changed()
        return True

    def cache_full(self, seq: Sequence, num_tokens: int) -> None:
        """Nothing: ``grow`` caches (it runs for every scheduled sequence)."""

    def free(self, seq: Sequence) -> None:
        """Give back every block of ``seq``, group by group, each tail first."""
        for g in self.groups:
            g.free(seq)
        self.junction.pop(seq, None)
        self.pool_changed()
        seq.num_blocks = 0


def _group(
    gid: int, spec: KVGroup, pool: BlockPool, align: int, in_flight: int, max_model_len: int
) -> FullGroup:
    """The tables of group ``gid`` by its kind (``in_flight``: most tokens a step schedules)."""
    if spec.kind == "sliding_window":
        assert spec.sliding_window is not None
        window = spec.sliding_window
        return WindowGroup(gid, spec.block_size, pool, align, window, in_flight, max_model_len)
    if spec.kind == "mamba":
        return MambaGroup(gid, spec.block_size, pool, align, spec.mamba_cache_mode or "none")
    return FullGroup(gid, spec.block_size, pool, align)
