"""Model uncertainty (docs/metrics.md, "Model uncertainty"): every GPU step scaled by
``serving.gpu_time_scale`` on every kind of server, each cost model's measured error band
(configs/error_bands.yaml), and the intervals ``servesim run`` and ``capacity`` report."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.cli import main
from simulator.cost.batch import Batch, StepSums
from simulator.cost.error_band import band_for, band_kind, load_bands
from simulator.cost.linear import LinearCostConfig, LinearCostModel
from simulator.engine.serving import ServingConfig, StepWithCpu
from simulator.explore.uncertainty import (
    at_scale,
    band_summary,
    intervals,
    model_uncertainty,
    run_side_by_side,
)
from simulator.scenario.config import validate
from tests.test_serving import ONE_REQUEST  # one request: 9 ms prefill, 5.1 ms decodes

ROOFLINE: dict[str, Any] = {
    "name": "roofline",
    "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 32},
    "cost_model": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"},
    "workload": {
        "num_requests": 200,
        "arrival": {"process": "poisson", "rate": 20},
        "prompt_len": {"dist": "uniform", "low": 50, "high": 400},
        "output_len": {"dist": "uniform", "low": 5, "high": 60},
    },
    "slo": {"ttft_ms": 200, "tpot_ms": 30},
}


def alone(scale: float, **extra: Any) -> Any:
    cfg = copy.deepcopy(ONE_REQUEST)
    cfg["serving"] = {"gpu_time_scale": scale}
    cfg.update(extra)
    return simulator.run(cfg).requests.iloc[0]


def test_a_scaled_gpu_scales_a_lone_request_exactly() -> None:
    base, slow = alone(1.0), alone(2.0)
    assert base.ttft_s == pytest.approx(0.009) and slow.ttft_s == pytest.approx(0.018)
    assert slow.e2e_s == pytest.approx(2 * base.e2e_s) and slow.tpot_s == pytest.approx(0.0102)


def test_a_scaled_gpu_scales_data_parallel_ranks_and_cluster_replicas() -> None:
    base = alone(1.0)
    dp = alone(2.0, parallel={"data_parallel_size": 2})
    cluster = alone(2.0, cluster={"replicas": 2, "router": "round_robin"})
    for row in (dp, cluster):
        assert row.ttft_s == pytest.approx(2 * base.ttft_s)
        assert row.tpot_s == pytest.approx(2 * base.tpot_s)


def test_the_cpu_share_is_not_scaled() -> None:
    # 10 ms of CPU overlapped: a 9 ms prefill at scale 0.5 takes the CPU's 10 ms
    row = alone(0.5, serving={"gpu_time_scale": 0.5, "step_cpu_ms": 10})
    assert row.ttft_s == pytest.approx(0.010) and row.tpot_s == pytest.approx(0.010)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(0, 4000)), min_size=1, max_size=20),
    st.floats(0.1, 10),
)
def test_scaled_steps_keep_time_sums_equal_to_step_time(
    seqs: list[tuple[int, int]], scale: float
) -> None:
    gpu = LinearCostModel(LinearCostConfig(base_ms=3, per_token_ms=0.05, per_seq_ms=0.2))
    server = StepWithCpu(gpu, ServingConfig(gpu_time_scale=scale))
    batch = Batch([n for n, _ in seqs], [c for _, c in seqs])
    assert server.step_time(batch) == server.time_sums(StepSums.of(batch))
    assert server.step_time(batch) == pytest.approx(scale * gpu.step_time(batch))


def test_every_band_follows_from_its_held_out_biases() -> None:
    bands = load_bands()
    z = statistics.NormalDist().inv_cdf(0.5 + bands.level / 2)
    for kind, band in bands.bands.items():
        assert band.low < 0 < band.high, kind
        if band.biases:  # mean +- z sd, holding 0, as benchmarks/error_bands.py writes it
            b = np.asarray(band.biases)
            mean, sd = b.mean(), b.std(ddof=1)
            assert band.low == pytest.approx(max(min(mean - z * sd, -0.001), -0.9), abs=1e-4)
            assert band.high == pytest.approx(max(mean + z * sd, 0.001), abs=1e-4)
            assert band.groups == len(b)


def test_physics_bands_tell_a_fitted_gpu_from_one_priced_from_its_spec_sheet() -> None:
    fitted = validate({**ROOFLINE, "cost_model": {"type": "physics", "model": "llama-3-8b",
                       "hardware": "rtx-4090"}}, "t").cost_model  # fmt: skip
    unseen = fitted.model_copy(update={"hardware": "l4"})
    assert band_kind(fitted) == "physics-fitted-gpu" and band_kind(unseen) == "physics-unseen-gpu"
    wide, narrow = band_for([unseen]), band_for([fitted])
    assert wide is not None and narrow is not None
    assert wide[1].high - wide[1].low > narrow[1].high - narrow[1].low
    linear = validate(ONE_REQUEST, "t").cost_model
    assert band_kind(linear) is None and band_for([fitted, linear]) is None


def test_intervals_hold_the_run_and_ignore_undefined_figures() -> None:
    runs = [
        {"ttft_mean_s": 1.0, "tpot_p99_s": float("nan"), "goodput": 3.0, "num_steps": 9},
        {"ttft_mean_s": 1.3, "tpot_p99_s": 0.02, "goodput": 2.0, "num_steps": 11},
        {"ttft_mean_s": 0.8, "tpot_p99_s": 0.01, "goodput": 3.5, "num_steps": 7},
    ]
    assert intervals(runs) == {"ttft_mean_s": [0.8, 1.3], "goodput": [2.0, 3.5]}


def test_model_uncertainty_runs_the_band_ends_and_orders_them() -> None:
    cfg = validate(ROOFLINE, "t")
    seen: list[float] = []

    def run_all(cfgs: list[Any]) -> list[dict[str, Any]]:
        seen.extend(c.serving.gpu_time_scale for c in cfgs)
        return run_side_by_side(cfgs, 2)

    base = simulator.run(cfg).summary
    u = model_uncertainty(cfg, base, run_all)
    band = load_bands().bands["roofline"]
    assert seen == pytest.approx(list(band.scales())) and u["available"]
    assert u["step_time_error"] == [band.low, band.high]
    for key in ("ttft_mean_s", "tpot_p99_s", "e2e_p50_s", "request_throughput", "goodput"):
        low, high = u[key]
        assert low <= base[key] <= high, key
    # slower steps (the model too fast) give the longer latencies
    slow = band_summary(at_scale(cfg, max(band.scales())))
    assert run_side_by_side([cfg], 1)[0]["ttft_mean_s"] == base["ttft_mean_s"]  # in-process
    assert u["tpot_mean_s"][1] == slow["tpot_mean_s"] > base["tpot_mean_s"]


def test_run_reports_intervals_in_summary_json_and_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(ROOFLINE))
    assert main(["run", str(path), "--out", str(tmp_path / "on")]) == 0
    printed = capsys.readouterr().out
    u = json.loads((tmp_path / "on" / "summary.json").read_text())["uncertainty"]
    assert u["level"] == 0.9 and u["cost_model"] == "roofline"
    assert "model      90% interval (roofline" in printed
    assert f"ttft {u['ttft_mean_s'][0] * 1e3:.1f}-{u['ttft_mean_s'][1] * 1e3:.1f}" in printed
    assert (tmp_path / "on" / "plots" / "ttft_tpot_cdf.png").exists()
    assert main(["run", str(path), "--out", str(tmp_path / "off"), "--uncertainty", "off",
                 "--no-plots"]) == 0  # fmt: skip
    assert "uncertainty" not in json.loads((tmp_path / "off" / "summary.json").read_text())
    assert "model " not in capsys.readouterr().out


def test_a_cost_model_without_a_measured_error_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(ONE_REQUEST))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    u = json.loads((tmp_path / "o" / "summary.json").read_text())["uncertainty"]
    assert u == {
        "level": 0.9,
        "available": False,
        "reason": "cost model linear has no measured held-out error",
    }
    assert "no 90% interval: cost model linear" in capsys.readouterr().out


def test_capacity_reports_a_model_interval(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(ROOFLINE))
    out = tmp_path / "cap"
    args = ["capacity", str(path), "--seeds", "1", "--tolerance", "0.1", "--out", str(out)]
    assert main([*args, "--no-plots"]) == 0
    found = json.loads((out / "capacity.json").read_text())
    model = found["model_interval"]
    assert model["available"] and model["cost_model"] == "roofline"
    assert model["low"] <= found["capacity"] <= model["high"]
    assert model["low"] < model["high"]


def test_the_band_runs_say_nothing_the_run_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = copy.deepcopy(ROOFLINE)
    cfg["scheduler"]["max_model_len"] = 300  # some requests rejected: a warning
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert err.count("request(s) rejected") == 1, err
