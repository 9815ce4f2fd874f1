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
    `vllm bench serve --save-result --save-detailed`, or a CSV request_id,ttft_s,tpot_s,e2e_s.
    A run folder gets the CDF figure as compare.png unless --plot or --no-plot says otherwise.
    """
    from simulator.output_file import check_output_file, write_text
    from simulator.results.writer import json_safe
    from simulator.validation.compare import compare, format_table, simulated
    from simulator.validation.measured import guess_format, read_measured

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
    meas = read_measured(args.measured, fmt)  # a bad file fails before anything is simulated
    requests, summary, label, folder = _simulation(args.sim, args.set)
    sim = simulated(requests, summary, meas.reference, label)
    metrics = compare(sim, meas)
    since = "the engine queue" if meas.reference == "queued" else "arrival"
    print(f"{label} vs {args.measured} ({fmt}; {len(meas)} requests; TTFT and E2E from {since})")
    print(format_table(metrics))
    if args.json:
        text = json.dumps({"metrics": json_safe(metrics)}, indent=2, allow_nan=False) + "\n"
        write_text(args.json, text, f"--json {args.json}")
    plot = None if args.no_plot else args.plot or (folder / "compare.png" if folder else None)
    if plot is not None:
        from simulator.plots.compare import plot_compare_cdfs
        from simulator.plots.style import save_figure

        path = save_figure(
            plot_compare_cdfs(sim, meas, f"{label} vs {Path(args.measured).name}"), Path(plot)
        )
        print(f"figure: {path}")
    return 0


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
    from simulator.config import load_scenario, parse_overrides
    from simulator.runner import run as simulate

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
        choices=["llmservingsim", "vllm-bench", "csv"],  # validation.measured.FORMATS
        help="format of MEASURED (default: from its name: .jsonl, .json, .csv)",
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
