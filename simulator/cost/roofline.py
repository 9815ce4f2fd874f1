"""Step-time cost models: how long one scheduler step takes on the GPU(s).

Formulas, symbols and a worked example are in ``docs/cost_models.md``. ``step_time`` is called
once per simulated step, so each model folds everything it can into constants at construction
and walks the batch once.
"""

from __future__ import annotations

from operator import mul
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.cost.batch import Batch
from simulator.cost.fitted import FittedCostConfig, load_fitted
from simulator.cost.presets import HardwareSpec, ModelSpec, load_hardware, load_model
from simulator.errors import InputError, in_field

__all__ = [
    "CostModel",
    "CostModelConfig",
    "LinearCostConfig",
    "LinearCostModel",
    "RooflineCostConfig",
    "RooflineCostModel",
    "build_cost_model",
]

_MS = 1e-3


class CostModel(Protocol):
    """Anything that times a step."""

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes; > 0 for a non-empty batch."""
        ...


class DecodeCostModel(CostModel, Protocol):
    """A cost model that can also time an all-decode step from two sums (the engine's fast
    path); ``decode_time(n, c)`` must equal ``step_time`` of any batch of ``n`` one-token
    sequences whose contexts add up to ``c``, to the last bit."""

    def decode_time(self, num_seqs: int, context: int) -> float:
        """Seconds of a step decoding ``num_seqs`` sequences with ``context`` KV tokens in all."""
        ...


class LinearCostConfig(BaseModel):
    """Step time as a linear function of the batch's token, sequence and context counts."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["linear"] = "linear"
    """Discriminator of the cost-model union."""
    base_ms: float = Field(default=0.0, ge=0)
    """Fixed cost of every step (launch, scheduling, sampling), ms."""
    per_token_ms: float = Field(default=0.0, ge=0)
    """Cost per computed token (sum of ``new_tokens``), ms."""
    per_seq_ms: float = Field(default=0.0, ge=0)
    """Cost per scheduled sequence, ms."""
    per_context_token_ms: float = Field(default=0.0, ge=0)
    """Cost per token already in KV cache (attention reads), ms."""

    @model_validator(mode="after")
    def _some_positive(self) -> LinearCostConfig:
        # Every scheduled sequence computes >= 1 token, so one of these > 0 guarantees a
        # positive step time; per_context_token_ms alone would time a fresh prefill at 0.
        if self.base_ms <= 0 and self.per_token_ms <= 0 and self.per_seq_ms <= 0:
            raise ValueError(
                "at least one of base_ms, per_token_ms, per_seq_ms must be > 0 "
                "(a step would otherwise take no time)"
            )
        return self


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


CostModelConfig = Annotated[
    LinearCostConfig | RooflineCostConfig | FittedCostConfig,
    Field(discriminator="type"),
]
"""Any cost-model config, told apart by its ``type`` field."""


class LinearCostModel:
    """``base + per_token * tokens + per_seq * seqs + per_context_token * context`` (ms)."""

    def __init__(self, cfg: LinearCostConfig) -> None:
        """Store the coefficients in seconds."""
        self.cfg = cfg
        self._base = cfg.base_ms * _MS
        self._per_token = cfg.per_token_ms * _MS
        self._per_seq = cfg.per_seq_ms * _MS
        self._per_ctx = cfg.per_context_token_ms * _MS

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes."""
        return self._time(sum(batch.new_tokens), len(batch.new_tokens), sum(batch.context_lens))

    def decode_time(self, num_seqs: int, context: int) -> float:
        """Seconds of a step decoding ``num_seqs`` sequences with ``context`` KV tokens in all."""
        return self._time(num_seqs, num_seqs, context)

    def _time(self, tokens: int, seqs: int, context: int) -> float:
        return (
            self._base + self._per_token * tokens + self._per_seq * seqs + self._per_ctx * context
        )


class RooflineCostModel:
    """``max(FLOPs / compute rate, bytes / memory rate) + all-reduce + overhead`` per GPU."""

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
        # QK^T and AV: 2 matmuls x 2 FLOPs per multiply-add, per (query, key) pair, per head.
        self._attn_flops_per_pair = 4.0 * model.num_layers * model.num_heads * model.head_dim / tp
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
        new, ctx_lens = batch.new_tokens, batch.context_lens
        tokens = sum(new)
        # n new queries see all c cached keys plus a causal triangle n (n + 1) / 2 of the chunk;
        # summed as dot products because map(mul) runs in C, ~10x faster than a Python loop.
        pairs = sum(map(mul, new, ctx_lens)) + (sum(map(mul, new, new)) + tokens) // 2
        return tokens, sum(ctx_lens), pairs

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes."""
        return self._time(*self._sums(batch))

    def decode_time(self, num_seqs: int, context: int) -> float:
        """Seconds of a step decoding ``num_seqs`` sequences with ``context`` KV tokens in all
        (each sees its context plus itself: ``context + num_seqs`` query-key pairs)."""
        return self._time(num_seqs, context, context + num_seqs)

    def _time(self, tokens: int, ctx: int, pairs: int) -> float:
        flops = self._mm_flops_per_token * tokens + self._attn_flops_per_pair * pairs
        nbytes = self._weight_bytes + self._kv_bytes_per_token * (ctx + tokens)
        t_roof = max(flops / self._compute_rate, nbytes / self._memory_rate)
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


def build_cost_model(cfg: CostModelConfig) -> CostModel:
    """The cost model a validated config describes (presets are loaded here)."""
    if isinstance(cfg, LinearCostConfig):
        return LinearCostModel(cfg)
    if isinstance(cfg, RooflineCostConfig):
        model = in_field("cost_model.model", load_model, cfg.model)
        hardware = in_field("cost_model.hardware", load_hardware, cfg.hardware)
        return RooflineCostModel(cfg, model, hardware)
    if isinstance(cfg, FittedCostConfig):
        return in_field("cost_model.path", load_fitted, cfg)
    raise InputError(f"cost_model: unsupported type {type(cfg).__name__}")
