"""``servesim calibrate``: fit a cost model (a `fitted` preset) to measured step times."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.cli.common import Subparsers
from simulator.cost.features import DEFAULT_FEATURES, FEATURES, OPTIONAL_FEATURES
from simulator.errors import InputError

if TYPE_CHECKING:
    import pandas as pd


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``calibrate`` command."""
    p = subparsers.add_parser(
        "calibrate",
        help="fit a cost model (a `fitted` preset) to measured step times",
        description=run.__doc__,
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
        help=(
            f"comma-separated features the fit may use (default: {', '.join(DEFAULT_FEATURES)}; "
            f"known: {', '.join(FEATURES)}); of {', '.join(OPTIONAL_FEATURES)} and the knee of "
            "gemm_large, an inner cross-validation keeps those that predict held-out rows best"
        ),
    )
    p.add_argument(
        "--source",
        action="append",
        metavar="KEY=VALUE",
        help="provenance to record in the preset (repeatable)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Fit a cost model (a `fitted` preset YAML) to a measurement CSV; print its k-fold
    held-out error."""
    from simulator.output_file import check_output_file

    # first: the fit (and even importing what it needs) takes a while, and its result must
    # have somewhere to go
    out = check_output_file(args.out)

    import numpy as np

    from simulator.cost.calibration.calibrate import calibrate, write_preset
    from simulator.cost.calibration.crossval import format_error_table
    from simulator.cost.calibration.measurements import read_measurements, select_group

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
    write_preset(preset, out)
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
        return DEFAULT_FEATURES
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
