"""``servesim search``: the capacity and cost of every deployment in a grid."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from simulator.cli.capacity import add_search_args, check_search_args
from simulator.cli.common import (
    Subparsers,
    add_backend_args,
    add_out_args,
    add_scenario_args,
    add_uncertainty_arg,
    console_table,
    results_folder,
)

if TYPE_CHECKING:
    import pandas as pd

    from simulator.explore.search import SearchSpec


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``search`` command."""
    p = subparsers.add_parser(
        "search",
        help="capacity and cost of every deployment in a grid; the cheapest that serves",
        description=run.__doc__,
    )
    add_scenario_args(p)
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        required=True,
        metavar="KEY=V1,V2,...",
        help="values of a dotted key to search (repeatable: the cartesian product), e.g. "
        "cost_model.hardware=a100-80gb,h100-sxm; keys given together vary together, one "
        "variant per ';', as in servesim sweep: 'name,cost_model.hardware,cost_model.tp="
        "2xH100-TP2,h100-sxm,2;1xH200,h200,1'",
    )
    add_search_args(p)
    p.add_argument(
        "--replicas-for",
        nargs="?",
        const="scenario",
        metavar="LOAD",
        help="instead of each capacity, the fewest cluster.replicas that serve LOAD (req/s, "
        "or a trace's time_scale; without LOAD the scenario's own)",
    )
    p.add_argument(
        "--gpu-cost",
        action="append",
        default=[],
        metavar="HARDWARE=USD",
        help="dollars per GPU-hour of a hardware preset (overrides its cost_per_hour), or a "
        "bare USD for every GPU (needed with a linear cost model)",
    )
    add_backend_args(p)
    add_uncertainty_arg(p, "each capacity (not --replicas-for's counts) gets")
    add_out_args(p, "<name>-search", "the figure")
    return p


def _spec(args: argparse.Namespace) -> tuple[SearchSpec, Any]:
    from simulator.errors import InputError
    from simulator.explore.pricing import parse_gpu_costs
    from simulator.explore.search import SearchSpec
    from simulator.explore.slo import make_target
    from simulator.explore.sweep import check_some_point_is_valid, parse_grid, sweep_base

    grid = parse_grid(args.grid, zipped=True)
    base, cfg = sweep_base(args.scenario, args.set, grid)
    check_some_point_is_valid(base, grid, args.scenario)
    slo = cfg.slo.model_dump() if cfg.slo is not None else None
    replicas_for = None
    if args.replicas_for not in (None, "scenario"):
        try:
            replicas_for = float(args.replicas_for)
        except ValueError:
            replicas_for = float("nan")
        if not replicas_for > 0:
            raise InputError(f"--replicas-for {args.replicas_for}: a load > 0")
    spec = SearchSpec(
        base=base,
        source=args.scenario,
        grid=grid,
        target=make_target(args.slo, args.attain, slo),
        seeds=tuple(cfg.seed + i for i in range(args.seeds)),
        tolerance=args.tolerance,
        prices=parse_gpu_costs(args.gpu_cost),
        start=args.start,
        replicas_for=replicas_for,
        replicas_for_scenario=args.replicas_for == "scenario",
        uncertainty=args.uncertainty == "on",
    )
    return spec, cfg


def run(args: argparse.Namespace) -> int:
    """For every deployment in the grid, find its capacity under the SLO (as `servesim
    capacity` does; all searches run together), then its cost: capacity per dollar and dollars
    per million tokens, from each hardware preset's cost_per_hour. Writes search.parquet and a
    Pareto figure (cost per million tokens against p99 TTFT) marking the cheapest deployment
    that meets the SLO."""
    from simulator.explore.backends import check_backend, make_backend
    from simulator.explore.driver import drive
    from simulator.explore.grid import cell_keys
    from simulator.explore.search import check_points, search_table, searches
    from simulator.results.outdir import check_out_dir
    from simulator.results.writer import write_search

    check_search_args(args)
    check_backend(args.backend, args.jobs, args.address)
    spec, cfg = _spec(args)
    check_points(spec)
    if args.out:
        from pathlib import Path

        check_out_dir(Path(args.out), args.overwrite)
    print(f"{cfg.name}: search under {spec.target.describe()}", file=sys.stderr)
    bar = _Progress(len(spec_points(spec)))
    with results_folder(args.out, args.overwrite, f"{cfg.name}-search") as (out, tmp):
        try:
            with make_backend(args.backend, args.jobs, args.address) as backend:
                rows = drive(searches(spec), backend, on_unit=bar.unit, on_search=bar.point)
        finally:
            bar.close()
        table = search_table(rows, spec.grid)
        write_search(table, tmp, _meta(args, spec, cfg), _scenario_yaml(cfg, args),
                     not args.no_plots, args.format)  # fmt: skip
    failed = int((table["status"] == "failed").sum())
    counts = ", ".join(f"{n} {status}" for status, n in table["status"].value_counts().items())
    print(f"{cfg.name}: {len(table)} deployments searched ({counts}); results in {out}")
    print(search_console_table(table, cell_keys(spec.grid)))
    for row in table[table["reason"].notna()].itertuples(index=False):
        print(f"  {row.point}: {row.status}: {row.reason}")  # every non-found status says why
    if not table["status"].isin(["found", "max_probes"]).any():  # as capacity's none
        print(f"{cfg.name}: no deployment searched serves the load within the SLO")
        return 1
    return 1 if failed else 0


