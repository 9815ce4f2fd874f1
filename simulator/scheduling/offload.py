"""The KV tiers below one replica's GPU KV, in lookup order (its CPU memory, then a store the
fleet shares), and the bytes that move to and from them: what vLLM's native offloading
(``OffloadingConnector``, ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/``) does,
with LMCache's or Mooncake's shared store as a second tier (docs/kv-offload.md):

- every full block a step computes is offered to every tier as the step is scheduled (vLLM
  stores each request's new full blocks after the step that computes them, asynchronously;
  not on eviction), and the tiers skip those they hold; blocks a request loaded from a tier
  are not offered again (vLLM starts its store index after them);
- a waiting request's prefix lookup that ends in GPU KV goes on in each tier in turn;
- the blocks found are loaded into GPU blocks the request holds while it waits (vLLM's
  ``WAITING_FOR_REMOTE_KVS``), over each tier's link; once the load ends they are cached in
  GPU KV, and the request, back at the head of the queue, is scheduled from after them.
"""

from __future__ import annotations

from simulator.scheduling.kv_tier import KVTier
from simulator.scheduling.sequence import Sequence

TIER_NAMES = ("cpu", "shared")
"""The tiers a replica may have, in lookup order: the columns of the bytes moved."""


class Offload:
    """The tiers of one replica and the bytes moved since last taken."""

    __slots__ = ("bytes_per_block", "tiers", "links", "stored", "moved", "loading")

    def __init__(self, bytes_per_block: int) -> None:
        if bytes_per_block <= 0:
            raise ValueError(f"bytes_per_block must be > 0, got {bytes_per_block}")
        self.bytes_per_block = bytes_per_block
        """KV bytes of one block over all layers (all the replica's GPUs)."""
        self.tiers: list[KVTier | None] = [None] * len(TIER_NAMES)
        """Per tier of ``TIER_NAMES``: the tier, or None when the replica has none."""
        self.links: list[tuple[float, float] | None] = [None] * len(TIER_NAMES)
        """Per tier: (bytes per second, seconds of latency per load) of its link to the GPU."""
        self.stored: dict[Sequence, int] = {}
        """Per sequence: how many of its first blocks were offered to the tiers (or loaded)."""
        self.loading: dict[int, int] = {}
        """Blocks being loaded now (hash -> loads carrying it): vLLM delays a request whose
        hit includes one (``_blocks_being_loaded``), rather than load it twice."""
        self.moved = [0] * (2 * len(TIER_NAMES))
        """Bytes stored to and loaded from each tier since ``take_moved``: (cpu store, cpu
        load, shared store, shared load)."""

    def attach(self, tier: KVTier, bandwidth_bytes_s: float, latency_s: float = 0.0) -> None:
        """Put ``tier`` (named ``cpu`` or ``shared``) below the GPU, reached over a link of
        ``bandwidth_bytes_s`` with ``latency_s`` per load."""
        if not bandwidth_bytes_s > 0 or latency_s < 0:
            raise ValueError(f"{tier.name}: bandwidth must be > 0 and latency >= 0")
        t = TIER_NAMES.index(tier.name)
        self.tiers[t] = tier
        self.links[t] = (bandwidth_bytes_s, latency_s)

    def lookup(self, hashes: list[int], start: int) -> list[int]:
        """Per tier, how many blocks of ``hashes`` it serves after the first ``start`` (the
        GPU's hit) and those of the tiers before it; every tier touches ``hashes``, as vLLM
        touches a request's blocks when it looks them up."""
        counts = [0] * len(TIER_NAMES)
        pos = start
        for t, tier in enumerate(self.tiers):
            if tier is None:
                continue
            tier.touch(hashes)
            k = tier.lookup(hashes[pos:])
            counts[t] = k
            pos += k
        return counts

    def store(self, seq: Sequence, hashes: list[int], full: int) -> None:
        """Offer the blocks of ``seq`` up to its ``full``-th (``hashes`` covers them) that were
        not offered yet to every tier; count the bytes each writes."""
        lo = self.stored.get(seq, 0)
        if full <= lo:
            return
        self.stored[seq] = full
        new = hashes[lo:full]
        for t, tier in enumerate(self.tiers):
            if tier is not None:
                written = tier.store(new)
                self.moved[2 * t] += written * self.bytes_per_block
                if written:  # as vLLM, which touches the prefix only when it stores blocks
                    tier.touch(hashes[:full])

    def in_flight(self, hashes: list[int]) -> bool:
        """Whether a load in progress carries any of ``hashes``."""
        loading = self.loading
        return bool(loading) and any(h in loading for h in hashes)

    def load(self, seq: Sequence, counts: list[int], upto: int) -> list[int]:
        """``seq`` loads ``counts`` blocks from each tier, ending at its ``upto``-th block:
        count the bytes, never offer those blocks back; returns the bytes per tier."""
        self.stored[seq] = max(self.stored.get(seq, 0), upto)
        loading = self.loading
        for h in seq.block_hashes[upto - sum(counts) : upto]:
            loading[h] = loading.get(h, 0) + 1
        nbytes = [k * self.bytes_per_block for k in counts]
        for t, b in enumerate(nbytes):
            self.moved[2 * t + 1] += b
        return nbytes

    def loaded(self, seq: Sequence, lo: int, hi: int) -> None:
        """The load of blocks ``lo..hi-1`` of ``seq`` ended."""
        loading = self.loading
        for h in seq.block_hashes[lo:hi]:
            left = loading.pop(h) - 1
            if left:
                loading[h] = left

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished: drop its bookkeeping."""
        self.stored.pop(seq, None)

    def take_moved(self) -> tuple[int, ...]:
        """The bytes moved since the last call (``moved``), and start counting anew."""
        out = tuple(self.moved)
        self.moved = [0] * len(out)
        return out
