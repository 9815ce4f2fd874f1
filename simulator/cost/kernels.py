"""The ``kernels`` cost model: a step's time as the sum of vLLM's kernels for that step's exact
batch, each looked up in NVIDIA's database of measured vLLM kernels (``aiconfigurator-core``,
``kernel_db.py``; formulas and sources: ``docs/cost_models.md``):

- by the step's tokens, every layer's GEMMs for this GPU's TP shard (QKV, O, gate-up, down;
  the MoE router and shared experts), its 2 all-reduces (vLLM's custom all-reduce as CUDA
  graphs replay it, by message size), its fused MoE (``moe_perf``, balanced routing), and what
  the database does not time (norms, rotary, activation, embedding: ``configs/kernels/
  overheads.yaml``, learned from operator profiles);
- by the step's sequences, the LM head's GEMM and the sampler (learned too);
- the decodes' attention (``generation_attention``) by their count and mean context, at least
  their KV's bytes at the kernel's rate from memory, and in a step with a prefill chunk
  a learned factor more (``overheads.yaml``'s ``mixed_decode``);
- the prefill chunks' attention (``context_attention``) by their count and causal query-key
  pairs per chunk (a chunk of ``n`` tokens after ``c`` cached ones does the work of a prefill
  of ``L`` tokens from empty with ``L (L + 1) / 2 = n c + n (n + 1) / 2``).

Everything is a function of the step's ``StepSums``, tabulated at construction, so
``step_time`` is ``time_sums`` of the batch's sums (the fast path is exact), but for the
decodes' spread of lengths (``skew``, on by default as ``profiled``'s), which needs the
longest decode: with it on the engine times decode steps from their batch. A step outside
the measured grids is extrapolated linearly, counted in ``extrapolated``, and warned about
once per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.cost.batch import Batch, StepSums
from simulator.cost.dtypes import Dtype
from simulator.cost.interface import CostModel
from simulator.cost.kernel_attention import AttentionRows
from simulator.cost.kernel_db import KernelDatabase
from simulator.cost.kernel_hybrid import refuse_hybrid
from simulator.cost.kernel_layers import (
    ModelKernels,
    launch_gaps,
    load_overheads,
    mixed_decode_extra,
    skew_alpha,
)
from simulator.cost.presets import HardwareSpec, ModelSpec
from simulator.cost.profiles import Curve
from simulator.errors import warn

_TOKENS = 16384
"""Token counts tabulated at construction (beyond: extrapolated per step)."""
_SEQS = 4096
"""Sequence counts tabulated at construction."""


class KernelsCostConfig(BaseModel):
    """Step time from NVIDIA's database of measured vLLM kernels (``pip install
    'servesim[kernels]'``) for GPUs it measured, summed for each step's exact batch."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["kernels"] = "kernels"
    """Discriminator of the cost-model union."""
    model: str
    """Model preset name (``configs/models/<name>.yaml``), YAML path, or the path of a Hugging
    Face ``config.json``: the shapes of the kernels looked up."""
    hardware: str
    """Hardware preset name or YAML path; its ``kernels_gpu`` names the database's GPU."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree: each GPU's GEMM shard and attention heads; 2 all-reduces per
    layer."""
    vllm_version: str | None = None
    """vLLM version of the kernel tables (e.g. ``0.24.0``); default: the newest measured on
    that GPU."""

    @field_validator("vllm_version", mode="before")
    @classmethod
    def _quoted(cls, value: object) -> object:
        # YAML reads 0.20 as the number 0.2: a version must be written as a string
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"write the version quoted, as '{value}' (a number drops zeros)")
        return value

    expert_parallel: int = Field(default=1, ge=1)
    """GPUs the routed experts are split over (set from ``parallel``): each MoE layer runs the
    fused MoE measured at this EP degree over the tokens of all data-parallel ranks, plus
    their NCCL all-gather and reduce-scatter."""
    weight_dtype: Dtype | None = None
    """Dtype of the linear layers' weights (bf16, fp8, fp4), overriding the model's: the GEMM
    and MoE tables' dtype."""
    kv_dtype: Dtype | None = None
    """Dtype of the KV cache (bf16, fp8), overriding the model's: the attention tables'."""
    skew: bool = True
    """Correct the decodes' attention for their spread of lengths (the tables time uniform
    batches): ``t(mean) + alpha (t(longest) - t(mean))``, ``alpha`` learned from
    LLMServingSim's skew fits. It needs each decode's context, so the engine then times
    decode steps one by one (``false``: the fast path, from the steps' sums, exact)."""


