"""The features of the ``fitted`` cost model: a step's shape as roofline-scaled times (ms at the
GPU's peak) and counts, which fitted coefficients weigh (``fitted.py``; ``docs/fidelity.md``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.batch import Batch, uniform_attention_pairs
from simulator.cost.presets import HardwareSpec, ModelSpec
from simulator.errors import InputError

FEATURES: tuple[str, ...] = (
    "overhead",
    "prefill_step",
    "per_prefill_seq",
    "per_decode_seq",
    "gemm",
    "gemm_large",
    "kv_read",
    "attention",
)
"""Feature names, in design-matrix column order (see ``uniform_features``). The order matters
when rows cannot tell two features apart: the later one is left out (on decode-only rows
``attention`` is proportional to ``kv_read``, and decodes are bound by the KV reads)."""

DEFAULT_FEATURES: tuple[str, ...] = tuple(f for f in FEATURES if f != "attention")
"""Features ``calibrate`` fits unless told otherwise: all but ``attention``. On random
held-out thirds of the Splitwise points a free attention coefficient was the worst
extrapolator (fitted on prompts of at most 1k tokens it reached ~90x the peak-rate time and
timed 8k-token prompts 2-3x too slow), and offering it to the shape choice made more groups
miss (docs/fidelity.md). Ask for it with ``--features``."""

OPTIONAL_FEATURES: tuple[str, ...] = ("prefill_step", "per_prefill_seq", "attention")
"""Prefill terms the fit may leave out: ``calibrate`` chooses which of them to keep (and the
knee of ``gemm_large``, or none) by an inner cross-validation (``calibration/shape.py``)."""

MIN_COEFFICIENTS: dict[str, float] = {"gemm": 1.0}
"""Lower bounds of coefficients (others: 0). ``gemm`` is the GEMM time at the GPU's peak FLOP/s,
or the weights streamed at its peak bandwidth: a coefficient (1 / efficiency) below 1 would run
faster than the hardware. Without the bound, a fit on prefills of >= 1k tokens only gave
``gemm`` 0, all matmul time to ``gemm_large`` and 124 ms to ``prefill_step``, timing a
128-token prompt 2.5x too slow (BLOOM H100 power-capped, benchmarks/heldout_thirds.py)."""

KNEE_GRID: tuple[int | None, ...] = (
    None,
    *(int(round(512 * 2 ** (i / 2))) for i in range(11)),
)
"""Candidate ``knee_tokens`` the fit chooses from, half an octave apart from 512 to 16384
(``None``: no ``gemm_large`` term). Half octaves because Splitwise's prompt sizes are whole
octaves apart and a transition often falls between two of them (H100: between 2k and 4k)."""

KNEE_STEEPNESS = 4.0
"""Exponent ``h`` of the ``gemm_large`` transition ``1 / (1 + (knee / tokens) ** h)``: 10% of
the way at ``knee / 3 ** (1/2)``, 90% at ``knee * 3 ** (1/2)`` (a factor 3 in step size)."""

Array = NDArray[np.float64]


class FeatureScales(BaseModel):
    """Per-GPU roofline constants that turn a step's shape into feature values (ms)."""

    model_config = ConfigDict(extra="forbid")

    matmul_ms_per_token: float = Field(gt=0, allow_inf_nan=False)
    """Dense-matmul time of one token at peak FLOP/s, per GPU (``2 * params / tp / peak``), ms."""
    weight_read_ms: float = Field(gt=0, allow_inf_nan=False)
    """Time to stream the weights once from HBM at peak bandwidth, per GPU, ms."""
    attention_ms_per_pair: float = Field(gt=0, allow_inf_nan=False)
    """Attention time (QK^T and AV) of one query-key pair over all layers at peak, per GPU, ms."""
    kv_read_ms_per_token: float = Field(gt=0, allow_inf_nan=False)
    """Time to read one token's K and V over all layers at peak bandwidth, per GPU, ms."""
    knee_tokens: int | None = Field(default=None, gt=0)
    """Step size (tokens) at which ``gemm_large`` is half in: it adds ``s(T)`` x the step's
    matmul time, ``s(T) = 1 / (1 + (knee_tokens / T) ** KNEE_STEEPNESS)``; ``None``: no such
    term."""

    @classmethod
    def from_specs(cls, model: ModelSpec, hw: HardwareSpec, tp: int) -> FeatureScales:
        """Constants of ``model`` sharded over ``tp`` GPUs of kind ``hw`` (no knee)."""
        if tp < 1:
            raise InputError(f"tp must be >= 1, got {tp}")
        ms = 1e3
        # each GPU reads its KV heads: one whole head when tp exceeds them (vLLM replicates)
        kv_share = tp if model.is_mla else min(tp, model.num_kv_heads)
        return cls(
            matmul_ms_per_token=model.flops_per_token_matmul / (tp * hw.peak_flops) * ms,
            weight_read_ms=model.weight_bytes / (tp * hw.hbm_bandwidth) * ms,
            attention_ms_per_pair=model.attention_flops_per_pair / (tp * hw.peak_flops) * ms,
            kv_read_ms_per_token=model.kv_bytes_per_token / (kv_share * hw.hbm_bandwidth) * ms,
        )

    def with_knee(self, knee_tokens: int | None) -> FeatureScales:
        """A copy with another ``knee_tokens``."""
        return self.model_copy(update={"knee_tokens": knee_tokens})


