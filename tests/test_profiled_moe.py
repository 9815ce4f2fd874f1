"""The profiled model on an MoE bundle (Qwen3-30B-A3B on an RTX PRO 6000): each MoE layer from
moe.csv at the step's tokens and the distinct experts they touch, the rest as for dense models;
the MoE table's 2D interpolation by hand; mismatched bundles and models refused."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from simulator.cost import CostModelConfig, ProfiledCostModel, build_cost_model
from simulator.cost.batch import Batch, StepSums
from simulator.cost.profiles import read_profile
from simulator.cost.profiles.moe import read_moe
from simulator.errors import InputError
from tests.paths import DATA, MISSING

BUNDLE = DATA / "llmservingsim/profiles/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507"
MODEL = DATA / "llmservingsim/models/Qwen3-30B-A3B-Instruct-2507.json"
CONFIG = TypeAdapter(CostModelConfig)


def profiled(bundle: Path = BUNDLE, model: str | None = None, **kw: object) -> ProfiledCostModel:
    assert BUNDLE.is_dir() and MODEL.is_file(), MISSING
    fields: dict[str, object] = {
        "type": "profiled",
        "profile": str(bundle),
        "model": model or str(MODEL),
        "hardware": "rtx-pro-6000",
        "skew": False,
    }
    cost = build_cost_model(CONFIG.validate_python({**fields, **kw}))
    assert isinstance(cost, ProfiledCostModel)
    return cost


def moe_rows() -> dict[tuple[int, int], float]:
    with (BUNDLE / "tp1" / "moe.csv").open() as f:
        return {
            (int(r["tokens"]), int(r["activated_experts"])): float(r["time_us"]) * 1e-6
            for r in csv.DictReader(f)
        }


def test_moe_table_interpolates_by_hand() -> None:
    table, rows = read_moe(BUNDLE / "tp1" / "moe.csv"), moe_rows()
    for (tokens, experts), t in rows.items():
        assert table.at(tokens, experts) == pytest.approx(t, rel=1e-12)
    # between token rows 64 and 128 and expert columns 32 and 64: bilinear
    at64 = rows[64, 32] + (rows[64, 64] - rows[64, 32]) * (40 - 32) / 32
    at128 = rows[128, 32] + (rows[128, 64] - rows[128, 32]) * (40 - 32) / 32
    assert table.at(96, 40) == pytest.approx(at64 + (at128 - at64) * 0.5, rel=1e-12)
    # token row 2 has experts 8 and 16 only: 20 experts extrapolate from them
    assert table.at(2, 20) == pytest.approx(rows[2, 16] + (rows[2, 16] - rows[2, 8]) / 2)


def test_the_moe_layers_are_priced_from_moe_csv() -> None:
    with_moe = profiled()
    m = with_moe.model
    rows = moe_rows()
    # one decode: 8 distinct experts, every one of the 48 layers is MoE
    assert m.expected_distinct_experts(1) == pytest.approx(8.0)
    assert with_moe._moe_time(1) == pytest.approx(48 * rows[1, 8], rel=1e-12)
    # 2048 tokens touch (nearly) all 128 experts
    assert with_moe._moe_time(2048) == pytest.approx(48 * rows[2048, 128], rel=1e-6)
    # the step is the dense part plus the MoE layers: drop moe.csv from what the model sees
    batch = Batch.uniform(16, 1, 700)
    dense_only = with_moe.step_time(batch) - with_moe._moe_time(16)
    assert dense_only > 0
    assert with_moe.step_time(batch) == pytest.approx(dense_only + with_moe._moe_time(16))
    # a decode step of 64 sequences: MoE is the larger part (3B active, 128 experts)
    assert with_moe._moe_time(64) > 0.5 * with_moe.step_time(Batch.uniform(64, 1, 500))


def test_moe_step_times_agree_across_paths() -> None:
    cost = profiled()
    for batch in (
        Batch.uniform(1, 1, 100),
        Batch.uniform(100, 1, 900),
        Batch((512,), (0,)),
        Batch((700, 1, 1), (300, 40, 5000)),
        Batch((3000,), (0,)),  # beyond the profiled 2048 tokens: extrapolated
    ):
        assert cost.time_sums(StepSums.of(batch)) == cost.step_time(batch)
    assert cost.time_sums(StepSums.decode(3, 300)) == cost.step_time(
        Batch((1, 1, 1), (100, 100, 100))
    )
    # more tokens touch more experts: a monotone step time in the tokens
    times = [cost.step_time(Batch((n,), (0,))) for n in (16, 64, 256, 1024, 2048)]
    assert times == sorted(times)


def test_mismatched_bundles_and_models_are_refused(tmp_path: Path) -> None:
    dense = DATA / "llmservingsim/profiles/RTXPRO6000/Llama-3.1-8B"
    with pytest.raises(InputError, match="no moe.csv to price the experts"):
        profiled(dense)
    with pytest.raises(InputError, match="has moe.csv, but model llama-3.1-8b has no experts"):
        profiled(model="llama-3.1-8b")


def test_a_bad_moe_csv_names_its_line(tmp_path: Path) -> None:
    assert BUNDLE.is_dir(), MISSING
    copy = tmp_path / "bundle"
    shutil.copytree(BUNDLE, copy)
    moe = copy / "tp1" / "moe.csv"
    moe.write_text(moe.read_text() + "1,8,3.0\n")
    with pytest.raises(InputError, match=r"moe\.csv:52: the point \(1, 8\) repeats line 2"):
        read_profile(copy, "llmservingsim", 1)
    moe.write_text("tokens,activated_experts,time_us\n0,8,3.0\n")
    with pytest.raises(InputError, match=r"moe\.csv:2: tokens and activated_experts must be >= 1"):
        read_profile(copy, "llmservingsim", 1)
