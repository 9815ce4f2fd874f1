"""Keys that vary together in one ``--grid`` (``'a,b=1,2;3,4'``): zipped, not multiplied,
with an optional name column; bad forms are one line, exit 2; the figures draw one line per
combination of the other keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.errors import InputError
from simulator.explore.grid import cell_keys, grid_points, parse_grid, plot_keys
from tests.test_cli import SMALL

LAYOUT = "layout,scheduler.max_num_seqs,scheduler.max_num_batched_tokens=small,4,128;big,16,512"


def test_zipped_keys_step_together_and_multiply_with_the_others() -> None:
    grid = parse_grid([LAYOUT, "seed=1,2"], zipped=True)
    points = grid_points(grid)
    assert len(points) == 2 * 2  # not 2 x 2 x 2
    assert [p.values for p in points[:2]] == [
        {"scheduler.max_num_seqs": 4, "scheduler.max_num_batched_tokens": 128, "seed": 1},
        {"scheduler.max_num_seqs": 4, "scheduler.max_num_batched_tokens": 128, "seed": 2},
    ]
    # the name is a column of the row, never a scenario key
    assert points[2].cells == {
        "layout": "big",
        "scheduler.max_num_seqs": 16,
        "scheduler.max_num_batched_tokens": 512,
        "seed": 1,
    }
    assert points[2].name == "002_layout=big_seed=1"
    assert cell_keys(grid)[0] == "layout" and plot_keys(grid) == ["layout", "seed"]
    unnamed = parse_grid(["scheduler.max_num_seqs,seed=4,1;8,2"], zipped=True)
    assert plot_keys(unnamed) == ["scheduler.max_num_seqs"]
    assert [p.values for p in grid_points(unnamed)] == [
        {"scheduler.max_num_seqs": 4, "seed": 1},
        {"scheduler.max_num_seqs": 8, "seed": 2},
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("a.b,c.d=1,2;3", "--grid a.b,c.d: variant 2 ('3') has 1 values for 2 keys"),
        ("a.b,c.d=1,2;1,2", "--grid a.b,c.d: repeated variants"),
        ("x,y,a.b=1,2,3", "--grid x,y,a.b: x and y are no scenario keys"),
        ("x,a.b=p,1;p,2", "--grid x,a.b: repeated x names"),
        ("x,a.b=", "--grid x,a.b: no values"),
        ("a.b,,c.d=1,2,3", "--grid a.b,,c.d: an empty key"),
        ("name,seed=n,1;m,2", None),  # fine: seed is a scenario key
    ],
)
def test_bad_zipped_grids_are_one_line(item: str, message: str | None) -> None:
    if message is None:
        assert len(grid_points(parse_grid([item], zipped=True))) == 2
        return
    with pytest.raises(InputError) as err:
        parse_grid([item], zipped=True)
    assert str(err.value) == message or str(err.value).startswith(message)


def test_a_key_both_alone_and_zipped_and_zipping_in_search_are_refused() -> None:
    with pytest.raises(InputError, match="--grid seed: given twice"):
        parse_grid(["seed=1,2", "scheduler.max_num_seqs,seed=4,1;8,2"], zipped=True)
    with pytest.raises(InputError, match="vary together are for servesim sweep"):
        parse_grid(["scheduler.max_num_seqs,seed=4,1;8,2"])


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    small = {**SMALL, "workload": {**SMALL["workload"], "num_requests": 30}}
    path.write_text(yaml.safe_dump(small))
    return path


def test_a_sweep_with_zipped_keys_runs_each_variant_once(
    scenario_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sw"
    argv = ["sweep", str(scenario_file), "--grid", LAYOUT, "--grid", "workload.arrival.rate=4,8"]
    assert main([*argv, "--out", str(out), "--jobs", "1"]) == 0
    table = pd.read_parquet(out / "sweep.parquet")
    assert len(table) == 4 and (table["status"] == "ok").all()
    assert table["layout"].tolist() == ["small", "small", "big", "big"]
    assert table["scheduler.max_num_seqs"].tolist() == [4, 4, 16, 16]
    for name in table["run"]:
        saved = yaml.safe_load((out / "runs" / name / "scenario.yaml").read_text())
        want = 4 if "small" in name else 16
        assert saved["scheduler"]["max_num_seqs"] == want and "layout" not in saved
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["keys"] == ["layout", "workload.arrival.rate"]
    assert f"--grid {LAYOUT}" in (out / "scenario.yaml").read_text()
    assert (out / "plots" / "sweep_layout.png").exists()


@pytest.mark.parametrize(
    ("grid", "field"),
    [
        ("scheduler.max_num_seqs,seed=4;8,2", "variant 1 ('4') has 1 values for 2 keys"),
        ("x,y,seed=1,2,3", "x and y are no scenario keys"),
    ],
)
def test_a_bad_zipped_grid_on_the_command_line_is_one_line_exit_2(
    scenario_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    grid: str,
    field: str,
) -> None:
    out = tmp_path / "never"
    assert main(["sweep", str(scenario_file), "--grid", grid, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servesim: error: --grid") and field in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_the_figures_draw_one_line_per_combination_of_the_other_keys() -> None:
    from simulator.plots.sweep import plot_sweep

    rows = []
    rng = np.random.default_rng(0)
    for layout in ("tp4", "dp4"):
        for mtp in ("off", "on"):
            for rate in (10, 20, 40):
                for seed in (0, 1):
                    value = rng.random()
                    row = {"layout": layout, "mtp": mtp, "rate": rate, "seed": seed}
                    row |= {"ttft_p50_s": value, "ttft_p99_s": 2 * value, "status": "ok"}
                    rows.append(row)
    table = pd.DataFrame(rows)
    fig = plot_sweep(table, ["layout", "mtp", "rate", "seed"])["rate"]
    ttft = fig.axes[0]
    labels = {ln.get_label() for ln in ttft.get_lines()}
    assert {"tp4 / off p99", "tp4 / on p99", "dp4 / off p50", "dp4 / on p50"} <= labels
    assert len(ttft.get_lines()) == 4 * 2  # 4 combinations x p50/p99, medians over seed
    assert "one line per layout / mtp" in fig.get_suptitle()
    assert "median over seed" in fig.get_suptitle()
    line = next(ln for ln in ttft.get_lines() if ln.get_label() == "dp4 / on p50")
    sel = table[(table["layout"] == "dp4") & (table["mtp"] == "on")]
    want = sel.groupby("rate")["ttft_p50_s"].median().to_numpy() * 1e3
    assert np.asarray(line.get_ydata()) == pytest.approx(want)
    # a layout's two MTP lines share a hue: a dark and a light shade (tab20's pairs)
    colors = {ln.get_label(): ln.get_color() for ln in ttft.get_lines()}
    assert colors["dp4 / off p50"] != colors["dp4 / on p50"]
