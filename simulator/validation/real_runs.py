"""The real runs servesim is validated against (``scenarios/real-*.yaml``: LLMServingSim's vLLM
0.19 runs, fetched with ``servesim fetch llmservingsim``): each replayed and compared with its
measurement and with LLMServingSim's own error, as the end-to-end table of docs/fidelity.md."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.validation.compare import STATS, compare, simulated
from simulator.validation.measured import read_llmservingsim_summary, read_measured

DATA_PREFIX = "data/llmservingsim/"
"""Where the scenarios read the runs (``servesim fetch llmservingsim``'s destination)."""
BEGIN, END = "<!-- BEGIN END-TO-END -->", "<!-- END END-TO-END -->"
KERNELS_MARKERS = ("<!-- BEGIN KERNELS -->", "<!-- END KERNELS -->")
"""Where docs/fidelity.md holds the ``kernels`` replays' table."""


@dataclass(frozen=True)
class RealRun:
    """A measured run and the scenario that replays it."""

    name: str
    scenario: str
    """``scenarios/<scenario>.yaml``."""
    folder: str
    """The run's folder under ``data/llmservingsim/runs/``."""

    @property
    def measured(self) -> str:
        """The measured requests, relative to the ``llmservingsim`` data folder."""
        return f"runs/{self.folder}/requests.jsonl"


RUNS = (
    RealRun("RTX 4090", "real-rtx4090-llama31-8b", "RTX4090/Llama-3.1-8B"),
    RealRun("RTX PRO 6000", "real-rtxpro6000-llama31-8b", "RTXPRO6000/Llama-3.1-8B"),
    RealRun(
        "2 x RTX PRO 6000, DP 2 EP 2, Qwen3-30B-A3B",
        "real-rtxpro6000-qwen3-30b-a3b",
        "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507",
    ),
)


def data_overrides(scenario: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """``--set`` overrides pointing a real-run scenario's files into ``data_dir`` (a folder
    laid out as ``data/llmservingsim/``, e.g. ../shared/data/llmservingsim)."""
    out = {}
    for key, value in (
        ("workload.trace.path", scenario["workload"]["trace"]["path"]),
        ("cost_model.profile", scenario["cost_model"]["profile"]),
    ):
        out[key] = str(data_dir / value.removeprefix(DATA_PREFIX))
    model = scenario["cost_model"].get("model", "")
    if model.startswith(DATA_PREFIX):  # a Hugging Face config.json of the run's model
        out["cost_model.model"] = str(data_dir / model.removeprefix(DATA_PREFIX))
    return out


KERNELS_RUNS = RUNS[1:]
"""The runs on a GPU the kernel database measured (RTX PRO 6000; not the RTX 4090)."""


def kernels_overrides(scenario: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """``data_overrides`` with the scenario's cost model replaced by ``kernels`` on the same
    model, GPU and TP (the newest vLLM version measured there)."""
    out = data_overrides(scenario, data_dir)
    cm = scenario["cost_model"]
    model = out.get("cost_model.model", cm["model"])
    keep = {k: v for k, v in out.items() if not k.startswith("cost_model.")}
    kernels = {"type": "kernels", "model": model, "hardware": cm["hardware"]}
    return {**keep, "cost_model": {**kernels, "tp": cm.get("tp", 1)}}


def physics_overrides(scenario: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """``data_overrides`` with the scenario's cost model replaced by ``physics`` (its shipped
    parameters) on the same model, GPU and TP (its interconnect is the preset's)."""
    out = data_overrides(scenario, data_dir)
    cm = scenario["cost_model"]
    keep = {k: v for k, v in out.items() if not k.startswith("cost_model.")}
    physics = {"type": "physics", "model": out.get("cost_model.model", cm["model"])}
    return {**keep, "cost_model": {**physics, "hardware": cm["hardware"], "tp": cm.get("tp", 1)}}


def replay(
    run: RealRun, root: Path, data_dir: Path, kernels: bool = False, physics: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(servesim's comparison, LLMServingSim's errors) of ``run``: its scenario under
    ``root/scenarios`` simulated on the files in ``data_dir`` (``kernels`` or ``physics``:
    with that cost model instead of the scenario's)."""
    from simulator.scenario.config import load_scenario, read_yaml
    from simulator.scenario.runner import run as simulate

    path = root / "scenarios" / f"{run.scenario}.yaml"
    overrides = kernels_overrides if kernels else physics_overrides if physics else data_overrides
    cfg = load_scenario(path, overrides(read_yaml(path), data_dir))
    result = simulate(cfg)
    meas = read_measured(data_dir / run.measured, "llmservingsim")
    metrics = compare(simulated(result.requests, result.summary, meas.reference, run.name), meas)
    theirs = read_llmservingsim_summary(
        data_dir / "runs" / run.folder / "llmservingsim_summary.txt"
    )
    return metrics, theirs


def end_to_end_table(data_dir: Path, root: Path | None = None) -> str:
    """The markdown table: per run, metric and statistic, the measurement, servesim's
    figure and error, and LLMServingSim's error."""
    root = root or Path(__file__).resolve().parents[2]
    lines = [
        "| run | metric | stat | measured | servesim | servesim error | LLMServingSim error |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for run in RUNS:
        metrics, theirs = replay(run, root, data_dir)
        for metric in ("ttft", "tpot", "e2e"):
            for stat in STATS:
                row = metrics[metric][stat]
                unit, scale = ("s", 1.0) if metric != "tpot" else ("ms", 1e3)
                lines.append(
                    f"| {run.name} | {metric.upper()} | {stat} "
                    f"| {row['measured'] * scale:,.{1 if unit == 's' else 1}f} {unit} "
                    f"| {row['simulated'] * scale:,.1f} {unit} | {row['error_pct']:+.1f}% "
                    f"| {theirs[metric][stat]:+.1f}% |"
                )
    return "\n".join(lines)


def kernels_table(data_dir: Path, root: Path | None = None) -> str:
    """The markdown table of every run replayed with ``kernels`` (on the GPUs the database
    measured; "-" elsewhere), beside the scenario's own ``profiled`` replay, ``physics`` (its
    shipped parameters) and LLMServingSim's own errors, per metric and statistic."""
    root = root or Path(__file__).resolve().parents[2]
    lines = [
        "| run | metric | stat | measured | kernels | kernels error | profiled error "
        "| physics error | LLMServingSim error |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in RUNS:
        ours = replay(run, root, data_dir, kernels=True)[0] if run in KERNELS_RUNS else None
        profiled, lss = replay(run, root, data_dir)
        physics, _ = replay(run, root, data_dir, physics=True)
        for metric in ("ttft", "tpot", "e2e"):
            unit, scale = ("s", 1.0) if metric != "tpot" else ("ms", 1e3)
            for stat in STATS:
                row = profiled[metric][stat]
                mine = "| - | - " if ours is None else _figure(ours[metric][stat], unit, scale)
                lines.append(
                    f"| {run.name} | {metric.upper()} | {stat} "
                    f"| {row['measured'] * scale:,.1f} {unit} {mine}"
                    f"| {row['error_pct']:+.1f}% "
                    f"| {physics[metric][stat]['error_pct']:+.1f}% "
                    f"| {lss[metric][stat]:+.1f}% |"
                )
    return "\n".join(lines)


def _figure(row: dict[str, float], unit: str, scale: float) -> str:
    """``| simulated | error `` cells of a comparison row."""
    return f"| {row['simulated'] * scale:,.1f} {unit} | {row['error_pct']:+.1f}% "


def replace_between_markers(text: str, table: str, markers: tuple[str, str] = (BEGIN, END)) -> str:
    """``text`` with what lies between ``markers`` (the END-TO-END ones) replaced by
    ``table``."""
    begin, end = markers
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"docs/fidelity.md has no {begin} marker")
    return pattern.sub(lambda _: f"{begin}\n{table}\n{end}", text)
