"""``--backend ray`` gives what the local backend gives: the same capacity and probes, the
same design-search table, the same sweep, on a 2-CPU local Ray instance shared by the session
(see ``conftest.ray_address``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from tests.paths import ROOT
from tests.test_cli import SMALL


def _capacity(out: Path, *extra: str) -> dict[str, Any]:
    argv = ["capacity", str(ROOT / "scenarios" / "quickstart.yaml"), "--seeds", "1"]
    assert main([*argv, "--out", str(out), *extra]) == 0
    assert (out / "plots" / "capacity.png").stat().st_size > 20_000
    return json.loads((out / "capacity.json").read_text())


def _without_timing(found: dict[str, Any]) -> dict[str, Any]:
    """capacity.json less what may differ between backends: wall times, the backend's name."""
    probes = [{k: v for k, v in p.items() if k != "wall_time_s"} for p in found["probes"]]
    return {**found, "probes": probes, "backend": None}


def test_quickstart_capacity_takes_at_most_12_simulations_and_ray_gives_the_same(
    ray_address: str, tmp_path: Path
) -> None:
    local = _capacity(tmp_path / "local", "--jobs", "1")
    assert local["num_simulations"] <= 12
    assert local["slo"]["limits"] == {"ttft_ms": 1000.0, "tpot_ms": 50.0}  # the scenario's
    assert local["slo"]["attain"] == 0.99 and 3 < local["capacity"] < 14
    assert (tmp_path / "local" / "probes.parquet").is_file()
    assert (tmp_path / "local" / "scenario.yaml").is_file()
    on_ray = _capacity(tmp_path / "ray", "--backend", "ray")
    assert on_ray["backend"] == "ray"
    assert on_ray["capacity"] == local["capacity"]
    assert _without_timing(on_ray) == _without_timing(local)


def test_a_20_point_search_on_ray_gives_the_local_table(ray_address: str, tmp_path: Path) -> None:
    import ray

    assert ray.cluster_resources()["CPU"] == 2  # a 2-worker cluster
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    argv = ["search", str(scenario), "--grid", "scheduler.max_num_seqs=2,4,8,16,32"]
    argv += ["--grid", "scheduler.max_num_batched_tokens=64,128,256,512"]
    argv += ["--slo", "ttft_p99_ms=400", "--gpu-cost", "2.5", "--no-plots", "--seeds", "1"]
    assert main([*argv, "--out", str(tmp_path / "local"), "--jobs", "2"]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), "--backend", "ray"]) == 0
    local = pd.read_parquet(tmp_path / "local" / "search.parquet")
    on_ray = pd.read_parquet(tmp_path / "ray" / "search.parquet")
    assert len(local) == 20 and (local["status"] == "found").all()
    pd.testing.assert_frame_equal(on_ray, local)
    assert local["cheapest"].sum() == 1


def test_a_sweep_on_ray_ships_each_run_folder_back(ray_address: str, tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    argv = ["sweep", str(scenario), "--grid", "scheduler.max_num_seqs=4,8", "--no-plots"]
    assert main([*argv, "--out", str(tmp_path / "local"), "--jobs", "1"]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), "--backend", "ray"]) == 0
    local = pd.read_parquet(tmp_path / "local" / "sweep.parquet")
    on_ray = pd.read_parquet(tmp_path / "ray" / "sweep.parquet")
    pd.testing.assert_frame_equal(on_ray, local)
    for run in local["run"]:
        for name in ("requests.parquet", "steps.parquet", "summary.json", "scenario.yaml"):
            got = (tmp_path / "ray" / "runs" / run / name).read_bytes()
            want = (tmp_path / "local" / "runs" / run / name).read_bytes()
            if name != "summary.json":  # its wall time differs
                assert got == want, name


def test_address_without_ray_backend_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", str(ROOT / "scenarios" / "quickstart.yaml"), "--address", "auto"]
    assert main(argv) == 2
    assert "--address: only with --backend ray" in capsys.readouterr().err
