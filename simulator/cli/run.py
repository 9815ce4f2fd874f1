"""``servesim run``: simulate one scenario and write its results."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from simulator.cli.common import (
    Subparsers,
    add_out_args,
    add_scenario_args,
    add_steps_arg,
    add_uncertainty_arg,
    format_replicas,
    format_server,
    format_summary,
    results_folder,
    served_too_little,
    warn_stack,
)


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``run`` command."""
    p = subparsers.add_parser("run", help="simulate one scenario", description=run.__doc__)
    add_scenario_args(p)
    add_out_args(p, "<name>", "plots")
    p.add_argument(
        "--progress", action="store_true", help="show a progress bar even off a terminal"
    )
    add_steps_arg(p)
    add_uncertainty_arg(p, "each figure of the summary gets")
    p.add_argument(
        "--vllm-bench-json",
        metavar="FILE",
        help="also write the run as `vllm bench serve --save-result --save-detailed` JSON",
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Simulate one scenario and write its tables, summary, resolved scenario and plots."""
    from simulator.results.writer import write_result
    from simulator.scenario.config import load_scenario, parse_overrides
    from simulator.scenario.runner import resolve
    from simulator.scenario.runner import run as run_scenario

    cfg = resolve(load_scenario(args.scenario, parse_overrides(args.set)))
    if args.vllm_bench_json:
        from simulator.output_file import check_output_file

        check_output_file(args.vllm_bench_json, f"--vllm-bench-json {args.vllm_bench_json}")
    # A default folder is created now, under a name no other run has (not even one started
    # in the same second), and removed again if this run fails; --out is checked on entry,
    # before the simulation, not after.
    with results_folder(args.out, args.overwrite, cfg.name) as (out, tmp):
        # the step table streams into the (temporary) results folder as the run goes
        result = run_scenario(
            cfg,
            progress=None if not args.progress else True,
            steps=args.steps,
            steps_path=tmp / "steps.parquet",
        )
        if args.uncertainty == "on":
            result.summary["uncertainty"] = _uncertainty(cfg, result.summary)
        write_result(result, tmp, plots=not args.no_plots, fmt=args.format)
        if args.vllm_bench_json:
            _write_vllm_bench(args.vllm_bench_json, result, cfg)
    # after the run, so bad input stays one line
    warn_stack(cfg.cost_model)
    print(f"{cfg.name}: results in {out}")
    print(format_summary(result.summary))
    if cfg.cluster is None:  # a cluster's groups each have theirs (scenario.yaml)
        ranks = 1 if cfg.parallel is None else cfg.parallel.data_parallel_size
        print(format_server(cfg.scheduler, ranks, cfg.cost_model))
    if result.replicas is not None:
        print(format_replicas(result.summary, result.replicas))
    problem = served_too_little(result.summary)
    if problem is not None:  # the results are written (they say why), but this is no success
        print(f"servesim: error: {problem}", file=sys.stderr)
        return 1
    return 0


def _uncertainty(cfg: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """The run's model uncertainty (``explore.uncertainty``): two more runs, no step rows,
    side by side on two cores where there are two."""
    import os

    from simulator.explore.uncertainty import model_uncertainty, run_side_by_side

    jobs = min(2, os.cpu_count() or 1)
    return model_uncertainty(cfg, summary, lambda cfgs: run_side_by_side(cfgs, jobs))


def _write_vllm_bench(path: str, result: Any, cfg: Any) -> None:
    """The run as vLLM bench JSON (``results.vllm_bench``), with the scenario's run fields."""
    import json

    from simulator.output_file import write_text
    from simulator.results.vllm_bench import vllm_bench_result
    from simulator.results.writer import json_safe

    arrival = getattr(cfg.workload, "arrival", None)
    rate = getattr(arrival, "rate", None)
    model = getattr(cfg.cost_model, "model", None) or getattr(cfg.cost_model, "path", None)
    meta = {
        "label": cfg.name,
        "model_id": None if model is None else str(model),
        "tokenizer_id": None if model is None else str(model),
        # vLLM writes an unlimited rate as "inf"; a trace replay has no one rate: null
        "request_rate": None if rate is None else "inf" if rate == float("inf") else float(rate),
        "burstiness": 1.0,
        "max_concurrency": cfg.workload.max_concurrency,
    }
    data = json_safe(vllm_bench_result(result.requests, result.summary, meta))
    label = f"--vllm-bench-json {path}"
    write_text(path, json.dumps(data, allow_nan=False) + "\n", label)
