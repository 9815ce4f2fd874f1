"""The ``profiled`` cost model: a step's time from operator profiles measured on the serving
stack, looked up for the step's exact batch (formulas and sources: ``docs/cost_models.md``).

- token-parallel operators (projections, MLP, norms, rotary) by the step's token count, times
  their calls per layer and the layer count, plus the once-per-step ones (embedding, final norm);
- attention per layer by (prefill chunk tokens, their cached context, decode sequences, their
  mean context), times the layer count;
- per-sequence operators (LM head, sampler) by the number of scheduled sequences (vLLM computes
  logits for the last token of every scheduled sequence, partial prefills included);
- what the profile lacks from the roofline of the model and hardware presets: attention (Vidur's
  MLP files), the LM head, and the 2 all-reduces per layer of tensor parallelism.

Between profiled points every operator is interpolated linearly, outside them extrapolated
linearly, with one warning per run. ``step_time`` runs once per simulated step: tables of every
integer token and sequence count are precomputed (numpy.interp), and a decode step's
attention per decode count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.batch import Batch, StepSums
from simulator.cost.interface import CostModel
from simulator.cost.network import NetworkConfig, cross_node_allreduce
from simulator.cost.presets import Dtype, HardwareSpec, ModelSpec
from simulator.cost.profile_checks import check_shape, moe_table
from simulator.cost.profiled_experts import ProfiledExperts
from simulator.cost.profiles import Curve, OperatorProfile, ProfileFormat
from simulator.cost.profiles.moe import MoeTable
from simulator.errors import InputError, warn


class ProfiledCostConfig(BaseModel):
    """Step time from operator profiles measured on the serving stack (LLMServingSim bundles,
    Vidur MLP profiles), interpolated for each step's batch."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["profiled"] = "profiled"
    """Discriminator of the cost-model union."""
    profile: str
    """The profile: an LLMServingSim bundle folder (``meta.yaml``, ``tp<N>/``) or a Vidur
    ``mlp.csv``; relative to the working directory, or absolute."""
    format: ProfileFormat = "llmservingsim"
    """Profile format: ``llmservingsim`` or ``vidur-mlp``."""
    model: str
    """Model preset name (``configs/models/<name>.yaml``) or YAML path: layer count, and the
    shape behind what the profile lacks."""
    hardware: str
    """Hardware preset name (``configs/hardware/<name>.yaml``) or YAML path: memory for the KV
    budget, peaks and interconnect for what the profile lacks."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree: the profile's ``tp<N>`` tables, and the all-reduces added."""
    compute_efficiency: float = Field(default=0.6, gt=0, le=1)
    """Achieved fraction of ``peak_flops`` for the roofline parts (as the roofline model)."""
    memory_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achieved fraction of ``hbm_bandwidth`` for the roofline parts (as the roofline model)."""
    interconnect_bandwidth: float | None = Field(default=None, gt=0)
    """Per-GPU one-way link bandwidth for the ring all-reduces, bytes/s; default: the
    hardware preset's (with neither, ``tp > 1`` leaves the all-reduces out, with a warning)."""
    allreduce_latency_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Fixed latency of one all-reduce, microseconds; default: the hardware preset's, else 0."""
    weight_dtype: Dtype | None = None
    """Dtype of the weights the profile was measured with, overriding the model's: the KV
    budget's weight bytes (the profile's times are what they are)."""
    kv_dtype: Dtype | None = None
    """Dtype of the KV cache, overriding the model's: the KV budget and roofline attention."""
    network: NetworkConfig | None = None
    """How nodes connect when ``tp`` exceeds the GPUs of one node (the hardware preset's
    ``gpus_per_node``): each all-reduce's cross-node part over this link; without it such a
    ``tp`` is refused (docs/cost_models.md, "TP across nodes")."""
    expert_parallel: int = Field(default=1, ge=1)
    """GPUs the routed experts are split over (set from ``parallel``: the data-parallel ranks
    times ``tp``): each MoE layer computes its share of the experts for the tokens of all DP
    ranks, plus their all-gather and reduce-scatter over the link (``profiled_experts.py``)."""
    skew: bool = True
    """Apply the profile's skew correction where it has one (LLMServingSim's ``skew_fit``:
    decodes of different contexts are slower than at their mean). It needs each decode's
    context, so the engine then times decode steps one by one (no fast path)."""


