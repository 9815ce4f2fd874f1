"""Calibrating a ``fitted`` cost-model preset (fit on all points, held-out error by k-fold),
predicting with one, and writing one as YAML."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from simulator.cost.calibration.crossval import (
    error_summary,
    fit_measurements,
    kfold_predictions,
    predict_rows,
)
from simulator.cost.calibration.measurements import (
    POINT_COLUMNS,
    aggregate_repeats,
    inconsistent_points,
    measurement_arrays,
    step_kinds,
)
from simulator.cost.features import DEFAULT_FEATURES, FeatureScales
from simulator.cost.fitted import FittedCostModel, FittedPreset, zero_time_steps
from simulator.cost.presets import load_hardware, load_model
from simulator.errors import InputError
from simulator.output_file import write_text


def calibrate(
    meas: pd.DataFrame,
    model: str,
    hardware: str,
    tp: int,
    *,
    folds: int = 5,
    rng: np.random.Generator,
    features: Sequence[str] = DEFAULT_FEATURES,
    name: str | None = None,
    source: dict[str, Any] | None = None,
    progress: Callable[[], None] | None = None,
) -> tuple[FittedPreset, pd.DataFrame]:
    """Fit a preset on all aggregated rows and measure the recipe's k-fold held-out error.

    The recipe, both for the preset and inside each of the k folds, chooses the model's shape
    (optional terms, knee) by an inner cross-validation on its own training rows, then fits
    it. Returns the preset (held-out errors recorded in it) and the rows with ``heldout_ms``,
    ``fitted_ms`` and ``inconsistent`` columns.
    """
    scales = FeatureScales.from_specs(load_model(model), load_hardware(hardware), tp)
    rows = aggregate_repeats(meas)
    heldout = kfold_predictions(rows, scales, folds, rng, features, progress)
    fit = fit_measurements(rows, scales, features, rng=rng.spawn(1)[0])
    flags = inconsistent_points(rows)
    coefficients = {k: _round_sig(v) for k, v in fit.coefficients.items()}
    zero_time = zero_time_steps(coefficients, scales.with_knee(fit.knee_tokens))
    if zero_time:  # what loading the preset would refuse, said here in the terms of the fit
        kind, fix = zero_time[0]
        raise InputError(
            f"the fit would time a {kind} step at 0 s (features left out: "
            f"{', '.join(fit.dropped) or 'none'}); fit with {fix}, or add such steps"
        )
    preset = FittedPreset(
        name=name or f"{model}_{hardware}_tp{tp}",
        model=model,
        hardware=hardware,
        tp=tp,
        scales=scales.with_knee(fit.knee_tokens),
        coefficients=coefficients,
        source=source or {},
        heldout=_heldout_report(rows, heldout, flags, folds),
        notes=(
            f"{len(rows)} distinct points; shape chosen by inner cross-validation among "
            f"{fit.candidates}; robust fit gave zero weight to "
            f"{int(np.sum(fit.weights == 0))}; features left out: "
            f"{', '.join(fit.dropped) or 'none'}"
        ),
    )
    rows = rows.assign(
        heldout_ms=heldout, fitted_ms=predict_rows(rows, scales, fit), inconsistent=flags
    )
    return preset, rows


def _heldout_report(
    rows: pd.DataFrame, heldout: np.ndarray, flags: np.ndarray, folds: int
) -> dict[str, Any]:
    """Held-out error per kind, over all points and over the consistent ones, and which
    points are inconsistent (what a preset records under ``heldout``)."""
    kinds = step_kinds(rows).tolist()
    y = rows["step_ms"].to_numpy(dtype=float)
    pts = rows[list(POINT_COLUMNS)].to_numpy(dtype=int)
    return {
        "folds": folds,
        "all_points": error_summary(kinds, y, heldout),
        "consistent_points": error_summary(kinds, y, heldout, ~flags),
        "inconsistent": [
            {k: int(v) for k, v in zip(POINT_COLUMNS, pts[i], strict=True)}
            | {"kind": kinds[i], "step_ms": round(float(y[i]), 3)}
            for i in np.flatnonzero(flags)
        ],
    }


def _round_sig(x: float, digits: int = 6) -> float:
    """``x`` to ``digits`` significant figures (readable preset files, no fit-relevant loss)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def predict(preset: FittedPreset, meas: pd.DataFrame) -> pd.DataFrame:
    """The measurement rows with a ``predicted_ms`` column from ``preset``."""
    b, n, c, _ = measurement_arrays(meas)
    return meas.assign(predicted_ms=FittedCostModel(preset).predict_ms(b, n, c))


def write_preset(preset: FittedPreset, path: Path | str) -> None:
    """Write a preset YAML (plain types, fields in declaration order), atomically."""
    data = preset.model_dump(mode="json")
    write_text(path, yaml.safe_dump(data, sort_keys=False, width=100), label=str(path))
