"""The KV tier a fleet shares (an LMCache server, a Mooncake store): one LRU store of blocks
(``scheduling/kv_tier.py``) that every replica writes the blocks it computes to and loads
prefixes from, each over its own link, and that a prefix-aware router may ask what it holds
(as llm-d's and Dynamo's KV-aware routers learn from KV events); docs/kv-offload.md."""

from __future__ import annotations

from simulator.cluster.config import SharedKVConfig
from simulator.scheduling.block_hash import extend_hashes
from simulator.scheduling.kv_tier import KVTier
from simulator.scheduling.sequence import Sequence
from simulator.scheduling.step_scheduler import StepScheduler


class SharedTier:
    """The fleet's shared tier, the links to it and what a router may ask of it."""

    def __init__(self, cfg: SharedKVConfig, block_size: int) -> None:
        assert cfg.kv_bytes_per_token is not None, "resolve the scenario first (KV bytes)"
        self.block_size = block_size
        """Tokens per block: every replica's (blocks are named by their content)."""
        self.bytes_per_block = cfg.kv_bytes_per_token * block_size
        """KV bytes of one block."""
        self.tier = KVTier("shared", int(cfg.size_gb * 1e9 // self.bytes_per_block))
        """The blocks it holds."""
        self.bandwidth = cfg.bandwidth_gb_s * 1e9
        """Bytes per second of each replica's link to it."""
        self.latency = cfg.latency_s
        """Seconds of latency per load."""

    def attach(self, scheduler: object, field: str) -> None:
        """Put the tier below ``scheduler``'s GPU KV and CPU tier (a ``StepScheduler``)."""
        if not isinstance(scheduler, StepScheduler) or scheduler.block_size != self.block_size:
            raise ValueError(
                f"{field}: a shared KV tier needs the step scheduler with the first group's "
                f"block_size ({self.block_size})"
            )
        scheduler.attach_tier(self.tier, self.bytes_per_block, self.bandwidth, self.latency)

    def prefix_blocks(self, seq: Sequence) -> int:
        """How many of the first full blocks of ``seq``'s prompt the tier holds."""
        n = (seq.num_tokens - 1) // self.block_size
        if n <= 0 or not len(self.tier):
            return 0
        return self.tier.lookup(extend_hashes(seq, n, self.block_size)[:n])
