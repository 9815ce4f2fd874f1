"""Answers a user can trust (issue 23): a deployment that cannot exist is refused with its
memory arithmetic, every request counts in an SLO, a capacity says how sure it is. Each test
goes through the command line and failed before the change it checks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from tests.paths import ROOT
from tests.test_cli import SMALL

QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")
SHORT = ["--set", "workload.num_requests=300"]
"""The quickstart cut to 300 requests: the same deployment, a few seconds per run."""


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("servesim: error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in "\n".join(err)
    return errors[0]


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------- impossible deployments


def test_run_refuses_llama_70b_on_one_h100_with_the_arithmetic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["run", QUICKSTART, "--set", "cost_model.model=llama-3-70b", "--out", str(out)]
    assert main(argv) == 2
    line = one_error_line(capsys)
    # 70.6e9 parameters x 2 bytes, and the quickstart's 4,000 blocks of 16 tokens x 320 KiB
    assert "llama-3-70b does not fit on 1 x h100-sxm" in line
    assert "141.1 GB of weights" in line and "21.0 GB KV (4,000 blocks)" in line
    assert "91.0 GB more than the 72.0 GB that gpu_memory_utilization=0.9 leaves of 80 GB" in line
    assert not out.exists()


@pytest.mark.parametrize(
    "sets",
    [
        ["cost_model.model=bloom-176b", "cost_model.hardware=rtx-4090"],
        ["scheduler.num_blocks=100000000000"],
    ],
)
def test_validate_refuses_what_cannot_fit(
    sets: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["validate", QUICKSTART]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 2
    assert "does not fit on 1 x" in one_error_line(capsys)


def test_a_linear_cost_model_is_not_checked(tmp_path: Path) -> None:
    data = {**SMALL, "scheduler": {**SMALL["scheduler"], "num_blocks": 10**11}}
    assert main(["validate", str(write(tmp_path, data))]) == 0


def test_sweep_and_capacity_refuse_a_deployment_that_cannot_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sw"
    sweep = ["sweep", QUICKSTART, *SHORT, "--set", "cost_model.model=llama-3-70b"]
    assert main([*sweep, "--grid", "cost_model.tp=1,4", "--out", str(out), "--jobs", "1"]) == 2
    line = one_error_line(capsys)
    assert "[000_tp=1]" in line and "does not fit on 1 x h100-sxm" in line
    assert not out.exists()
    capacity = ["capacity", QUICKSTART, *SHORT, "--set", "cost_model.model=llama-3-70b"]
    assert main([*capacity, "--out", str(tmp_path / "cap"), "--jobs", "1"]) == 2
    assert "does not fit on 1 x h100-sxm" in one_error_line(capsys)


def test_search_marks_infeasible_points_and_picks_a_feasible_cheapest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "srch"
    argv = ["search", QUICKSTART, *SHORT, "--set", "cost_model.model=llama-3-70b"]
    argv += ["--grid", "cost_model.tp=1,2,4", "--slo", "ttft_p99_ms=2000,tpot_p99_ms=100"]
    assert main([*argv, "--seeds", "2", "--jobs", "1", "--out", str(out), "--no-plots"]) == 0
    table = pd.read_parquet(out / "search.parquet").set_index("cost_model.tp")
    assert list(table["status"]) == ["infeasible", "infeasible", "found"]
    # TP 2: 70.6 GB of weights and 10.5 GB of KV per GPU, past 72 GB
    assert "does not fit on 2 x h100-sxm" in table.loc[2, "reason"]
    assert "9.9 GB more than" in table.loc[2, "reason"]
    assert table["cheapest"].tolist() == [False, False, True]
    printed = capsys.readouterr().out
    assert "does not fit on 1 x h100-sxm" in printed  # the reason under the table
    # the capacity with its 95% interval, to the digits the interval supports
    assert re.search(r" found +\d+(\.\d+)? \(\d+(\.\d+)?-\d+(\.\d+)?\) ", printed), printed


# ------------------------------------------------------------- every request counts


@pytest.mark.parametrize("slo", ["ttft_p99_ms=500,tpot_p99_ms=50", "tpot_p99_ms=50"])
def test_capacity_counts_rejected_requests_as_misses(
    slo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 40 blocks of 16 tokens: most ShareGPT-like requests can never fit at any load (TPOT
    # gives the stop rule no bound: those runs go to their end)
    argv = ["capacity", QUICKSTART, *SHORT, "--set", "scheduler.num_blocks=40"]
    argv += ["--slo", slo, "--seeds", "1", "--jobs", "1"]
    assert main([*argv, "--out", str(tmp_path / "cap"), "--no-plots"]) == 1
    printed = capsys.readouterr().out
    assert "meets the SLO" not in printed and "capacity 0." not in printed
    assert "no capacity (none)" in printed and re.search(r"\d+,?\d* (requests )?rejected", printed)
    found = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert found["capacity"] is None and found["status"] == "none"
    assert found["probes"] and not any(p["meets"] for p in found["probes"])
    finished = [p for p in found["probes"] if p.get("num_rejected") is not None]
    assert all(p["failed_terms"][0] == "unfinished" for p in finished)
    assert finished or "ttft" in slo  # without a TTFT bound no run is cut short


def test_a_run_that_serves_almost_nothing_exits_1_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r"
    argv = ["run", QUICKSTART, *SHORT, "--set", "scheduler.num_blocks=10", "--no-plots"]
    assert main([*argv, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.startswith("servesim: error:")]
    assert len(err) == 1 and "rejected: they can never be served" in err[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_rejected"] > 250
    assert summary["rejected_share"] == summary["num_rejected"] / 300
    assert list(summary)[:3] == ["num_requests", "num_rejected", "rejected_share"]
    first = captured.out.splitlines()[1]  # under "results in"
    assert re.match(r"rejected +\d+ of 300 requests \(\d+\.\d%\)", first), first


def test_a_run_where_nothing_finishes_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", QUICKSTART, *SHORT, "--set", "scheduler.num_blocks=1", "--no-plots"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 1
    assert "no request finished (300 of 300 rejected)" in one_error_line(capsys)


# ------------------------------------------------------------- how sure


def test_capacity_runs_five_seeds_and_reports_intervals_to_their_digits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cap"
    argv = ["capacity", QUICKSTART, *SHORT, "--slo", "ttft_p99_ms=1000", "--jobs", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    found = json.loads((out / "capacity.json").read_text())
    per_seed = [s["capacity"] for s in found["per_seed"]]
    assert [s["seed"] for s in found["per_seed"]] == [0, 1, 2, 3, 4]
    assert found["capacity"] == pytest.approx(sum(per_seed) / 5)
    ci, one = found["interval"], found["one_seed_interval"]
    assert ci["low"] < found["capacity"] < ci["high"]
    assert one["low"] < ci["low"] and ci["high"] < one["high"]  # one seed varies more
    assert ci["level"] == 0.95 and "Student" in ci["method"]
    line = capsys.readouterr().out.strip().splitlines()[-1]
    shown = re.search(r"capacity (\d+(?:\.\d+)?) req/s \(95% CI ([\d.]+)-([\d.]+)", line)
    assert shown, line
    half = (ci["high"] - ci["low"]) / 2
    decimals = len(shown[1].partition(".")[2])
    assert 10.0**-decimals <= half < 10.0 ** (1 - decimals)  # digits the interval supports
    assert float(shown[1]) == pytest.approx(found["capacity"], abs=10.0**-decimals / 2)
    assert (out / "plots" / "capacity.png").stat().st_size > 20_000


def test_sweep_repeats_each_point_over_seeds_and_plots_the_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sw"
    argv = ["sweep", str(write(tmp_path, SMALL)), "--grid", "workload.arrival.rate=4,8"]
    assert main([*argv, "--seeds", "3", "--out", str(out), "--jobs", "1"]) == 0
    table = pd.read_parquet(out / "sweep.parquet")
    assert list(table["seed"]) == [3, 4, 5, 3, 4, 5]  # SMALL's seed, +1, +2 per point
    assert table.groupby("workload.arrival.rate")["ttft_p99_s"].nunique().min() == 3
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["keys"] == ["workload.arrival.rate"] and meta["seeds"] == [3, 4, 5]
    assert (out / "plots" / "sweep_workload_arrival_rate.png").stat().st_size > 20_000
    assert main([*argv, "--seeds", "0", "--out", str(tmp_path / "x")]) == 2


# ------------------------------------------------------------- clear figures


def _cluster_run(tmp_path: Path, name: str, *sets: str) -> tuple[pd.DataFrame, dict[str, Any], str]:
    from tests.paths import DATA

    out = tmp_path / f"{name}-{len(sets)}"
    argv = ["run", str(ROOT / "scenarios" / f"{name}.yaml"), "--out", str(out), "--no-plots"]
    argv += ["--set", f"workload.trace.path={DATA / 'azure2023_conv.csv'}"]
    argv += ["--set", "workload.trace.max_requests=1500", "--steps", "none"]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    return pd.read_parquet(out / "replicas.parquet"), summary, out.name


def test_a_fleet_far_from_saturation_does_not_read_as_saturated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # eight replicas with KV ~3% used: every replica steps most of the time (any held
    # request keeps it stepping), but hardly a step leaves out a request it holds
    table, summary, _ = _cluster_run(tmp_path, "cluster-routing")
    assert summary["utilization_mean"] > 0.8
    assert summary["saturated_share_mean"] < 0.05
    assert (table["saturated_share"] < 0.05).all()
    printed = capsys.readouterr().out
    assert re.search(r"replicas   8, saturated \d\.\d% of the time mean", printed), printed
    assert summary["saturated_share"] == summary["saturated_share_mean"]
    # the same requests in a tenth of the time: a burst the fleet drains for a minute, a
    # quarter of which it spends saturated
    _, loaded, _ = _cluster_run(tmp_path, "cluster-routing", "workload.trace.time_scale=0.02")
    assert loaded["saturated_share_mean"] > max(0.2, 5 * summary["saturated_share_mean"])


def test_a_prefill_replica_shows_the_requests_it_handled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, summary, _ = _cluster_run(tmp_path, "pd-disaggregation")
    prefill = table[table["role"] == "prefill"].iloc[0]
    assert prefill["num_requests"] == prefill["num_finished"] == summary["num_finished"] == 1500
    assert prefill["request_throughput"] == pytest.approx(1500 / summary["duration_s"])
    decode = table[table["role"] == "decode"]
    assert decode["num_finished"].sum() == 1500
    row = next(line for line in capsys.readouterr().out.splitlines() if " prefill " in line)
    assert float(row.split()[5]) > 0  # req/s on the console too


def test_search_says_why_a_point_has_no_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "srch"
    argv = ["search", QUICKSTART, *SHORT, "--grid", "scheduler.num_blocks=40,4000"]
    argv += ["--slo", "ttft_p99_ms=2000,tpot_p99_ms=50", "--seeds", "1", "--jobs", "1"]
    assert main([*argv, "--out", str(out), "--no-plots"]) == 0
    table = pd.read_parquet(out / "search.parquet").set_index("scheduler.num_blocks")
    assert table.loc[40, "status"] == "none"
    assert re.search(r"\d+ (requests )?rejected", table.loc[40, "reason"]), table.loc[40, "reason"]
    assert table.loc[4000, "status"] == "found" and pd.isna(table.loc[4000, "reason"])
    printed = capsys.readouterr().out
    assert "num_blocks=40: none: even requests sent one at a time miss it: 205 requests" in printed


# ------------------------------------------------------------- input files not there


@pytest.mark.parametrize(
    "argv",
    [
        ["capacity", "--seeds", "1", "--slo", "ttft_p99_ms=500"],
        ["sweep", "--grid", "workload.trace.time_scale=1,2"],
        ["search", "--grid", "cost_model.per_token_ms=0.02,0.03", "--seeds", "1"]
        + ["--gpu-cost", "1", "--slo", "ttft_p99_ms=500"],
        ["run"],
    ],
)
def test_a_trace_that_is_not_there_is_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A capacity search printed a traceback (exit 1) when its probes could not find the
    trace; a sweep and a search ran every point to a 'failed' row and wrote their folder."""
    data = {**SMALL, "workload": {"trace": {"path": str(tmp_path / "gone.csv"), "format": "csv"}}}
    out = tmp_path / "out"
    command, *rest = argv
    assert main([command, str(write(tmp_path, data)), *rest, "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert "workload.trace.path:" in line and "gone.csv: file not found" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("cost_model.per_token_ms", ".inf", "Input should be a finite number"),
        ("cost_model.per_context_token_ms", ".inf", "Input should be a finite number"),
        ("serving.frontend_delay_ms", "1e12", "less than or equal to 3600000"),
        ("serving.response_delay_ms", ".inf", "finite number"),
        (
            "speculative",
            "{num_speculative_tokens: 1000000000000, acceptance: {rate: 0.5}}",
            "less than or equal to 64",
        ),
        ("parallel.data_parallel_size", "100000", "less than or equal to 1024"),
        ("cluster.replicas", "1000000000000", "at most 4,096 replicas are simulated"),
        ("scheduler.block_size", "1000000000000", "less than or equal to 4096"),
    ],
)
def test_an_infinite_cost_or_an_endless_delay_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, why: str
) -> None:
    # found by mutated scenarios: an infinite per-token cost ran to a NaN step time and a
    # traceback; a front end of 1e12 ms kept an autoscaled fleet deciding for 30,000 years;
    # 1e12 drafts a step built a list of 1e12 acceptance probabilities; 1e5 data-parallel
    # ranks ran for ever, 1e12 replicas or 1e12-token blocks ran out of memory
    data = {**SMALL, "cost_model": {"type": "linear", "base_ms": 5.0}}
    path = write(tmp_path, data)
    out = tmp_path / "out"
    assert main(["run", str(path), "--set", f"{key}={value}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and why in err, err
    assert not out.exists()
