"""``servesim search``: capacity and cost per deployment, the cheapest one, the Pareto front,
prices from presets or ``--gpu-cost``, and the fewest-replicas search."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.cost.presets import load_hardware
from simulator.explore.backend import Done
from simulator.explore.pricing import cost_per_hour, parse_gpu_costs
from simulator.explore.probe import Load
from simulator.explore.replicas import replicas_search
from simulator.explore.slo import make_target
from simulator.plots.search import pareto_front
from simulator.scenario.config import validate
from tests.test_cli import SMALL

ROOFLINE: dict[str, Any] = {
    **SMALL,
    "cost_model": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm", "tp": 1},
    "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 16, "num_blocks": 400},
}


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_search_prices_each_deployment_and_marks_the_cheapest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "srch"
    argv = ["search", str(write(tmp_path, ROOFLINE)), "--jobs", "1", "--out", str(out)]
    argv += ["--seeds", "1"]
    argv += ["--grid", "cost_model.hardware=a100-80gb,h100-sxm", "--grid", "cost_model.tp=1,2"]
    assert main([*argv, "--slo", "ttft_p99_ms=300", "--gpu-cost", "a100-80gb=1.5"]) == 0
    table = pd.read_parquet(out / "search.parquet")
    assert len(table) == 4 and (table["status"] == "found").all()
    price = {"a100-80gb": 1.5, "h100-sxm": load_hardware("h100-sxm").cost_per_hour}
    hardware, tp = table["cost_model.hardware"], table["cost_model.tp"]
    want = [price[h] * n for h, n in zip(hardware, tp, strict=True)]
    assert list(table["usd_per_hour"]) == pytest.approx(want)
    assert list(table["gpus"]) == list(table["cost_model.tp"])
    # priced on what each serves at its capacity: the measured throughput over the span its
    # requests arrived in, without the run's final drain (a day at that load has none)
    per_token = table["usd_per_hour"] / (table["served_token_rate"] * 3600) * 1e6
    assert list(table["usd_per_million_tokens"]) == pytest.approx(list(per_token))
    assert list(table["requests_per_usd"]) == pytest.approx(
        list(table["served_request_rate"] * 3600 / table["usd_per_hour"])
    )
    assert (table["served_request_rate"] > table["request_throughput"]).all()
    assert (table["served_token_rate"] > table["total_token_throughput"]).all()
    # every point draws the same 150 Poisson arrivals, scaled to its capacity: served per
    # second they are that capacity times one factor (1.053 for this sample), whereas the
    # throughput over each whole run falls short by each deployment's drain (0.78-0.91)
    ratio = table["served_request_rate"] / table["capacity"]
    assert np.allclose(ratio, ratio.iloc[0]) and 0.9 < ratio.iloc[0] < 1.15
    drained = table["request_throughput"] / table["capacity"]
    assert drained.max() - drained.min() > 0.05
    # each capacity's model interval: searched again at the roofline's error band's ends
    low, high = table["capacity_model_low"], table["capacity_model_high"]
    assert (low < table["capacity"]).all() and (table["capacity"] < high).all()
    cheapest = table[table["cheapest"]]
    assert len(cheapest) == 1
    assert cheapest["usd_per_million_tokens"].iloc[0] == table["usd_per_million_tokens"].min()
    assert (table["ttft_p99_s"] <= 0.3).all()  # each at its capacity meets the SLO
    # the capacity search of each point is the one `servesim capacity` finds
    point = table.iloc[3]
    one = tmp_path / "one"
    sets = ["--set", f"cost_model.hardware={point['cost_model.hardware']}"]
    sets += ["--set", f"cost_model.tp={point['cost_model.tp']}"]
    capacity = ["capacity", str(write(tmp_path, ROOFLINE)), *sets, "--slo", "ttft_p99_ms=300"]
    capacity += ["--seeds", "1"]
    capacity += ["--uncertainty", "off"]
    assert main([*capacity, "--out", str(one), "--no-plots", "--jobs", "1"]) == 0
    assert json.loads((one / "capacity.json").read_text())["capacity"] == point["capacity"]
    printed = capsys.readouterr().out
    assert "$/M tokens" in printed and "cost_model.tp" in printed and "(GPUs / replica)" in printed
    assert "model 90%" in printed and "model: 90% interval" not in printed
    assert (out / "plots" / "pareto.png").stat().st_size > 20_000
    meta = json.loads((out / "search.json").read_text())
    assert meta["gpu_cost"] == {"a100-80gb": 1.5}
    (out / "plots" / "pareto.png").unlink()
    assert main(["plot", str(out)]) == 0  # servesim plot redraws it
    assert (out / "plots" / "pareto.png").is_file()


def test_a_gpu_without_a_price_is_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "srch"
    argv = ["search", str(write(tmp_path, SMALL)), "--grid", "scheduler.max_num_seqs=4,8"]
    assert main([*argv, "--slo", "ttft_p99_ms=300", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "linear cost model (no hardware) has no cost_per_hour" in err
    assert "--gpu-cost" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_gpu_costs_parse_and_bad_ones_are_refused() -> None:
    assert parse_gpu_costs(["h100-sxm=2.1", "3"]) == {"h100-sxm": 2.1, "*": 3.0}
    for bad in ("h100-sxm=free", "-1", "h100-sxm=0"):
        with pytest.raises(ValueError, match="--gpu-cost"):
            parse_gpu_costs([bad])
    cfg = validate(ROOFLINE, "t")
    assert cost_per_hour(cfg, {}) == (load_hardware("h100-sxm").cost_per_hour, 1)
    assert cost_per_hour(cfg, {"*": 2.0}) == (2.0, 1)


def test_every_hardware_preset_states_its_price_and_source() -> None:
    for name in ("a100-80gb", "h100-sxm", "h200"):
        hw = load_hardware(name)
        assert hw.cost_per_hour is not None and hw.cost_per_hour > 0
        assert hw.cost_source and "$" in hw.cost_source


def test_the_pareto_front_keeps_what_nothing_beats() -> None:
    x = np.array([1.0, 2.0, 3.0, 2.5, 4.0])
    y = np.array([5.0, 3.0, 1.0, 4.0, 1.0])
    assert list(pareto_front(x, y)) == [0, 1, 2]


def _drive_replicas(needed: int) -> Any:
    """The replica search against a fake probe that meets the SLO with ``needed`` replicas."""
    target = make_target(["ttft_p99_ms=100"], None, None)
    search = replicas_search({}, "t", target, Load("workload.arrival.rate", 1.0), 50.0, [0])
    tried = []
    try:
        units = next(search)
        while True:
            spec = units[0].args[0]
            count = dict(spec.overrides)["cluster.replicas"]
            tried.append(count)
            record = {"meets": count >= needed, "level": spec.level, "seed": spec.seed}
            units = search.send([Done(1, record)])
    except StopIteration as stop:
        return stop.value, tried


@pytest.mark.parametrize("needed", [1, 2, 3, 5, 8, 13, 100])
def test_the_replica_search_finds_the_fewest_that_serve(needed: int) -> None:
    found, tried = _drive_replicas(needed)
    assert found.fewest == needed and found.outcome == "found"
    assert len(tried) == len(set(tried))  # no count probed twice
    assert len(tried) <= 2 * int(np.ceil(np.log2(needed))) + 1


def test_replicas_for_uses_cluster_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "srch"
    argv = ["search", str(write(tmp_path, ROOFLINE)), "--grid", "cost_model.tp=1,2"]
    argv += ["--slo", "ttft_p99_ms=300", "--replicas-for", "40", "--out", str(out), "--seeds", "1"]
    assert main([*argv, "--jobs", "1"]) == 0
    table = pd.read_parquet(out / "search.parquet")
    assert (table["replicas"] >= 1).all()
    assert list(table["gpus"]) == list(table["replicas"] * table["cost_model.tp"])


def test_served_rates_fall_back_to_the_run_where_nothing_spans() -> None:
    from simulator.explore.search import _served

    run = {"request_throughput": 8.0, "duration_s": 12.0, "arrival_span_s": 10.0}
    assert _served(run, "request_throughput") == pytest.approx(9.6)  # 96 requests in 10 s
    # all arriving at once (``rate: inf``) or one request: the run's own throughput
    assert _served({**run, "arrival_span_s": 0.0}, "request_throughput") == 8.0
    assert _served({**run, "arrival_span_s": None}, "request_throughput") == 8.0
    assert _served({**run, "request_throughput": None}, "request_throughput") is None


def test_replicas_for_an_slo_requests_alone_miss_is_none_and_unpriced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a decode step of Llama-3-8B on one H100 takes several ms: a 1 ms TPOT needs no count
    out = tmp_path / "srch"
    argv = ["search", str(write(tmp_path, ROOFLINE)), "--grid", "cost_model.tp=1"]
    argv += ["--slo", "tpot_p99_ms=1", "--replicas-for", "40", "--out", str(out), "--seeds", "1"]
    assert main([*argv, "--jobs", "1", "--no-plots"]) == 1  # no deployment serves it
    assert "no deployment searched serves the load within the SLO" in capsys.readouterr().out
    [row] = pd.read_parquet(out / "search.parquet").to_dict("records")
    assert row["status"] == "none" and row["num_simulations"] == 2  # one replica, then alone
    assert row["reason"].startswith("even requests sent one at a time miss it: tpot_p99_ms ")
    assert pd.isna(row["gpus"]) and pd.isna(row["replicas"])  # no deployment to price
    assert "usd_per_hour" not in row or pd.isna(row["usd_per_hour"])


def test_search_takes_keys_that_vary_together_and_labels_replica_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "2 x H100 TP2 against 1 x H200": two deployments, not the cartesian four
    from simulator.plots.search import plot_search

    out = tmp_path / "srch"
    grid = "layout,cost_model.hardware,cost_model.tp=h100-tp2,h100-sxm,2;h200-tp1,h200,1"
    argv = ["search", str(write(tmp_path, ROOFLINE)), "--grid", grid, "--seeds", "1"]
    argv += ["--slo", "ttft_p99_ms=300", "--replicas-for", "40", "--out", str(out)]
    assert main([*argv, "--jobs", "1", "--no-plots"]) == 0
    table = pd.read_parquet(out / "search.parquet")
    assert list(table["layout"]) == ["h100-tp2", "h200-tp1"]
    assert list(table["cost_model.hardware"]) == ["h100-sxm", "h200"]
    assert list(table["cost_model.tp"]) == [2, 1]
    assert list(table["gpus"]) == list(table["replicas"] * table["cost_model.tp"])
    assert "h100-tp2" in capsys.readouterr().out
    keys = json.loads((out / "search.json").read_text())["keys"]
    assert keys == ["layout"]  # the variants' name labels the points
    ax = plot_search(table, keys).axes[0]
    # the points are at the load asked for, not at each one's capacity
    assert ax.get_xlabel() == "p99 TTFT at 40 req/s (ms)"
    assert "capacity" not in ax.get_ylabel()
    labels = sorted(t.get_text() for t in ax.texts)
    want = [f"layout={n}, {r} replica{'' if r == 1 else 's'}" for n, r in
            zip(table["layout"], table["replicas"], strict=True)]  # fmt: skip
    assert labels == sorted(want)


def test_search_capacity_figure_still_says_at_capacity() -> None:
    from simulator.plots.search import plot_search

    table = pd.DataFrame(
        {
            "status": ["found"],
            "ttft_p99_s": [0.1],
            "usd_per_million_tokens": [1.0],
            "cheapest": [True],
            "cost_model.tp": [2],
        }  # fmt: skip
    )
    ax = plot_search(table, ["cost_model.tp"]).axes[0]
    assert ax.get_xlabel() == "p99 TTFT at capacity (ms)"
    assert [t.get_text() for t in ax.texts] == ["tp=2"]
