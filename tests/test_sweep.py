"""``servesim sweep``: what the sweep folder says produced it, and conflicting options."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from tests.test_cli import SMALL


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text("# a comment the saved scenario need not keep\n" + yaml.safe_dump(SMALL))
    return path


def test_sweep_folder_saves_the_base_scenario_with_set_applied(
    scenario_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sw"
    argv = ["sweep", str(scenario_file), "--set", "workload.num_requests=40"]
    argv += ["--grid", "scheduler.max_num_seqs=4,8", "--out", str(out), "--no-plots"]
    assert main([*argv, "--jobs", "1"]) == 0
    text = (out / "scenario.yaml").read_text()
    saved = yaml.safe_load(text)
    assert saved["workload"]["num_requests"] == 40  # --set applied
    assert saved["scheduler"]["block_size"] == 16  # defaults spelled out
    assert "--set workload.num_requests=40" in text
    assert "--grid scheduler.max_num_seqs=4,8" in text


def test_a_key_in_both_set_and_grid_is_refused(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sw"
    argv = ["sweep", str(scenario_file), "--set", "scheduler.max_num_seqs=3"]
    argv += ["--grid", "scheduler.max_num_seqs=4,8", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--set scheduler.max_num_seqs: also a --grid key" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_sweeps_in_the_same_second_get_their_own_default_folders(
    scenario_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import simulator.results.outdir as outdir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(outdir.time, "strftime", lambda fmt, *a: "20260101-000000")  # same second
    argv = ["sweep", str(scenario_file), "--set", "workload.num_requests=20", "--no-plots"]
    argv += ["--grid", "scheduler.max_num_seqs=4,8", "--jobs", "1"]
    assert main(argv) == 0
    assert main(argv) == 0
    folders = sorted(p.name for p in (tmp_path / "results" / "cli-test-sweep").iterdir())
    assert folders == ["20260101-000000", "20260101-000000-2"]
    for name in folders:
        assert (tmp_path / "results" / "cli-test-sweep" / name / "sweep.parquet").is_file()
