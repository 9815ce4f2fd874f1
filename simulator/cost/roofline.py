"""The ``roofline`` cost model: a step's FLOPs and bytes against a GPU's peak compute and
HBM bandwidth (formulas, symbols and a worked example: ``docs/cost_models.md``).

``step_time`` is called once per simulated step, so the model folds everything it can into
constants at construction and walks the batch once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.all_to_all import allgather_reducescatter_time
from simulator.cost.batch import Batch, StepSums
from simulator.cost.decode_times import roofline_decodes
from simulator.cost.hybrid_terms import HybridTerms
from simulator.cost.interface import CostModel
from simulator.cost.kv_heads import replicated_kv_weight_bytes
from simulator.cost.network import NetworkConfig, cross_node_allreduce
from simulator.cost.presets import Dtype, HardwareSpec, ModelSpec
from simulator.errors import InputError

_MS = 1e-3


class RooflineCostConfig(BaseModel):
    """Step time from FLOPs and bytes against a GPU's peak compute and HBM bandwidth."""

    model_config = ConfigDict(extra="forbid")

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
    overhead_ms: float = Field(default=2.0, ge=0, allow_inf_nan=False)
    """Fixed per-step cost outside the roofline (launches, scheduling, sampling), ms."""
    interconnect_bandwidth: float | None = Field(default=None, gt=0)
    """Per-GPU one-way link bandwidth for ring all-reduce, bytes/s; ``None`` ignores it."""
    allreduce_latency_us: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Fixed latency of one all-reduce (two per layer when ``tp > 1``), microseconds."""
    weight_dtype: Dtype | None = None
    """Dtype of the linear layers' weights (bf16, fp16, fp8, fp4), overriding the model's;
    their bytes at its size and their matmuls at the GPU's peak for it."""
    kv_dtype: Dtype | None = None
    """Dtype of the KV cache, overriding the model's (bytes per element)."""
    network: NetworkConfig | None = None
    """How nodes connect when ``tp`` exceeds the GPUs of one node (the hardware preset's
    ``gpus_per_node``): each all-reduce's cross-node part over this link; without it such a
    ``tp`` is refused (docs/cost_models.md, "TP across nodes")."""
    expert_parallel: int = Field(default=1, ge=1)
    """GPUs the routed experts are split over (set from ``parallel``: data-parallel ranks times
    ``tp``): each GPU reads its experts the tokens of all DP ranks touch and computes their
    top-k slots routed to it; each MoE layer adds the all-gather and reduce-scatter of the
    ranks' tokens over ``interconnect_bandwidth`` (default: the hardware preset's)."""


_CLEAR = 1 + 1e-9
"""How far one roofline term must beat the other at both ends of a stretch of decode steps
for ``time_decodes`` to take it at every step between (rounding moves each by a few ulps)."""


