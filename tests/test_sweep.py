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


def test_a_sweep_with_an_slo_shows_goodput_and_units(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    from simulator.plots.sweep import plot_sweep

    out = tmp_path / "sw"
    argv = ["sweep", str(scenario_file), "--set", "slo.ttft_ms=200", "--jobs", "1"]
    argv += ["--grid", "workload.arrival.rate=2,40", "--out", str(out), "--no-plots"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # headings on two lines, the name above its unit (console tables fit 120 columns)
    lines = printed.splitlines()
    at = next(i for i, line in enumerate(lines) if "status" in line)
    header, units = lines[at], lines[at + 1]
    for name, unit in (
        ("workload.arrival.rate", "req/s"),
        ("goodput", "req/s"),
        ("within SLO", "%"),
    ):
        assert name in header and f"({unit})" in units
    assert "ttft_p99" in header and "throughput" in header and "(ms)" in units
    table = pd.read_parquet(out / "sweep.parquet")
    assert table["slo_attainment"].iloc[0] > table["slo_attainment"].iloc[1]  # 40 req/s overloads
    fig = plot_sweep(table, ["workload.arrival.rate"])["workload.arrival.rate"]
    titles = [ax.get_title() for ax in fig.axes]
    assert "Goodput" in titles and "SLO attainment" in titles
    goodput = fig.axes[titles.index("Goodput")]
    assert goodput.get_xlabel() == "workload.arrival.rate (req/s)"
    line = next(ln for ln in goodput.get_lines() if ln.get_label() == "goodput")
    assert list(line.get_ydata()) == pytest.approx(list(table["goodput"]))
    fig.canvas.draw()


def test_a_sweep_without_an_slo_keeps_four_panels(scenario_file: Path, tmp_path: Path) -> None:
    import pandas as pd

    from simulator.plots.sweep import plot_sweep

    out = tmp_path / "sw"
    argv = ["sweep", str(scenario_file), "--jobs", "1", "--no-plots"]
    assert main([*argv, "--grid", "scheduler.max_num_seqs=4,8", "--out", str(out)]) == 0
    table = pd.read_parquet(out / "sweep.parquet")
    assert "goodput" not in table
    fig = plot_sweep(table, ["scheduler.max_num_seqs"])["scheduler.max_num_seqs"]
    assert len(fig.axes) == 4
    assert fig.axes[0].get_xlabel() == "scheduler.max_num_seqs (sequences)"
