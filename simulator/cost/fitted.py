"""The ``fitted`` cost model: roofline-shaped features of a step, weighted by coefficients that
``servesim calibrate`` fits to measured step times (``simulator/calibration.py``).

Every feature is a time in milliseconds *at the GPU's peak* (or a count), so a fitted
coefficient reads as an inverse efficiency (``gemm: 2.0`` = GEMMs run at 50% of the roofline) or
as a fixed cost in ms (``overhead``, ``prefill_step``, ``per_prefill_seq``, ``per_decode_seq``).
Coefficients are never negative: each feature is work that can only add time. Formulas and the
measured accuracy: ``docs/fidelity.md``.

A preset file holds the per-GPU constants (``scales``) next to the coefficients, so a fitted
model is self-contained: it does not re-read the model or hardware presets it was fitted for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.cost.batch import Batch
from simulator.cost.presets import HardwareSpec, ModelSpec, configs_dir, load_yaml_model
from simulator.errors import InputError

__all__ = [
    "FEATURES",
    "FeatureScales",
    "FitResult",
    "FittedCostConfig",
    "FittedCostModel",
    "FittedPreset",
    "KNEE_GRID",
    "KNEE_STEEPNESS",
    "batch_features",
    "fit_coefficients",
    "fit_preset_coefficients",
    "fitted_dir",
    "list_fitted",
    "load_fitted",
    "load_preset",
    "resolve_fitted_path",
    "uniform_features",
]

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

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    matmul_ms_per_token: float = Field(gt=0)
    """Dense-matmul time of one token at peak FLOP/s, per GPU (``2 * params / tp / peak``), ms."""
    weight_read_ms: float = Field(gt=0)
    """Time to stream the weights once from HBM at peak bandwidth, per GPU, ms."""
    attention_ms_per_pair: float = Field(gt=0)
    """Attention time (QK^T and AV) of one query-key pair over all layers at peak, per GPU, ms."""
    kv_read_ms_per_token: float = Field(gt=0)
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
        # QK^T and AV: 2 matmuls x 2 FLOPs per multiply-add, per (query, key) pair and head.
        attn_flops = 4.0 * model.num_layers * model.num_heads * model.head_dim
        return cls(
            matmul_ms_per_token=model.flops_per_token_matmul / (tp * hw.peak_flops) * ms,
            weight_read_ms=model.weight_bytes / (tp * hw.hbm_bandwidth) * ms,
            attention_ms_per_pair=attn_flops / (tp * hw.peak_flops) * ms,
            kv_read_ms_per_token=model.kv_bytes_per_token / (tp * hw.hbm_bandwidth) * ms,
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
    # A causal chunk of n queries on c cached keys: n*c pairs plus the n(n+1)/2 triangle.
    pairs = b * (n * c + n * (n + 1) / 2)
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
    new, ctx = batch.new_tokens, batch.context_lens
    tokens = sum(new)
    # Causal pairs n*c + n(n+1)/2 summed with map(mul): runs in C, called once per step.
    pairs = sum(map(mul, new, ctx)) + (sum(map(mul, new, new)) + tokens) // 2
    return step_features(len(new), new.count(1), tokens, sum(ctx), pairs, scales)


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


# -- fitting -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitResult:
    """Outcome of one robust fit: coefficients per feature and which rows it trusted."""

    coefficients: dict[str, float]
    """Fitted value per name in ``FEATURES`` (0 for features left out)."""
    knee_tokens: int | None
    """Chosen ``knee_tokens`` (``None``: no ``gemm_large``)."""
    dropped: tuple[str, ...]
    """Features left out: not requested, zero on every row, or not identifiable from the rows."""
    weights: Array
    """Final robustness weight per row in [0, 1]; 0 marks a row the fit treated as an outlier."""


_TUKEY_C = 4.685
# Below this the relative residuals are "exact": 0.1% is far under any GPU timing noise, and a
# floor keeps the robust scale from collapsing to 0 on noiseless (synthetic) data.
_SCALE_FLOOR = 1e-3


def _robust_scale(r: Array, w: Array) -> float:
    """MAD-based scale of the residuals of all rows: the MAD ignores outliers by itself, and
    measuring it on the rows still in play only would shrink it each round until most rows
    are dropped (it did: 7 of 13 prefills on H100 TP 8)."""
    mad = float(np.median(np.abs(r - np.median(r))))
    return max(1.4826 * mad, _SCALE_FLOOR)


def _log_start(a: Array) -> Array:
    """Robust start: minimise soft-L1 of ``log(a @ x)`` (log ratio of predicted to measured) over
    ``x >= 0``. A log ratio punishes 10x too high and 10x too low alike, where a relative error
    would let one absurdly low measurement drag every prediction down (an under-prediction can
    cost at most 100%, an over-prediction without bound)."""
    from scipy.optimize import least_squares, nnls  # here: a simulation never fits

    x0, _ = nnls(a, np.ones(a.shape[0]), maxiter=50 * a.shape[1])
    x0 = np.maximum(x0, 1e-3 * max(float(np.max(x0)), 1e-12))

    def resid(x: Array) -> Array:
        return np.asarray(np.log(np.maximum(a @ x, 1e-12)), dtype=float)

    def jac(x: Array) -> Array:
        return np.asarray(a / np.maximum(a @ x, 1e-12)[:, None], dtype=float)

    res = least_squares(resid, x0, jac=jac, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.05)
    return np.asarray(res.x, dtype=float)


def _wnnls(a: Array, w: Array) -> Array:
    """Non-negative least squares of ``a @ x ~ 1`` with row weights ``w``."""
    from scipy.optimize import nnls

    sw = np.sqrt(w)
    x, _ = nnls(a * sw[:, None], sw, maxiter=50 * a.shape[1])
    return np.asarray(x, dtype=float)


def _row_scales(r: Array, w: Array, strata: Array) -> Array:
    """Robust scale per stratum, spread to its rows: decodes may scatter by 1% and prefills by
    5%, and one pooled scale would call every prefill an outlier."""
    out = np.empty(len(r))
    for s in np.unique(strata):
        m = strata == s
        out[m] = _robust_scale(r[m], w[m])
    return out


def _irls(a: Array, x: Array, strata: Array, iters: int = 50) -> tuple[Array, Array]:
    """Iteratively reweighted NNLS from ``x`` with Tukey biweights on the log ratios."""
    w = np.ones(a.shape[0])
    for _ in range(iters):
        # Weights from the log ratio (symmetric, see _log_start); the solve itself is in
        # relative error, which the log ratio approximates for the rows that keep weight.
        r = np.log(np.maximum(a @ x, 1e-12))
        u = np.abs(r) / _row_scales(r, w, strata)
        w_new = np.where(u < _TUKEY_C, (1.0 - (u / _TUKEY_C) ** 2) ** 2, 0.0)
        if np.count_nonzero(w_new) < a.shape[1]:
            break  # too few rows left to pin every coefficient: keep the last good solution
        x_new = _wnnls(a, w_new)
        done = np.allclose(x_new, x, rtol=1e-9, atol=1e-12)
        x, w = x_new, w_new
        if done:
            break
    return x, w


def _identifiable(a: Array, tol: float = 1e-9) -> list[int]:
    """Columns that each add rank to the ones before (in ``FEATURES`` order)."""
    keep: list[int] = []
    for j in range(a.shape[1]):
        if not np.any(a[:, j]):
            continue
        trial = a[:, [*keep, j]]
        s = np.linalg.svd(trial / np.linalg.norm(trial, axis=0), compute_uv=False)
        if s[-1] > tol * s[0] * math.sqrt(a.shape[0]):
            keep.append(j)
    return keep


def fit_coefficients(
    x: Array,
    y: Array,
    features: Sequence[str] = FEATURES,
    strata: Array | None = None,
) -> tuple[Array, tuple[str, ...], Array]:
    """Robust, non-negative, relative-error fit of ``x @ coef ~ y``.

    Relative error: row ``i`` is divided by ``y[i]``. Start from a soft-L1 fit of log ratios
    (outlier-resistant), then refine by Tukey biweight IRLS, which gives rows far off the fit
    zero weight; outliers are judged against the scatter of their own ``strata`` (e.g.
    prefill vs decode rows; default: one stratum). Returns (coefficients over all
    ``FEATURES`` columns, names of the features left out, final row weights).
    """
    y = np.asarray(y, dtype=float)
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise InputError("step_ms: every measured time must be a positive number")
    wanted = [j for j, name in enumerate(FEATURES) if name in features]
    a_all = x / y[:, None]
    cols = [wanted[j] for j in _identifiable(a_all[:, wanted])]
    if not cols:
        raise InputError("no feature is non-zero on these rows: nothing to fit")
    a = a_all[:, cols]
    norm = np.linalg.norm(a, axis=0)
    a = a / norm
    # Straight to Tukey from the robust start (an MM-estimate): Huber would keep a small weight
    # on a wild row, and in relative units a 15x over-prediction still swamps the fit.
    groups = np.zeros(len(y)) if strata is None else np.asarray(strata)
    x2, w = _irls(a, _log_start(a), groups)
    coef = np.zeros(x.shape[1])
    coef[cols] = x2 / norm
    dropped = tuple(FEATURES[j] for j in range(len(FEATURES)) if j not in cols)
    return coef, dropped, w


def _selection_loss(pred: Array, y: Array) -> float:
    """In-sample loss for choosing the knee: mean relative error, capped so that one wild row
    (which the robust fit ignores anyway) cannot decide."""
    return float(np.mean(np.minimum(np.abs(pred - y) / y, 0.5)))


def fit_preset_coefficients(
    num_seqs: Array,
    new_tokens: Array,
    context_len: Array,
    step_ms: Array,
    scales: FeatureScales,
    features: Sequence[str] = FEATURES,
    knee_grid: Sequence[int | None] = KNEE_GRID,
) -> FitResult:
    """Fit every knee in ``knee_grid`` and keep the one with the lowest in-sample loss."""
    best: tuple[float, FitResult] | None = None
    grid = knee_grid if "gemm_large" in features else (None,)
    for knee in grid:
        sc = scales.with_knee(knee)
        x = uniform_features(num_seqs, new_tokens, context_len, sc)
        strata = (np.asarray(new_tokens) > 1).astype(float)
        coef, dropped, w = fit_coefficients(x, step_ms, features, strata)
        if knee is not None and "gemm_large" in dropped:
            continue  # the same fit as knee=None
        loss = _selection_loss(x @ coef, np.asarray(step_ms, dtype=float))
        result = FitResult(dict(zip(FEATURES, map(float, coef), strict=True)), knee, dropped, w)
        if best is None or loss < best[0] - 1e-12:
            best = (loss, result)
    assert best is not None
    return best[1]


# -- presets and the cost model -------------------------------------------------------------


class FittedPreset(BaseModel):
    """A fitted cost-model preset file (``configs/fitted/<name>.yaml``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str
    """Short identifier, e.g. ``llama-2-70b_a100-80gb_tp8``."""
    model: str
    """Model preset the features were computed for."""
    hardware: str
    """Hardware preset the features were computed for."""
    tp: int = Field(ge=1)
    """Tensor-parallel degree of the measurements."""
    scales: FeatureScales
    """Per-GPU roofline constants (ms) that turn a step into feature values."""
    coefficients: dict[str, float]
    """Fitted weight per feature: ms for ``overhead`` and ``per_*_seq``, else a multiplier."""
    source: dict[str, Any] = Field(default_factory=dict)
    """Where the measurements came from (file, repository, commit, group, rows)."""
    heldout: dict[str, Any] = Field(default_factory=dict)
    """k-fold held-out error of this fitting recipe on its data, per step kind."""
    notes: str = ""
    """Free text: caveats of the data or of the fit."""

    @field_validator("coefficients")
    @classmethod
    def _known_nonnegative(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown feature(s) {unknown}; known: {list(FEATURES)}")
        bad = {k: v for k, v in value.items() if not (math.isfinite(v) and v >= 0)}
        if bad:
            raise ValueError(f"coefficients must be finite and >= 0, got {bad}")
        if not any(v > 0 for v in value.values()):
            raise ValueError("at least one coefficient must be > 0")
        return value


class FittedCostConfig(BaseModel):
    """Cost model from a fitted preset (``servesim calibrate`` writes those)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["fitted"] = "fitted"
    """Discriminator of the cost-model union."""
    path: str
    """Preset name under ``configs/fitted/`` (without ``.yaml``) or a path to a preset YAML."""


class FittedCostModel:
    """Step time = sum of fitted coefficient x feature (ms), returned in seconds."""

    def __init__(self, preset: FittedPreset) -> None:
        """Keep the preset and its coefficients in ``FEATURES`` order."""
        self.preset = preset
        self.scales = preset.scales
        self._coef = [preset.coefficients.get(name, 0.0) for name in FEATURES]

    def step_ms(self, batch: Batch) -> float:
        """Milliseconds the step takes (0 for an empty batch)."""
        if not batch.new_tokens:
            return 0.0
        feats = batch_features(batch, self.scales)
        return float(sum(c * f for c, f in zip(self._coef, feats, strict=True)))

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes (0 for an empty batch)."""
        return self.step_ms(batch) * 1e-3

    def decode_time(self, num_seqs: int, context: int) -> float:
        """Seconds of a step that decodes ``num_seqs`` sequences holding ``context`` tokens of
        KV in all: exactly ``step_time`` of that batch, without building it."""
        feats = step_features(
            num_seqs, num_seqs, num_seqs, context, context + num_seqs, self.scales
        )
        return float(sum(c * f for c, f in zip(self._coef, feats, strict=True))) * 1e-3

    def predict_ms(self, num_seqs: Array, new_tokens: Array, context_len: Array) -> Array:
        """Milliseconds of uniform batches, vectorised (what ``servesim predict`` uses)."""
        x = uniform_features(num_seqs, new_tokens, context_len, self.scales)
        return np.asarray(x @ np.asarray(self._coef), dtype=float)


def fitted_dir() -> Path:
    """Directory of the shipped fitted presets (``configs/fitted``)."""
    return configs_dir() / "fitted"


def list_fitted() -> list[str]:
    """Names of the shipped fitted presets, sorted."""
    folder = fitted_dir()
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if p.is_file())


def resolve_fitted_path(name_or_path: str) -> Path:
    """A preset name (``configs/fitted/<name>.yaml``) or a YAML path -> the file."""
    path = Path(name_or_path)
    looks_like_path = "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))
    if looks_like_path or path.is_file():
        if not path.is_file():
            raise InputError(f"fitted cost model {name_or_path}: file not found")
        return path
    candidate = fitted_dir() / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    known = ", ".join(list_fitted()) or "none"
    raise InputError(f"unknown fitted preset {name_or_path!r}; known: {known}")


def load_preset(name_or_path: str) -> FittedPreset:
    """Read and validate a fitted preset; any problem -> ``InputError`` naming the file."""
    return load_yaml_model(resolve_fitted_path(name_or_path), FittedPreset)


def load_fitted(cfg: FittedCostConfig) -> FittedCostModel:
    """The cost model of a fitted preset; a bad or missing file -> ``InputError`` naming it."""
    return FittedCostModel(load_preset(cfg.path))
