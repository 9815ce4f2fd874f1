"""KV heads under tensor parallelism as vLLM holds them: split over ``tp`` GPUs while ``tp``
divides them, one whole head per GPU (replicated) when ``tp`` exceeds them; so a larger TP
group does not multiply the KV cache past what its memory holds."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.cost import RooflineCostConfig, build_cost_model
from simulator.cost.batch import Batch
from simulator.cost.features import FeatureScales
from simulator.cost.network import NetworkConfig
from simulator.cost.presets import (
    ModelSpec,
    derive_num_blocks,
    load_hardware,
    load_model,
    serve_budgets,
)
from simulator.cost.roofline import RooflineCostModel
from simulator.errors import DoesNotFit, InputError
from simulator.scenario.runner import resolve


def _blocks(model: str, tp: int) -> int:
    """KV blocks derived on H100 SXM with ``vllm serve``'s budgets there."""
    hw = load_hardware("h100-sxm")
    tokens, seqs = serve_budgets(hw, None, None)
    return derive_num_blocks(
        load_model(model), hw, tp, 16, max_num_batched_tokens=tokens, max_num_seqs=seqs
    )


def test_qwen3_moe_at_tp8_holds_one_replicated_head_per_gpu() -> None:
    # 4 KV heads: TP 8 keeps one head per GPU as TP 4 does, so only the freed weight memory
    # adds blocks (vLLM: about 164k at TP 8 against 133,909 at TP 4; was 306,642 here)
    tp4, tp8 = _blocks("qwen3-30b-a3b", 4), _blocks("qwen3-30b-a3b", 8)
    assert tp4 == 133_909  # unchanged: tp divides the heads
    assert tp4 < tp8 <= 1.5 * tp4


def test_llama3_8b_at_tp16_no_longer_doubles_its_cache() -> None:
    tp8, tp16 = _blocks("llama-3-8b", 8), _blocks("llama-3-8b", 16)
    assert tp8 < tp16 < 1.05 * tp8  # was 2.03x: 8 KV heads over 16 GPUs
    model = load_model("llama-3-8b")
    # one head of K and V, 128 wide, bf16, 32 layers, on every GPU of TP 8 and of TP 16
    assert model.kv_bytes_per_token_per_gpu(16) == model.kv_bytes_per_token_per_gpu(8)
    assert model.kv_bytes_per_token_per_gpu(16) == 32 * 2 * 128 * 2


def test_a_replicated_head_keeps_its_k_and_v_projections_whole() -> None:
    model = load_model("llama-3-8b")
    assert model.weight_bytes_per_gpu(8) == model.weight_bytes / 8  # split evenly
    # TP 16: each GPU holds a whole head's K and V weights (32 layers x 2 x 128 x 4096), half
    # a head more than its 1/16 share of the 8 heads
    extra = 32 * 2 * 128 * 4096 * 0.5 * 2
    assert model.weight_bytes_per_gpu(16) == pytest.approx(model.weight_bytes / 16 + extra)


def test_given_blocks_past_the_replicated_cache_are_refused() -> None:
    # 300k blocks fit "16 GPUs of half a head" but not 16 GPUs of one head each
    scenario: dict[str, Any] = {
        "name": "tp16",
        "scheduler": {"num_blocks": 300_000},
        "cost_model": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"},
        "workload": {
            "num_requests": 4,
            "arrival": {"process": "poisson", "rate": 1},
            "prompt_len": {"dist": "fixed", "value": 100},
            "output_len": {"dist": "fixed", "value": 10},
        },
    }
    # TP 16 spans 2 nodes of 8 H100s: how they connect, one 400 Gb/s NIC per GPU
    scenario["cost_model"].update(tp=16, network={"bandwidth": 50e9, "latency_us": 10})
    with pytest.raises(DoesNotFit, match="scheduler.num_blocks"):
        resolve(scenario)


def test_every_cost_model_reads_one_head_per_gpu_past_the_kv_heads() -> None:
    model, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    scales = [FeatureScales.from_specs(model, hw, tp).kv_read_ms_per_token for tp in (8, 16)]
    assert scales[0] == scales[1]  # was halved at TP 16
    kv = []
    for tp in (8, 16):
        net = NetworkConfig(bandwidth=50e9)
        cfg = RooflineCostConfig(model="llama-3-8b", hardware="h100-sxm", tp=tp, network=net)
        cost = build_cost_model(cfg)
        assert isinstance(cost, RooflineCostModel)
        kv.append(cost.breakdown(Batch((1,) * 64, (4000,) * 64))["bytes_kv"])
    assert kv[0] == kv[1]


def test_a_tp_that_splits_kv_heads_unevenly_is_refused() -> None:
    # 40 query heads, 8 KV heads: TP 5 divides the first, neither divides nor is a multiple of
    # the second, which vLLM's QKVParallelLinear refuses
    shape = load_model("llama-3-8b").model_dump()
    model = ModelSpec(**{**shape, "name": "odd", "num_heads": 40, "hidden_size": 5120})
    with pytest.raises(InputError, match=r"cost_model.tp: 5 .*num_kv_heads=8"):
        model.deployed(5, None, None)
    model.deployed(4, None, None)


def test_a_cpu_tier_holds_every_rank_s_replicated_head() -> None:
    # TP 16 of 8 KV heads: each of the 16 ranks offloads its own copy of one head
    scenario: dict[str, Any] = {
        "name": "tp16-offload",
        "scheduler": {
            "policy": "vllm-v1",
            "kv_offload": {"cpu": {"size_gb": 10, "bandwidth_gb_s": 50}},
        },
        "cost_model": {
            "type": "roofline",
            "model": "llama-3-8b",
            "hardware": "h100-sxm",
            "tp": 16,
            "network": {"bandwidth": 50e9},
        },
        "workload": {
            "num_requests": 4,
            "arrival": {"process": "poisson", "rate": 1},
            "prompt_len": {"dist": "fixed", "value": 100},
            "output_len": {"dist": "fixed", "value": 10},
        },
    }
    per_token = resolve(scenario).scheduler.kv_offload
    assert per_token is not None
    assert per_token.kv_bytes_per_token == 2 * load_model("llama-3-8b").kv_bytes_per_token