class KernelsCostModel(CostModel):
    """Measured vLLM kernels summed for the step's batch (see the module docstring)."""

    times_from_sums = True

    def __init__(self, cfg: KernelsCostConfig, model: ModelSpec, hw: HardwareSpec) -> None:
        """Open the GPU's tables and tabulate the token, sequence and attention terms."""
        refuse_hybrid(model)  # windowed, linear, Mamba, sparse layers: not read yet
        model = model.deployed(cfg.tp, cfg.weight_dtype, cfg.kv_dtype)
        self.cfg, self.model, self.hw = cfg, model, hw
        self.db = KernelDatabase.open(hw.kernels_gpu, cfg.vllm_version, hw.name)
        kernels = ModelKernels(self.db, model, cfg.tp, hw.hbm_bandwidth)
        self.source = kernels.where
        self._overheads = load_overheads(hw)
        self._gaps = gaps = launch_gaps()
        counts = np.arange(_TOKENS + 1, dtype=float)
        self._dense_curve = self._dense_terms(kernels, counts)
        dense = self._dense_curve.table(counts)
        dense[0] = 0.0
        self._dense_table: list[float] = dense.tolist()
        ep = cfg.expert_parallel
        self._moe_layers = model.num_moe_layers
        self._experts = kernels.experts(ep)
        self._exchange = _exchange_curves(kernels, ep) if ep > 1 else None
        self._bytes_per_token = model.hidden_size * model.dtype_bytes
        tokens = dense + self._moe_times(counts)
        self._token_table: list[float] = tokens.tolist()
        seqs = np.arange(_SEQS + 1, dtype=float)
        self._seq_table: list[float] = self._sequence_terms(kernels, seqs).tolist()
        self._attention = AttentionRows(self.db, kernels, model.num_layers)
        self._mixed = 1.0 + mixed_decode_extra(kernels.heads // kernels.kv_heads)
        """Decode attention's factor when a prefill chunk shares the step (learned)."""
        layers = model.num_layers
        self._attention_gaps = (
            layers * gaps["decode_attention"],
            layers * gaps["prefill_attention"],
        )
        """Seconds the attention calls of a step take beyond their kernels (learned)."""
        self._alpha = skew_alpha() if cfg.skew else 0.0
        self.times_from_sums = not cfg.skew
        self.extrapolated = 0
        """Lookups outside the measured grids (extrapolated) so far: a step may count twice
        when both its decodes and its chunks fall outside."""

    def _dense_terms(self, kernels: ModelKernels, counts: np.ndarray) -> Curve:
        """Seconds of the token-parallel layers but the routed experts, at each count."""
        m, o = self.model, self._overheads
        h, tp = m.hidden_size, self.cfg.tp
        d = m.dtype_bytes
        out = kernels.token_gemms(counts)
        heads = (kernels.heads + kernels.kv_heads) * m.head_dim
        per_layer = 2 * o["layernorm"].times(counts, 4 * h * d)
        per_layer += o["rotary_emb"].times(counts, 2 * heads * d)
        if m.qk_norm:
            per_layer += o["qk_norm"].times(counts, 2 * heads * d)
        allreduce = kernels.allreduce()
        if allreduce is not None:
            per_layer += 2 * np.where(counts > 0, allreduce.table(counts * h * d), 0.0)
        act = o["act_fn"].times(counts, 3 * m.intermediate_size / tp * d)
        out = out + m.num_layers * per_layer + m.num_dense_layers * act
        if m.is_moe:  # the experts' activation is inside the fused-MoE kernel's time
            width = (m.shared_expert_intermediate_size or 0) * m.num_shared_experts / tp
            out = out + m.num_moe_layers * o["act_fn"].times(counts, 3 * width * d)
        out = out + np.where(counts > 0, kernels.gemms_per_step() * self._gaps["gemm"], 0.0)
        out = out + o["embedding"].times(counts, 2 * h * d)
        out = out + o["final_layernorm"].times(counts, 4 * h * d)
        return Curve(counts.tolist(), np.asarray(out).tolist())

    def _moe_times(self, counts: np.ndarray) -> np.ndarray:
        """All MoE layers of steps of ``counts`` tokens on every DP rank alike (as
        ``_moe_across``, vectorised)."""
        if self._experts is None:
            return np.zeros(len(counts))
        total = counts * max(1, self.cfg.expert_parallel // self.cfg.tp)
        layer = self._experts.table(total)
        if self._exchange is not None:
            nbytes = total * (self.model.hidden_size * self.model.dtype_bytes)
            layer = layer + self._exchange[0].table(nbytes) + self._exchange[1].table(nbytes)
        return np.where(total > 0, self._moe_layers * layer, 0.0)

    def _moe_across(self, chunks: Sequence[int]) -> float:
        """Seconds of all MoE layers when DP rank ``i`` runs ``chunks[i]`` tokens."""
        if self._experts is None:
            return 0.0
        total = sum(chunks)
        if total <= 0:
            return 0.0
        layer = self._experts.at(total)
        if self._exchange is not None:  # all-gather the ranks' tokens, reduce-scatter back
            nbytes = total * self._bytes_per_token
            gather, scatter = self._exchange
            layer += gather.at(nbytes) + scatter.at(nbytes)
        return self._moe_layers * layer

    def _sequence_terms(self, kernels: ModelKernels, seqs: np.ndarray) -> np.ndarray:
        """Seconds of the LM head and the sampler over ``seqs`` sequences."""
        sampler = self._overheads["sampler"].times(seqs, self.model.vocab_size * 16)
        head = kernels.lm_head(seqs) + self._gaps["gemm"]
        return np.where(seqs > 0, head + sampler, 0.0)

    # -- the step ------------------------------------------------------------------------

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes: ``time_sums`` of its sums (and with ``skew``, the
        decodes' spread of lengths)."""
        new, ctx = batch.new_tokens, batch.context_lens
        n = len(new)
        if sum(new) == n:  # decodes only (most steps): their sums without another pass
            context = sum(ctx)
            t = self.time_sums((n, n, n, context, context, context + n))  # type: ignore[arg-type]
            if self._alpha and n > 1:
                t += self._spread(n, context / n, max(ctx), 1.0)
            return t
        sums = StepSums.of(batch)
        return self.time_sums(sums) + self._skewed(batch, sums)

    def _skewed(self, batch: Batch, sums: StepSums) -> float:
        """The extra attention of decodes of different lengths (0 without ``skew``)."""
        nd = sums.num_decodes
        if not self._alpha or nd < 2:
            return 0.0
        pairs = zip(batch.new_tokens, batch.context_lens, strict=True)
        longest = max(c for n, c in pairs if n == 1)
        mixed = self._mixed if sums.num_seqs > nd else 1.0  # a prefill chunk in the launch
        return self._spread(nd, sums.decode_context / nd, longest, mixed)

    def _spread(self, nd: int, mean: float, longest: int, factor: float) -> float:
        """``alpha`` of the gap between ``nd`` decodes at the longest context and at the
        mean (times ``factor``)."""
        if longest <= mean:
            return 0.0
        attn = self._attention
        gap = attn.decode(nd, float(longest))[0] - attn.decode(nd, mean)[0]
        return self._alpha * gap * factor

    def step_time_in_dp(self, batch: Batch, tokens_across_dp: Sequence[int], rank: int) -> float:
        """Seconds of DP rank ``rank``'s step when rank ``i`` runs ``tokens_across_dp[i]``
        tokens (vLLM's padded counts): the dense layers at this rank's count, the MoE layers
        over all ranks', attention and the per-sequence work of its own ``batch``."""
        num_seqs, nd, _, context, decode_context, pairs = StepSums.of(batch)
        padded = tokens_across_dp[rank]
        dense = self._dense_table
        token_time = dense[padded] if padded < len(dense) else self._dense_beyond(padded)
        token_time += self._moe_across(tokens_across_dp)
        attention = self._attend(num_seqs, nd, context, decode_context, pairs)
        skew = self._skewed(batch, StepSums.of(batch)) if self._alpha else 0.0
        return token_time + attention + self._sequence_time(num_seqs) + skew

    def time_sums(self, sums: StepSums) -> float:
        """Seconds of a step with these sums (the engine's fast path; ``step_time`` too)."""
        num_seqs, nd, num_tokens, context, decode_context, pairs = sums
        table = self._token_table
        if num_tokens < len(table):
            token_time = table[num_tokens]
        else:
            token_time = self._dense_beyond(num_tokens) + self._moe_times(np.array([num_tokens]))[0]
        attention = self._attend(num_seqs, nd, context, decode_context, pairs)
        return token_time + attention + self._sequence_time(num_seqs)

    def _attend(
        self, num_seqs: int, nd: int, context: int, decode_context: int, pairs: int
    ) -> float:
        """All layers' attention of ``nd`` decodes and ``num_seqs - nd`` prefill chunks."""
        attn = self._attention
        t = 0.0
        if nd:
            t, outside = attn.decode(nd, decode_context / nd)
            t += self._attention_gaps[0]
            if outside:
                self._outside(outside)
        chunks = num_seqs - nd
        if chunks:
            t *= self._mixed  # decodes in one varlen launch with the chunks
            per_chunk = (pairs - decode_context - nd) / chunks
            extra, outside = attn.prefill(chunks, per_chunk)
            t += extra + self._attention_gaps[1]
            if outside:
                self._outside(outside)
        return t

    def _dense_beyond(self, tokens: int) -> float:
        self._outside(f"{tokens} tokens beyond the {_TOKENS} tabulated")
        return self._dense_curve.at(tokens)

    def _sequence_time(self, seqs: int) -> float:
        table = self._seq_table
        if seqs < len(table):
            return table[seqs]
        self._outside(f"{seqs} sequences beyond the {_SEQS} tabulated")
        slope = table[-1] - table[-2]
        return table[-1] + slope * (seqs - _SEQS)

    def _outside(self, what: str) -> None:
        """Count a lookup outside the measured grids; warn about the first one."""
        self.extrapolated += 1
        if self.extrapolated == 1:
            warn(
                f"cost_model: {what}: extrapolated from the last measured points of the "
                f"{self.source} (steps like it are counted; warned once per run)"
            )


def _exchange_curves(kernels: ModelKernels, ep: int) -> tuple[Curve, Curve]:
    """NCCL's all-gather and reduce-scatter over ``ep`` GPUs, by bytes."""
    return kernels.nccl("all_gather", ep), kernels.nccl("reduce_scatter", ep)
