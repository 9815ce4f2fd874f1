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
    assert len(err) == 1 and "rejected: they can never fit in the KV cache" in err[0]
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
