"""A tier of KV blocks below the GPU's: CPU memory of one replica, or a store the fleet
shares (an LMCache server, a Mooncake store). Blocks are named by the chained content hashes
of ``block_hash.py``, so equal names mean equal tokens from the start of the sequence.

The rules are vLLM's ``LRUOffloadingManager`` (``vllm/v1/kv_offload/lru_manager.py``), the
manager of its native CPU offloading (``OffloadingConnector``):

- a lookup counts the leading blocks present (the first absent one ends the hit);
- a store skips blocks already present and, when the tier is full, evicts the least recently
  used ones to make room; a store that could not fit even in an empty tier stores nothing;
- a touch makes blocks the most recently used, the first block last, so a prefix outlives
  its tails (vLLM touches in reverse order for that reason).

vLLM also pins blocks being loaded against eviction and holds a stored block back until its
copy ends; here a load and a store are whole at once (docs/kv-offload.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class KVTier:
    """An LRU set of at most ``capacity`` blocks, each named by its content hash."""

    __slots__ = ("name", "capacity", "_blocks", "num_stored", "num_evicted")

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"{name}: capacity must be >= 0 blocks, got {capacity}")
        self.name = name
        """``cpu`` or ``shared``: the tier's label in the tables."""
        self.capacity = capacity
        """Most blocks the tier holds."""
        self._blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.num_stored = 0
        """Blocks written to the tier so far."""
        self.num_evicted = 0
        """Blocks evicted so far to make room."""

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def lookup(self, hashes: Iterable[int]) -> int:
        """How many of ``hashes``, from the first, the tier holds (the first miss ends it)."""
        blocks, hits = self._blocks, 0
        for h in hashes:
            if h not in blocks:
                break
            hits += 1
        return hits

    def touch(self, hashes: Sequence[int]) -> None:
        """Make the held ones of ``hashes`` the most recently used, the first one last."""
        blocks = self._blocks
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)

    def store(self, hashes: Sequence[int]) -> int:
        """Write the blocks of ``hashes`` the tier lacks, evicting the least recently used
        to make room; returns how many were written (0 when they cannot all fit)."""
        blocks = self._blocks
        new = [h for h in dict.fromkeys(hashes) if h not in blocks]
        if not new or len(new) > self.capacity:
            return 0
        over = len(blocks) + len(new) - self.capacity
        for _ in range(over):
            blocks.popitem(last=False)
        self.num_evicted += max(over, 0)
        for h in new:
            blocks[h] = None
        self.num_stored += len(new)
        return len(new)
