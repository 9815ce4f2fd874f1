"""Validate the `physics` cost model and write its tables into docs/fidelity.md (between the
PHYSICS markers): (a) leave-one-GPU-out and leave-one-model-out over the operator profiles
of configs/physics/sources.yaml (per held-out group, median and p90 absolute step-time
error, steps built from the group's profiled operators: cost/learn/steps.py); (b) the public
real vLLM runs (scenarios/real-*.yaml) replayed with `physics` fitted without the run's GPU,
and with it, beside the `profiled` model's and LLMServingSim's own errors; (c) the replay's
speed with `physics` and with `profiled`. Deterministic; ~6-8 minutes on 2 busy cores.

    .venv/bin/python benchmarks/physics_validation.py            # write the tables
    .venv/bin/python benchmarks/physics_validation.py --check    # exit 1 if stale
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.cost.learn.run import error_summary, learn  # noqa: E402
from simulator.cost.learn.sources import default_sources_path, load_sources  # noqa: E402
from simulator.cost.learn.steps import group_errors  # noqa: E402
from simulator.cost.physics_params import PhysicsParams, load_params  # noqa: E402
from simulator.scenario.config import load_scenario, read_yaml  # noqa: E402
from simulator.scenario.runner import run as simulate  # noqa: E402
from simulator.validation.compare import STATS, compare, simulated  # noqa: E402
from simulator.validation.measured import read_llmservingsim_summary, read_measured  # noqa: E402
from simulator.validation.real_runs import DATA_PREFIX, RUNS, RealRun, data_overrides  # noqa: E402
from tests.paths import DATA  # noqa: E402

DOC = ROOT / "docs" / "fidelity.md"
BEGIN, END = "<!-- BEGIN PHYSICS -->", "<!-- END PHYSICS -->"
METRICS = ("ttft", "tpot", "e2e")


def held_out(data: Path, tmp: Path) -> tuple[str, dict[str, Path]]:
    """The leave-one-out table, and the parameters fitted without each GPU or model (by
    preset name)."""
    sources = load_sources(default_sources_path())
    lines = [
        "| held out | group | steps | median abs error | p90 abs error |",
        "|---|---|---:|---:|---:|",
    ]
    without: dict[str, Path] = {}
    shipped_allreduce = load_params(None).allreduce
    for kind, names in (
        ("GPU", sorted({s.hardware for s in sources.sources})),
        ("model", sorted({s.model for s in sources.sources})),
    ):
        for name in names:
            groups = [s for s in sources.sources if name in (s.hardware, s.model)]
            roots = [data, ROOT / "data"]  # the all-reduce profiles: where `servesim fetch` saves
            params = learn(sources, data, f"--exclude {name}", [name], roots, shipped_allreduce)
            without[name] = tmp / f"without-{name}.yaml"
            without[name].write_text(yaml.safe_dump(params.model_dump(mode="json")))
            for src in groups:
                errs = group_errors(src, data, params)
                if errs is None:
                    continue
                e = error_summary(errs)
                lines.append(
                    f"| {kind} {name} | {src.name} | {e.points} | {e.median_pct:.1f}% "
                    f"| {e.p90_pct:.1f}% |"
                )
    return "\n".join(lines), without


def _replay(run: RealRun, data: Path, physics: Path | None) -> dict:
    """Per metric and statistic, servesim's signed error on ``run``; ``physics``: the
    parameters to replay with (None: the scenario's own `profiled` model)."""
    path = ROOT / "scenarios" / f"{run.scenario}.yaml"
    scenario = read_yaml(path)
    if physics is None:
        overrides = data_overrides(scenario, data)
    else:
        cm = scenario["cost_model"]
        model = cm["model"]  # a preset, or the run's config.json under the data folder
        if model.startswith(DATA_PREFIX):
            model = str(data / model.removeprefix(DATA_PREFIX))
        overrides = {
            "workload.trace.path": str(
                data / scenario["workload"]["trace"]["path"].removeprefix(DATA_PREFIX)
            ),
            "cost_model.type": "physics",
            "cost_model.model": model,
            "cost_model.hardware": cm["hardware"],
            "cost_model.params": str(physics),
        }
    cfg = load_scenario(path, overrides)
    started = time.process_time()
    result = simulate(cfg)
    elapsed = time.process_time() - started
    meas = read_measured(data / run.measured, "llmservingsim")
    metrics = compare(simulated(result.requests, result.summary, meas.reference, run.name), meas)
    return {"metrics": metrics, "cpu_s": elapsed}


SOURCE_MODEL = {
    "real-rtx4090-llama31-8b": "llama-3.1-8b",
    "real-rtxpro6000-llama31-8b": "llama-3.1-8b",
    "real-rtxpro6000-qwen3-30b-a3b": "qwen3-30b-a3b",
}
"""Each run's model as configs/physics/sources.yaml names it (what "model left out" drops:
for Qwen3-30B-A3B its whole bundle, moe.csv included)."""


def end_to_end(data: Path, without: dict[str, Path]) -> str:
    """The per-figure table of every real run, and its summary lines."""
    shipped = ROOT / "configs" / "physics" / "params.yaml"
    lines = [
        "| run | metric | stat | measured | profiled | physics, GPU left out | physics, model "
        "left out | physics, all included | LLMServingSim |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    summary = []
    for run in RUNS:
        hardware = read_yaml(ROOT / "scenarios" / f"{run.scenario}.yaml")["cost_model"]["hardware"]
        prof = _replay(run, data, None)
        out = _replay(run, data, without[hardware])
        mod = _replay(run, data, without[SOURCE_MODEL[run.scenario]])
        inc = _replay(run, data, shipped)
        theirs = read_llmservingsim_summary(
            data / "runs" / run.folder / "llmservingsim_summary.txt"
        )
        errs: dict[str, list[float]] = {"out": [], "mod": [], "inc": [], "gap": []}
        for metric in METRICS:
            for stat in STATS:
                scale, unit = (1e3, "ms") if metric == "tpot" else (1.0, "s")
                e_p = prof["metrics"][metric][stat]["error_pct"]
                e_o = out["metrics"][metric][stat]["error_pct"]
                e_i = inc["metrics"][metric][stat]["error_pct"]
                e_m = mod["metrics"][metric][stat]["error_pct"]
                errs["mod"].append(abs(e_m))
                errs["out"].append(abs(e_o))
                errs["inc"].append(abs(e_i))
                errs["gap"].append(abs(e_i) - abs(e_p))
                measured = prof["metrics"][metric][stat]["measured"] * scale
                lines.append(
                    f"| {run.name} | {metric.upper()} | {stat} | {measured:,.1f} {unit} "
                    f"| {e_p:+.1f}% | {e_o:+.1f}% | {e_m:+.1f}% | {e_i:+.1f}% "
                    f"| {theirs[metric][stat]:+.1f}% |"
                )
        summary.append(
            f"- {run.name}: GPU left out, median abs error {np.median(errs['out']):.1f}% "
            f"(worst {max(errs['out']):.1f}%); model left out, median "
            f"{np.median(errs['mod']):.1f}% (worst {max(errs['mod']):.1f}%); included, median "
            f"{np.median(errs['inc']):.1f}% "
            f"(worst {max(errs['inc']):.1f}%), at most {max(errs['gap']):+.1f} points from "
            f"`profiled`; replay CPU time {inc['cpu_s']:.2f} s with `physics`, "
            f"{prof['cpu_s']:.2f} s with `profiled`."
        )
    return "\n".join([*lines, "", *summary])


def in_sample(params: PhysicsParams) -> str:
    """The shipped parameters' own step-time error per group (in sample)."""
    lines = ["| group | steps | median abs error | p90 abs error |", "|---|---:|---:|---:|"]
    for group, e in params.errors.items():
        lines.append(f"| {group} | {e.points} | {e.median_pct:.1f}% | {e.p90_pct:.1f}% |")
    return "\n".join(lines)


def _timeless(text: str) -> str:
    """``text`` with the replays' CPU times blanked."""
    return re.sub(r"CPU time [0-9.]+ s with `physics`, [0-9.]+ s", "CPU time _", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check docs/fidelity.md")
    args = parser.parse_args()
    data = Path(str(DATA / "llmservingsim")).parent
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        loo, without = held_out(data, Path(tmp))
        e2e = end_to_end(data / "llmservingsim", without)
    shipped = load_params(None)
    body = "\n\n".join(
        [
            "Leave one out (fitted without the held-out GPU or model, then its steps predicted):",
            loo,
            f"In sample (the shipped `configs/physics/params.yaml`, fitted {shipped.fitted_at}):",
            in_sample(shipped),
            "End to end (the real runs of the table at the top):",
            e2e,
        ]
    )
    text = DOC.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    new = pattern.sub(lambda _: f"{BEGIN}\n{body}\n{END}", text)
    if args.check:
        # CPU times vary run to run: every other figure must be the same
        same = _timeless(new) == _timeless(text)
        print("docs/fidelity.md is current" if same else "docs/fidelity.md is stale")
        return int(not same)
    DOC.write_text(new)
    print(body)
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
