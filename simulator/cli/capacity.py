"""``servesim capacity``: the highest load at which a scenario still meets an SLO."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.cli.common import (
    Subparsers,
    add_backend_args,
    add_out_args,
    add_scenario_args,
    add_uncertainty_arg,
    results_folder,
)

if TYPE_CHECKING:
    from simulator.explore.capacity import ProbeReport
    from simulator.explore.estimate import SeededCapacity
    from simulator.explore.probe import Load


def add_search_args(p: argparse.ArgumentParser) -> None:
    """``--slo``, ``--attain``, ``--seeds``, ``--tolerance``: what a capacity must meet; and
    ``--start``, the load its search probes first."""
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="TERMS",
        help="bounds on run statistics, <metric>_<stat>_ms=<bound> (metric: ttft, tpot, itl, "
        "e2e, queue_delay; stat: mean or pNN), e.g. ttft_p99_ms=500,tpot_p99_ms=50; or "
        "per-request limits <metric>_ms=<limit> with --attain. Default: the scenario's slo: "
        "met by 99%% of requests",
    )
    p.add_argument(
        "--attain",
        type=float,
        metavar="SHARE",
        help="goodput attainment: at least this share of requests meet every per-request "
        "limit (--slo ttft_ms=...,tpot_ms=..., or the scenario's slo:), e.g. 0.99",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=5,
        help="seeds: one capacity search each, the capacity their mean with 95%% intervals "
        "(default 5; with --replicas-for, each must meet the SLO)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="stop when the bracket's relative width is at most this (default 0.02)",
    )
    p.add_argument(
        "--start",
        type=float,
        help="first load probed: req/s, or a trace's time_scale (default: the scenario's)",
    )


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``capacity`` command."""
    p = subparsers.add_parser(
        "capacity",
        help="the most load a scenario serves within an SLO",
        description=run.__doc__,
    )
    add_scenario_args(p)
    add_search_args(p)
    add_backend_args(p)
    add_uncertainty_arg(p, "the capacity gets")
    add_out_args(p, "<name>-capacity", "the figure")
    return p


def check_search_args(args: argparse.Namespace) -> None:
    """Refuse nonsense numbers in one line before anything runs."""
    from simulator.errors import InputError

    if args.seeds < 1:
        raise InputError(f"--seeds {args.seeds}: must be >= 1")
    if not 0 < args.tolerance < 1:
        raise InputError(f"--tolerance {args.tolerance}: must be in (0, 1)")
    if getattr(args, "start", None) is not None and not args.start > 0:
        raise InputError(f"--start {args.start}: must be > 0")


def run(args: argparse.Namespace) -> int:
    """Find the highest arrival rate (or trace time_scale) at which the scenario meets the
    SLO: bracketing then bisection to --tolerance, probes that can no longer meet the SLO cut
    short; when the first load misses, the requests are first sent one at a time, and if even
    that misses there is no capacity. Writes capacity.json (capacity, bracket, every probe),
    probes.parquet and a figure of latency against load."""
    from simulator.explore.backends import check_backend
    from simulator.explore.driver import drive
    from simulator.explore.estimate import seeded_capacity
    from simulator.explore.probe import ProbeSpec, load_for, probe_scenario
    from simulator.explore.slo import make_target
    from simulator.explore.sweep import sweep_base
    from simulator.results.outdir import check_out_dir
    from simulator.results.writer import write_capacity

    check_search_args(args)
    check_backend(args.backend, args.jobs, args.address)
    base, cfg = sweep_base(args.scenario, args.set, {})
    slo = cfg.slo.model_dump() if cfg.slo is not None else None
    target = make_target(args.slo, args.attain, slo)
    load = load_for(cfg, args.start)
    seeds = [cfg.seed + i for i in range(args.seeds)]
    first = ProbeSpec(base, args.scenario, load, load.start, cfg.seed, target)
    _validate_probe(probe_scenario(first), args.scenario)
    if args.out:
        check_out_dir(Path(args.out), args.overwrite)
    print(f"{cfg.name}: capacity under {target.describe()}, {len(seeds)} seed(s)", file=sys.stderr)
    searches = [
        seeded_capacity(base, args.scenario, target, load, seeds, args.tolerance, at, report)
        for at, report in [((), _reporter(load)), *_band_ends(args, cfg)]
    ]
    with results_folder(args.out, args.overwrite, f"{cfg.name}-capacity") as (out, tmp):
        with _backend(args, len(seeds) * len(searches)) as backend:
            found, *ends = drive(searches, backend)
        result = _json(found.to_json(), cfg.name, args, target, seeds)
        if args.uncertainty == "on":
            result["model_interval"] = _model_interval(cfg, found, ends)
        write_capacity(result, tmp, _scenario_yaml(cfg, args), not args.no_plots, args.format)
    if args.uncertainty == "on":
        print(_interval_line(result["model_interval"], found.load.unit))
    print(_summary_line(cfg.name, found, out))  # the answer, last
    return 0 if found.outcome == "found" else 1


