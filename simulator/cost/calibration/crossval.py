"""Fitting measurement rows and measuring a fit's held-out error: k folds stratified by kind,
out-of-fold predictions, and per-kind error summaries."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from simulator.cost.calibration.measurements import measurement_arrays, step_kinds
from simulator.cost.calibration.robust_fit import FitResult, fit_preset_coefficients
from simulator.cost.features import FEATURES, FeatureScales, uniform_features
from simulator.errors import InputError


def fit_measurements(
    meas: pd.DataFrame, scales: FeatureScales, features: Sequence[str] = FEATURES
) -> FitResult:
    """Fit the fitted-model coefficients (and knee) to aggregated measurement rows."""
    b, n, c, t = measurement_arrays(meas)
    return fit_preset_coefficients(b, n, c, t, scales, features)


def predict_rows(meas: pd.DataFrame, scales: FeatureScales, fit: FitResult) -> np.ndarray:
    """Step time (ms) that ``fit`` predicts for each measurement row."""
    b, n, c, _ = measurement_arrays(meas)
    x = uniform_features(b, n, c, scales.with_knee(fit.knee_tokens))
    coef = np.array([fit.coefficients[name] for name in FEATURES])
    return np.asarray(x @ coef, dtype=float)


def fold_labels(kinds: Sequence[str], k: int, rng: np.random.Generator) -> np.ndarray:
    """Fold number per row, stratified by kind so every fold mixes prefill and decode."""
    kinds_arr = np.asarray(kinds)
    labels = np.empty(len(kinds_arr), dtype=int)
    offset = 0
    for kind in sorted(set(kinds_arr.tolist())):
        idx = rng.permutation(np.flatnonzero(kinds_arr == kind))
        # Continue the round-robin across kinds so small kinds don't all land in fold 0.
        labels[idx] = (np.arange(len(idx)) + offset) % k
        offset += len(idx)
    return labels


def kfold_predictions(
    meas: pd.DataFrame,
    scales: FeatureScales,
    k: int,
    rng: np.random.Generator,
    features: Sequence[str] = FEATURES,
    progress: Callable[[], None] | None = None,
) -> np.ndarray:
    """Out-of-fold prediction (ms) for every aggregated row: each fold is fitted (knee
    included) on the other folds only."""
    if k < 2:
        raise InputError(f"--folds must be >= 2, got {k}")
    if len(meas) < k:
        raise InputError(f"{len(meas)} distinct points cannot be split into {k} folds")
    labels = fold_labels(step_kinds(meas).tolist(), k, rng)
    pred = np.empty(len(meas))
    for fold in range(k):
        test = labels == fold
        train = meas[~test]
        fit = fit_measurements(train, scales, features)
        pred[test] = predict_rows(meas[test], scales, fit)
        if progress is not None:
            progress()
    return pred


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
