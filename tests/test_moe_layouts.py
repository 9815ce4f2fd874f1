"""The MoE layout comparison of ``scenarios/moe-deployment.yaml`` (README, "Data-parallel ranks
and expert parallelism"): the roofline figures its answer gives for TP 4 against DP 4 + EP 4
on four H100s, and the answer itself on a small run."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.cost import build_cost_model
from simulator.cost.batch import Batch
from simulator.scenario.config import load_scenario
from simulator.scenario.runner import resolve, run
from tests.paths import ROOT

PATH = ROOT / "scenarios" / "moe-deployment.yaml"
TP4 = {
    "parallel.data_parallel_size": 1,
    "cost_model.tp": 4,
    "parallel.enable_expert_parallel": False,
}
MTP = {"speculative.num_speculative_tokens": 1}


def _cost(overrides: dict[str, Any]) -> Any:
    return build_cost_model(resolve(load_scenario(PATH, overrides)).cost_model)


def decodes(n: int) -> Batch:
    """``n`` one-token decodes at 3,000 tokens of context."""
    return Batch([1] * n, [3000] * n)


def test_the_readmes_roofline_figures_for_tp4_and_dp4_ep4() -> None:
    tp4, dp4 = _cost(TP4), _cost({})
    chunk = Batch([2048], [0])
    # TP 4 splits a prefill chunk and 128 decodes over four GPUs
    assert tp4.step_time(chunk) * 1e3 == pytest.approx(7.9, abs=0.05)
    assert tp4.step_time(decodes(128)) * 1e3 == pytest.approx(11.2, abs=0.05)
    # a DP rank runs its chunk on its one GPU, beside three ranks of 32 decodes each, and the
    # lockstep step waits for it; 32 decodes per rank cost more than TP 4's 128
    busy = [2048, 32, 32, 32]
    assert dp4.step_time_in_dp(chunk, busy, 0) * 1e3 == pytest.approx(22.0, abs=0.1)
    assert dp4.step_time_in_dp(decodes(32), busy, 1) < dp4.step_time_in_dp(chunk, busy, 0)
    assert dp4.step_time_in_dp(decodes(32), [32] * 4, 0) * 1e3 == pytest.approx(12.2, abs=0.05)


def test_tp4_has_the_lower_p99_tpot_and_mtp_lowers_both() -> None:
    small = {"workload.num_requests": 300, "workload.arrival.rate": 20}
    tpot = {
        (name, k): run(load_scenario(PATH, {**small, **layout, **mtp})).summary["tpot_p99_s"]
        for name, layout in (("tp4", TP4), ("dp4", {}))
        for k, mtp in ((0, {}), (1, MTP))
    }
    assert tpot["tp4", 0] < tpot["dp4", 0] and tpot["tp4", 1] < tpot["dp4", 1]
    for name in ("tp4", "dp4"):  # one draft at 0.85: 1.85 tokens per step, ~40% less TPOT
        assert 0.3 < 1 - tpot[name, 1] / tpot[name, 0] < 0.5