class ProfiledCostModel(CostModel):
    """Interpolated operator times of the step's exact batch (see the module docstring)."""

    times_from_sums = True

    def __init__(
        self, cfg: ProfiledCostConfig, model: ModelSpec, hw: HardwareSpec, profile: OperatorProfile
    ) -> None:
        """Precompute the per-token, per-sequence and decode-attention tables."""
        model = model.deployed(cfg.tp, cfg.weight_dtype, cfg.kv_dtype)
        check_shape(profile, model)
        self.cfg, self.model, self.hw, self.profile = cfg, model, hw, profile
        self.num_layers = model.num_layers
        self._compute_rate = hw.peak_flops * cfg.compute_efficiency
        self._memory_rate = hw.hbm_bandwidth * cfg.memory_efficiency
        comm_fixed, comm_per_token = self._allreduce_constants()
        if not profile.includes_tp_comm:  # the all-reduces' cross-node part, if any
            cross_fixed, cross_per_token = cross_node_allreduce(model, cfg.tp, hw, cfg.network)
            comm_fixed, comm_per_token = comm_fixed + cross_fixed, comm_per_token + cross_per_token
        self._experts = self._expert_layers(moe_table(profile, model))
        # an MoE model's dense MLP operators run in its dense layers only
        tokens = _weighted_sum(
            [(calls * _layers_of(name, model), c) for name, (calls, c) in profile.per_layer.items()]
            + [(1, c) for c in profile.per_step.values()]
        )
        if tokens is None:
            raise InputError(f"cost_model.profile: {profile.source}: no token-parallel operators")
        self._tokens = tokens
        # one entry per token count 0..max profiled: all token-parallel work and the all-reduces
        counts = np.arange(int(self._tokens.hi) + 1)
        self._comm = (comm_fixed, comm_per_token)
        token_times = self._tokens.table(counts) + comm_fixed + comm_per_token * counts
        self._dense_table = token_times.tolist()
        if self._experts is not None:  # the MoE layers, by the step's tokens (no-op for dense)
            token_times = token_times + np.array([self._moe_time(int(n)) for n in counts])
        self._token_table = token_times.tolist()
        self._seqs = _weighted_sum([(1, c) for c in profile.per_sequence.values()])
        self._roofline_head = "lm_head" not in profile.per_sequence
        # up to the most profiled sequences; with none profiled (the roofline's LM head), 4096
        seq_counts = np.arange(int(self._seqs.hi if self._seqs else 4096) + 1)
        self._seq_table = self._sequence_times(seq_counts).tolist()
        self._attn = profile.attention
        self._skew = profile.skew if cfg.skew else None
        # the skew correction needs every decode's context: no timing from sums then
        self.times_from_sums = self._skew is None
        self._decode_rows = self._decode_attention_rows()
        self._limits = self._profiled_limits()
        self._warned = False

    def _allreduce_constants(self) -> tuple[float, float]:
        """Seconds per step and per token of the 2 all-reduces per layer under TP."""
        cfg, model = self.cfg, self.model
        if cfg.tp == 1 or self.profile.includes_tp_comm:
            return 0.0, 0.0
        bandwidth = cfg.interconnect_bandwidth or self.hw.interconnect_bandwidth
        if bandwidth is None:  # as the roofline model: no link named, no link time
            warn(
                f"cost_model: tp={cfg.tp} but neither cost_model.interconnect_bandwidth nor "
                f"hardware preset {self.hw.name} names the GPUs' link: the all-reduces are "
                "left out (steps come out too fast)"
            )
            return 0.0, 0.0
        latency = cfg.allreduce_latency_us
        if latency is None:
            latency = self.hw.allreduce_latency_us or 0.0
        num = 2 * model.num_layers
        ring = 2.0 * (cfg.tp - 1) / cfg.tp  # a ring all-reduce sends this much of the buffer
        return num * latency * 1e-6, num * ring * model.hidden_size * model.dtype_bytes / bandwidth

    def _expert_layers(self, table: MoeTable | None) -> ProfiledExperts | None:
        """The MoE layers' pricing: the table, the EP degree, the DP ranks' link."""
        if table is None:
            return None
        cfg, hw = self.cfg, self.hw
        ep, link = cfg.expert_parallel, None
        bandwidth = cfg.interconnect_bandwidth or hw.interconnect_bandwidth
        if ep > 1 and bandwidth is not None:  # no link named: checked by dp_scenario
            latency = cfg.allreduce_latency_us
            link = (bandwidth, (hw.allreduce_latency_us or 0.0) if latency is None else latency)
        dp = max(1, ep // cfg.tp)
        return ProfiledExperts(table, self.model, ep, dp, link, self._memory_rate)

    def _moe_time(self, tokens: int) -> float:
        """All MoE layers of a step of ``tokens`` tokens on each DP rank alike."""
        return 0.0 if self._experts is None else self._experts.time(tokens)

    def _sequence_times(self, seqs: np.ndarray) -> np.ndarray:
        """Per-sequence work of ``seqs`` sequences: the profiled operators, and the LM head's
        roofline (its weights read once, its matmul per sequence) when it is not profiled."""
        out = self._seqs.table(seqs) if self._seqs is not None else np.zeros(len(seqs))
        if self._roofline_head:
            m, tp = self.model, self.cfg.tp
            flops = 2.0 * m.vocab_size * m.hidden_size / tp * seqs
            weights = m.vocab_size * m.hidden_size * m.dtype_bytes / tp
            out = out + np.maximum(flops / self._compute_rate, weights / self._memory_rate)
        return np.where(seqs > 0, out, 0.0)

    def _decode_attention_rows(self) -> list[Curve | None]:
        """Per decode count ``n`` up to the profiled most: all layers' attention of ``n``
        decodes by their mean context, evaluated at every profiled decode context (between
        them the lookup is linear, so the row equals the lookup everywhere)."""
        attn = self._attn
        if attn is None:
            return []
        kvds = [k for k in attn.decode_contexts() if k > 0]
        if not kvds:
            return []
        table = self.num_layers * attn.decode_table(kvds, int(attn.bounds[2][1]))
        return [None, *(Curve(kvds, row.tolist()) for row in table[1:])]

    def _profiled_limits(self) -> tuple[float, ...]:
        """Largest profiled tokens, sequences and attention axes (beyond: extrapolation)."""
        attn = self._attn.bounds if self._attn is not None else [(0, float("inf"))] * 4
        seqs = self._seqs.hi if self._seqs is not None else float("inf")
        return (self._tokens.hi, seqs, *(hi for _, hi in attn))

    # -- the step ------------------------------------------------------------------------

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes."""
        return self._step(batch, None)

    def step_time_in_dp(self, batch: Batch, tokens_across_dp: Sequence[int], rank: int) -> float:
        """Seconds of DP rank ``rank``'s step when every rank ``i`` runs ``tokens_across_dp[i]``
        tokens (vLLM's padded counts) through its token-parallel layers: those at this rank's
        count, the MoE layers over all ranks' (``profiled_experts.py``), attention and the
        per-sequence work of its own ``batch``."""
        padded = tokens_across_dp[rank]
        dense = self._dense_table
        tokens = dense[padded] if padded < len(dense) else self._token_time(padded)
        if padded >= len(dense):  # extrapolated: the balanced MoE is in there, take it out
            tokens -= self._moe_time(padded)
        if self._experts is not None:
            tokens += self._experts.across_dp(tokens_across_dp, rank)
        return self._step(batch, tokens)

    def _step(self, batch: Batch, token_time: float | None) -> float:
        """``step_time``, with the token-parallel layers' time given (None: looked up)."""
        new, ctx = batch.new_tokens, batch.context_lens
        num_seqs = len(new)
        tokens = sum(new)
        skew = self._skew
        if tokens == num_seqs:  # every sequence computes one token: a decode step
            context = sum(ctx)
            if skew is None or num_seqs < 2:
                if token_time is None:
                    return self._decode_time(num_seqs, context)
                attention = self._decode_attention(num_seqs, context / num_seqs, context)
                return token_time + attention + self._sequence_time(num_seqs)
            mean = context / num_seqs
            longest = max(ctx)
            t_mean = self._decode_attention(num_seqs, mean, context)
            t_max = self._decode_attention(num_seqs, longest, longest * num_seqs)
            extra = self._skewed(0, 0, num_seqs, mean, longest, min(ctx), t_max - t_mean)
            if token_time is None:
                token_time = self._token_time(tokens)
            return token_time + t_mean + extra + self._sequence_time(num_seqs)
        # prefill chunks are few in a step: find them, and the decodes' sums by difference
        chunks = [(n, c) for n, c in zip(new, ctx, strict=True) if n != 1]
        nd = num_seqs - len(chunks)
        kvp = sum(c for _, c in chunks)
        mean = (sum(ctx) - kvp) / nd if nd else 0.0
        pc = tokens - nd
        attention = self._attention(pc, kvp, nd, mean, batch)
        if skew is not None and nd >= 2:
            decodes = [c for n, c in zip(new, ctx, strict=True) if n == 1]
            longest = max(decodes)
            if longest > mean:
                gap = self._attention(pc, kvp, nd, longest, batch) - attention
                attention += self._skewed(pc, kvp, nd, mean, longest, min(decodes), gap)
        if token_time is None:
            token_time = self._token_time(tokens)
        return token_time + attention + self._sequence_time(num_seqs)

    def time_sums(self, sums: StepSums) -> float:
        """``step_time`` of a step with these sums when the skew correction is off (with it
        on, the engine never calls this): the same lookups on the same numbers."""
        num_seqs, nd, num_tokens, context, decode_context, pairs = sums
        if num_tokens == num_seqs:
            return self._decode_time(num_seqs, context)
        mean = decode_context / nd if nd else 0.0
        pc = num_tokens - nd
        attention = self._attention(
            pc, context - decode_context, nd, mean, None, counts=(pairs, context + num_tokens)
        )
        return self._token_time(num_tokens) + attention + self._sequence_time(num_seqs)

    def _decode_time(self, num_seqs: int, context: int) -> float:
        """Seconds of a step decoding ``num_seqs`` sequences with ``context`` KV tokens in all
        (exactly ``step_time`` of any such batch when the skew correction is off: both go
        through here; with it on, the engine never calls this)."""
        return (
            self._token_time(num_seqs)
            + self._decode_attention(num_seqs, context / num_seqs, context)
            + self._sequence_time(num_seqs)
        )

    def _decode_attention(self, num_seqs: int, mean: float, context: float) -> float:
        """All layers' attention of ``num_seqs`` decodes of mean context ``mean``."""
        rows = self._decode_rows
        if num_seqs < len(rows):
            row = rows[num_seqs]
            assert row is not None
            if mean > row.hi:
                self._extrapolating(f"kv_decode {mean:g} beyond the profiled {row.hi:g}")
            return row.at(mean)
        return self._attention(0, 0, num_seqs, mean, None, int(context))

    def _skewed(
        self, pc: int, kvp: int, nd: int, mean: float, longest: int, shortest: int, gap: float
    ) -> float:
        """The skew correction's extra attention time: ``alpha`` of the ``gap`` between the
        uniform batch at the longest context and at the mean (none if not longer)."""
        if self._skew is None or gap <= 0:
            return 0.0
        spread = longest - shortest
        rate = (mean - shortest) / spread if spread > 0 else 0.5
        return self._skew.alpha(pc, nd, rate, longest, kvp) * gap

    def _token_time(self, tokens: int) -> float:
        table = self._token_table
        if tokens < len(table):
            return table[tokens]
        self._extrapolating(f"{tokens} tokens beyond the profiled {self._tokens.hi:g}")
        fixed, per_token = self._comm
        return self._tokens.at(tokens) + fixed + per_token * tokens + self._moe_time(tokens)

    def _sequence_time(self, seqs: int) -> float:
        table = self._seq_table
        if seqs < len(table):
            return table[seqs]
        if self._seqs is not None:
            self._extrapolating(f"{seqs} sequences beyond the profiled {self._seqs.hi:g}")
        return float(self._sequence_times(np.array([seqs]))[0])

    def _attention(
        self,
        pc: int,
        kvp: int,
        nd: int,
        kvd: float,
        batch: Batch | None,
        context: int = 0,
        counts: tuple[float, float] | None = None,
    ) -> float:
        """All layers' attention: looked up in the profile, else the roofline (from the
        batch, or its ``counts``: causal query-key pairs, KV tokens read)."""
        attn = self._attn
        if attn is None:
            if counts is None:
                counts = _roofline_attention_counts(pc, kvp, nd, kvd, batch, context)
            pairs, read = counts
            m, tp = self.model, self.cfg.tp
            flops = m.attention_flops_per_pair / tp * pairs
            nbytes = m.kv_bytes_per_token_per_gpu(tp) * read
            return max(flops / self._compute_rate, nbytes / self._memory_rate)
        limits = self._limits
        if pc > limits[2] or kvp > limits[3] or nd > limits[4] or kvd > limits[5]:
            self._extrapolating(attn.outside(pc, kvp, nd, kvd) or "attention")
        return self.num_layers * attn.at(pc, kvp, nd, kvd)

    def _extrapolating(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            warn(
                f"cost_model: {what}: extrapolating from the profile's last points "
                f"({self.profile.source}; warned once per run)"
            )


def _roofline_attention_counts(
    pc: int, kvp: int, nd: int, kvd: float, batch: Batch | None, context: int
) -> tuple[float, float]:
    """(causal query-key pairs, KV tokens read) of the step for the roofline attention."""
    if batch is None:  # a decode step: each decode sees its context and itself
        return context + nd, context + nd
    return batch.attention_pairs(), sum(batch.context_lens) + sum(batch.new_tokens)


def _weighted_sum(parts: list[tuple[int, Curve]]) -> Curve | None:
    """``sum(weight * curve)`` as one curve over the union of the curves' points (exact
    between them: each is linear between its own points)."""
    if not parts:
        return None
    xs = sorted({x for _, c in parts for x in c.xs})
    points = np.asarray(xs)
    total = sum(w * c.table(points) for w, c in parts)
    return Curve(xs, np.asarray(total).tolist())


_MLP_OPERATORS = ("gate_up_proj", "act_fn", "down_proj")


def _layers_of(operator: str, model: ModelSpec) -> int:
    """Layers a per-layer operator runs in: all, but a dense MLP's only in the dense layers."""
    return model.num_dense_layers if operator in _MLP_OPERATORS else model.num_layers
