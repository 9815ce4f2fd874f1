"""Issue 23's sweeps, through the command line: the size and a rough time said before
starting, an absurd grid refused unless ``--yes``, progress as lines off a terminal."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli import main
from tests.test_cli import SMALL as CLI_SMALL

# test_cli's scenario, smaller: a sweep of six points stays quick
SMALL: dict[str, Any] = {
    **CLI_SMALL,
    "name": "plan-test",
    "seed": 1,
    "workload": {**CLI_SMALL["workload"], "num_requests": 40},
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def test_a_sweep_says_its_size_and_time_then_reports_progress_as_lines(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["sweep", str(scenario_file), "--out", str(out), "--jobs", "1", "--no-plots"]
    argv += ["--grid", "scheduler.max_num_seqs=4,8,16", "--grid", "seed=1,2"]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"plan-test: 6 runs \(3 x 2\) on 1 process, roughly \d+ s", err[0])
    progress = [line for line in err if line.startswith("sweep: ")]
    assert len(progress) == 6  # each run is more than a tenth of six
    assert re.fullmatch(r"sweep: 1/6 runs done, \d+ s, ~\d+ s left", progress[0])
    assert re.fullmatch(r"sweep: 6/6 runs done, \d+ s", progress[-1])


def test_no_progress_is_silent_and_progress_is_a_bar(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["sweep", str(scenario_file), "--jobs", "1", "--no-plots", "--grid", "seed=1,2"]
    assert main([*base, "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "runs done" not in err and "it/s" not in err and "run/s" not in err
    assert main([*base, "--out", str(tmp_path / "b"), "--progress"]) == 0
    err = capsys.readouterr().err
    assert "runs done" not in err and "2/2" in err  # tqdm's bar, forced off a terminal


def test_an_absurd_grid_is_refused_unless_yes(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = ",".join(str(v) for v in range(1, 12))
    keys = ["scheduler.max_num_seqs", "seed", "workload.num_requests", "scheduler.num_blocks"]
    out = tmp_path / "out"
    argv = ["sweep", str(scenario_file), "--out", str(out)]
    argv += [a for k in keys for a in ("--grid", f"{k}={values}")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("servesim: error: --grid: 14,641 runs (11 x 11 x 11 x 11) on ")
    assert err.endswith("more than 10,000 runs; pass --yes to run them")
    assert "roughly" in err
    assert not out.exists()


def test_a_wide_sweep_table_fits_120_columns_with_one_format_per_column(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["sweep", str(scenario_file), "--out", str(out), "--jobs", "1", "--no-plots"]
    argv += ["--set", "slo.ttft_ms=200", "--set", "slo.tpot_ms=20"]
    argv += [
        "--grid",
        "scheduler.max_num_seqs=4,16",
        "--grid",
        "scheduler.max_num_batched_tokens=128,512",
    ]
    argv += ["--grid", "workload.arrival.rate=2,8"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert max(map(len, lines)) <= 120
    blocks = "\n".join(lines).split("\n\n")
    assert len(blocks) >= 2  # wrapped: each block repeats the grid keys and status
    for block in blocks:
        rows = block.splitlines()
        assert "scheduler.max_num_seqs" in rows[0] and "status" in rows[0]
        assert len(rows) == 2 + 8
    # one format per column: every figure of a column has as many decimals
    import re

    for block in blocks:
        rows = [r.split() for r in block.splitlines()[2:]]
        for col in zip(*rows, strict=True):
            decimals = {len(v.partition(".")[2]) for v in col if re.fullmatch(r"[\d,]+(\.\d+)?", v)}
            assert len(decimals) <= 1, col
