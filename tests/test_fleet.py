"""An autoscaled fleet on the cluster's clock: a fleet the autoscaler may not change is the
fixed cluster bit for bit; a step of load is followed to the count the target implies within
the delays, and back after the stabilization window; the cost is the integral of the replicas
billed; every request is served once, by a replica that was ready; bad input is one line."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

import simulator
import simulator.scenario.runner
from simulator.cli import main
from simulator.cluster.autoscale_policies import AutoscalePolicy, MetricsWindow
from simulator.cluster.routers import ROUTERS

SERVICE_STEPS, STEP_S = 20, 0.100  # a request runs its prefill step and 19 decode steps
MAX_SEQS, TARGET = 50, 0.1  # 5 running sequences per replica at the target
LOW, HIGH = 6.0, 24.0  # req/s: a step of r -> 4r ...
UP_S, DOWN_S, END_S = 200.0, 700.0, 1400.0  # ... at 200 s, back at 700 s, to 1400 s
SCALING = {
    "policy": "target_utilization",
    "target": TARGET,
    "metric": "running",
    "interval_s": 15,
    "metrics_delay_s": 5,
    "window_s": 30,
    "min_replicas": 1,
    "max_replicas": 16,
    "startup_s": 60,
    "scale_down_stabilization_s": 120,
    "cost_per_hour": 2.0,
    "scrape_interval_s": 1.0,
}


def fleet(router: str = "round_robin", replicas: int = 3, **scaling: Any) -> dict[str, Any]:
    """Fixed-length requests at a constant rate that steps from LOW to HIGH and back, each
    step 100 ms whatever the batch: every request runs exactly 2 s, so a replica's running
    sequences are its share of ``rate * 2 s`` (Little's law, no queue: 50 slots)."""
    n = int(LOW * UP_S + HIGH * (DOWN_S - UP_S) + LOW * (END_S - DOWN_S))
    return {
        "name": "step",
        "seed": 1,
        "scheduler": {
            "max_num_batched_tokens": 4096,
            "max_num_seqs": MAX_SEQS,
            "num_blocks": 1024,
            "block_size": 16,
        },
        "cost_model": {"type": "linear", "base_ms": STEP_S * 1e3},
        "workload": {
            "num_requests": n,
            "arrival": {
                "process": "constant",
                "rate_schedule": [[0, LOW], [UP_S, HIGH], [DOWN_S, LOW]],
            },
            "prompt_len": {"dist": "fixed", "value": 16},
            "output_len": {"dist": "fixed", "value": SERVICE_STEPS},
        },
        "cluster": {
            "replicas": replicas,
            "router": router,
            "autoscaler": {**SCALING, **scaling},
        },
    }


def implied(rate: float) -> int:
    """The count the target implies: ceil(load / per-replica capacity at the target)."""
    return math.ceil(rate * SERVICE_STEPS * STEP_S / (TARGET * MAX_SEQS))


def live_at(table: pd.DataFrame, t: float) -> int:
    """Replicas live at ``t`` (after the changes at ``t``)."""
    rows = table[table["time_s"] <= t]
    return int(rows["live"].iloc[-1])


@pytest.fixture(scope="module")
def stepped() -> Any:
    return simulator.run(fleet())


# -- autoscaling off: the fixed fleet --------------------------------------------------------------


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_fleet_pinned_at_n_replicas_is_the_fixed_cluster_bit_for_bit(router: str) -> None:
    cfg = fleet(router, replicas=4, min_replicas=4, max_replicas=4)
    cfg["workload"]["num_requests"] = 2500
    cfg["workload"]["arrival"] = {
        "process": "poisson",
        "rate_schedule": [[0, 20], [50, 60], [100, 20]],
    }
    fixed = copy.deepcopy(cfg)
    del fixed["cluster"]["autoscaler"]
    a, b = simulator.run(fixed), simulator.run(cfg)
    for name in ("requests", "steps", "replicas", "rejected"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    np.testing.assert_array_equal(a.checksums, b.checksums)
    assert b.tables["fleet"]["live"].tolist() == [4, 0]  # from 0 until the end
    assert b.summary["gpu_seconds"] == pytest.approx(4 * b.tables["fleet"]["time_s"].iloc[-1])


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv"])
def test_deferred_decode_steps_change_nothing_while_the_fleet_scales(router: str) -> None:
    cfg = fleet(router)
    cfg["workload"]["num_requests"] = 6000
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    assert len(fast.tables["replica_lifetimes"]) > 3  # it did scale
    for name in ("requests", "steps", "replicas"):
        pd.testing.assert_frame_equal(getattr(fast, name), getattr(slow, name), check_exact=True)
    for name in ("fleet", "replica_lifetimes"):
        pd.testing.assert_frame_equal(fast.tables[name], slow.tables[name], check_exact=True)


# -- a step of load against theory -----------------------------------------------------------------


def test_a_step_of_load_reaches_the_implied_count_within_the_delays(stepped: Any) -> None:
    table = stepped.tables["fleet"]
    low, high = implied(LOW), implied(HIGH)
    assert (low, high) == (3, 10)
    s = SCALING
    assert live_at(table, UP_S) == low  # settled on the low load before the step
    # the first decision whose window lies after the step, then one cold start
    first = math.ceil((UP_S + s["metrics_delay_s"] + s["window_s"]) / s["interval_s"])
    reached = first * s["interval_s"] + s["startup_s"]
    bound = UP_S + s["interval_s"] + s["metrics_delay_s"] + s["window_s"] + s["startup_s"]
    assert reached <= bound
    assert live_at(table, reached) == high
    assert live_at(table, reached - 1e-6) < high
    assert (table["live"] + table["starting"]).max() == high  # no overshoot
    during = table[(table["time_s"] >= reached) & (table["time_s"] < DOWN_S)]
    assert (during["live"] == high).all()


def test_after_the_load_falls_the_count_returns_within_the_stabilization_window(
    stepped: Any,
) -> None:
    table, s = stepped.tables["fleet"], SCALING
    stabilized = s["scale_down_stabilization_s"]
    back = table[(table["time_s"] > DOWN_S) & (table["live"] == implied(LOW))]["time_s"].min()
    # the last decision whose window still saw high load, plus the window
    late = DOWN_S + s["metrics_delay_s"] + s["window_s"] + s["interval_s"] + stabilized
    assert DOWN_S + stabilized <= back <= late
    assert live_at(table, END_S) == implied(LOW)
    # without the window it comes back as soon as the metrics show the low load
    quick = simulator.run(fleet(scale_down_stabilization_s=0)).tables["fleet"]
    early = quick[(quick["time_s"] > DOWN_S) & (quick["live"] == implied(LOW))]["time_s"].min()
    assert early <= DOWN_S + s["metrics_delay_s"] + s["window_s"] + s["interval_s"] < back


# -- the books -------------------------------------------------------------------------------------


def test_the_cost_is_the_integral_of_the_replicas_billed(stepped: Any) -> None:
    table, lives, summary = (
        stepped.tables["fleet"],
        stepped.tables["replica_lifetimes"],
        stepped.summary,
    )
    times = table["time_s"].to_numpy()
    billed = (table["live"] + table["starting"] + table["draining"]).to_numpy()
    integral = float(np.diff(times) @ billed[:-1])
    assert billed[-1] == 0  # every replica is gone at the end
    assert summary["gpu_seconds"] == pytest.approx(integral, rel=1e-12)
    assert lives["gpu_seconds"].sum() == pytest.approx(integral, rel=1e-12)
    assert summary["cost_usd"] == pytest.approx(integral * 2.0 / 3600, rel=1e-12)
    started = lives.iloc[3:]
    ready = started["ready_s"].dropna()
    assert (ready - started.loc[ready.index, "requested_s"] == SCALING["startup_s"]).all()
    assert summary["replicas_peak"] == 10


def test_every_request_is_served_once_by_a_replica_that_was_ready(stepped: Any) -> None:
    req, lives = stepped.requests, stepped.tables["replica_lifetimes"]
    assert (req["status"] == "finished").all()
    assert stepped.replicas["num_finished"].sum() == len(req)
    k = req["replica"].to_numpy()
    arrival = req["arrival_s"].to_numpy()
    ready = lives["ready_s"].to_numpy()[k]
    retired = lives["retired_s"].to_numpy()[k]
    assert (ready <= arrival).all() and (arrival < retired).all()
    gone = lives["gone_s"].to_numpy()[k]
    assert (req["finish_s"].to_numpy() <= gone).all()  # a replica drains before it goes
    tokens = stepped.replicas["num_tokens"].sum()
    assert tokens == len(req) * (16 + SERVICE_STEPS - 1)  # every token computed once


def test_a_replicas_figures_are_over_its_own_time_serving(stepped: Any) -> None:
    # replicas that served for minutes of the run are not shown idle the rest of it
    table = stepped.replicas.set_index("replica")
    lives = stepped.tables["replica_lifetimes"].set_index("replica")
    serving = lives["gone_s"] - lives["ready_s"]
    assert serving.min() < 0.5 * stepped.summary["duration_s"]  # some served briefly
    assert table["utilization"].to_numpy() == pytest.approx(table["busy_s"] / serving)
    assert (table["utilization"] > 0.95).all()  # the step load keeps each one busy
    got = table["request_throughput"].to_numpy()
    assert got == pytest.approx(table["num_finished"] / serving)
    weighted = (table["kv_utilization_mean"] * serving).sum() / serving.sum()
    assert stepped.summary["kv_utilization_mean"] == pytest.approx(weighted)
    rates = table["num_tokens"] / serving
    assert stepped.summary["load_imbalance"] == pytest.approx(rates.max() / rates.mean())


def test_a_derived_cold_start_and_the_preset_price_land_in_the_summary(tmp_path: Path) -> None:
    cfg = fleet(startup_s=None, load_gb_s=2.0, engine_start_s=20.0, cost_per_hour=None)
    cfg["cost_model"] = {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"}
    cfg["workload"]["num_requests"] = 1500
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    out = tmp_path / "out"
    summary = yaml.safe_load((out / "summary.json").read_text())
    from simulator.cost.presets import load_hardware, load_model

    weights = load_model("llama-3-8b").weight_bytes
    assert summary["startup_s"] == pytest.approx(weights / 2e9 + 20.0)
    price = load_hardware("h100-sxm").cost_per_hour
    assert summary["cost_per_hour"] == price
    assert summary["cost_usd"] == pytest.approx(summary["gpu_seconds"] * price / 3600)
    saved = yaml.safe_load((out / "scenario.yaml").read_text())
    assert saved["cluster"]["autoscaler"]["cost_per_hour"] == price  # the resolved scenario
    table = pd.read_parquet(out / "fleet.parquet")
    assert list(table.columns) == ["time_s", "live", "starting", "draining"]
    assert len(pd.read_parquet(out / "replica_lifetimes.parquet")) >= 3


# -- policies --------------------------------------------------------------------------------------


class AlwaysFive(AutoscalePolicy):
    """A policy of a test's own, named by import path."""

    def desired(self, window: MetricsWindow) -> int:
        return 5


def test_a_policy_by_import_path_and_the_ttft_slo_policy_scale_the_fleet() -> None:
    cfg = fleet(policy="tests.test_fleet:AlwaysFive")
    cfg["workload"]["num_requests"] = 1500
    result = simulator.run(cfg)
    assert result.tables["fleet"]["live"].max() == 5
    assert result.summary["replica_starts"] == 2
    # a fleet too small for the load: the TTFT grows, and the SLO policy adds replicas
    cfg = fleet(replicas=1, policy="slo_ttft", target=0.5)
    cfg["scheduler"]["max_num_seqs"] = 4
    cfg["workload"]["num_requests"] = 3000
    result = simulator.run(cfg)
    assert result.summary["replicas_peak"] > 1


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"min_replicas": 4, "max_replicas": 2},
            "cluster.autoscaler: min_replicas (4) must be <= max_replicas (2)",
        ),
        (
            {"min_replicas": 4},
            "cluster.replicas (3) must be within cluster.autoscaler.min_replicas (4) and "
            "max_replicas (16)",
        ),
        ({"max_replicas": 2}, "cluster.replicas (3) must be within"),
        ({"policy": "nowhere.policies:Mine"}, "cluster.autoscaler.policy: cannot import"),
        (
            {"policy": "simulator.cluster.routers:RoundRobin"},
            "'simulator.cluster.routers:RoundRobin' is not an AutoscalePolicy subclass",
        ),
        ({"policy": "fastest"}, "cluster.autoscaler.policy: unknown policy 'fastest'"),
    ],
)
def test_bad_autoscaling_is_one_line_and_exit_2(
    change: dict[str, Any], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(fleet(**change)))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err
    assert not (tmp_path / "out").exists()


