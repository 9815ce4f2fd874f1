"""The robust fit behind ``servesim calibrate``: non-negative, relative-error coefficients of
the ``fitted`` cost model's features, outliers weighed down (Tukey biweights)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simulator.cost.features import FEATURES, MIN_COEFFICIENTS, Array
from simulator.errors import InputError

_TUKEY_C = 4.685
# Below this the relative residuals are "exact": 0.1% is far under any GPU timing noise, and a
# floor keeps the robust scale from collapsing to 0 on noiseless (synthetic) data.
_SCALE_FLOOR = 1e-3
# Width of the soft-L1 start: log ratios under ~5% count quadratically, larger ones linearly.
_SOFT_L1_SCALE = 0.05


def _median(v: Array) -> float:
    """Median of a small array. Why not np.median: on the ~10-400 rows of a fit its fixed cost
    (~60 us) dominated, and the inner cross-validation calls it ~10^5 times per preset."""
    s = np.sort(v)
    n = len(s)
    return 0.5 * float(s[(n - 1) // 2] + s[n // 2])


def _robust_scale(r: Array) -> float:
    """MAD-based scale of the residuals of all rows: the MAD ignores outliers by itself, and
    measuring it on the rows still in play only would shrink it each round until most rows
    are dropped (it did: 7 of 13 prefills on H100 TP 8)."""
    mad = _median(np.abs(r - _median(r)))
    return max(1.4826 * mad, _SCALE_FLOOR)


def _nnls(a: Array, b: Array, lower: Array) -> Array:
    """Least squares of ``a @ x ~ b`` subject to ``x >= lower`` (NNLS of the excess)."""
    from scipy.optimize import nnls  # here: a simulation never fits

    z, _ = nnls(a, b - a @ lower, maxiter=50 * a.shape[1])
    return np.asarray(z, dtype=float) + lower


def _soft_l1(r: Array) -> float:
    """Soft-L1 loss of the log ratios ``r`` (quadratic near 0, linear far out)."""
    return float(np.sum(2.0 * (np.sqrt(1.0 + (r / _SOFT_L1_SCALE) ** 2) - 1.0)))


def _log_start(a: Array, lower: Array, iters: int = 60) -> Array:
    """Robust start: minimise soft-L1 of ``log(a @ x)`` (log ratio of predicted to measured) over
    ``x >= lower``. A log ratio punishes 10x too high and 10x too low alike, where a relative error
    would let one absurdly low measurement drag every prediction down (an under-prediction can
    cost at most 100%, an over-prediction without bound).

    Gauss-Newton with iteratively reweighted NNLS steps and step halving (the soft-L1 weights
    are ``1 / sqrt(1 + (r / f)^2)``). Why not scipy's ``least_squares``: it reaches the same
    minimum (checked on every Splitwise group) but costs ~10x more on these small problems.
    """
    x = _nnls(a, np.ones(a.shape[0]), lower)
    x = np.maximum(x, 1e-3 * max(float(np.max(x)), 1e-12))
    r = np.log(np.maximum(a @ x, 1e-12))
    loss = _soft_l1(r)
    for _ in range(iters):
        jac = a / np.maximum(a @ x, 1e-12)[:, None]
        sw = (1.0 + (r / _SOFT_L1_SCALE) ** 2) ** -0.25
        # Linearised: r + J (x' - x) ~ 0, weighted by the soft-L1 weights, x' >= lower.
        target = _nnls(jac * sw[:, None], sw * (jac @ x - r), lower)
        step, new_loss, new_r, new_x = 1.0, loss, r, x
        while step > 1e-4:
            new_x = x + step * (target - x)
            new_r = np.log(np.maximum(a @ new_x, 1e-12))
            new_loss = _soft_l1(new_r)
            if new_loss <= loss:
                break
            step *= 0.5
        if new_loss > loss:
            break  # no descent along the Gauss-Newton direction: at the minimum
        done = loss - new_loss <= 1e-10 * max(loss, 1e-12)
        x, r, loss = new_x, new_r, new_loss
        if done:
            break
    return x


def _wnnls(a: Array, w: Array, lower: Array) -> Array:
    """Least squares of ``a @ x ~ 1`` with row weights ``w``, ``x >= lower``."""
    sw = np.sqrt(w)
    return _nnls(a * sw[:, None], sw, lower)


def _loses_a_stratum(w: Array, masks: list[np.ndarray]) -> bool:
    """Whether weights ``w`` leave half or more of the rows of some stratum (``masks``) at
    zero. An outlier is a minority by definition; without this guard a fit that trades one
    stratum for the other walks away from it: on a held-out third of Llama-2-70B H100 TP 2,
    every decode row fell to zero weight round by round, and ``kv_read`` (linear in the
    tokens on prefill rows) took a coefficient of ~800 to fit the prefills, timing decodes
    2-35x too slow (benchmarks/heldout_thirds.py)."""
    return any(2 * np.count_nonzero(w[m]) <= np.count_nonzero(m) for m in masks)


def _irls(a: Array, x: Array, lower: Array, strata: Array, iters: int = 50) -> tuple[Array, Array]:
    """Iteratively reweighted NNLS from ``x`` with Tukey biweights on the log ratios.

    Each row is judged against the scatter of its own stratum at the start (decodes may
    scatter by 1% and prefills by 5%, and one pooled scale would call every prefill an
    outlier). The scale stays fixed from then on, as in an MM-estimate: re-measuring it each
    round made ~1 fit in 4 cycle between two weightings until the iteration cap."""
    r = np.log(np.maximum(a @ x, 1e-12))
    masks = [strata == s for s in np.unique(strata)]
    scale = np.empty(a.shape[0])
    for m in masks:
        scale[m] = _robust_scale(r[m])
    w: Array = np.ones(a.shape[0])  # annotated: numpy 2.2 (Python 3.10) infers a 1-D shape type
    for _ in range(iters):
        # Weights from the log ratio (symmetric, see _log_start); the solve itself is in
        # relative error, which the log ratio approximates for the rows that keep weight.
        u = np.abs(r) / scale
        w_new = np.where(u < _TUKEY_C, (1.0 - (u / _TUKEY_C) ** 2) ** 2, 0.0)
        if np.count_nonzero(w_new) < a.shape[1] or _loses_a_stratum(w_new, masks):
            break  # too few rows left to pin the fit: keep the last good solution
        x_new = _wnnls(a, w_new, lower)
        # 1e-7 relative: far below any change a prediction could show (the step times are
        # known to ~1%), and Tukey IRLS converges only linearly, so tighter costs many rounds.
        done = bool(np.all(np.abs(x_new - x) <= 1e-12 + 1e-7 * np.max(np.abs(x))))
        x, w = x_new, w_new
        r = np.log(np.maximum(a @ x, 1e-12))
        if done:
            break
    return x, w


def _identifiable(a: Array, tol: float = 1e-8) -> list[int]:
    """Columns that each add rank to the ones before (in ``FEATURES`` order): a column is kept
    if the part of it (unit-normalised) outside the span of the kept ones has norm > ``tol``
    (Gram-Schmidt, orthogonalised twice for accuracy)."""
    keep: list[int] = []
    basis: list[Array] = []
    for j in range(a.shape[1]):
        norm = float(np.linalg.norm(a[:, j]))
        if norm == 0.0:
            continue
        v = a[:, j] / norm
        for _ in range(2):
            for q in basis:
                v = v - (q @ v) * q
        rest = float(np.linalg.norm(v))
        if rest > tol * math.sqrt(a.shape[0]):
            keep.append(j)
            basis.append(v / rest)
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
    lower = np.array([MIN_COEFFICIENTS.get(FEATURES[j], 0.0) for j in cols]) * norm
    # Straight to Tukey from the robust start (an MM-estimate): Huber would keep a small weight
    # on a wild row, and in relative units a 15x over-prediction still swamps the fit.
    groups = np.zeros(len(y)) if strata is None else np.asarray(strata)
    x2, w = _irls(a, _log_start(a, lower), lower, groups)
    coef = np.zeros(x.shape[1])
    coef[cols] = x2 / norm
    dropped = tuple(FEATURES[j] for j in range(len(FEATURES)) if j not in cols)
    return coef, dropped, w
