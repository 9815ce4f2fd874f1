"""Calibrating the ``fitted`` cost model: measurement CSVs, converters from public profiles,
k-fold held-out error, prediction, and the ``calibrate`` / ``predict`` / ``convert`` commands.

A measurement CSV has one row per measured step of a *uniform* batch::

    num_seqs, new_tokens, context_len, step_ms

(``num_seqs`` sequences each computing ``new_tokens`` tokens on top of ``context_len`` tokens
already in KV; a prefill of B prompts of P tokens is ``B, P, 0, t``, a decode step of B
sequences at context c is ``B, 1, c, t``). Other columns are kept but ignored, except
``kind`` (prefill/decode/mlp: how errors are grouped), ``group`` (one calibration per group)
and ``model``/``hardware``/``tp`` (defaults for ``calibrate``). Repeats of a point are reduced
to their median before fitting, so k-fold never puts a point's repeats on both sides.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from simulator.cost.calibration.robust_fit import FitResult, fit_preset_coefficients
from simulator.cost.features import FEATURES, FeatureScales, uniform_features
from simulator.cost.fitted import FittedCostModel, FittedPreset, load_preset
from simulator.cost.presets import load_hardware, load_model
from simulator.errors import InputError

__all__ = [
    "MEAS_COLUMNS",
    "SPLITWISE_HARDWARE",
    "SPLITWISE_MODELS",
    "add_subcommands",
    "aggregate_repeats",
    "calibrate",
    "cmd_calibrate",
    "cmd_convert",
    "cmd_predict",
    "convert_splitwise",
    "convert_vidur_mlp",
    "error_summary",
    "fit_measurements",
    "format_error_table",
    "inconsistent_points",
    "kfold_predictions",
    "predict",
    "read_measurements",
    "step_kinds",
]

MEAS_COLUMNS: tuple[str, ...] = ("num_seqs", "new_tokens", "context_len", "step_ms")
"""Required columns of a measurement CSV."""

POINT_COLUMNS: tuple[str, ...] = ("num_seqs", "new_tokens", "context_len")
"""Columns that identify one measurement point (repeats share them)."""

SPLITWISE_MODELS: dict[str, str] = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}
"""Splitwise ``model`` value -> servesim model preset."""

SPLITWISE_HARDWARE: dict[str, str] = {
    "a100-80gb": "a100-80gb",
    "h100-80gb": "h100-sxm",
    # Same silicon with a power cap: the fitted coefficients absorb the slowdown.
    "h100-80gb-pcap": "h100-sxm",
}
"""Splitwise ``hardware`` value -> servesim hardware preset (features only)."""

_SPLITWISE_COLUMNS = (
    "model",
    "hardware",
    "tensor_parallel",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
)


# -- reading measurements ----------------------------------------------------------------


def _read_csv(path: Path | str, what: str) -> pd.DataFrame:
    """A CSV as a DataFrame; unreadable or empty -> ``InputError`` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {p}: file not found")
    try:
        with warnings.catch_warnings():
            # index_col=False: a row with one field too many must not turn the first column
            # into the index (shifting every value); pandas warns instead, made an error here
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(p, index_col=False)
    except pd.errors.ParserWarning:
        raise InputError(f"{what} {p}: {_long_row(p)}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {p}: not a readable CSV: {' '.join(str(exc).split())}") from None
    if df.empty:
        raise InputError(f"{what} {p}: no data rows")
    return df


def _long_row(path: Path) -> str:
    """Where a CSV has a row with more fields than its header (for the error message)."""
    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        rows = csv.reader(handle)
        width = len(next(rows, []))
        for row in rows:
            if len(row) > width:
                return f"line {rows.line_num}: {len(row)} fields, the header has {width}"
    return "a row has more fields than the header"


