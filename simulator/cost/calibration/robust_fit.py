"""The robust fit behind ``servesim calibrate``: non-negative, relative-error coefficients of
the ``fitted`` cost model's features, outliers weighed down (Tukey biweights)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.cost.features import (
    FEATURES,
    KNEE_GRID,
    Array,
    FeatureScales,
    uniform_features,
)
from simulator.errors import InputError


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


def _robust_scale(r: Array) -> float:
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


def _row_scales(r: Array, strata: Array) -> Array:
    """Robust scale per stratum, spread to its rows: decodes may scatter by 1% and prefills by
    5%, and one pooled scale would call every prefill an outlier."""
    out = np.empty(len(r))
    for s in np.unique(strata):
        m = strata == s
        out[m] = _robust_scale(r[m])
    return out


def _irls(a: Array, x: Array, strata: Array, iters: int = 50) -> tuple[Array, Array]:
    """Iteratively reweighted NNLS from ``x`` with Tukey biweights on the log ratios."""
    w: Array = np.ones(a.shape[0])  # annotated: numpy 2.2 (Python 3.10) infers a 1-D shape type
    for _ in range(iters):
        # Weights from the log ratio (symmetric, see _log_start); the solve itself is in
        # relative error, which the log ratio approximates for the rows that keep weight.
        r = np.log(np.maximum(a @ x, 1e-12))
        u = np.abs(r) / _row_scales(r, strata)
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
