"""The physics model's learned TP all-reduce: the fit recovers a known latency and link
efficiency from a file in Vidur's format, is used for NVLink presets only, and a learn without
the (unshipped) profiles keeps the shipped fit and says so."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from simulator.cost import CostModelConfig, build_cost_model
from simulator.cost.learn.allreduce import AllReduceSource, find, fit_allreduce
from simulator.cost.learn.run import allreduce_fit
from simulator.cost.learn.sources import default_sources_path, load_sources
from simulator.cost.physics_params import load_params
from simulator.cost.presets import load_hardware
from simulator.errors import InputError

HEADER = (
    ",time_stats.all_reduce.min,time_stats.all_reduce.max,time_stats.all_reduce.mean,"
    "time_stats.all_reduce.median,time_stats.all_reduce.std,rank,num_workers,size,collective,"
    "devices_per_node,max_devices_per_node"
)


def vidur_file(path: Path, latency_us: float, eff: float, bw: float) -> str:
    """A Vidur-format all_reduce.csv of exact ring times (ms), and a cross-node row that the
    fit must ignore; returns its sha256."""
    lines, i = [HEADER], 0
    for ranks in (2, 4, 8):
        for size in (2048, 65536, 1 << 20, 1 << 23, 1 << 26):
            t = latency_us * 1e-6 + 2 * (ranks - 1) / ranks * 2 * size / (bw * eff)
            ms = t * 1e3
            lines.append(f"{i},{ms},{ms},{ms},{ms},0,0,{ranks},{size},all_reduce,{ranks},8")
            i += 1
    lines.append(f"{i},99,99,99,99,0,0,2,2048,all_reduce,1,8")  # across nodes: left out
    path.write_text("\n".join(lines) + "\n")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source(path: Path, digest: str) -> AllReduceSource:
    return AllReduceSource(
        name="h100/test",
        hardware="h100-sxm",
        path=path.name,
        repo="microsoft/vidur",
        commit="0" * 40,
        source_path="data/profiling/network/h100_dgx/all_reduce.csv",
        sha256=digest,
    )


def test_the_fit_recovers_a_known_latency_and_efficiency(tmp_path: Path) -> None:
    bw = load_hardware("h100-sxm").interconnect_bandwidth
    assert bw is not None
    digest = vidur_file(tmp_path / "ar.csv", 12.0, 0.7, bw)
    src = source(tmp_path / "ar.csv", digest)
    found = find(src, [tmp_path / "nowhere", tmp_path])
    assert found == tmp_path / "ar.csv"
    fit = fit_allreduce([(src, found)])
    assert fit.latency_us == pytest.approx(12.0, rel=1e-3)
    assert fit.bandwidth_efficiency == pytest.approx(0.7, rel=1e-3)
    assert fit.points == 15 and fit.median_pct < 0.1
    with pytest.raises(InputError, match="sha256 differs"):
        find(source(tmp_path / "ar.csv", "f" * 64), [tmp_path])


def test_without_the_profiles_the_shipped_fit_is_kept_with_a_note(tmp_path: Path) -> None:
    sources = load_sources(default_sources_path())
    shipped = load_params(None).allreduce
    assert sources.allreduce and shipped is not None
    kept, notes = allreduce_fit(sources, [tmp_path], shipped, ())
    assert kept == shipped
    assert len(notes) == 1 and "not found under" in notes[0] and "kept as shipped" in notes[0]


def test_the_learned_link_prices_nvlink_presets_only() -> None:
    params = load_params(None)
    fit = params.allreduce
    assert fit is not None and fit.fitted_on
    h100, pcie = load_hardware("h100-sxm"), load_hardware("rtx-pro-6000")
    assert h100.interconnect_bandwidth is not None
    bw, latency = params.link_for(h100)
    assert (bw, latency) == (h100.interconnect_bandwidth * fit.bandwidth_efficiency, fit.latency_us)
    assert params.link_for(pcie) == (pcie.interconnect_bandwidth, pcie.allreduce_latency_us)
    cfg = TypeAdapter(CostModelConfig).validate_python(
        {"type": "physics", "model": "llama-2-70b", "hardware": "h100-sxm", "tp": 4}
    )
    model = build_cost_model(cfg)
    # 2 all-reduces per layer of 80: the latency of each, and the ring's bytes per token
    per_token = 160 * 1.5 * 8192 * 2 / bw
    want = 160 * latency * 1e-6 + 64 * per_token
    assert model.allreduce_time(64) == pytest.approx(want, rel=1e-9)  # type: ignore[attr-defined]


def test_the_ep_all_to_all_uses_the_learned_nvlink_link() -> None:
    from simulator.cost.all_to_all import all_to_all_time
    from tests.paths import DATA, MISSING

    qwen3 = DATA / "llmservingsim" / "models" / "Qwen3-30B-A3B-Instruct-2507.json"
    assert qwen3.is_file(), MISSING
    params = load_params(None)
    bw, latency = params.link_for(load_hardware("h100-sxm"))
    assert bw is not None
    cfg = TypeAdapter(CostModelConfig).validate_python(
        {"type": "physics", "model": str(qwen3), "hardware": "h100-sxm", "expert_parallel": 2}
    )
    model = build_cost_model(cfg)
    want = 48 * all_to_all_time(100, 2048, 2, bw, latency, top_k=8)
    assert model.allreduce_time(100) == pytest.approx(want, rel=1e-9)  # type: ignore[attr-defined]