def _check_numeric(df: pd.DataFrame, path: Path | str, col: str, integer: bool, low: float) -> None:
    """Every value of ``col`` is a number >= ``low`` (an integer if asked), or name the line."""
    values = pd.to_numeric(df[col], errors="coerce")
    bad = values.isna() | ~np.isfinite(values) | (values < low)
    if integer:
        bad |= values.notna() & (values != np.floor(values))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        kind = "an integer" if integer else "a number"
        # +2: the header is line 1 and pandas counts data rows from 0.
        raise InputError(
            f"{path}: line {i + 2}, column {col}: expected {kind} >= {low:g}, "
            f"got {df[col].iloc[i]!r}"
        )
    df[col] = values.astype(int) if integer else values.astype(float)


def read_measurements(path: Path | str) -> pd.DataFrame:
    """Read and validate a measurement CSV (rows kept as they are, repeats included)."""
    df = _read_csv(path, "measurements")
    missing = [c for c in MEAS_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {', '.join(missing)}; a measurement CSV needs "
            f"{', '.join(MEAS_COLUMNS)}"
        )
    for col in ("num_seqs", "new_tokens"):
        _check_numeric(df, path, col, integer=True, low=1)
    _check_numeric(df, path, "context_len", integer=True, low=0)
    _check_numeric(df, path, "step_ms", integer=False, low=0)
    if (df["step_ms"] <= 0).any():
        i = int(np.flatnonzero((df["step_ms"] <= 0).to_numpy())[0])
        raise InputError(f"{path}: line {i + 2}, column step_ms: a step time must be > 0")
    return df


def step_kinds(meas: pd.DataFrame) -> pd.Series:
    """Kind of each row: the ``kind`` column if present, else prefill (>1 new token) / decode."""
    if "kind" in meas.columns:
        return meas["kind"].astype(str)
    return pd.Series(
        np.where(meas["new_tokens"].to_numpy() > 1, "prefill", "decode"), index=meas.index
    )


