"""Check the model-uncertainty intervals against the public real vLLM runs: each run of
scenarios/real-*.yaml replayed with its cost model (``profiled``; ``physics`` with the GPU
in its fit; ``physics`` fitted without the run's GPU; ``kernels`` where the kernel database
measured the GPU), at both ends of the model's error band
(configs/error_bands.yaml, from held-out operator and step measurements only), and each of
the 12 figures (mean/p50/p90/p99 of TTFT, TPOT, E2E, as ``servesim compare`` counts them)
tested for lying in its interval. Writes the table between the UNCERTAINTY markers of
docs/fidelity.md (~3-6 min on 2 busy cores).

    .venv/bin/python benchmarks/uncertainty_coverage.py
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.cost.kernel_db import measured_gpus  # noqa: E402
from simulator.cost.learn.run import learn  # noqa: E402
from simulator.cost.learn.sources import default_sources_path, load_sources  # noqa: E402
from simulator.cost.physics_params import load_params  # noqa: E402
from simulator.cost.presets import load_hardware  # noqa: E402
from simulator.explore.uncertainty import at_scale, scenario_band  # noqa: E402
from simulator.scenario.config import ScenarioConfig, load_scenario, read_yaml  # noqa: E402
from simulator.scenario.runner import resolve  # noqa: E402
from simulator.scenario.runner import run as simulate  # noqa: E402
from simulator.validation.compare import STATS, compare, simulated  # noqa: E402
from simulator.validation.measured import read_measured  # noqa: E402
from simulator.validation.real_runs import DATA_PREFIX, RUNS, RealRun, data_overrides  # noqa: E402
from tests.paths import DATA  # noqa: E402

DOC = ROOT / "docs" / "fidelity.md"
BEGIN, END = "<!-- BEGIN UNCERTAINTY -->", "<!-- END UNCERTAINTY -->"
METRICS = ("ttft", "tpot", "e2e")


def scenario(run: RealRun, data: Path, physics: Path | None, kind: str) -> ScenarioConfig:
    """The run's scenario on ``data``, with its own cost model (``kind`` ``profiled``), or
    ``physics`` (fitted as ``physics`` says, None: shipped) or ``kernels`` on its model and GPU."""
    path = ROOT / "scenarios" / f"{run.scenario}.yaml"
    raw = read_yaml(path)
    overrides = data_overrides(raw, data)
    if kind != "profiled":
        cm = raw["cost_model"]
        model = cm["model"]
        if model.startswith(DATA_PREFIX):
            model = str(data / model.removeprefix(DATA_PREFIX))
        overrides = {
            "workload.trace.path": overrides["workload.trace.path"],
            "cost_model.type": kind,
            "cost_model.model": model,
            "cost_model.hardware": cm["hardware"],
        }
        if physics is not None:
            overrides["cost_model.params"] = str(physics)
    return resolve(load_scenario(path, overrides))


def figures(cfg: ScenarioConfig, run: RealRun, data: Path) -> dict[str, dict[str, float]]:
    """``{metric: {stat: simulated}}`` and the measured ones under ``"measured"``."""
    result = simulate(cfg, steps="none")
    meas = read_measured(data / run.measured, "llmservingsim")
    metrics = compare(simulated(result.requests, result.summary, meas.reference, run.name), meas)
    out: dict[str, dict[str, float]] = {"measured": {}, "simulated": {}}
    for m in METRICS:
        for s in STATS:
            out["measured"][f"{m} {s}"] = metrics[m][s]["measured"]
            out["simulated"][f"{m} {s}"] = metrics[m][s]["simulated"]
    return out


def coverage(cfg: ScenarioConfig, run: RealRun, data: Path) -> dict[str, Any]:
    """Per figure: measured, simulated, its interval, and whether it holds the measurement."""
    found = scenario_band(cfg)
    assert found is not None, "every cost model checked here has a band"
    kind, band = found
    base = figures(cfg, run, data)
    ends = [figures(at_scale(cfg, s), run, data)["simulated"] for s in band.scales()]
    rows = {}
    for key, measured in base["measured"].items():
        values = [base["simulated"][key], *(e[key] for e in ends)]
        lo, hi = min(values), max(values)
        sim = base["simulated"][key]
        half = (hi - lo) / 2 / sim * 100 if sim else float("nan")
        rows[key] = {"measured": measured, "simulated": sim, "low": lo, "high": hi}
        rows[key].update(holds=bool(lo <= measured <= hi), half_pct=half)
    return {"kind": kind, "band": (band.low, band.high), "rows": rows}


def main() -> int:
    data = DATA / "llmservingsim"
    sources = load_sources(default_sources_path())
    shipped = load_params(None)
    lines = [
        "| run | cost model | step-time band | figures inside | median half-width "
        "| outside (error, interval) |",
        "|---|---|---|---:|---:|---|",
    ]
    held, widths = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for run in RUNS:
            gpu = read_yaml(ROOT / "scenarios" / f"{run.scenario}.yaml")["cost_model"]["hardware"]
            without = Path(tmp) / f"without-{gpu}.yaml"
            if not without.exists():  # fitted once per GPU
                params = learn(sources, data.parent, f"--exclude {gpu}", [gpu], [data.parent],
                               shipped.allreduce)  # fmt: skip
                without.write_text(yaml.safe_dump(params.model_dump(mode="json")))
            kinds = [
                ("profiled", None, "profiled"),
                ("physics, GPU in its fit", None, "physics"),
                ("physics, GPU left out", without, "physics"),
            ]
            if load_hardware(gpu).kernels_gpu in measured_gpus():
                kinds.append(("kernels", None, "kernels"))
            for label, physics, kind in kinds:
                c = coverage(scenario(run, data, physics, kind), run, data)
                rows = c["rows"].values()
                held += [r["holds"] for r in rows]
                widths += [r["half_pct"] for r in rows]
                outside = [
                    f"{k} {(r['simulated'] / r['measured'] - 1) * 100:+.1f}% "
                    f"({(r['low'] / r['measured'] - 1) * 100:+.1f}% to "
                    f"{(r['high'] / r['measured'] - 1) * 100:+.1f}%)"
                    for k, r in c["rows"].items()
                    if not r["holds"]
                ]
                lo, hi = c["band"]
                lines.append(
                    f"| {run.name} | {label} (`{c['kind']}`) | {lo:+.1%} to {hi:+.1%} "
                    f"| {sum(r['holds'] for r in rows)} of {len(rows)} "
                    f"| {np.median([r['half_pct'] for r in rows]):.1f}% "
                    f"| {'; '.join(outside) or '-'} |"
                )
                print(lines[-1], flush=True)
    lines.append("")
    lines.append(
        f"All: {sum(held)} of {len(held)} figures inside their 90% interval "
        f"({sum(held) / len(held):.0%}); median half-width {np.median(widths):.1f}%."
    )
    body = "\n".join(lines)
    text = DOC.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    DOC.write_text(pattern.sub(lambda _: f"{BEGIN}\n{body}\n{END}", text))
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