class _Progress:
    """A bar over deployments, the simulations run so far beside it (on a terminal)."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="search", unit="deployment", file=sys.stderr,
                        disable=None)  # fmt: skip
        self.runs = 0

    def unit(self, search: int, done: Any) -> None:
        self.runs += 1
        self.bar.set_postfix_str(f"{self.runs} simulations", refresh=False)
        self.bar.refresh()

    def point(self, search: int, row: dict[str, Any]) -> None:
        if row.get("status") == "failed":
            self.bar.write(f"servesim: {row['point']} failed: {row['error']}", file=sys.stderr)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def spec_points(spec: SearchSpec) -> list[Any]:
    from simulator.explore.sweep import grid_points

    return grid_points(spec.grid)


def _meta(args: argparse.Namespace, spec: SearchSpec, cfg: Any) -> dict[str, Any]:
    from simulator.explore.grid import label_keys

    return {
        "scenario_name": cfg.name,
        "scenario": args.scenario,
        "set": args.set,
        "grid": spec.grid,
        "keys": label_keys(spec.grid),  # what labels the figure's points
        "slo": spec.target.to_json(),
        "seeds": list(spec.seeds),
        "tolerance": spec.tolerance,
        "gpu_cost": spec.prices,
        "replicas_for": args.replicas_for,
        "backend": args.backend,
    }


def _scenario_yaml(cfg: Any, args: argparse.Namespace) -> str:
    from simulator.explore.sweep import headed_yaml

    grid = [f"#   --grid {item}" for item in args.grid]
    return headed_yaml(cfg, "a design search", args.scenario, args.set, grid)


def search_console_table(table: pd.DataFrame, keys: list[str]) -> str:
    """One row per deployment: its answer and cost, units in the headings; ``*`` marks the
    cheapest that serves the SLO."""
    units = table["unit"].dropna().tolist() if "unit" in table else []  # none: none searched
    unit = str(units[0]) if units else ""
    answer = "replicas" if "replicas" in table else "capacity"
    cols = {  # column -> (heading, scale)
        answer: (answer if answer == "replicas" else f"capacity ({unit})", 1.0),
        "gpus": ("GPUs", 1.0),
        "usd_per_hour": ("$/hour", 1.0),
        "requests_per_usd": ("requests/$", 1.0),
        "usd_per_million_tokens": ("$/M tokens", 1.0),
        "ttft_p99_s": ("ttft_p99 (ms)", 1e3),
        "num_simulations": ("runs", 1.0),
    }
    show = console_table(table, keys, cols)
    if answer == "capacity" and "capacity_ci_low" in table:
        heading = cols["capacity"][0]
        show[heading] = [_capacity_cell(r) for r in table.to_dict("records")]
    if answer == "capacity" and "capacity_model_low" in table:
        show["model 90%"] = [_model_cell(r) for r in table.to_dict("records")]
    show[""] = ["*" if c else "" for c in table["cheapest"]]
    from simulator.cli.console import render

    return render(show, ident=len(keys) + 1)


def _model_cell(row: dict[Any, Any]) -> str:
    """A point's capacity model interval (its cost model's error band), ``low-high``."""
    import math

    lo, hi = row.get("capacity_model_low"), row.get("capacity_model_high")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"{lo:.3g}-{hi:.3g}"


def _capacity_cell(row: dict[Any, Any]) -> str:
    """A point's capacity to the digits its 95% interval supports, with the interval."""
    import math

    from simulator.explore.estimate import significant

    value, lo, hi = row.get("capacity"), row.get("capacity_ci_low"), row.get("capacity_ci_high")
    if value is None or not math.isfinite(value):
        return "-"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return significant(value, None, 0.02)
    half = (hi - lo) / 2

    def fmt(v: float) -> str:
        return significant(v, half, 0.02)

    return f"{fmt(value)} ({fmt(lo)}-{fmt(hi)})"
