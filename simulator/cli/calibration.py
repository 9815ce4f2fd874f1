"""The ``calibrate``, ``predict`` and ``convert`` commands (fitted cost-model calibration)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.cost.calibration.calibrate import calibrate, predict, write_preset
from simulator.cost.calibration.convert import convert_splitwise, convert_vidur_mlp
from simulator.cost.calibration.crossval import error_summary, format_error_table
from simulator.cost.calibration.measurements import read_measurements, select_group, step_kinds
from simulator.cost.features import FEATURES
from simulator.cost.fitted import load_preset
from simulator.errors import InputError


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
