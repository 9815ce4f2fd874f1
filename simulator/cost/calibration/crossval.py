"""Fitting measurement rows and measuring a fit's held-out error: k folds stratified by kind,
out-of-fold predictions (each fold chooses its own shape by an inner cross-validation on its
training rows only: nested), and per-kind error summaries."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from simulator.cost.calibration.measurements import POINT_COLUMNS, measurement_arrays, step_kinds
from simulator.cost.calibration.shape import FitResult, fit_preset_coefficients, fold_labels
from simulator.cost.features import DEFAULT_FEATURES, FEATURES, FeatureScales, uniform_features
from simulator.errors import InputError


def fit_measurements(
    meas: pd.DataFrame,
    scales: FeatureScales,
    features: Sequence[str] = DEFAULT_FEATURES,
    *,
    rng: np.random.Generator,
) -> FitResult:
    """Fit the fitted-model coefficients to measurement rows, the shape (optional terms, knee)
    chosen by an inner cross-validation on these rows whose folds ``rng`` draws."""
    b, n, c, t = measurement_arrays(meas)
    return fit_preset_coefficients(b, n, c, t, scales, features, rng=rng)


def predict_rows(meas: pd.DataFrame, scales: FeatureScales, fit: FitResult) -> np.ndarray:
    """Step time (ms) that ``fit`` predicts for each measurement row."""
    b, n, c, _ = measurement_arrays(meas)
    x = uniform_features(b, n, c, scales.with_knee(fit.knee_tokens))
    coef = np.array([fit.coefficients[name] for name in FEATURES])
    return np.asarray(x @ coef, dtype=float)


def point_keys(meas: pd.DataFrame) -> list[tuple[int, ...]]:
    """One key per row naming its measured point: repeats share a key, so no fold split
    (outer or inner) ever puts a point's repeats on both sides."""
    return [tuple(map(int, p)) for p in meas[list(POINT_COLUMNS)].to_numpy()]


def kfold_predictions(
    meas: pd.DataFrame,
    scales: FeatureScales,
    k: int,
    rng: np.random.Generator,
    features: Sequence[str] = DEFAULT_FEATURES,
    progress: Callable[[], None] | None = None,
) -> np.ndarray:
    """Out-of-fold prediction (ms) for every row: each fold is fitted, its shape chosen by an
    inner cross-validation, on the other folds only (nested: a held-out row never influences
    the fit or the shape that predicts it). Repeats of a point share a fold."""
    if k < 2:
        raise InputError(f"--folds must be >= 2, got {k}")
    keys = point_keys(meas)
    if len(set(keys)) < k:
        raise InputError(f"{len(set(keys))} distinct points cannot be split into {k} folds")
    labels = fold_labels(step_kinds(meas).tolist(), k, rng, keys)
    inner = rng.spawn(k)
    pred = np.empty(len(meas))
    for fold in range(k):
        test = labels == fold
        train = meas[~test]
        fit = fit_measurements(train, scales, features, rng=inner[fold])
        pred[test] = predict_rows(meas[test], scales, fit)
        if progress is not None:
            progress()
    return pred


def random_third(meas: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """A random held-out third (mask): of each kind, a third of the distinct points (rounded),
    every repeat of a held-out point with it."""
    keys = point_keys(meas)
    kinds = step_kinds(meas).to_numpy()
    first: dict[tuple[int, ...], int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    reps = np.array(sorted(first.values()), dtype=int)
    held: set[tuple[int, ...]] = set()
    for kind in sorted(set(kinds[reps].tolist())):
        idx = rng.permutation(reps[kinds[reps] == kind])
        held |= {keys[i] for i in idx[: int(round(len(idx) / 3))]}
    return np.array([key in held for key in keys], dtype=bool)


def error_summary(
    kinds: Sequence[str],
    measured: np.ndarray,
    predicted: np.ndarray,
    mask: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """Per kind: number of points, median / mean / max absolute percentage error."""
    kinds_arr = np.asarray(kinds)
    ape = np.abs(np.asarray(predicted) - measured) / measured * 100.0
    keep = np.ones(len(ape), dtype=bool) if mask is None else np.asarray(mask)
    out: dict[str, dict[str, float]] = {}
    for kind in sorted(set(kinds_arr.tolist())):
        a = ape[(kinds_arr == kind) & keep]
        if len(a) == 0:
            continue
        out[kind] = {
            "n": int(len(a)),
            "median_ape_pct": round(float(np.median(a)), 2),
            "mean_ape_pct": round(float(np.mean(a)), 2),
            "max_ape_pct": round(float(np.max(a)), 2),
        }
    return out


def format_error_table(title: str, summary: dict[str, dict[str, float]]) -> str:
    """A small fixed-width table of ``error_summary`` output."""
    lines = [title, f"  {'kind':<10}{'points':>7}{'median %':>10}{'mean %':>9}{'max %':>9}"]
    for kind, s in summary.items():
        lines.append(
            f"  {kind:<10}{s['n']:>7}{s['median_ape_pct']:>10.1f}"
            f"{s['mean_ape_pct']:>9.1f}{s['max_ape_pct']:>9.1f}"
        )
    return "\n".join(lines)
