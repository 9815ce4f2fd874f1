"""``servesim run``: simulate one scenario and write its results."""

from __future__ import annotations

import argparse
import sys
from contextlib import suppress
from pathlib import Path

from simulator.cli.common import (
    Subparsers,
    add_format_arg,
    add_scenario_args,
    add_steps_arg,
    format_replicas,
    format_summary,
    served_too_little,
)


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``run`` command."""
    p = subparsers.add_parser("run", help="simulate one scenario", description=run.__doc__)
    add_scenario_args(p)
    p.add_argument("--out", help="output folder (default: results/<name>/<timestamp>/)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--no-plots", action="store_true", help="skip drawing plots")
    add_format_arg(p)
    p.add_argument(
        "--progress", action="store_true", help="show a progress bar even off a terminal"
    )
    add_steps_arg(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Simulate one scenario and write its tables, summary, resolved scenario and plots."""
    from simulator.config import load_scenario, parse_overrides
    from simulator.results.outdir import atomic_dir, check_out_dir, default_out_dir, reserve_out_dir
    from simulator.results.writer import write_result
    from simulator.runner import resolve
    from simulator.runner import run as run_scenario

    cfg = resolve(load_scenario(args.scenario, parse_overrides(args.set)))
    given = bool(args.out)
    # A default folder is created now, under a name no other run has (not even one started
    # in the same second), and removed again if this run fails.
    out = Path(args.out) if given else reserve_out_dir(default_out_dir(cfg.name))
    try:
        check_out_dir(out, args.overwrite, given=given)  # fail before the simulation, not after
        with atomic_dir(out, args.overwrite, given=given) as tmp:
            # the step table streams into the (temporary) results folder as the run goes
            result = run_scenario(
                cfg,
                progress=None if not args.progress else True,
                steps=args.steps,
                steps_path=tmp / "steps.parquet",
            )
            write_result(result, tmp, plots=not args.no_plots, fmt=args.format)
    except BaseException:
        if not given:
            with suppress(OSError):
                out.rmdir()  # only if still empty
        raise
    print(f"{cfg.name}: results in {out}")
    print(format_summary(result.summary))
    if result.replicas is not None:
        print(format_replicas(result.summary, result.replicas))
    problem = served_too_little(result.summary)
    if problem is not None:  # the results are written (they say why), but this is no success
        print(f"servesim: error: {problem}", file=sys.stderr)
        return 1
    return 0