def _transition(tokens: Array, knee: int | None) -> Array:
    """Share of the ``gemm_large`` cost a step of ``tokens`` pays: a smooth step in
    log(tokens) from 0 to 1, half-way at ``knee`` (all 0 without a knee).

    Why a step and not a ramp from 0: on Splitwise's GPUs the per-token prefill cost is flat
    up to ~2k tokens per step, 1.3-2x higher from ~4k on, and flat again beyond (1 x 4096 and
    8 x 512 prompts cost the same per token, so it follows the step's size, not attention).
    """
    if knee is None:
        return np.zeros_like(tokens)
    safe = np.maximum(tokens, 1.0)
    return np.asarray(1.0 / (1.0 + (knee / safe) ** KNEE_STEEPNESS), dtype=float)


def uniform_features(
    num_seqs: Array | Sequence[float],
    new_tokens: Array | Sequence[float],
    context_len: Array | Sequence[float],
    scales: FeatureScales,
) -> Array:
    """Design matrix (rows x ``FEATURES``) of uniform batches: ``num_seqs`` sequences each
    computing ``new_tokens`` tokens on top of ``context_len`` cached ones."""
    b = np.asarray(num_seqs, dtype=float)
    n = np.asarray(new_tokens, dtype=float)
    c = np.asarray(context_len, dtype=float)
    prefill = (n > 1).astype(float)
    tokens = b * n
    matmul = tokens * scales.matmul_ms_per_token
    ramp = _transition(tokens, scales.knee_tokens)
    pairs = uniform_attention_pairs(b, n, c)
    return np.column_stack(
        [
            np.ones_like(tokens),
            prefill,
            b * prefill,
            b * (1.0 - prefill),
            np.maximum(matmul, scales.weight_read_ms),
            ramp * matmul,
            b * (c + n) * scales.kv_read_ms_per_token,
            pairs * scales.attention_ms_per_pair,
        ]
    )


def batch_features(batch: Batch, scales: FeatureScales) -> list[float]:
    """Feature values (``FEATURES`` order) of one step, mixed prefill and decode allowed."""
    new = batch.new_tokens
    return step_features(
        len(new), new.count(1), sum(new), sum(batch.context_lens), batch.attention_pairs(), scales
    )


def step_features(
    num_seqs: int, decodes: int, tokens: int, context: int, pairs: int, scales: FeatureScales
) -> list[float]:
    """Feature values of a step from its sums: sequences, decodes (1-token sequences),
    tokens computed, tokens already in KV, and causal query-key pairs."""
    knee = scales.knee_tokens
    ramp = 0.0 if knee is None else 1.0 / (1.0 + (knee / tokens) ** KNEE_STEEPNESS)
    matmul = tokens * scales.matmul_ms_per_token
    return [
        1.0,
        1.0 if decodes < num_seqs else 0.0,
        float(num_seqs - decodes),
        float(decodes),
        max(matmul, scales.weight_read_ms),
        ramp * matmul,
        (context + tokens) * scales.kv_read_ms_per_token,
        pairs * scales.attention_ms_per_pair,
    ]
