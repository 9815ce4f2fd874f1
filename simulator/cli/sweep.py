"""``servesim sweep``: run a grid of scenario variants in parallel and tabulate them."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.cli.common import (
    Subparsers,
    add_backend_args,
    add_out_args,
    console_table,
    results_folder,
    warn_stack,
)
from simulator.errors import InputError

MAX_RUNS = 10_000
"""A grid of more runs is refused unless ``--yes``: a typo (one value too many on each of
four keys) can turn an hour into days."""

RUN_RATES = {"requests_per_s": 1000.0, "plots_s": 10.0}
"""What one sweep run costs, for the estimate said before a sweep starts: simulated requests
per second of one process, and seconds to draw a run's plots. Measured on this project's
2-core machine shared by several jobs (2026-12-01: two quickstart runs of 3,000 requests,
``--jobs 1``: 11.4 s without plots, 35.0 s with); a rough figure, not a promise."""

if TYPE_CHECKING:
    import pandas as pd

    from simulator.scenario.config import ScenarioConfig


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``sweep`` command."""
    p = subparsers.add_parser(
        "sweep", help="run a grid of scenario variants in parallel", description=run.__doc__
    )
    p.add_argument("scenario", help="base scenario YAML file")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        required=True,
        metavar="KEY=V1,V2,...",
        help="values of a dotted key to sweep (repeatable: the cartesian product is run); "
        "keys that vary together: 'KEY1,KEY2=V1,V2;V1,V2;...', one variant per ';' (a bare "
        "word among them that is no scenario key names the variants, e.g. layout)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="fixed override")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run each point with this many seeds (the scenario's seed, +1, ...); the plots "
        "show their median and min-max band (default 1)",
    )
    add_backend_args(p)
    add_out_args(p, "<name>-sweep", "plots")
    p.add_argument(
        "--yes",
        action="store_true",
        help=f"run a grid of more than {MAX_RUNS:,} runs (refused without it)",
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        action="store_true",
        help="show a progress bar even off a terminal (default: a bar on a terminal, "
        "else a line at each tenth of the runs)",
    )
    shown.add_argument("--no-progress", action="store_true", help="report no progress")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the cartesian product of grids in parallel processes (keys given together in one
    --grid vary together)."""
    from simulator.explore.backends import check_backend
    from simulator.explore.grid import cell_keys
    from simulator.explore.sweep import (
        check_points_fit,
        check_some_point_is_valid,
        parse_grid,
        seeded_grid,
        sweep_base,
    )

    # validate every grid point first, then run them, then write table and plots
    grid = parse_grid(args.grid, zipped=True)
    base, base_cfg = sweep_base(args.scenario, args.set, grid)
    name = base_cfg.name
    check_backend(args.backend, args.jobs, args.address)
    runs = seeded_grid(grid, args.seeds, base_cfg.seed)  # grid plus the seeds' column
    num_runs = math.prod(len(v) for v in runs.values())
    plan = _plan(num_runs, runs, base_cfg, args)
    if num_runs > MAX_RUNS and not args.yes:
        # refused before anything is validated point by point, run or written
        raise InputError(f"--grid: {plan}: more than {MAX_RUNS:,} runs; pass --yes to run them")
    check_some_point_is_valid(base, grid, args.scenario)
    check_points_fit(base, grid, args.scenario)  # a deployment that cannot exist: exit 2
    warn_stack(base_cfg.cost_model)
    print(f"{name}: {plan}", file=sys.stderr)
    # a default folder is reserved under a name no other sweep has, and removed on failure
    with results_folder(args.out, args.overwrite, f"{name}-sweep") as (out, tmp):
        table = _run_into(tmp, args, base, base_cfg, grid, runs)
    failed = table[table["status"] == "failed"]
    print(f"{name}: {len(table) - len(failed)} of {len(table)} runs ok; results in {out}")
    print(_sweep_table(table, cell_keys(runs)))
    # exit 1 if any point failed, so a script notices; the table still holds every point
    return 1 if len(failed) else 0


def _run_into(
    tmp: Path,
    args: argparse.Namespace,
    base: dict[str, Any],
    base_cfg: ScenarioConfig,
    grid: dict[str, list[Any]],
    runs: dict[str, list[Any]],
) -> pd.DataFrame:
    """Run the sweep (``runs``: the grid and its seeds) into the temporary folder ``tmp``
    (``results_folder``'s); the table."""
    from simulator.explore.sweep import base_yaml, plot_keys, run_sweep
    from simulator.results.writer import write_sweep

    # on a terminal a bar (tqdm's, None: shown there only); off one, lines
    bar = None if sys.stderr.isatty() else False
    table = run_sweep(
        base,
        runs,
        tmp,
        source=args.scenario,
        jobs=args.jobs,
        plots=not args.no_plots,
        fmt=args.format,
        progress=False if args.no_progress else True if args.progress else bar,
        backend=args.backend,
        address=args.address,
        report=None if args.no_progress or args.progress or bar is None else _say,
    )
    # the figures' keys: one per grid entry (keys varied together by their name)
    keys = plot_keys(grid)
    meta = {"scenario": args.scenario, "grid": grid, "set": args.set, "keys": keys}
    meta["seeds"] = runs.get("seed", [base_cfg.seed])  # repeats of each point, not a key
    scenario = base_yaml(base_cfg, args.scenario, args.set, grid)
    write_sweep(table, tmp, meta, scenario, plots=not args.no_plots, fmt=args.format)
    return table


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _plan(
    runs: int, grid: dict[str, list[Any]], cfg: ScenarioConfig, args: argparse.Namespace
) -> str:
    """``24 runs (4 x 6) on 2 processes, about 3 min``: the size of the sweep and a rough
    estimate of its time (``RUN_RATES``)."""
    import os

    shape = " x ".join(str(len(v)) for v in grid.values())
    procs = 1 if args.jobs == 1 else min(args.jobs or os.cpu_count() or 1, runs)
    head = f"{runs:,} run{'s' if runs != 1 else ''} ({shape}) on {procs} process"
    head += "es" if procs != 1 else ""
    counts = grid.get("workload.num_requests") or [cfg.workload.num_requests]
    if not all(isinstance(n, int) for n in counts):
        return head + " (no estimate of the time: a trace's size is known once read)"
    per_run = sum(counts) / len(counts) / RUN_RATES["requests_per_s"]
    per_run += 0.0 if args.no_plots else RUN_RATES["plots_s"]
    from simulator.explore.sweep import duration_text

    return f"{head}, roughly {duration_text(runs * per_run / procs)}"


def _sweep_table(table: pd.DataFrame, keys: list[str]) -> str:
    """The sweep's headline figures, one row per point, each column headed with its unit;
    goodput and SLO attainment when the scenario sets an SLO."""
    cols = {  # summary column -> (heading, scale)
        "ttft_p50_s": ("ttft_p50 (ms)", 1e3),
        "ttft_p99_s": ("ttft_p99 (ms)", 1e3),
        "tpot_p50_s": ("tpot_p50 (ms)", 1e3),
        "tpot_p99_s": ("tpot_p99 (ms)", 1e3),
        "request_throughput": ("throughput (req/s)", 1.0),
        "goodput": ("goodput (req/s)", 1.0),
        "slo_attainment": ("within SLO (%)", 100.0),
        "num_preemptions": ("preemptions", 1.0),
    }
    from simulator.cli.console import render

    show = console_table(table, keys, cols)
    return render(show, ident=len(keys) + 1)
