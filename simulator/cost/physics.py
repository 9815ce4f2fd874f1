"""The ``physics`` cost model: a step's time as a sum of roofline terms per operator (dense
matmuls and memory-bound operators by token count, routed experts by the pairs and distinct
experts the tokens touch, attention (GQA or MLA) by prefill chunk, context and decodes, LM
head and sampler by sequence, tensor-parallel all-reduces and expert-parallel all-to-alls
from the link), at the weights' and KV's dtypes and the GPU's peak for them; each
bent by a learned efficiency curve whose parameters belong to the serving stack, not to one
GPU: a GPU nobody measured is priced from its spec sheet (formulas: ``docs/cost_models.md``;
parameters: ``configs/physics/params.yaml``, refitted by ``servesim learn``).

The core is one function of the step's sums (``PhysicsCostModel.time_sums``), which ``step_time``
calls too, so the engine's fast path is exact.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.all_to_all import all_to_all_time
from simulator.cost.batch import Batch, StepSums
from simulator.cost.dtypes import Dtype
from simulator.cost.hybrid_terms import HybridTerms, effective_sums
from simulator.cost.interface import CostModel
from simulator.cost.network import NetworkConfig, cross_node_allreduce
from simulator.cost.physics_params import PhysicsParams
from simulator.cost.physics_terms import RankShape, chunk_wave, sequence_time, token_time
from simulator.cost.presets import HardwareSpec, ModelSpec
from simulator.cost.roofline import matmul_peak
from simulator.errors import InputError

_US = 1e-6
_TABLE = 16384
"""Token and sequence counts tabulated at construction (beyond: computed per step)."""


class PhysicsCostConfig(BaseModel):
    """Step time from per-operator roofline terms with learned efficiencies (any GPU preset,
    any dense or MoE model preset or ``config.json``, GQA or MLA; no profile needed)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["physics"] = "physics"
    """Discriminator of the cost-model union."""
    model: str
    """Model preset name (``configs/models/<name>.yaml``), YAML path, or the path of a Hugging
    Face ``config.json``."""
    hardware: str
    """Hardware preset name (``configs/hardware/<name>.yaml``) or YAML path: peak FLOPs (at the
    weights' dtype), memory bandwidth, and for ``tp > 1`` or expert parallelism the link's
    bandwidth and latency."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree: each rank computes its shard; 2 all-reduces per layer."""
    network: NetworkConfig | None = None
    """How nodes connect when ``tp`` exceeds the GPUs of one node (the hardware preset's
    ``gpus_per_node``): each all-reduce's cross-node part over this link; without it such a
    ``tp`` is refused (docs/cost_models.md, "TP across nodes")."""
    expert_parallel: int = Field(default=1, ge=1)
    """Expert-parallel ranks the routed experts are split over (set from ``parallel``): each
    MoE layer computes the rank's experts for its share of the tokens of all ranks, plus the
    all-to-all dispatch and combine over the link."""
    weight_dtype: Dtype | None = None
    """Dtype of the linear layers' weights (bf16, fp16, fp8, fp4), overriding the model's:
    their bytes, and their matmuls at the GPU's peak for it (a GPU without it: an error)."""
    kv_dtype: Dtype | None = None
    """Dtype of the KV cache, overriding the model's (bytes per element)."""
    params: str | None = None
    """Learned parameters (a ``servesim learn`` YAML); default: the shipped
    ``configs/physics/params.yaml``."""
    gpu_fit: bool = True
    """Use the GPU's own fitted scales when the parameters have them; ``false`` prices it
    from its spec sheet alone, as a GPU nobody measured."""


