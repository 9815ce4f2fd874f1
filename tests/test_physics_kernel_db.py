"""`physics` learned on NVIDIA's database of measured vLLM kernels (issue 34, item 4): the
database sources of configs/physics/sources-kernels.yaml, `servesim learn` on them, a small
leave-one-GPU-out, and the benchmark's table in docs/fidelity.md."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.cli import main
from simulator.cost.batch import Batch
from simulator.cost.kernel_db import measured_gpus
from simulator.cost.kernels import KernelsCostConfig, KernelsCostModel
from simulator.cost.learn.kernel_source import KernelDbSources, load_gpu
from simulator.cost.learn.sources import (
    Sources,
    default_sources_path,
    load_sources,
    read_kernels,
)
from simulator.cost.learn.steps import step_grid
from simulator.cost.physics import PhysicsCostConfig, PhysicsCostModel
from simulator.cost.physics_params import load_params
from simulator.cost.presets import configs_dir, load_model
from simulator.errors import InputError
from tests.paths import DATA, ROOT

KERNEL_SOURCES = configs_dir() / "physics" / "sources-kernels.yaml"


def test_the_database_sources_extend_todays_and_cover_every_gpu_with_a_preset() -> None:
    ours, today = load_sources(KERNEL_SOURCES), load_sources(default_sources_path())
    assert ours.sources == today.sources and ours.allreduce == today.allreduce
    assert ours.excluded == today.excluded and ours.kernels is not None
    folders = {load_gpu(g).kernels_gpu for g in ours.kernels.gpus}
    # every measured GPU of the database but Intel's B60 (no hardware preset: docs/fidelity.md)
    assert set(measured_gpus()) - folders == {"b60"}
    assert len(folders) == len(ours.kernels.gpus) == 9


def test_a_gpu_s_rows_are_read_deterministically_with_their_shares() -> None:
    cfg = load_sources(KERNEL_SOURCES).kernels
    assert cfg is not None
    first, second = read_kernels(cfg, "l40s"), read_kernels(cfg, "l40s")
    ops = [s.op for s in first]
    assert ops[:2] == ["gemm:decode", "gemm:large"]
    assert {"attention:prefill:32q8kv128", "attention:decode:8q1kv128"} <= set(ops)
    for a, b in zip(first, second, strict=True):
        assert np.array_equal(a.measured, b.measured)
        assert np.all(a.measured > 0) and np.all(np.isfinite(a.measured))
        assert a.group == "l40s/kernels" and a.own_stack
    # the GEMMs' two sets weigh 1 each, the attention layouts share the prefills' 1 and the
    # decodes' 1 (more layouts read do not outweigh the matmuls)
    assert [s.weight for s in first[:2]] == [1.0, 1.0]
    assert sum(s.weight for s in first[2:]) == pytest.approx(2.0)
    # subsampled: every m up to 17, then multiples of 16, of 5 x 5 widths, up to 8,192 rows
    p, c, m = load_params(None).for_gpu("l40s")
    hw = load_gpu("l40s")
    pred = first[0].predict(p, hw.peak_flops * c, hw.hbm_bandwidth * m)
    assert pred.shape == first[0].measured.shape and len(first[0].measured) <= 25 * (17 + 15)


def test_a_sources_file_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"base": "missing.yaml"}))
    with pytest.raises(InputError, match="missing.yaml"):
        load_sources(path)
    path.write_text(yaml.safe_dump({"stack": "x"}))
    with pytest.raises(InputError, match="sources: none given"):
        load_sources(path)


def test_learn_leaves_a_database_gpu_out_and_prices_its_steps_from_its_spec_sheet(
    tmp_path: Path,
) -> None:
    """A small leave-one-GPU-out (the benchmark's, on three GPUs and one layout): fitted on
    H100 and L40S only, H200's whole steps (Llama-3.1-8B TP 1, the step grid) are within 10%
    median of the `kernels` model's on H200."""
    small = Sources(
        stack="vLLM 0.24 kernels (aiconfigurator-core)",
        kernels=KernelDbSources(
            package="aiconfigurator-core",
            gpus=["h100-sxm", "h200", "l40s"],
            gemm_widths=[1024, 4096, 6144, 16384],
            max_tokens=4096,
            attention_models=["llama-3.1-8b"],
            tp=[1],
            max_context=8192,
        ),
    )
    sources = tmp_path / "sources.yaml"
    sources.write_text(yaml.safe_dump(small.model_dump(mode="json")))
    out = tmp_path / "params.yaml"
    data = Path(str(DATA / "llmservingsim")).parent
    args = ["learn", "--sources", str(sources), "--data", str(data)]
    assert main([*args, "--out", str(out), "--exclude", "h200"]) == 0
    params = load_params(str(out))
    assert set(params.gpus) == {"h100-sxm", "l40s"}  # h200: its spec sheet alone
    assert any("aiconfigurator-core" in line for line in params.fitted_on)
    model, hw = load_model("llama-3.1-8b"), load_gpu("h200")
    kernels = KernelsCostModel(KernelsCostConfig(model=model.name, hardware="h200"), model, hw)
    cfg = PhysicsCostConfig(model=model.name, hardware="h200")
    physics = PhysicsCostModel(cfg, model, hw, params)
    grid: list[Batch] = step_grid()
    errs = np.abs([physics.step_time(b) / kernels.step_time(b) - 1 for b in grid])
    assert np.median(errs) < 0.10, np.median(errs)
    assert main([*args, "--out", str(tmp_path / "x.yaml"), "--exclude", "mi300x"]) == 2


def test_the_leave_one_gpu_out_table_lists_every_database_gpu() -> None:
    """docs/fidelity.md's PHYSICS-KERNELS table (benchmarks/physics_kernels_logo.py) has a
    row per GPU the sources file reads, and its summary line names the worst of them."""
    text = (ROOT / "docs" / "fidelity.md").read_text()
    body = text.split("<!-- BEGIN PHYSICS-KERNELS -->")[1].split("<!-- END PHYSICS-KERNELS -->")[0]
    cfg = load_sources(KERNEL_SOURCES).kernels
    assert cfg is not None
    rows = {line.split("|")[1].strip(): line for line in body.splitlines() if line.startswith("| ")}
    assert set(cfg.gpus) <= set(rows)
    medians = {g: float(rows[g].split("|")[9].strip().rstrip("%")) for g in cfg.gpus}
    found = re.search(r"Worst held-out whole-step median: ([^,]+), ([0-9.]+)%", body)
    assert found and medians[found.group(1)] == max(medians.values()) == float(found.group(2))
    # issue 34's bound, every held-out GPU (as printed: to 0.1 point)
    assert max(medians.values()) <= 10.0
