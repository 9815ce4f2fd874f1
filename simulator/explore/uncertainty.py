"""A prediction's model uncertainty: the same scenario, same seed, run again with every GPU
step at each end of its cost model's measured error band (``cost/error_band.py``); each
figure's interval is the range of the three runs (method and checks: docs/metrics.md,
"Model uncertainty").

Why two runs and not many draws: the error that matters for a run's figures is the cost
model's bias on the GPU and model priced (its per-step scatter averages out over thousands
of steps), one number per run, and every figure moves one way as all steps get slower
(latencies up, throughput and goodput down, within the noise of the batching), so the
runs at the band's two ends give the figures at their ends."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from simulator.cost.error_band import Band, band_for, load_bands
from simulator.scenario.config import ScenarioConfig

RATE_FIGURES = (
    "request_throughput",
    "output_token_throughput",
    "total_token_throughput",
    "goodput",
    "slo_attainment",
)
"""The summary's figures other than latencies that get an interval."""
LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue_delay")


def cost_models(cfg: ScenarioConfig) -> list[Any]:
    """Every cost-model config a scenario runs: its own, or each replica group's."""
    if cfg.cluster is None:
        return [cfg.cost_model]
    from simulator.cluster.config import replica_groups

    return [g.cost_model for g in replica_groups(cfg.cluster, cfg.scheduler, cfg.cost_model)]


def scenario_band(cfg: ScenarioConfig) -> tuple[str, Band] | None:
    """The error band of a scenario's cost model(s), None where none is measured."""
    return band_for(cost_models(cfg))


def at_scale(cfg: ScenarioConfig, scale: float) -> ScenarioConfig:
    """``cfg`` with every GPU step ``scale`` times as long."""
    serving = cfg.serving.model_copy(update={"gpu_time_scale": cfg.serving.gpu_time_scale * scale})
    return cfg.model_copy(update={"serving": serving})


def figure_keys(summary: dict[str, Any]) -> list[str]:
    """The summary's figures that get an interval, in the summary's order."""
    return [
        k
        for k in summary
        if k in RATE_FIGURES or (k.endswith("_s") and any(k.startswith(f"{m}_") for m in LATENCIES))
    ]


def intervals(summaries: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per figure, ``[low, high]`` over the runs (figures undefined in any run left out)."""
    out: dict[str, list[float]] = {}
    for key in figure_keys(summaries[0]):
        values = [s.get(key) for s in summaries]
        finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
        if len(finite) == len(values):
            out[key] = [min(finite), max(finite)]
    return out


def no_band(cfg: ScenarioConfig) -> dict[str, Any]:
    """What the summary says when the cost model has no measured error."""
    kinds = sorted({str(getattr(cm, "type", "?")) for cm in cost_models(cfg)})
    return {
        "level": load_bands().level,
        "available": False,
        "reason": f"cost model {', '.join(kinds)} has no measured held-out error",
    }


def band_summary(cfg: ScenarioConfig) -> dict[str, Any]:
    """The summary of one band end's run (a work unit: no step rows, its warnings unsaid,
    since the run's own said what the scenario warns of)."""
    import contextlib
    import io

    from simulator.scenario.runner import run

    with contextlib.redirect_stderr(io.StringIO()):
        return run(cfg, steps="none").summary


def run_side_by_side(cfgs: list[ScenarioConfig], jobs: int) -> list[dict[str, Any]]:
    """``band_summary`` of each scenario, up to ``jobs`` at once on local processes (one:
    in this process), in order."""
    from simulator.explore.backends import make_backend

    with make_backend("local", max(1, min(jobs, len(cfgs)))) as backend:
        tickets = [backend.submit(band_summary, c) for c in cfgs]
        done: dict[int, dict[str, Any]] = {}
        while len(done) < len(tickets):
            for d in backend.wait():
                if d.error is not None:
                    raise d.error
                done[d.ticket] = d.value
    return [done[t] for t in tickets]


def model_uncertainty(
    cfg: ScenarioConfig,
    summary: dict[str, Any],
    run_all: Callable[[list[ScenarioConfig]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """The ``uncertainty`` entry of a run's summary: ``run_all`` simulates scenarios and
    returns their summaries (given the two at the band's ends; ``summary`` is the run's own)."""
    found = scenario_band(cfg)
    if found is None:
        return no_band(cfg)
    kind, band = found
    ends = run_all([at_scale(cfg, s) for s in band.scales()])
    return {
        "level": load_bands().level,
        "available": True,
        "cost_model": kind,
        "step_time_error": [band.low, band.high],
        "source": band.source,
        **intervals([summary, *ends]),
    }
