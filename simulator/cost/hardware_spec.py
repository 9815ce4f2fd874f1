"""One GPU's peak numbers by dtype, memory and link, as the cost models and the KV budget need
them (presets: ``configs/hardware/``, each value with its datasheet source)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.errors import InputError

__all__ = ["HardwareSpec"]

_PEAK_FIELDS = {
    "bf16": "peak_flops",
    "fp16": "peak_flops",
    "fp8": "peak_flops_fp8",
    "fp4": "peak_flops_fp4",
}


class HardwareSpec(BaseModel):
    """One GPU's peak numbers, as the roofline cost model and the KV-block budget need them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Short identifier, e.g. ``a100-80gb``."""
    source: str
    """Where the numbers come from (vendor datasheet)."""
    peak_flops: float = Field(gt=0, allow_inf_nan=False)
    """Dense (no sparsity) bf16 tensor-core FLOP/s of one GPU."""
    peak_flops_fp8: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Dense fp8 tensor-core FLOP/s; None: the GPU has no fp8 tensor cores."""
    peak_flops_fp4: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Dense fp4 tensor-core FLOP/s; None: the GPU has no fp4 tensor cores."""
    hbm_bandwidth: float = Field(gt=0, allow_inf_nan=False)
    """HBM bandwidth of one GPU, bytes/s."""
    memory_bytes: int = Field(gt=0)
    """HBM capacity of one GPU, bytes (presets use decimal GB: 80 GB = 80e9, unless the source
    gives the bytes the CUDA driver reports)."""
    interconnect: str | None = None
    """The GPU-to-GPU link, e.g. ``NVLink 4`` or ``PCIe Gen5 x16``."""
    interconnect_bandwidth: float | None = Field(default=None, gt=0)
    """Per-GPU one-way bandwidth of the link tensor-parallel all-reduces use, bytes/s."""
    pcie_generation: int | None = Field(default=None, ge=3, le=6)
    """PCI Express generation of the GPU's link to its host (``configs/pcie.yaml``); None:
    not known. The link KV swapped to host memory crosses (``host_link_bandwidth``)."""
    pcie_lanes: int | None = Field(default=None, ge=1, le=32)
    """Lanes of that link (16 on every preset)."""
    allreduce_latency_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Fixed latency of one small all-reduce between these GPUs, microseconds."""
    gpus_per_node: int | None = Field(default=None, ge=1)
    """GPUs of one node sharing ``interconnect`` (an HGX board: 8): a TP group larger than
    this crosses the network, which a scenario must describe (``cost_model.network``); None:
    not known, not checked."""
    kernels_gpu: str | None = None
    """The GPU's folder in NVIDIA's database of measured vLLM kernels (``h100_sxm``, ...):
    the ``kernels`` cost model's tables; None: not measured there."""
    cost_per_hour: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Dollars per GPU-hour (on-demand cloud rental), for ``servesim search``'s cost columns;
    None if unknown (``search --gpu-cost NAME=USD`` sets or overrides it)."""
    cost_source: str | None = None
    """Where ``cost_per_hour`` comes from, and when."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Per field, the document (and URL) its value comes from, where ``source`` is not enough."""

    @field_validator("sources")
    @classmethod
    def _sources_name_fields(cls, value: dict[str, str]) -> dict[str, str]:
        # a source for a field that does not exist is a typo hiding a value without one
        unknown = sorted(set(value) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"sources for unknown fields {unknown}")
        return value

    def peak_flops_for(self, dtype: str) -> float:
        """Dense tensor-core FLOP/s at ``dtype`` (bf16, fp16, fp8, fp4); a dtype the GPU has no
        tensor cores for -> ``InputError`` naming it."""
        field = _PEAK_FIELDS.get(dtype)
        if field is None:
            raise InputError(f"dtype {dtype!r}: unknown (known: {', '.join(_PEAK_FIELDS)})")
        peak: float | None = getattr(self, field)
        if peak is None:
            raise InputError(
                f"hardware {self.name} has no {dtype} tensor cores ({field} not given): "
                f"use a dtype it supports or another GPU"
            )
        return peak

    def require(self, field: str, why: str) -> float:
        """The value of an optional numeric ``field``; missing -> ``InputError`` naming it and
        what needs it."""
        value = getattr(self, field)
        if value is None:
            raise InputError(f"hardware {self.name}: {field} not given ({why} needs it)")
        return float(value)