class PhysicsCostModel(CostModel):
    """Per-operator roofline terms with learned efficiencies (see the module docstring)."""

    times_from_sums = True

    def __init__(
        self, cfg: PhysicsCostConfig, model: ModelSpec, hw: HardwareSpec, params: PhysicsParams
    ) -> None:
        """Check the shapes and specs the terms need; tabulate the token and sequence terms."""
        model = model.deployed(cfg.tp, cfg.weight_dtype, cfg.kv_dtype)
        ep = cfg.expert_parallel
        if ep > 1:
            if not model.is_moe:
                raise InputError(
                    f"cost_model.expert_parallel: {ep}, but model {model.name} has no experts"
                )
            model.experts_per_rank(ep)  # EP must divide the experts
        self.cfg, self.model, self.hw = cfg, model, hw
        p, c_scale, m_scale = params.for_gpu(hw.name, cfg.gpu_fit)
        self._p = p
        self._flops = hw.peak_flops * c_scale
        where = "cost_model.weight_dtype" if cfg.weight_dtype else ""
        self._mm_flops = matmul_peak(model, hw, where) * c_scale
        self._bw = hw.hbm_bandwidth * m_scale
        self.shape = shape = RankShape.of(model, cfg.tp, ep)
        comm_fixed, self._comm_per_token = _link_constants(cfg.tp, ep, model, hw, params)
        cross_fixed, cross_per_token = cross_node_allreduce(model, cfg.tp, hw, cfg.network)
        comm_fixed += cross_fixed
        self._comm_per_token += cross_per_token
        counts = np.arange(_TABLE + 1, dtype=float)
        tokens = self._token_terms(counts)
        tokens = tokens + np.where(counts > 0, comm_fixed + self._comm_per_token * counts, 0.0)
        self._comm_fixed = comm_fixed
        self._token_table: list[float] = tokens.tolist()
        self._seq_table: list[float] = sequence_time(
            counts, shape, self._flops, self._bw, p, hw.hbm_bandwidth
        ).tolist()
        self._attention_constants()
        self._hybrid = HybridTerms.of(model, cfg.tp)  # windowed, indexer and state layers
        if self._hybrid is not None:
            self.times_from_sums = False
            base = model.num_layers * shape.prefill_flops_per_pair
            self._h_flops = model.attention_flops_per_pair / cfg.tp / base
            self._h_kv = model.kv_bytes_per_token_per_gpu(cfg.tp) / (
                model.num_layers * shape.kv_bytes_per_token
            )

    def _token_terms(self, counts: np.ndarray) -> np.ndarray:
        """Seconds of the token-parallel operators at each token count (no link time)."""
        return token_time(
            counts,
            self.shape,
            self._flops,
            self._bw,
            self._p,
            self.hw.hbm_bandwidth,
            self._mm_flops,
        )

    def _attention_constants(self) -> None:
        """Fold the attention terms' parameters into per-step constants (seconds)."""
        p, s, layers = self._p, self.shape, self.shape.layers
        kvb = s.kv_bytes_per_token
        rate = self._flops * p["prefill_compute"]
        self._a_launch = layers * p["attn_launch_us"] * _US
        self._a_causal = p["prefill_causal"]
        self._a_wave = chunk_wave(s.q_heads)
        self._a_pair = layers * s.prefill_flops_per_pair / rate
        self._a_ctx = layers * s.context_flops_per_token / rate  # MLA: decompress the latent
        self._a_dpair = layers * s.decode_flops_per_pair / rate  # MLA: decodes over the latent
        self._a_pread = layers * kvb / (self._bw * p["prefill_memory"])
        self._a_sharp = p["attn_sharpness"]
        self._a_dread = layers * kvb / (self._bw * p["decode_memory"])
        self._a_occ = p["decode_occupancy"] / math.sqrt(s.kv_heads)
        self._a_seq = layers * p["decode_seq_us"] * _US
        self._a_dstep = layers * p["decode_step_us"] * _US
        self._a_units = s.kv_heads / p["decode_units"]
        self._a_mixed = p["mixed_decode"]

    # -- the step ------------------------------------------------------------------------

    def time_sums(self, s: StepSums) -> float:
        """Seconds of a step with these sums: the whole model, in one function (the scalar
        form of ``physics_terms.attention_time`` for attention; tests compare the two)."""
        # by position: the engine passes plain tuples in StepSums order on its fast path
        num_seqs, nd, num_tokens, context, decode_context, all_pairs = s
        pc = num_tokens - nd
        t = self._tokens(num_tokens) + self._sequences(num_seqs) + self._a_launch
        if pc > 0:
            pairs = all_pairs - (decode_context + nd)
            kvp = context - decode_context
            tri = min(pc * (pc + 1) / 2, pairs)
            wave = self._a_wave
            pad = (math.ceil(pc / wave) * wave - pc) * kvp
            compute = self._a_pair * (pairs - tri + pad + tri / self._a_causal)
            if self._a_ctx:
                compute += self._a_ctx * kvp
            memory = self._a_pread * (kvp + pc)
            q = self._a_sharp
            t += (compute**q + memory**q) ** (1.0 / q)
        if nd > 0:
            occupancy = 1.0 + self._a_occ / math.sqrt(nd)
            read = self._a_dread * (decode_context + nd) * occupancy
            if self._a_dpair:
                q, dcompute = self._a_sharp, self._a_dpair * (decode_context + nd)
                read = (read**q + dcompute**q) ** (1.0 / q)
            if pc > 0:
                t += (read + self._a_seq * nd) * self._a_mixed
            else:  # decode_seq_time, and the decode kernel's fixed part
                t += read + self._a_seq * nd / (1.0 + nd * self._a_units) + self._a_dstep
        return t

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes."""
        if not batch.new_tokens:
            return 0.0
        if self._hybrid is not None:
            return self.time_sums(effective_sums(self._hybrid, batch, self._h_flops, self._h_kv))
        return self.time_sums(StepSums.of(batch))

    def allreduce_time(self, num_tokens: int) -> float:
        """Seconds of a step's tensor-parallel all-reduces and expert-parallel all-to-alls (in
        ``time_sums``; 0 on one GPU)."""
        if (self.cfg.tp == 1 and self.cfg.expert_parallel == 1) or num_tokens == 0:
            return 0.0
        return self._comm_fixed + self._comm_per_token * num_tokens

    def _tokens(self, n: int) -> float:
        table = self._token_table
        if n < len(table):
            return table[n]
        t = self._token_terms(np.array([float(n)]))[0]
        return float(t) + self._comm_fixed + self._comm_per_token * n

    def _sequences(self, n: int) -> float:
        table = self._seq_table
        if n < len(table):
            return table[n]
        return float(
            sequence_time(
                np.array([float(n)]),
                self.shape,
                self._flops,
                self._bw,
                self._p,
                self.hw.hbm_bandwidth,
            )[0]
        )


def _link_constants(
    tp: int, ep: int, model: ModelSpec, hw: HardwareSpec, params: PhysicsParams
) -> tuple[float, float]:
    """Seconds per step and per token of the link: the 2 ring all-reduces per layer under TP
    and, under EP, each MoE layer's all-to-all dispatch and combine (``all_to_all.py``:
    linear in the tokens), over the link as ``PhysicsParams.link_for`` gives it (latency and
    efficiency learned for NVLink GPUs, else the preset's); a preset without a link cannot
    price either."""
    if tp == 1 and ep == 1:
        return 0.0, 0.0
    if hw.interconnect_bandwidth is None:
        raise InputError(
            f"cost_model.hardware: preset {hw.name} has no interconnect_bandwidth, which the "
            f"physics model needs for tp={tp}, expert_parallel={ep}"
        )
    # NVLink presets: the learned latency and efficiency (all-reduce and all-to-all alike)
    bw, latency = params.link_for(hw)
    assert bw is not None
    fixed = per_token = 0.0
    if tp > 1:
        ar_bw, ar_latency = bw, latency
        num = 2 * model.num_layers
        ring = 2.0 * (tp - 1) / tp  # a ring all-reduce sends this much of the buffer
        per_token = num * ring * model.hidden_size * model.dtype_bytes / ar_bw
        fixed = num * ar_latency * _US  # presets without a latency: none measured, none added
    if ep > 1:
        k, h, n = model.num_experts_per_tok or 1, model.hidden_size, model.num_moe_layers
        zero = all_to_all_time(0.0, h, ep, bw, latency, top_k=k, bytes_per_element=2)
        one = all_to_all_time(1.0, h, ep, bw, latency, top_k=k, bytes_per_element=2)
        fixed, per_token = fixed + n * zero, per_token + n * (one - zero)
    return fixed, per_token
