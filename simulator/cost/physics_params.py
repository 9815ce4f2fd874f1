"""The `physics` cost model's learned parameters: a data file (``configs/physics/params.yaml``,
written by ``servesim learn``) saying what it was fitted on, when, and its errors."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.cost.physics_terms import GPU_CURVES, PER_GPU, SHARED, gpu_params
from simulator.cost.presets import HardwareSpec, configs_dir, load_yaml_model
from simulator.errors import InputError

__all__ = [
    "AllReduceFit",
    "GpuFit",
    "GroupError",
    "PhysicsParams",
    "default_params_path",
    "load_params",
]


class GpuFit(BaseModel):
    """What the fit learned of one measured GPU (an unmeasured GPU has scales of 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute_scale: float = Field(gt=0, allow_inf_nan=False)
    """Achieved matmul peak relative to the preset's ``peak_flops`` x ``gemm_compute``."""
    memory_scale: float = Field(gt=0, allow_inf_nan=False)
    """Achieved bandwidth relative to the preset's ``hbm_bandwidth`` x each term's efficiency."""
    tiled_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """This GPU's tiled matmul kernels' weight streaming relative to ``gemm_tiled_memory``."""
    ridge_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """This GPU's ``gemm_sharpness`` relative to the stack's (how sharply its matmuls turn
    from memory- to compute-bound)."""
    decode_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """This GPU's decode attention bandwidth relative to ``decode_memory``."""
    own_stack: bool = True
    """Measured on the stack priced. ``false``: only on another stack (Vidur's 2024 profiler),
    whose memory-bound end is that stack's, not vLLM 0.19's: its memory and curve scales took
    up the other stack's level in the fit and are not used in pricing (its cuBLAS compute
    scale is)."""

    def curve_scales(self) -> dict[str, float]:
        """The scales of ``GPU_CURVES`` by name."""
        return {k: getattr(self, k) for k in GPU_CURVES}


class GroupError(BaseModel):
    """The fit's in-sample error on one group of measurements (step times built from them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    points: int = Field(ge=0)
    """Steps compared."""
    median_pct: float = Field(ge=0)
    """Median absolute error, percent."""
    p90_pct: float = Field(ge=0)
    """90th percentile of the absolute error, percent."""


class AllReduceFit(BaseModel):
    """The tensor-parallel all-reduce learned for GPUs on an NVLink link (the only links
    measured): ``latency_us + 2 (tp - 1) / tp x bytes / (interconnect_bandwidth x
    bandwidth_efficiency)``; other links keep their preset's values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_us: float = Field(gt=0, allow_inf_nan=False)
    """Fixed time of one all-reduce, microseconds."""
    bandwidth_efficiency: float = Field(gt=0, allow_inf_nan=False)
    """Achieved ring bandwidth over the preset's one-way ``interconnect_bandwidth``."""
    link: str = "NVLink"
    """The presets it applies to: those whose ``interconnect`` starts with it."""
    points: int = Field(ge=0)
    """All-reduces fitted."""
    median_pct: float = Field(ge=0)
    """Median absolute error of the fit, percent."""
    p90_pct: float = Field(ge=0)
    """90th percentile of its absolute error, percent."""
    fitted_on: list[str] = Field(default_factory=list)
    """The profiles fitted (repository, commit, path)."""


class PhysicsParams(BaseModel):
    """Learned efficiencies of one serving stack: shared ones, and per-GPU scales."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str
    """The serving stack the measurements were taken on (its kernels are what is learned)."""
    fitted_on: list[str]
    """The measurement files fitted (path under the data folder and sha256)."""
    excluded: list[str] = Field(default_factory=list)
    """Public measurements deliberately left out, each with its reason."""
    fitted_at: str
    """When the fit ran (UTC, ISO 8601)."""
    command: str
    """The command that wrote this file."""
    shared: dict[str, float]
    """Parameters of the stack, the same on every GPU (``physics_terms.SHARED``)."""
    gpus: dict[str, GpuFit] = Field(default_factory=dict)
    """Per hardware preset name with measurements: its scales."""
    errors: dict[str, GroupError] = Field(default_factory=dict)
    """Per measured group (GPU / model / tp): the fit's in-sample step-time error."""
    allreduce: AllReduceFit | None = None
    """The learned all-reduce (None: every link at its preset's values)."""

    @field_validator("shared")
    @classmethod
    def _all_shared(cls, value: dict[str, float]) -> dict[str, float]:
        missing = [k for k in SHARED if k not in value]
        unknown = [k for k in value if k not in SHARED]
        if missing or unknown:
            raise ValueError(f"missing {missing}, unknown {unknown} (expected {list(SHARED)})")
        bad = [k for k, v in value.items() if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"{bad[0]} must be a finite number > 0")
        return value

    def for_gpu(self, name: str, fitted: bool = True) -> tuple[dict[str, float], float, float]:
        """(curve parameters, compute scale, memory scale) to price hardware preset ``name``:
        the stack's curves and the spec sheet where it has no fit on the stack priced (or
        ``fitted`` is false), else its own."""
        fit = self.gpus.get(name) if fitted else None
        if fit is None:
            return dict(self.shared), 1.0, 1.0
        if not fit.own_stack:  # another stack's memory-bound end: its cuBLAS peak only
            return dict(self.shared), fit.compute_scale, 1.0
        return gpu_params(self.shared, fit.curve_scales()), fit.compute_scale, fit.memory_scale

    def as_fitted(self, name: str) -> tuple[dict[str, float], float, float]:
        """``for_gpu`` with every fitted scale of ``name``, another stack's too (how the fit
        saw its measurements)."""
        fit = self.gpus.get(name)
        if fit is None:
            return dict(self.shared), 1.0, 1.0
        return gpu_params(self.shared, fit.curve_scales()), fit.compute_scale, fit.memory_scale

    def link_for(self, hw: HardwareSpec) -> tuple[float | None, float]:
        """(bandwidth, latency in us) of one all-reduce on ``hw``'s link: learned where
        ``allreduce`` covers the link, else the preset's (latency 0 when it gives none)."""
        fit, bw = self.allreduce, hw.interconnect_bandwidth
        if fit is not None and bw is not None and (hw.interconnect or "").startswith(fit.link):
            return bw * fit.bandwidth_efficiency, fit.latency_us
        return bw, hw.allreduce_latency_us or 0.0


assert set(PER_GPU) == set(GpuFit.model_fields) - {"own_stack"}, "GpuFit's scales are PER_GPU"


def default_params_path() -> Path:
    """The shipped parameters, ``configs/physics/params.yaml``."""
    return configs_dir() / "physics" / "params.yaml"


def load_params(path: str | None) -> PhysicsParams:
    """Parameters from ``path`` (a YAML file), or the shipped ones when ``None``."""
    file = Path(path) if path is not None else default_params_path()
    if not file.is_file():
        raise InputError(f"physics parameters file {file}: not found")
    return load_yaml_model(file, PhysicsParams)