def test_autoscaling_replica_groups_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = fleet()
    cfg["cluster"]["replicas"] = [{"count": 2}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "autoscaler: scales a count of identical replicas" in err


# -- the scenario ----------------------------------------------------------------------------------


def test_a_shortened_fleet_day_scales_up_for_the_peak_and_down_after(tmp_path: Path) -> None:
    """scenarios/fleet-day.yaml with its day cut to 20 minutes at half the load."""
    sets = {
        "workload.num_requests": 10800,
        "workload.arrival.diurnal.period_s": 1200,
        "workload.arrival.diurnal.peak_at_s": 600,
        "workload.arrival.diurnal.peak": 16,
        "workload.arrival.diurnal.trough": 2,
    }
    args = [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]
    out = tmp_path / "out"
    assert main(["run", "scenarios/fleet-day.yaml", *args, "--out", str(out)]) == 0
    summary = yaml.safe_load((out / "summary.json").read_text())
    table = pd.read_parquet(out / "fleet.parquet")
    assert summary["num_finished"] == 10800
    assert summary["replicas_peak"] >= 2
    peak_at = table.loc[table["live"].idxmax(), "time_s"]
    assert 300 < peak_at < 900  # around the peak of the day
    assert live_at(table, 1150) == 1  # back to one replica at night
    fixed = summary["replicas_peak"] * summary["duration_s"]  # a fleet sized for the peak
    assert summary["gpu_seconds"] < 0.8 * fixed
    assert (out / "plots" / "fleet.png").stat().st_size > 10_000


def test_a_request_that_fits_no_replica_is_rejected_once_while_the_fleet_scales() -> None:
    for router in ("round_robin", "least_outstanding"):
        cfg = fleet(router)
        cfg["workload"]["num_requests"] = 2000
        cfg["workload"]["prompt_len"] = {"dist": "uniform", "low": 16, "high": 120}
        cfg["scheduler"]["num_blocks"] = 7  # 112 tokens: prompts over 92 never fit (+20 out)
        cfg["scheduler"]["max_num_seqs"] = 50
        cfg["cluster"]["autoscaler"].update(metric="demand", target=0.5)  # the queue grows
        result = simulator.run(cfg)
        req, rejected = result.requests, result.rejected
        finished = req["status"] == "finished"
        assert 0 < len(rejected) == (~finished).sum()
        assert rejected["request_id"].is_unique
        assert (finished | (req["status"] == "rejected")).all()
        assert (req.loc[~finished, "replica"] == -1).all()
        assert len(result.tables["replica_lifetimes"]) > 3  # it scaled meanwhile