def aggregate_repeats(meas: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct point (and group/kind if present): median ``step_ms``,
    ``n_repeats`` added (summed if the rows already carry it)."""
    df = meas.copy()
    df["kind"] = step_kinds(df)
    keys = [c for c in ("group", "kind") if c in df.columns] + list(POINT_COLUMNS)
    if "n_repeats" not in df.columns:
        df["n_repeats"] = 1
    agg: dict[str, Any] = {"step_ms": "median", "n_repeats": "sum"}
    for col in df.columns:
        if col not in agg and col not in keys:
            agg[col] = "first"
    out = df.groupby(keys, sort=True, as_index=False).agg(agg)
    return out.reset_index(drop=True)


def select_group(meas: pd.DataFrame, group: str | None, path: Path | str) -> pd.DataFrame:
    """Rows of one group; a file with several groups needs ``--group``."""
    if "group" not in meas.columns:
        if group is not None:
            raise InputError(f"{path}: --group {group!r} given but the file has no group column")
        return meas
    groups = sorted(meas["group"].astype(str).unique())
    if group is None:
        if len(groups) > 1:
            raise InputError(
                f"{path}: {len(groups)} groups ({', '.join(groups)}); pick one with --group"
            )
        return meas
    if group not in groups:
        raise InputError(f"{path}: no group {group!r}; groups: {', '.join(groups)}")
    return meas[meas["group"].astype(str) == group].reset_index(drop=True)


# -- converters ----------------------------------------------------------------------------


def convert_splitwise(src: Path | str, group: str | None = None) -> pd.DataFrame:
    """Splitwise ``perf_model.csv`` -> measurement rows, one per distinct point.

    ``prompt_time`` of B prompts of P tokens -> prefill row ``B, P, 0``; ``token_time`` (mean
    decode iteration over T-1 iterations whose context grows from P to P+T-2) -> decode row
    ``B, 1, P + T//2``. Repeats (5 per run, and the same prefill under every T) -> median.
    ``group`` is ``<model>_<hardware>_tp<N>`` in Splitwise's names; ``model``/``hardware``
    columns hold the servesim presets whose features the fit should use.
    """
    df = _read_csv(src, "splitwise file")
    missing = [c for c in _SPLITWISE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{src}: not a Splitwise perf_model.csv: missing {', '.join(missing)}")
    for col in ("tensor_parallel", "prompt_size", "batch_size", "token_size"):
        _check_numeric(df, src, col, integer=True, low=1)
    for col in ("prompt_time", "token_time"):
        _check_numeric(df, src, col, integer=False, low=0)
    df["group"] = (
        df["model"].astype(str)
        + "_"
        + df["hardware"].astype(str)
        + "_tp"
        + df["tensor_parallel"].astype(str)
    )
    if group is not None:
        known = sorted(df["group"].unique())
        if group not in known:
            raise InputError(f"{src}: no group {group!r}; groups: {', '.join(known)}")
        df = df[df["group"] == group]
    unknown = sorted(set(df["model"].astype(str)) - set(SPLITWISE_MODELS))
    unknown += sorted(set(df["hardware"].astype(str)) - set(SPLITWISE_HARDWARE))
    if unknown:
        raise InputError(f"{src}: no servesim preset for {', '.join(unknown)}")
    prefill = df.assign(
        kind="prefill",
        num_seqs=df["batch_size"],
        new_tokens=df["prompt_size"],
        context_len=0,
        step_ms=df["prompt_time"],
    )
    decode = df.assign(
        kind="decode",
        num_seqs=df["batch_size"],
        new_tokens=1,
        context_len=df["prompt_size"] + df["token_size"] // 2,
        step_ms=df["token_time"],
    )
    rows = pd.concat([prefill, decode], ignore_index=True)
    rows = rows.assign(
        model=rows["model"].map(SPLITWISE_MODELS),
        hardware_src=rows["hardware"],
        hardware=rows["hardware"].map(SPLITWISE_HARDWARE),
        tp=rows["tensor_parallel"],
    )
    keep = ["group", "model", "hardware", "hardware_src", "tp", "kind", *MEAS_COLUMNS]
    return aggregate_repeats(rows[keep])


def convert_vidur_mlp(src: Path | str, model: str, hardware: str | None = None) -> pd.DataFrame:
    """Vidur per-operator ``mlp.csv`` -> measurement rows ``1, num_tokens, 0`` per TP degree.

    Step time = ``num_layers`` x (sum of the per-layer ops' median times) + ``emb``. These are
    token-parallel ops only (projections, MLP, norms, rotary, residual add), profiled on one GPU
    with each TP degree's shard shapes: no attention kernel, LM head, all-reduce or per-step
    overhead, so rows get ``kind = mlp``. ``model`` is the servesim preset (for the layer count,
    checked against the file's shapes); ``hardware`` only names the group.
    """
    df = _read_csv(src, "vidur file")
    spec = load_model(model)
    need = ("num_tokens", "num_tensor_parallel_workers", "n_embd", "time_stats.emb.median")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise InputError(f"{src}: not a Vidur mlp.csv: missing {', '.join(missing)}")
    embd = sorted(df["n_embd"].unique())
    if embd != [spec.hidden_size]:
        raise InputError(
            f"{src}: n_embd {embd} does not match model {model} (hidden_size {spec.hidden_size})"
        )
    ops = [
        c
        for c in df.columns
        if c.startswith("time_stats.") and c.endswith(".median") and c != "time_stats.emb.median"
    ]
    for col in (*ops, "time_stats.emb.median"):
        _check_numeric(df, src, col, integer=False, low=0)
    for col in ("num_tokens", "num_tensor_parallel_workers"):
        _check_numeric(df, src, col, integer=True, low=1)
    step = spec.num_layers * df[ops].sum(axis=1) + df["time_stats.emb.median"]
    hw_label = hardware or "gpu"
    rows = pd.DataFrame(
        {
            "group": [f"{model}_{hw_label}_tp{t}" for t in df["num_tensor_parallel_workers"]],
            "model": model,
            "hardware": hardware if hardware is not None else "",
            "tp": df["num_tensor_parallel_workers"],
            "kind": "mlp",
            "num_seqs": 1,
            "new_tokens": df["num_tokens"],
            "context_len": 0,
            "step_ms": step,
        }
    )
    return aggregate_repeats(rows)


# -- fitting and held-out error ------------------------------------------------------------


def _arrays(meas: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        meas["num_seqs"].to_numpy(dtype=float),
        meas["new_tokens"].to_numpy(dtype=float),
        meas["context_len"].to_numpy(dtype=float),
        meas["step_ms"].to_numpy(dtype=float),
    )


def fit_measurements(
    meas: pd.DataFrame, scales: FeatureScales, features: Sequence[str] = FEATURES
) -> FitResult:
    """Fit the fitted-model coefficients (and knee) to aggregated measurement rows."""
    b, n, c, t = _arrays(meas)
    return fit_preset_coefficients(b, n, c, t, scales, features)


def _predict_rows(meas: pd.DataFrame, scales: FeatureScales, fit: FitResult) -> np.ndarray:
    b, n, c, _ = _arrays(meas)
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
        pred[test] = _predict_rows(meas[test], scales, fit)
        if progress is not None:
            progress()
    return pred


def inconsistent_points(meas: pd.DataFrame, tol: float = 0.10) -> np.ndarray:
    """Rows whose time contradicts the others of their group and kind: more work (no fewer
    sequences, new tokens or context, one of them more) yet over ``tol`` faster. Removes the
    worst offender until none is left (ties: the bigger point), returns a boolean mask.

    This checks the data, not a model: no fit can be right about both sides of such a pair.
    """
    flags = np.zeros(len(meas), dtype=bool)
    kinds = step_kinds(meas).to_numpy()
    groups = (
        meas["group"].astype(str).to_numpy() if "group" in meas.columns else np.zeros(len(meas))
    )
    pts = meas[list(POINT_COLUMNS)].to_numpy(dtype=float)
    t = meas["step_ms"].to_numpy(dtype=float)
    work = pts[:, 0] * pts[:, 1] * (1.0 + pts[:, 2])
    for g in np.unique(groups):
        for kind in np.unique(kinds):
            idx = np.flatnonzero((groups == g) & (kinds == kind))
            p, tt = pts[idx], t[idx]
            # bad[i, j]: point i does no less work than j (more in some way) but is too fast.
            ge = np.all(p[:, None, :] >= p[None, :, :], axis=2)
            gt = np.any(p[:, None, :] > p[None, :, :], axis=2)
            bad = ge & gt & (tt[:, None] < (1.0 - tol) * tt[None, :])
            live = np.ones(len(idx), dtype=bool)
            while True:
                sub = bad & live[:, None] & live[None, :]
                counts = sub.sum(axis=0) + sub.sum(axis=1)
                if counts.max(initial=0) == 0:
                    break
                # The worst offender goes first; ties go to the bigger point.
                order = np.lexsort((work[idx], counts))
                worst = order[-1]
                flags[idx[worst]] = True
                live[worst] = False
    return flags


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


def calibrate(
    meas: pd.DataFrame,
    model: str,
    hardware: str,
    tp: int,
    *,
    folds: int = 5,
    rng: np.random.Generator,
    features: Sequence[str] = FEATURES,
    name: str | None = None,
    source: dict[str, Any] | None = None,
    progress: Callable[[], None] | None = None,
) -> tuple[FittedPreset, pd.DataFrame]:
    """Fit a preset on all aggregated rows and measure the recipe's k-fold held-out error.

    Returns the preset (held-out errors recorded in it) and the rows with ``heldout_ms``,
    ``fitted_ms`` and ``inconsistent`` columns.
    """
    scales = FeatureScales.from_specs(load_model(model), load_hardware(hardware), tp)
    rows = aggregate_repeats(meas)
    heldout = kfold_predictions(rows, scales, folds, rng, features, progress)
    fit = fit_measurements(rows, scales, features)
    flags = inconsistent_points(rows)
    kinds = step_kinds(rows).tolist()
    y = rows["step_ms"].to_numpy(dtype=float)
    pts = rows[list(POINT_COLUMNS)].to_numpy(dtype=int)
    report: dict[str, Any] = {
        "folds": folds,
        "all_points": error_summary(kinds, y, heldout),
        "consistent_points": error_summary(kinds, y, heldout, ~flags),
        "inconsistent": [
            {k: int(v) for k, v in zip(POINT_COLUMNS, pts[i], strict=True)}
            | {"kind": kinds[i], "step_ms": round(float(y[i]), 3)}
            for i in np.flatnonzero(flags)
        ],
    }
    preset = FittedPreset(
        name=name or f"{model}_{hardware}_tp{tp}",
        model=model,
        hardware=hardware,
        tp=tp,
        scales=scales.with_knee(fit.knee_tokens),
        coefficients={k: _round_sig(v) for k, v in fit.coefficients.items()},
        source=source or {},
        heldout=report,
        notes=(
            f"{len(rows)} distinct points; robust fit gave zero weight to "
            f"{int(np.sum(fit.weights == 0))}; features left out: "
            f"{', '.join(fit.dropped) or 'none'}"
        ),
    )
    rows = rows.assign(
        heldout_ms=heldout, fitted_ms=_predict_rows(rows, scales, fit), inconsistent=flags
    )
    return preset, rows


def _round_sig(x: float, digits: int = 6) -> float:
    """``x`` to ``digits`` significant figures (readable preset files, no fit-relevant loss)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def predict(preset: FittedPreset, meas: pd.DataFrame) -> pd.DataFrame:
    """The measurement rows with a ``predicted_ms`` column from ``preset``."""
    b, n, c, _ = _arrays(meas)
    return meas.assign(predicted_ms=FittedCostModel(preset).predict_ms(b, n, c))


def write_preset(preset: FittedPreset, path: Path | str) -> None:
    """Write a preset YAML (plain types, fields in declaration order)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = preset.model_dump(mode="json")
    p.write_text(yaml.safe_dump(data, sort_keys=False, width=100))


# -- CLI -----------------------------------------------------------------------------------


@contextmanager
def _progress(total: int, desc: str) -> Iterator[Callable[[], None]]:
    """A tqdm bar that only appears if the work takes more than ~2 s."""
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, delay=2.0, leave=False) as bar:

        def tick() -> None:
            bar.update(1)

        yield tick


def _column_default(meas: pd.DataFrame, col: str, given: Any, path: Path | str, flag: str) -> Any:
    """``given`` if set, else the single value of column ``col``, else an ``InputError``."""
    if given is not None:
        return given
    if col in meas.columns:
        values = meas[col].dropna().unique()
        if len(values) == 1 and str(values[0]) != "":
            return values[0].item() if hasattr(values[0], "item") else values[0]
    raise InputError(f"{path}: pass {flag} (the file has no single {col!r} value to use)")


def _parse_features(text: str | None) -> tuple[str, ...]:
    if text is None:
        return FEATURES
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in names if x not in FEATURES]
    if unknown or not names:
        raise InputError(
            f"--features: unknown {unknown or '(empty)'}; known: {', '.join(FEATURES)}"
        )
    return names


def _parse_source(items: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--source {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit a fitted cost-model preset to a measurement CSV; print k-fold held-out error."""
    started = time.monotonic()
    meas = select_group(read_measurements(args.measurements), args.group, args.measurements)
    model = str(_column_default(meas, "model", args.model, args.measurements, "--model"))
    hardware = str(
        _column_default(meas, "hardware", args.hardware, args.measurements, "--hardware")
    )
    tp = int(_column_default(meas, "tp", args.tp, args.measurements, "--tp"))
    features = _parse_features(args.features)
    source = {"measurements": str(args.measurements)} | _parse_source(args.source)
    if args.group is not None:
        source["group"] = args.group
    with _progress(args.folds, "calibrate (k-fold)") as tick:
        preset, rows = calibrate(
            meas,
            model,
            hardware,
            tp,
            folds=args.folds,
            rng=np.random.default_rng(args.seed),
            features=features,
            name=args.name,
            source=source,
            progress=tick,
        )
    write_preset(preset, args.out)
    print(f"{len(rows)} distinct points, {args.folds}-fold held-out error of the fit:")
    print(format_error_table("all points", preset.heldout["all_points"]))
    if preset.heldout["inconsistent"]:
        n_bad = len(preset.heldout["inconsistent"])
        print(
            format_error_table(
                f"without {n_bad} inconsistent point(s)", preset.heldout["consistent_points"]
            )
        )
    coefs = ", ".join(f"{k}={v:.4g}" for k, v in preset.coefficients.items() if v > 0)
    print(f"coefficients: {coefs}; knee_tokens={preset.scales.knee_tokens}")
    print(f"wrote {args.out} ({time.monotonic() - started:.1f} s)")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """Predict step times of a measurement CSV with a fitted preset; print the error."""
    preset = load_preset(args.preset)
    meas = select_group(read_measurements(args.measurements), args.group, args.measurements)
    out = predict(preset, meas)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)
    kinds = step_kinds(out).tolist()
    summary = error_summary(kinds, out["step_ms"].to_numpy(), out["predicted_ms"].to_numpy())
    ape = np.abs(out["predicted_ms"] - out["step_ms"]) / out["step_ms"] * 100.0
    print(format_error_table(f"{preset.name} on {len(out)} rows", summary))
    print(f"overall: median APE {np.median(ape):.1f}%, mean APE {np.mean(ape):.1f}%")
    print(f"wrote {args.out}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert a public profile (Splitwise, Vidur MLP) to a measurement CSV."""
    if args.format == "splitwise":
        rows = convert_splitwise(args.source, args.group)
    else:
        if args.model is None:
            raise InputError("convert vidur-mlp: pass --model (for the layer count)")
        rows = convert_vidur_mlp(args.source, args.model, args.hardware)
        if args.group is not None:
            rows = select_group(rows, args.group, args.source)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(args.out, index=False)
    groups = rows["group"].nunique()
    print(f"wrote {args.out}: {len(rows)} points in {groups} group(s)")
    return 0


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``calibrate``, ``predict`` and ``convert`` to the ``servesim`` parser."""
    p = subparsers.add_parser(
        "calibrate",
        help="fit a fitted cost-model preset to measured step times",
        description=cmd_calibrate.__doc__,
    )
    p.add_argument("measurements", help="measurement CSV (num_seqs,new_tokens,context_len,step_ms)")
    p.add_argument("--model", help="model preset for the features (default: the file's model)")
    p.add_argument("--hardware", help="hardware preset (default: the file's hardware column)")
    p.add_argument("--tp", type=int, help="tensor-parallel degree (default: the file's tp)")
    p.add_argument("--out", required=True, help="preset YAML to write")
    p.add_argument("--group", help="calibrate only this group of a multi-group file")
    p.add_argument("--folds", type=int, default=5, help="k of the k-fold held-out error (5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment (0)")
    p.add_argument("--name", help="preset name (default: MODEL_HARDWARE_tpN)")
    p.add_argument(
        "--features",
        help=f"comma list of features to fit (default all: {','.join(FEATURES)})",
    )
    p.add_argument(
        "--source",
        action="append",
        metavar="KEY=VALUE",
        help="provenance to record in the preset (repeatable)",
    )
    p.set_defaults(func=cmd_calibrate)

    p = subparsers.add_parser(
        "predict",
        help="predict measured steps with a fitted preset",
        description=cmd_predict.__doc__,
    )
    p.add_argument("preset", help="fitted preset name or YAML path")
    p.add_argument("measurements", help="measurement CSV")
    p.add_argument("--out", required=True, help="CSV to write (the rows plus predicted_ms)")
    p.add_argument("--group", help="predict only this group of a multi-group file")
    p.set_defaults(func=cmd_predict)

    p = subparsers.add_parser(
        "convert",
        help="convert Splitwise / Vidur profiles to a measurement CSV",
        description=cmd_convert.__doc__,
    )
    p.add_argument("format", choices=["splitwise", "vidur-mlp"], help="source format")
    p.add_argument("source", help="Splitwise perf_model.csv or Vidur mlp.csv")
    p.add_argument("--out", required=True, help="measurement CSV to write")
    p.add_argument("--group", help="keep only this group (e.g. llama2-70b_a100-80gb_tp8)")
    p.add_argument("--model", help="vidur-mlp: model preset (layer count, shape check)")
    p.add_argument("--hardware", help="vidur-mlp: hardware preset the profile was taken on")
    p.set_defaults(func=cmd_convert)