def _band_ends(args: argparse.Namespace, cfg: Any) -> list[Any]:
    """The scenario at both ends of its cost model's error band (``explore.uncertainty``),
    as (overrides, reporter) pairs; none with --uncertainty off or no measured band."""
    from simulator.explore.uncertainty import scenario_band

    found = scenario_band(cfg) if args.uncertainty == "on" else None
    if found is None:
        return []
    scale = cfg.serving.gpu_time_scale
    return [((("serving.gpu_time_scale", scale * s),), None) for s in found[1].scales()]


def _model_interval(cfg: Any, found: SeededCapacity, ends: list[SeededCapacity]) -> dict:
    """capacity.json's ``model_interval``: the capacity at the band's ends (with the
    search's own), or why there is none."""
    from simulator.cost.error_band import load_bands
    from simulator.explore.uncertainty import no_band, scenario_band

    band = scenario_band(cfg)
    if band is None:
        return no_band(cfg)
    values = [c.capacity for c in (found, *ends)]
    head = {"level": load_bands().level, "available": True, "cost_model": band[0]}
    head["step_time_error"] = [band[1].low, band[1].high]
    known = [v for v in values if v is not None]
    if len(known) < len(values):
        return {**head, "low": None, "high": None, "reason": "a band end found no capacity"}
    return {**head, "low": min(known), "high": max(known)}


def _interval_line(interval: dict[str, Any], unit: str) -> str:
    """The capacity's model interval in one line."""
    level = f"{interval['level']:.0%}"
    if not interval.get("available") or interval["low"] is None:
        return f"model: no {level} interval: {interval['reason']}"
    low, high = interval["step_time_error"]
    return (
        f"model: {level} interval {interval['low']:.3g}-{interval['high']:.3g} {unit} "
        f"({interval['cost_model']}: steps {low:+.1%} to {high:+.1%} off on held-out GPUs)"
    )


def _validate_probe(data: dict[str, Any], source: str) -> None:
    """The first probe's scenario is valid (and its presets resolve), before any run."""
    from simulator.scenario.config import validate
    from simulator.scenario.runner import resolve

    resolve(validate(data, source))


def _backend(args: argparse.Namespace, units: int) -> Any:
    from simulator.explore.backends import make_backend

    jobs = args.jobs
    if args.backend == "local" and jobs is None:
        # the seeds' searches run side by side, one probe each at a time
        jobs = min(units, os.cpu_count() or 1)
    return make_backend(args.backend, jobs, args.address)


def _reporter(load: Load) -> Any:
    def report(seed: int, r: ProbeReport) -> None:
        verdict = "meets the SLO" if r.meets else "misses the SLO"
        cut = " (cut short)" if r.cut_short else ""
        lo = "-" if r.meets_at is None else load.describe(r.meets_at)
        hi = "-" if r.fails_at is None else load.describe(r.fails_at)
        print(
            f"  seed {seed} probe {r.index + 1}: {load.describe(r.level)} {verdict}{cut}; "
            f"meets at {lo}, misses at {hi}",
            file=sys.stderr,
        )

    return report


def _json(
    found: dict[str, Any], name: str, args: argparse.Namespace, target: Any, seeds: list[int]
) -> dict[str, Any]:
    head = {"scenario_name": name, "scenario": args.scenario, "set": args.set}
    head.update(slo=target.to_json(), seeds=seeds, backend=args.backend)
    return {**head, **found}


def _scenario_yaml(cfg: Any, args: argparse.Namespace) -> str:
    from simulator.explore.sweep import headed_yaml

    note = "# each probe sets the load and the seed (capacity.json: probes)"
    return headed_yaml(cfg, "a capacity search", args.scenario, args.set, [note])


def _summary_line(name: str, found: SeededCapacity, out: Path) -> str:
    """The answer in one line: capacity and its intervals (to the digits they support), the
    runs used, where the results are."""
    probes, sims = found.num_probes, found.num_simulations
    runs = f"{probes} probe{'s' * (probes != 1)}, {sims} simulation{'s' * (sims != 1)}"
    cut = sum(p["cut_short"] is not None for p in found.probes)
    runs += f" ({cut} cut short)" if cut else ""
    return f"{name}: {capacity_text(found)}; {runs}; results in {out}"


def capacity_text(found: SeededCapacity) -> str:
    """``capacity 6.7 req/s (95% CI 6.3-7.1, ...)``, or why there is none."""
    from simulator.explore.estimate import significant

    mean, ci, pi = found.capacity, found.interval(), found.interval(one_seed=True)
    if mean is None:
        return f"no capacity ({found.outcome}): {found.reason()}"
    unit = found.load.unit
    stopped = "" if found.outcome == "found" else f" (stopped: {found.outcome})"
    if ci is None or pi is None:
        text = significant(mean, None, found.tolerance)
        return (
            f"capacity {text} {unit}{stopped} (one seed, no interval: seeds differ by ~20% "
            "in the quickstart; --seeds 5 measures it)"
        )
    half = (ci[1] - ci[0]) / 2

    def fmt(v: float) -> str:
        return significant(v, half, found.tolerance)

    return (
        f"capacity {fmt(mean)} {unit}{stopped} (95% CI {fmt(ci[0])}-{fmt(ci[1])}, mean of "
        f"{len(found.seeds)} seeds; one seed's capacity: {fmt(pi[0])}-{fmt(pi[1])})"
    )
