"""The ``roofline`` cost model: a step's FLOPs and bytes against a GPU's peak compute and
HBM bandwidth (formulas, symbols and a worked example: ``docs/cost_models.md``).

``step_time`` is called once per simulated step, so the model folds everything it can into
constants at construction and walks the batch once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.batch import Batch, StepSums
from simulator.cost.interface import CostModel
from simulator.cost.presets import HardwareSpec, ModelSpec
from simulator.errors import InputError

_MS = 1e-3


class RooflineCostConfig(BaseModel):
    """Step time from FLOPs and bytes against a GPU's peak compute and HBM bandwidth."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["roofline"] = "roofline"
    """Discriminator of the cost-model union."""
    model: str
    """Model preset name (``configs/models/<name>.yaml``) or YAML path."""
    hardware: str
    """Hardware preset name (``configs/hardware/<name>.yaml``) or YAML path."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree: FLOPs and bytes are split evenly over this many GPUs."""
    compute_efficiency: float = Field(default=0.6, gt=0, le=1)
    """Achieved fraction of ``peak_flops``."""
    memory_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achieved fraction of ``hbm_bandwidth``."""
    overhead_ms: float = Field(default=2.0, ge=0)
    """Fixed per-step cost outside the roofline (launches, scheduling, sampling), ms."""
    interconnect_bandwidth: float | None = Field(default=None, gt=0)
    """Per-GPU one-way link bandwidth for ring all-reduce, bytes/s; ``None`` ignores it."""
    allreduce_latency_us: float = Field(default=0.0, ge=0)
    """Fixed latency of one all-reduce (two per layer when ``tp > 1``), microseconds."""


class RooflineCostModel(CostModel):
    """``max(FLOPs / compute rate, bytes / memory rate) + all-reduce + overhead`` per GPU."""

    times_from_sums = True

    def __init__(self, cfg: RooflineCostConfig, model: ModelSpec, hw: HardwareSpec) -> None:
        """Fold the model shape, GPU and efficiencies into per-token and per-step constants."""
        if model.num_heads % cfg.tp != 0:
            raise InputError(
                f"cost_model.tp: {cfg.tp} does not divide num_heads={model.num_heads} "
                f"of model {model.name}"
            )
        self.cfg, self.model, self.hw = cfg, model, hw
        tp = cfg.tp
        self._mm_flops_per_token = model.flops_per_token_matmul / tp
        self._attn_flops_per_pair = model.attention_flops_per_pair / tp
        self._weight_bytes = model.weight_bytes / tp
        self._kv_bytes_per_token = model.kv_bytes_per_token / tp
        self._compute_rate = hw.peak_flops * cfg.compute_efficiency
        self._memory_rate = hw.hbm_bandwidth * cfg.memory_efficiency
        self._overhead = cfg.overhead_ms * _MS
        self._comm_per_token, self._comm_fixed = self._allreduce_constants(cfg, model)

    @staticmethod
    def _allreduce_constants(cfg: RooflineCostConfig, model: ModelSpec) -> tuple[float, float]:
        """Seconds per token and per step of the 2 all-reduces per layer under TP."""
        if cfg.tp == 1:
            return 0.0, 0.0
        num_allreduces = 2 * model.num_layers
        fixed = num_allreduces * cfg.allreduce_latency_us * 1e-6
        if cfg.interconnect_bandwidth is None:
            return 0.0, fixed
        # A ring all-reduce sends 2 (tp - 1) / tp of the buffer out of each GPU.
        ring = 2.0 * (cfg.tp - 1) / cfg.tp
        bytes_per_token = num_allreduces * ring * model.hidden_size * model.dtype_bytes
        return bytes_per_token / cfg.interconnect_bandwidth, fixed

    @staticmethod
    def _sums(batch: Batch) -> tuple[int, int, int]:
        """(new tokens, context tokens, causal query-key pairs) of the batch."""
        return sum(batch.new_tokens), sum(batch.context_lens), batch.attention_pairs()

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes."""
        tokens, ctx, pairs = self._sums(batch)
        return self.time_sums((0, 0, tokens, ctx, 0, pairs))  # type: ignore[arg-type]

    def time_sums(self, sums: StepSums) -> float:
        """Seconds of a step with these sums (``step_time`` goes through here too)."""
        # one call: the engine times most steps of a run here
        tokens, ctx, pairs = sums[2], sums[3], sums[5]
        flops = self._mm_flops_per_token * tokens + self._attn_flops_per_pair * pairs
        nbytes = self._weight_bytes + self._kv_bytes_per_token * (ctx + tokens)
        t_compute, t_memory = flops / self._compute_rate, nbytes / self._memory_rate
        t_roof = t_memory if t_memory > t_compute else t_compute  # max(), without the call
        return t_roof + self._comm_fixed + self._comm_per_token * tokens + self._overhead

    def breakdown(self, batch: Batch) -> dict[str, float]:
        """Per-GPU FLOPs, bytes and the time terms (seconds) behind ``step_time``."""
        tokens, ctx, pairs = self._sums(batch)
        flops_matmul = self._mm_flops_per_token * tokens
        flops_attn = self._attn_flops_per_pair * pairs
        bytes_kv = self._kv_bytes_per_token * (ctx + tokens)
        t_compute = (flops_matmul + flops_attn) / self._compute_rate
        t_memory = (self._weight_bytes + bytes_kv) / self._memory_rate
        t_comm = self._comm_fixed + self._comm_per_token * tokens
        return {
            "flops_matmul": flops_matmul,
            "flops_attn": flops_attn,
            "bytes_weights": self._weight_bytes,
            "bytes_kv": bytes_kv,
            "t_compute": t_compute,
            "t_memory": t_memory,
            "t_comm": t_comm,
            "t_overhead": self._overhead,
            "t": max(t_compute, t_memory) + t_comm + self._overhead,
        }
