"""``servesim compare``: a simulation held against a measured run of the same requests."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path
from typing import Any

from simulator.cli.common import Subparsers
from simulator.errors import InputError


def run(args: argparse.Namespace) -> int:
    """Hold a simulation against a measured run of the same requests: mean, p50, p90 and p99
    of TTFT, TPOT, ITL (where measured) and E2E, measured vs simulated with the signed error.

    SIM is a folder written by `servesim run`, or a scenario YAML, simulated here first
    (nothing of the run is saved). MEASURED is LLMServingSim's requests.jsonl (TTFT and E2E
    then count from the engine queue on both sides, as that file records them), the JSON of
    `vllm bench serve --save-result --save-detailed` (or `servesim run --vllm-bench-json`),
    guidellm's benchmarks.json (one comparison per benchmark in it), or a CSV
    request_id,ttft_s,tpot_s,e2e_s. A run folder gets the CDF figure as compare.png (one
    compare-N.png per guidellm benchmark) unless --plot or --no-plot says otherwise.
    """
    from simulator.output_file import check_output_file
    from simulator.validation.compare import compare, format_table, read_measured_runs, simulated
    from simulator.validation.measured import guess_format

    for flag, target in (("--json", args.json), ("--plot", args.plot)):
        if not target:
            continue
        if not Path(target).parent.is_dir():  # fail before any work
            raise InputError(f"{flag} {target}: folder {Path(target).parent} does not exist")
        check_output_file(target, f"{flag} {target}")
    if not args.no_plot and not args.plot and Path(args.sim).is_dir():
        default_plot = Path(args.sim) / "compare.png"
        check_output_file(default_plot, str(default_plot))
    fmt = args.format or guess_format(args.measured)
    # a bad file fails before anything is simulated
    runs = read_measured_runs(args.measured, fmt)
    requests, summary, label, folder = _simulation(args.sim, args.set)
    results = []
    for i, (name, meas) in enumerate(runs):
        sim = simulated(requests, summary, meas.reference, label)
        metrics = compare(sim, meas)
        since = "the engine queue" if meas.reference == "queued" else "arrival"
        what = args.measured if len(runs) == 1 else f"{args.measured} {name}"
        if i:
            print()
        print(f"{label} vs {what} ({fmt}; {len(meas)} requests; TTFT and E2E from {since})")
        print(format_table(metrics))
        results.append((name, sim, meas, metrics))
    if args.json:
        _write_json(args.json, [(name, metrics) for name, _, _, metrics in results])
    plot = None if args.no_plot else args.plot or (folder / "compare.png" if folder else None)
    if plot is not None:
        _plot(Path(plot), results, f"{label} vs {Path(args.measured).name}")
    return 0


def _write_json(path: str, named: list[tuple[str, Any]]) -> None:
    """The comparison as JSON: ``metrics``, or one entry per guidellm benchmark."""
    from simulator.output_file import write_text
    from simulator.results.writer import json_safe

    if len(named) == 1:
        doc: dict[str, Any] = {"metrics": json_safe(named[0][1])}
    else:
        doc = {"benchmarks": [{"benchmark": n, "metrics": json_safe(m)} for n, m in named]}
    write_text(path, json.dumps(doc, indent=2, allow_nan=False) + "\n", f"--json {path}")


def _plot(plot: Path, results: list[Any], title: str) -> None:
    """The CDF figure, or one per benchmark (``compare-0.png``, ``compare-1.png``, ...)."""
    from simulator.plots.compare import plot_compare_cdfs
    from simulator.plots.style import save_figure

    for i, (name, sim, meas, _) in enumerate(results):
        target, named = plot, title
        if len(results) > 1:
            target, named = plot.with_name(f"{plot.stem}-{i}{plot.suffix}"), f"{title} {name}"
        print(f"figure: {save_figure(plot_compare_cdfs(sim, meas, named), target)}")


def _simulation(sim: str, overrides: list[str]) -> tuple[Any, dict[str, Any], str, Path | None]:
    """(requests, summary, label, run folder or None) of a run folder or a scenario (with
    its ``--set`` overrides)."""
    path = Path(sim)
    if path.is_dir():
        if overrides:
            raise InputError(f"--set applies to a scenario, and {sim} is a run folder")
        table = path / "requests.parquet"
        if not table.is_file():
            raise InputError(f"{sim}: not a servesim run folder (no requests.parquet)")
        from simulator.results.reader import read_parquet, read_summary

        return read_parquet(table), read_summary(path), str(path), path
    if not path.is_file():
        raise InputError(f"{sim}: no such run folder or scenario file")
    from simulator.scenario.config import load_scenario, parse_overrides
    from simulator.scenario.runner import run as simulate

    result = simulate(load_scenario(path, parse_overrides(overrides)), progress=None)
    return result.requests, result.summary, str(path), None


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``compare`` command."""
    p = subparsers.add_parser(
        "compare",
        help="compare a simulation with a measured run of the same requests",
        description=inspect.cleandoc(run.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sim", metavar="SIM", help="a `servesim run` folder, or a scenario YAML")
    p.add_argument("measured", metavar="MEASURED", help="the measured run's file")
    p.add_argument(
        "--format",
        choices=["llmservingsim", "vllm-bench", "guidellm", "csv"],  # measured.FORMATS
        help="format of MEASURED (default: from its name: .jsonl, .json, .csv; a .json with "
        "a 'benchmarks' list is guidellm's)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the comparison as JSON (seconds)")
    p.add_argument("--plot", metavar="FILE", help="write the CDF figure here")
    p.add_argument("--no-plot", action="store_true", help="draw no figure")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of a SIM scenario, e.g. --set scheduler.max_num_seqs=64",
    )
    return p