class RooflineCostModel(CostModel):
    """``max(FLOPs / compute rate, bytes / memory rate) + all-reduce + overhead`` per GPU."""

    times_from_sums = True

    def __init__(self, cfg: RooflineCostConfig, model: ModelSpec, hw: HardwareSpec) -> None:
        """Fold the model shape, GPU and efficiencies into per-token and per-step constants."""
        model = model.deployed(cfg.tp, cfg.weight_dtype, cfg.kv_dtype)
        self.cfg, self.model, self.hw = cfg, model, hw
        tp = cfg.tp
        # matmuls run at the weights' dtype peak, attention at the activations' (bf16); both
        # are counted in matmul-rate FLOPs (a factor of exactly 1.0 when the peaks agree)
        mm_peak = matmul_peak(model, hw, "cost_model.weight_dtype" if cfg.weight_dtype else "")
        attn_scale = mm_peak / hw.peak_flops
        self._mm_flops_per_token = model.flops_per_token_matmul / tp
        self._attn_flops_per_pair = model.attention_flops_per_pair / tp * attn_scale
        # MLA decodes attend over the latent (more FLOPs per pair than a prefill's)
        extra = model.decode_attention_flops_per_pair - model.attention_flops_per_pair
        self._decode_extra_flops = extra / tp * attn_scale if model.is_mla else 0.0
        # routed experts: only those the step's tokens touch are read (ModelSpec)
        self._weight_bytes = (model.weight_bytes - model.routed_expert_bytes) / tp
        if not model.is_moe:
            self._weight_bytes = model.weight_bytes / tp  # the dense formula, as it was
        self._weight_bytes += replicated_kv_weight_bytes(model, tp)  # tp > KV heads
        self._moe = _expert_constants(model, tp)
        self._kv_bytes_per_token = model.kv_bytes_per_token_per_gpu(tp)
        self._compute_rate = mm_peak * cfg.compute_efficiency
        self._memory_rate = hw.hbm_bandwidth * cfg.memory_efficiency
        self._overhead = cfg.overhead_ms * _MS
        self._comm_per_token, self._comm_fixed = self._allreduce_constants(cfg, model)
        cross_fixed, cross_per_token = cross_node_allreduce(model, tp, hw, cfg.network)
        self._comm_fixed += cross_fixed
        self._comm_per_token += cross_per_token
        # the plain dense step, or one with the MoE/MLA terms
        self._plain = self._moe is None and not model.is_mla
        # a hybrid's windowed, indexer and state layers: effective sums from each sequence
        self._hybrid = HybridTerms.of(model, tp)
        if self._hybrid is not None:
            self._plain, self.times_from_sums = False, False
        self._ep = self._expert_parallel(cfg, model, hw)
        self._dp = max(1, cfg.expert_parallel // tp)

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

    def _expert_parallel(
        self, cfg: RooflineCostConfig, model: ModelSpec, hw: HardwareSpec
    ) -> tuple[float, float, float | None] | None:
        """Under EP: (FLOPs of one routed top-k slot, seconds per collective, link bytes/s)."""
        if cfg.expert_parallel == 1 or not model.is_moe:
            return None
        model.experts_per_rank(cfg.expert_parallel)
        link = cfg.interconnect_bandwidth or hw.interconnect_bandwidth
        latency = (cfg.allreduce_latency_us or hw.allreduce_latency_us or 0.0) * 1e-6
        slot_flops = 2.0 * model.num_moe_layers * model.expert_params
        # the experts' FLOPs leave the per-token constant: they follow every rank's tokens
        k = model.num_experts_per_tok or 1
        self._mm_flops_per_token -= slot_flops * k / cfg.tp
        return slot_flops, latency, link

    def step_time_in_dp(self, batch: Batch, tokens_across_dp: Sequence[int], rank: int) -> float:
        """Seconds of DP rank ``rank``'s step when rank ``i`` runs ``tokens_across_dp[i]``
        tokens (vLLM's padded counts): its own attention and non-expert layers, the experts
        over all ranks' tokens under EP (without EP the ranks are independent)."""
        tokens, ctx, pairs, decode_pairs = self._sums(batch)
        if self._ep is None:
            return self._time(tokens, ctx, pairs, decode_pairs)
        return self._ep_time(tokens_across_dp[rank], ctx, pairs, decode_pairs, tokens_across_dp)

    def _ep_time(
        self, tokens: int, ctx: float, pairs: float, decode_pairs: float, chunks: Sequence[int]
    ) -> float:
        """``_time`` under expert parallelism, rank ``i`` running ``chunks[i]`` tokens."""
        assert self._ep is not None
        slot_flops, latency, link = self._ep
        m, ep = self.model, self.cfg.expert_parallel
        total = sum(chunks)
        slots = total * (m.num_experts_per_tok or 1) / ep  # routed to this GPU's experts
        flops = self._mm_flops_per_token * tokens + self._attn_flops_per_pair * pairs
        flops += self._decode_extra_flops * decode_pairs + slot_flops * slots
        nbytes = self._weight_bytes + self._kv_bytes_per_token * (ctx + tokens)
        nbytes += m.touched_expert_bytes(total, ep)
        t_compute, t_memory = flops / self._compute_rate, nbytes / self._memory_rate
        t = max(t_compute, t_memory) + self._comm_fixed + self._comm_per_token * tokens
        if link is not None and len(chunks) > 1:
            exchange = allgather_reducescatter_time(
                chunks,
                m.hidden_size,
                link,
                latency * 1e6,
                top_k=m.num_experts_per_tok or 1,
                bytes_per_element=m.dtype_bytes,
            )
            t += m.num_moe_layers * exchange
        return t + self._overhead

    def _sums(self, batch: Batch) -> tuple[int, float, float, float]:
        """(new tokens, context tokens, causal query-key pairs, those of decodes) of the
        batch (the last only for MLA, whose decode pairs cost more); a hybrid's effective
        context and pairs (``HybridTerms.effective``)."""
        new, ctx = batch.new_tokens, batch.context_lens
        if self._hybrid is not None:
            return (sum(new), *self._hybrid.effective(batch))
        decode_pairs = 0
        if self._decode_extra_flops:
            decode_pairs = sum(c + 1 for n, c in zip(new, ctx, strict=True) if n == 1)
        return sum(new), sum(ctx), batch.attention_pairs(), decode_pairs

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes (under EP, every DP rank alike)."""
        if self._ep is not None:
            tokens, ctx, pairs, decode_pairs = self._sums(batch)
            return self._ep_time(tokens, ctx, pairs, decode_pairs, [tokens] * self._dp)
        return self._time(*self._sums(batch))

    def time_sums(self, sums: StepSums) -> float:
        """Seconds of a step with these sums (the same arithmetic as ``step_time``)."""
        tokens, ctx, pairs = sums[2], sums[3], sums[5]
        if self._ep is not None:
            chunks = [tokens] * self._dp
            return self._ep_time(tokens, ctx, pairs, sums[4] + sums[1], chunks)
        if not self._plain:
            # each decode sees its context and itself: decode pairs = decode_context + decodes
            return self._time(tokens, ctx, pairs, sums[4] + sums[1])
        # ``_time`` written out: the engine times most steps of a run here, and a call is a
        # good part of its cost (tests compare both)
        flops = self._mm_flops_per_token * tokens + self._attn_flops_per_pair * pairs
        nbytes = self._weight_bytes + self._kv_bytes_per_token * (ctx + tokens)
        t_compute, t_memory = flops / self._compute_rate, nbytes / self._memory_rate
        t_roof = t_memory if t_memory > t_compute else t_compute  # max(), without the call
        return t_roof + self._comm_fixed + self._comm_per_token * tokens + self._overhead

    def time_decodes(self, num_seqs: int, contexts: range) -> list[float]:
        """``time_sums`` of decode steps of ``num_seqs`` sequences over ``contexts``: the
        same arithmetic in the same order, with what does not change hoisted (most steps of
        a run are timed here)."""
        if self._ep is not None or not self._plain:
            return super().time_decodes(num_seqs, contexts)
        m = num_seqs
        mm, attn = self._mm_flops_per_token * m, self._attn_flops_per_pair
        weights, kv = self._weight_bytes, self._kv_bytes_per_token
        compute, memory = self._compute_rate, self._memory_rate
        fixed, per_token, overhead = self._comm_fixed, self._comm_per_token * m, self._overhead
        # each decode sees its context and itself: pairs = context + m = KV after the step
        pairs = range(contexts.start + m, contexts.stop + m, contexts.step)
        if not pairs:
            return []
        # Both times are affine in ``p`` and computed to a few ulps of it: when the memory
        # time beats the compute time by a relative 1e-9 at both ends, it beats it (by far
        # more than rounding) at every step between, so ``max`` is the memory time there
        lo, hi = pairs[0], pairs[-1]
        memory_bound = (weights + kv * lo) / memory > (mm + attn * lo) / compute * _CLEAR and (
            weights + kv * hi
        ) / memory > (mm + attn * hi) / compute * _CLEAR
        tail = (fixed, per_token, overhead)
        return roofline_decodes(pairs, mm, attn, weights, kv, compute, memory, tail, memory_bound)

    def _time(self, tokens: int, ctx: float, pairs: float, decode_pairs: float = 0) -> float:
        flops = self._mm_flops_per_token * tokens + self._attn_flops_per_pair * pairs
        nbytes = self._weight_bytes + self._kv_bytes_per_token * (ctx + tokens)
        if not self._plain:
            flops += self._decode_extra_flops * decode_pairs
            nbytes += self._expert_bytes(tokens)
        t_compute, t_memory = flops / self._compute_rate, nbytes / self._memory_rate
        t_roof = t_memory if t_memory > t_compute else t_compute  # max(), without the call
        return t_roof + self._comm_fixed + self._comm_per_token * tokens + self._overhead

    def _expert_bytes(self, tokens: int) -> float:
        """Per-GPU bytes of the routed experts ``tokens`` routed tokens touch, all layers."""
        if self._moe is None:
            return 0.0
        keep, all_bytes = self._moe  # P(an expert is missed by one token), all experts' bytes
        return all_bytes * (1.0 - keep**tokens) if tokens > 0 else 0.0

    def breakdown(self, batch: Batch) -> dict[str, float]:
        """Per-GPU FLOPs (in matmul-rate units), bytes and the time terms (seconds) behind
        ``step_time``."""
        tokens, ctx, pairs, decode_pairs = self._sums(batch)
        flops_matmul = self._mm_flops_per_token * tokens
        flops_attn = self._attn_flops_per_pair * pairs + self._decode_extra_flops * decode_pairs
        bytes_kv = self._kv_bytes_per_token * (ctx + tokens)
        bytes_weights = self._weight_bytes + self._expert_bytes(tokens)
        t_compute = (flops_matmul + flops_attn) / self._compute_rate
        t_memory = (bytes_weights + bytes_kv) / self._memory_rate
        t_comm = self._comm_fixed + self._comm_per_token * tokens
        return {
            "flops_matmul": flops_matmul,
            "flops_attn": flops_attn,
            "bytes_weights": bytes_weights,
            "bytes_experts": self._expert_bytes(tokens),
            "bytes_kv": bytes_kv,
            "t_compute": t_compute,
            "t_memory": t_memory,
            "t_comm": t_comm,
            "t_overhead": self._overhead,
            "t": max(t_compute, t_memory) + t_comm + self._overhead,
        }


def matmul_peak(model: ModelSpec, hw: HardwareSpec, field: str = "") -> float:
    """The GPU's dense peak FLOP/s for the model's matmuls: at its weight dtype when one is
    set (fp8 weights run fp8 GEMMs), else bf16; a dtype the GPU lacks -> ``InputError`` naming
    ``field`` (default: the model's). A checkpoint's own fp4 (gpt-oss's MXFP4) on a GPU
    without fp4 tensor cores runs weight-only at the bf16 peak, as vLLM's Marlin path on
    Hopper does; fp4 asked for by ``field`` there is refused."""
    if model.weight_dtype is None:
        return hw.peak_flops
    if model.weight_dtype == "fp4" and not field and hw.peak_flops_fp4 is None:
        return hw.peak_flops
    try:
        return hw.peak_flops_for(model.weight_dtype)
    except InputError as err:
        where = field or f"cost_model.model: {model.name}: weight_dtype {model.weight_dtype}"
        raise InputError(f"{where}: {err}") from None


def _expert_constants(model: ModelSpec, tp: int) -> tuple[float, float] | None:
    """(probability one token misses a given expert, per-GPU bytes of all routed experts):
    a step of ``T`` tokens reads ``bytes * (1 - miss^T)`` (``ModelSpec.touched_expert_bytes``)."""
    if not model.is_moe or model.num_experts is None or model.num_experts_per_tok is None:
        return None
    return 1.0 - model.num_experts_per_tok / model.num_experts, model.routed_expert_bytes / tp
