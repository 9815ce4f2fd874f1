"""``servesim predict``: predict measured step times with a fitted preset."""

from __future__ import annotations

import argparse

from simulator.cli.common import Subparsers


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``predict`` command."""
    p = subparsers.add_parser(
        "predict",
        help="predict measured steps with a fitted preset",
        description=run.__doc__,
    )
    p.add_argument("preset", help="fitted preset name or YAML path")
    p.add_argument("measurements", help="measurement CSV")
    p.add_argument("--out", required=True, help="CSV to write (the rows plus predicted_ms)")
    p.add_argument("--group", help="predict only this group of a multi-group file")
    return p


def run(args: argparse.Namespace) -> int:
    """Predict step times of a measurement CSV with a fitted preset; print the error."""
    import numpy as np

    from simulator.cost.calibration.calibrate import predict
    from simulator.cost.calibration.crossval import error_summary, format_error_table
    from simulator.cost.calibration.measurements import read_measurements, select_group, step_kinds
    from simulator.cost.fitted import load_preset
    from simulator.output_file import check_output_file, write_file

    path = check_output_file(args.out)
    preset = load_preset(args.preset)
    meas = select_group(read_measurements(args.measurements), args.group, args.measurements)
    out = predict(preset, meas)
    write_file(path, lambda tmp: out.to_csv(tmp, index=False))
    kinds = step_kinds(out).tolist()
    summary = error_summary(kinds, out["step_ms"].to_numpy(), out["predicted_ms"].to_numpy())
    ape = np.abs(out["predicted_ms"] - out["step_ms"]) / out["step_ms"] * 100.0
    print(format_error_table(f"{preset.name} on {len(out)} rows", summary))
    print(f"overall: median APE {np.median(ape):.1f}%, mean APE {np.mean(ape):.1f}%")
    print(f"wrote {args.out}")
    return 0
