"""A scenario's KV tiers below a replica's GPU KV (``scheduler.kv_offload``): its CPU memory,
as vLLM's native offloading uses it (``--kv-transfer-config '{"kv_connector":
"OffloadingConnector", ...}'`` with ``cpu_bytes_to_use``); docs/kv-offload.md."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CPUTierConfig(_Model):
    """A replica's CPU tier: host memory that keeps KV blocks after the GPU computed them."""

    size_gb: float = Field(ge=0, allow_inf_nan=False)
    """Host memory for KV blocks, GB (1e9 bytes), the replica's whole (vLLM's
    ``cpu_bytes_to_use``); blocks of ``kv_bytes_per_token`` x ``block_size`` bytes. 0: no
    block fits, and the run is the run without the tier."""
    bandwidth_gb_s: float = Field(gt=0, allow_inf_nan=False)
    """Bandwidth of the host-to-GPU copies that load blocks back, GB/s (an H100's PCIe 5.0
    x16 link carries 64 GB/s each way at most; copies achieve less)."""
    latency_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Fixed time of each load on top of bytes / bandwidth, s."""
    host_memory_gb: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Host memory of the replica's machine, GB, which the tier must fit in; omit to take it
    from the GPU preset's machine class (``configs/host_memory.yaml``: e.g. a DGX H100's 2 TB
    over its 8 GPUs, 256 GB per GPU, times the replica's GPUs)."""


class KVOffloadConfig(_Model):
    """KV tiers below a replica's GPU KV (needs prefix caching: blocks are found by content)."""

    cpu: CPUTierConfig | None = None
    """The replica's CPU tier; None: none (a cluster may still give a shared one,
    ``cluster.shared_kv``)."""
    kv_bytes_per_token: int | None = Field(default=None, ge=1)
    """KV bytes of one token over all layers; omit to take it from the cost model's model
    preset (required with a cost model that names no model, such as a linear one)."""
