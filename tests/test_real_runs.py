"""The two real vLLM runs (scenarios/real-*.yaml against ../shared/data/llmservingsim): the
scenarios carry the runs' budgets, the KV budget derived like vLLM's is checked against the
4090's recorded one, each replay's errors are held to bounds, and docs/fidelity.md's table is
what the replays give."""

from __future__ import annotations

import json

import pytest
import yaml

from simulator.scenario.config import load_scenario
from simulator.scenario.runner import resolve
from simulator.validation.real_runs import (
    KERNELS_MARKERS,
    KERNELS_RUNS,
    RUNS,
    RealRun,
    data_overrides,
    end_to_end_table,
    kernels_table,
    replace_between_markers,
    replay,
)
from tests.paths import DATA, ROOT

LSS = DATA / "llmservingsim"

# The target: every figure within 5% of the measurement and never more than 2 points worse
# than LLMServingSim's own error on it. One figure misses the 5% (docs/fidelity.md says what is
# known of why): the RTX PRO 6000's TTFT p50, -8.3% (LLMServingSim's own: -8.6%); held there.
WITHIN = 5.0
MISSES = {("RTX PRO 6000", "ttft", "p50"): 8.8}
# The MoE run (DP 2, EP 2): TPOT and E2E meet the target (within 5%); TTFT does not (its
# queued requests wait for the first finishers, so a TPOT error of 2-3% in the filling phase
# becomes 7-23% there; docs/fidelity.md says what is known). Each TTFT figure is held at what
# the replay gives now (+0.5 points), so that a change for the worse shows; the p50 is better
# than LLMServingSim's own (-21.8%). Since TTFT counts from vLLM's QUEUED stamp (the step
# boundary at which the engine takes a request in) and the ranks' schedulers plan ahead as
# vLLM's do: -18.9 / -10.6 / -21.8 / -7.4% (before, from the arrival: -16.8 / +11.2 / -22.5 /
# -7.2%).
MOE = "2 x RTX PRO 6000, DP 2 EP 2, Qwen3-30B-A3B"
HELD = {
    ("ttft", "mean"): 19.4,
    ("ttft", "p50"): 11.1,
    ("ttft", "p90"): 22.3,
    ("ttft", "p99"): 7.9,
}


def _scenario(name: str) -> dict:
    return yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("run", RUNS, ids=[r.scenario for r in RUNS])
def test_scenarios_carry_the_runs_budgets(run: RealRun) -> None:
    meta = json.loads((LSS / "runs" / run.folder / "meta.json").read_text())
    sched = _scenario(run.scenario)["scheduler"]
    kwargs = meta["engine_kwargs"]
    assert sched["max_num_seqs"] == kwargs["max_num_seqs"]
    assert sched["max_num_batched_tokens"] == kwargs["max_num_batched_tokens"]
    recorded = meta.get("kv_cache", {}).get("num_gpu_blocks")
    assert sched.get("num_blocks") == recorded  # the 4090's 2,588; derived where unrecorded
    if "kv_cache" in meta:
        assert sched["block_size"] == meta["kv_cache"]["block_size"]


def test_derived_kv_budget_against_vllms_on_the_rtx_4090() -> None:
    path = ROOT / "scenarios" / "real-rtx4090-llama31-8b.yaml"
    over = data_overrides(_scenario("real-rtx4090-llama31-8b"), LSS)
    cfg = load_scenario(path, {**over, "scheduler.num_blocks": None})
    derived = resolve(cfg).scheduler.num_blocks
    meta = json.loads((LSS / "runs" / "RTX4090" / "Llama-3.1-8B" / "meta.json").read_text())
    recorded = meta["kv_cache"]["num_gpu_blocks"]
    assert recorded == 2588 and derived == 2763  # +6.8% (docs/cost_models.md)
    assert abs(derived / recorded - 1) < 0.07


@pytest.mark.parametrize("run", RUNS, ids=[r.scenario for r in RUNS])
def test_replay_errors_within_bounds(run: RealRun) -> None:
    metrics, theirs = replay(run, ROOT, LSS)
    assert list(metrics) == ["ttft", "tpot", "e2e"]
    errors = {(m, s): row["error_pct"] for m, by in metrics.items() for s, row in by.items()}
    assert len(errors) == 12 and len(theirs) == 3
    for (metric, stat), error in errors.items():
        if run.name == MOE and metric == "ttft":
            assert abs(error) <= HELD[metric, stat], (metric, stat, error)
            if stat == "p50":
                assert abs(error) < abs(theirs[metric][stat]), (metric, stat, error)
            continue
        if run.name == MOE:
            assert abs(error) <= WITHIN, (metric, stat, error)
            continue
        bound = MISSES.get((run.name, metric, stat), WITHIN)
        assert abs(error) <= bound, (metric, stat, error)
        assert abs(error) <= abs(theirs[metric][stat]) + 2.0, (metric, stat, error)


def test_fidelity_doc_table_is_what_the_replays_give() -> None:
    doc = (ROOT / "docs" / "fidelity.md").read_text()
    assert replace_between_markers(doc, end_to_end_table(LSS)) == doc, (
        "docs/fidelity.md is stale: run benchmarks/real_runs.py"
    )


# The kernels cost model on the RTX PRO 6000 runs (docs/fidelity.md, "The kernels cost model"):
# TPOT and E2E within 5% (3.6% at worst); TTFT misses it on both runs (-3.4 to -9.6% for
# Llama-3.1-8B, -5.5 to -16.6% for the MoE run, whose profiled replay is further off): each
# metric held at what the replays give now (+0.5 points, so that a change for the worse shows).
KERNELS_HELD = {
    "RTX PRO 6000": {"ttft": 10.1, "tpot": 2.3, "e2e": 3.7},
    MOE: {"ttft": 17.1, "tpot": 4.1, "e2e": 3.9},
}


@pytest.mark.parametrize("run", KERNELS_RUNS, ids=[r.scenario for r in KERNELS_RUNS])
def test_kernels_replay_errors_within_what_was_measured(run: RealRun) -> None:
    metrics, _ = replay(run, ROOT, LSS, kernels=True)
    for metric, by in metrics.items():
        for stat, row in by.items():
            error = row["error_pct"]
            assert abs(error) <= KERNELS_HELD[run.name][metric], (metric, stat, error)
            if metric != "ttft":
                assert abs(error) <= WITHIN, (metric, stat, error)


def test_fidelity_doc_kernels_table_is_what_the_replays_give() -> None:
    doc = (ROOT / "docs" / "fidelity.md").read_text()
    new = replace_between_markers(doc, kernels_table(LSS), KERNELS_MARKERS)
    assert new == doc, "docs/fidelity.md is stale: run benchmarks/real_runs.py"
