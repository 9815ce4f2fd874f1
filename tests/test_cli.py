"""The ``servesim`` command line: outputs, bad input, sweeps and redrawing plots."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.metrics import REQUEST_COLUMNS, STEP_COLUMNS

SMALL: dict[str, Any] = {
    "name": "cli-test",
    "seed": 3,
    "scheduler": {"max_num_batched_tokens": 256, "max_num_seqs": 16, "num_blocks": 120},
    "cost_model": {"type": "linear", "base_ms": 4, "per_token_ms": 0.03, "per_seq_ms": 0.05},
    "workload": {
        "num_requests": 150,
        "arrival": {"process": "poisson", "rate": 6},
        "prompt_len": {"dist": "uniform", "low": 20, "high": 400},
        "output_len": {"dist": "uniform", "low": 1, "high": 80},
    },
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def test_run_writes_tables_summary_scenario_and_plots(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["run", str(scenario_file), "--out", str(out), "--set", "seed=4"]) == 0
    req = pd.read_parquet(out / "requests.parquet")
    steps = pd.read_parquet(out / "steps.parquet")
    assert list(req.columns) == REQUEST_COLUMNS and len(req) == 150
    assert list(steps.columns) == STEP_COLUMNS and len(steps) > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 150
    resolved = yaml.safe_load((out / "scenario.yaml").read_text())
    assert resolved["seed"] == 4  # the override is what was simulated, and what is saved
    assert resolved["scheduler"]["block_size"] == 16  # defaults spelled out
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert len(pngs) == 4
    printed = capsys.readouterr().out
    assert "ttft" in printed and str(out) in printed
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_run_refuses_a_non_empty_folder_without_overwrite(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["run", str(scenario_file), "--out", str(out), "--no-plots"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    # --overwrite replaces only what servesim wrote (a folder of someone's files is refused)
    assert main(["run", str(scenario_file), "--out", str(out), "--no-plots", "--overwrite"]) == 2
    assert "not a servesim output folder" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    ours = tmp_path / "ours"
    assert main(["run", str(scenario_file), "--out", str(ours), "--no-plots"]) == 0
    (ours / "extra.txt").write_text("added later")
    assert main(["run", str(scenario_file), "--out", str(ours), "--no-plots", "--overwrite"]) == 0
    assert not (ours / "extra.txt").exists() and (ours / "summary.json").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "scheduler.max_num_seqs=0"], "scheduler.max_num_seqs"),
        (["--set", "cost_model.per_token_ms=-1"], "cost_model.per_token_ms"),
        (["--set", "workload.arrival.rate=fast"], "workload.arrival.rate"),
        (["--set", "scheduler.typo=1"], "scheduler.typo"),
        (["--set", "novalue"], "--set 'novalue'"),
        (["--set", "workload.trace.path=/nonexistent.csv"], "workload"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    scenario_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
) -> None:
    out = tmp_path / "never"
    assert main(["run", str(scenario_file), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servesim: error:") and expected in err
    assert len(err.splitlines()) == 1
    assert not out.exists()


def test_bad_files_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.yaml"
    assert main(["validate", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nscheduler: [unclosed\n")
    assert main(["validate", str(broken)]) == 2
    assert f"{broken}:" in capsys.readouterr().err


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SMALL, "seed": "abc"}))
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "run", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"servesim: error: {bad}: seed: ")


def test_validate_prints_the_resolved_scenario(
    scenario_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(scenario_file), "--set", "scheduler.block_size=32"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["scheduler"]["block_size"] == 32
    assert resolved["cost_model"]["per_context_token_ms"] == 0


def test_presets_lists_models_and_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in ("llama-3-8b", "llama-2-70b", "bloom-176b", "h100-sxm", "a100-80gb", "h200"):
        assert name in out

    # each GPU says what a scenario that leaves its budgets out gets on it
    def entry(name: str) -> str:  # a preset's lines, up to the next preset's
        found = re.search(rf"\n  {name} .*?(?=\n  \S)", out, re.DOTALL)
        assert found is not None, name
        return found.group(0)

    assert "vllm serve's defaults: 8192 tokens a step, 1024 sequences" in entry("h100-sxm")
    assert "vllm serve's defaults: 2048 tokens a step, 256 sequences" in entry("a100-80gb")


def _sweep(scenario_file: Path, out: Path, jobs: int, *extra: str) -> pd.DataFrame:
    code = main(
        [
            "sweep",
            str(scenario_file),
            "--grid",
            "scheduler.max_num_batched_tokens=128,512",
            "--grid",
            "scheduler.max_num_seqs=4,16",
            "--jobs",
            str(jobs),
            "--out",
            str(out),
            *extra,
        ]
    )
    assert code == 0
    return pd.read_parquet(out / "sweep.parquet")


def test_sweep_parallel_equals_serial_and_has_one_row_per_point(
    scenario_file: Path, tmp_path: Path
) -> None:
    serial = _sweep(scenario_file, tmp_path / "s", 1, "--no-plots")
    parallel = _sweep(scenario_file, tmp_path / "p", 2)
    drop = ["wall_time_s"] if "wall_time_s" in serial else []
    pd.testing.assert_frame_equal(serial.drop(columns=drop), parallel.drop(columns=drop))
    assert len(serial) == 4 and (serial["status"] == "ok").all()
    assert list(serial["scheduler.max_num_batched_tokens"]) == [128, 128, 512, 512]
    assert list(serial["scheduler.max_num_seqs"]) == [4, 16, 4, 16]
    # the runs differ, and each has its own folder with its own resolved scenario
    assert serial["ttft_p50_s"].nunique() == 4
    runs = sorted((tmp_path / "p" / "runs").iterdir())
    assert len(runs) == 4
    saved = yaml.safe_load((runs[1] / "scenario.yaml").read_text())
    assert saved["scheduler"]["max_num_seqs"] == 16
    assert list((tmp_path / "p" / "plots").glob("*.png"))


def test_a_failing_grid_point_does_not_lose_the_others(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "f"
    code = main(
        [
            "sweep",
            str(scenario_file),
            "--grid",
            "scheduler.max_num_seqs=8,-1,16",
            "--jobs",
            "2",
            "--out",
            str(out),
            "--no-plots",
        ]
    )
    assert code == 1  # a script must notice; the table still has every point
    table = pd.read_parquet(out / "sweep.parquet")
    assert list(table["status"]) == ["ok", "failed", "ok"]
    assert "scheduler.max_num_seqs" in table["error"].iloc[1]
    assert "max_num_seqs=-1" in capsys.readouterr().err


def test_plot_redraws_run_and_sweep_folders(scenario_file: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    assert main(["run", str(scenario_file), "--out", str(run_dir), "--no-plots"]) == 0
    assert not (run_dir / "plots").exists()
    assert main(["plot", str(run_dir), "--format", "svg"]) == 0
    assert len(list((run_dir / "plots").glob("*.svg"))) == 4
    sweep_dir = tmp_path / "sw"
    _sweep(scenario_file, sweep_dir, 1, "--no-plots")
    assert main(["plot", str(sweep_dir)]) == 0
    assert list((sweep_dir / "plots").glob("*.png"))
    assert main(["plot", str(tmp_path / "nothing")]) == 2


def test_a_grid_of_only_invalid_points_is_bad_input(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    argv = ["sweep", str(scenario_file), "--grid", "scheduler.max_num_seq=4,8", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scheduler.max_num_seq" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("mode", ["sampled", "none"])
def test_run_steps_sampled_or_none(
    mode: str, scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, out = tmp_path / "full", tmp_path / mode
    assert main(["run", str(scenario_file), "--out", str(full), "--no-plots"]) == 0
    assert main(["run", str(scenario_file), "--out", str(out), "--steps", mode]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary == {
        **json.loads((full / "summary.json").read_text()),
        "wall_time_s": summary["wall_time_s"],
    }
    every = pd.read_parquet(full / "steps.parquet")
    if mode == "none":
        assert not (out / "steps.parquet").exists()
    else:
        kept = pd.read_parquet(out / "steps.parquet")
        assert 0 < len(kept) < len(every) and set(kept["step"]) <= set(every["step"])
    assert (out / "plots" / "kv_timeline.png").exists()


def test_trace_fixes_are_said_once_and_listed_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,5,3\n2,0,4\n1,7,2\n")
    data = dict(SMALL, workload={"trace": {"path": str(trace), "format": "csv"}})
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    err = capsys.readouterr().err
    notes = json.loads((tmp_path / "out" / "summary.json").read_text())["workload_notes"]
    assert len(notes) == 2
    assert any("prompt length 0 set to 1" in n for n in notes)
    assert any("arrive before the row above them" in n for n in notes)
    for note in notes:
        assert err.count(note) == 1


def test_summary_table_shows_the_configured_percentiles(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", str(scenario_file), "--out", str(tmp_path / "o"), "--no-plots"]
    assert main([*args, "--set", "metrics.percentiles=[50, 99.9]"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "latency" in line)
    assert header.split() == ["latency", "ms", "mean", "p50", "p99.9"]
