"""``servesim convert``: public GPU profiles (Splitwise, Vidur MLP) to a measurement CSV."""

from __future__ import annotations

import argparse

from simulator.cli.common import Subparsers


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``convert`` command."""
    p = subparsers.add_parser(
        "convert",
        help="convert Splitwise / Vidur profiles to a measurement CSV",
        description=run.__doc__,
    )
    p.add_argument("format", choices=["splitwise", "vidur-mlp"], help="source format")
    p.add_argument("source", help="Splitwise perf_model.csv or Vidur mlp.csv")
    p.add_argument("--out", required=True, help="measurement CSV to write")
    p.add_argument("--group", help="keep only this group (e.g. llama2-70b_a100-80gb_tp8)")
    p.add_argument("--model", help="vidur-mlp: model preset (layer count, shape check)")
    p.add_argument("--hardware", help="vidur-mlp: hardware preset the profile was taken on")
    return p


def run(args: argparse.Namespace) -> int:
    """Convert a public profile (Splitwise, Vidur MLP) to a measurement CSV."""
    from simulator.cost.calibration.convert import convert_splitwise, convert_vidur_mlp
    from simulator.cost.calibration.measurements import select_group
    from simulator.errors import InputError
    from simulator.output_file import check_output_file, write_file

    out = check_output_file(args.out)
    if args.format == "splitwise":
        rows = convert_splitwise(args.source, args.group)
    else:
        if args.model is None:
            raise InputError("convert vidur-mlp: pass --model (for the layer count)")
        rows = convert_vidur_mlp(args.source, args.model, args.hardware)
        if args.group is not None:
            rows = select_group(rows, args.group, args.source)
    write_file(out, lambda tmp: rows.to_csv(tmp, index=False))
    groups = rows["group"].nunique()
    print(f"wrote {args.out}: {len(rows)} points in {groups} group(s)")
    return 0
