"""The fitted model's shape (which optional terms, which ``knee_tokens``), chosen by an inner
cross-validation on the training rows only, with fewer terms when the points are few."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.cost.calibration.robust_fit import fit_coefficients
from simulator.cost.features import (
    DEFAULT_FEATURES,
    FEATURES,
    KNEE_GRID,
    OPTIONAL_FEATURES,
    Array,
    FeatureScales,
    uniform_features,
)

INNER_FOLDS = 10
"""Folds of the inner cross-validation that chooses the shape (fewer if the points are few).
10, not 5: a Splitwise training set holds 8-9 prefill points, so each fold holds out at most
one of them (leave-one-out on prefills), and which prefills happen to share a fold no longer
sways the choice. On 30 random held-out thirds (benchmarks/heldout_thirds.py) 5 folds left 29
of the 720 (group, kind) cells above 12% and a worst cell of 67%, 10 folds 27 and 45%, at
twice the fits."""

SPARE_POINTS = 2
"""A shape is a candidate only if every inner training fold holds at least this many distinct
prefill points more than the shape has prefill parameters (``Shape.prefill_terms``)."""

_ERROR_CAP = 0.5
# A held-out relative error counts at most this much in the shape's loss: one wild row (which
# the robust fit ignores anyway) must not decide.


@dataclass(frozen=True)
class Shape:
    """Which features a fit may use and where its ``gemm_large`` transition sits."""

    features: tuple[str, ...]
    """Features the fit may give weight to (``FEATURES`` order)."""
    knee_tokens: int | None
    """``knee_tokens`` of ``gemm_large`` (``None``: no such term)."""

    def prefill_terms(self) -> int:
        """Parameters that only prefill rows pin down: the optional prefill terms, ``gemm``
        (decodes only ever see its weight-read floor) and, with a knee, ``gemm_large`` and
        the knee itself."""
        own = sum(f in self.features for f in OPTIONAL_FEATURES)
        return own + 1 + (2 if self.knee_tokens is not None else 0)


@dataclass(frozen=True)
class FitResult:
    """Outcome of one fit: coefficients per feature, its shape and which rows it trusted."""

    coefficients: dict[str, float]
    """Fitted value per name in ``FEATURES`` (0 for features left out)."""
    knee_tokens: int | None
    """Chosen ``knee_tokens`` (``None``: no ``gemm_large``)."""
    dropped: tuple[str, ...]
    """Features left out: not requested, not chosen, or not identifiable from the rows."""
    weights: Array
    """Final robustness weight per row in [0, 1]; 0 marks a row the fit treated as an outlier."""
    inner_loss: float | None = None
    """Inner cross-validated loss of the chosen shape (``None``: too few points to compare)."""
    candidates: int = 1
    """How many shapes the inner cross-validation compared."""


def fold_labels(
    kinds: Sequence[str], k: int, rng: np.random.Generator, points: Sequence[object] | None = None
) -> np.ndarray:
    """Fold number per row, stratified by kind so every fold mixes prefill and decode. Rows
    with the same ``points`` key (repeats of one measured point) always share a fold."""
    kinds_arr = np.asarray(kinds)
    keys = list(range(len(kinds_arr))) if points is None else list(points)
    first: dict[object, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    reps = np.array(sorted(first.values()), dtype=int)
    labels = np.empty(len(kinds_arr), dtype=int)
    offset = 0
    for kind in sorted(set(kinds_arr[reps].tolist())):
        idx = rng.permutation(reps[kinds_arr[reps] == kind])
        # Continue the round-robin across kinds so small kinds don't all land in fold 0.
        labels[idx] = (np.arange(len(idx)) + offset) % k
        offset += len(idx)
    return labels[[first[key] for key in keys]]


def fit_shape(
    b: Array, n: Array, c: Array, t: Array, scales: FeatureScales, shape: Shape
) -> FitResult:
    """Robust fit of one shape (strata: prefill rows apart from decode rows)."""
    x = uniform_features(b, n, c, scales.with_knee(shape.knee_tokens))
    coef, dropped, w = _fit_design(x, t, n > 1, shape)
    return FitResult(
        dict(zip(FEATURES, map(float, coef), strict=True)), shape.knee_tokens, dropped, w
    )


def candidate_shapes(
    features: Sequence[str], knee_grid: Sequence[int | None], prefill_tokens: Array
) -> list[Shape]:
    """Every subset of the requested optional features with every knee of the grid that lies
    within the prefill step sizes measured (a transition outside them is pure extrapolation),
    fewest terms first."""
    required = tuple(f for f in features if f not in OPTIONAL_FEATURES and f != "gemm_large")
    optional = [f for f in OPTIONAL_FEATURES if f in features]
    knees: list[int | None] = [None]
    if "gemm_large" in features and len(prefill_tokens):
        lo, hi = float(np.min(prefill_tokens)), float(np.max(prefill_tokens))
        knees += [k for k in knee_grid if k is not None and lo <= k <= hi]
    out = []
    for r in range(len(optional) + 1):
        for subset in itertools.combinations(optional, r):
            for knee in knees:
                chosen = set(required) | set(subset) | ({"gemm_large"} if knee else set())
                if not chosen:
                    continue
                out.append(Shape(tuple(f for f in FEATURES if f in chosen), knee))
    return sorted(out, key=lambda s: (s.prefill_terms(), len(s.features)))


def _fit_design(
    x: Array, t: Array, prefill: np.ndarray, shape: Shape
) -> tuple[Array, tuple[str, ...], Array]:
    """Robust fit of ``shape`` on a design matrix built with its knee."""
    features = tuple(f for f in shape.features if f != "gemm_large" or shape.knee_tokens)
    return fit_coefficients(x, t, features, prefill.astype(float))


def _inner_loss(
    x: Array, t: Array, prefill: np.ndarray, shape: Shape, labels: np.ndarray, bound: float
) -> float:
    """Mean over kinds of the capped held-out relative error of ``shape``, each fold fitted on
    the others (equal weight per kind: 9 prefills must count as much as 13 decodes).

    Every fold only adds to the loss, so once the folds done reach ``bound`` (the best loss so
    far) the shape cannot win and the rest are skipped: the result is then a lower bound >=
    ``bound``, which is all the comparison needs (about half the fits on Splitwise groups).
    """
    kinds = np.unique(prefill)
    share = np.empty(len(t))  # each row's weight in the loss
    for p in kinds:
        share[prefill == p] = 1.0 / (len(kinds) * np.count_nonzero(prefill == p))
    loss = 0.0
    for fold in np.unique(labels):
        test = labels == fold
        coef, _, _ = _fit_design(x[~test], t[~test], prefill[~test], shape)
        err = np.minimum(np.abs(x[test] @ coef / t[test] - 1.0), _ERROR_CAP)
        loss += float(share[test] @ err)
        if loss >= bound:
            break
    return loss


def _distinct(points: Sequence[object], mask: np.ndarray) -> int:
    """Number of distinct points among the rows ``mask`` selects."""
    return len({p for p, m in zip(points, mask.tolist(), strict=True) if m})


def choose_shape(
    b: Array,
    n: Array,
    c: Array,
    t: Array,
    scales: FeatureScales,
    features: Sequence[str] = DEFAULT_FEATURES,
    knee_grid: Sequence[int | None] = KNEE_GRID,
    *,
    rng: np.random.Generator,
) -> tuple[Shape, float | None, int]:
    """The candidate shape with the lowest inner cross-validated loss on these rows.

    Folds: ``INNER_FOLDS`` (fewer if no kind has that many distinct points), stratified by
    kind, drawn from ``rng``, repeats of a point never split. Fewer terms when points are
    few: a shape is only a candidate if every inner training fold keeps ``SPARE_POINTS``
    more distinct prefill points than the shape has prefill parameters
    (``Shape.prefill_terms``); with under 2 points of a kind there is nothing to
    cross-validate and the fewest-terms shape is used. Ties go to fewer terms. Returns
    (shape, its loss or ``None``, number of shapes compared).
    """
    prefill = np.asarray(n) > 1
    points = list(zip(b.tolist(), n.tolist(), c.tolist(), strict=True))
    cands = candidate_shapes(features, knee_grid, (b * n)[prefill])
    per_kind = [_distinct(points, prefill == p) for p in np.unique(prefill)]
    if min(per_kind) < 2:
        return cands[0], None, 1
    k = min(INNER_FOLDS, max(per_kind))
    kinds = ["prefill" if p else "decode" for p in prefill.tolist()]
    labels = fold_labels(kinds, k, rng, points)
    room = min(_distinct(points, prefill & (labels != f)) for f in range(k))
    designs: dict[int | None, Array] = {}
    best: tuple[float, Shape] | None = None
    compared = 0
    for shape in cands:
        if shape is not cands[0] and shape.prefill_terms() + SPARE_POINTS > room:
            continue  # too few prefill points in the inner folds to judge this many terms
        knee = shape.knee_tokens
        if knee not in designs:
            designs[knee] = uniform_features(b, n, c, scales.with_knee(knee))
        bound = math.inf if best is None else best[0] - 1e-9
        loss = _inner_loss(designs[knee], t, prefill, shape, labels, bound)
        compared += 1
        if loss < bound:
            best = (loss, shape)
    assert best is not None
    return best[1], best[0], compared


def fit_preset_coefficients(
    num_seqs: Array,
    new_tokens: Array,
    context_len: Array,
    step_ms: Array,
    scales: FeatureScales,
    features: Sequence[str] = DEFAULT_FEATURES,
    knee_grid: Sequence[int | None] = KNEE_GRID,
    *,
    rng: np.random.Generator,
) -> FitResult:
    """Choose the shape by inner cross-validation on these rows (``choose_shape``, folds drawn
    from ``rng``), then fit it on all of them."""
    b, n, c = (np.asarray(v, dtype=float) for v in (num_seqs, new_tokens, context_len))
    t = np.asarray(step_ms, dtype=float)
    shape, loss, compared = choose_shape(b, n, c, t, scales, features, knee_grid, rng=rng)
    fit = fit_shape(b, n, c, t, scales, shape)
    dropped = tuple(f for f in FEATURES if f in fit.dropped or f not in shape.features)
    return FitResult(fit.coefficients, shape.knee_tokens, dropped, fit.weights, loss, compared)
