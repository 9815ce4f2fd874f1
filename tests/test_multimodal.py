"""Multimodal requests (issue 38): the 300 cases recorded from vLLM 0.33's scheduler with encoder
inputs replay step for step on both paths (and a replay with the encoder ignored does not);
the encoder cache evicts as vLLM's does; and the issue's checks on a Qwen3-VL-8B scenario
built from its config.json: no step exceeds the encoder budget, sending each image twice
back to back halves the encoder's work, and an image adds at least its encoding to TTFT."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulator.cli import main
from simulator.cost.hf_config import read_hf_config
from simulator.cost.presets import load_hardware
from simulator.cost.vision_encoder import EncoderCost, VisionEncoder
from simulator.errors import InputError
from simulator.scenario.runner import run
from simulator.scheduling.encoder_cache import EncoderCache
from simulator.scheduling.encoder_inputs import EncoderInputs
from simulator.scheduling.sequence import Sequence
from simulator.scheduling.step_scheduler import StepScheduler
from simulator.validation.scheduler_cases import Case, read_cases
from simulator.validation.scheduler_replay import check_cases, first_divergence, replay

ROOT = Path(__file__).parent
MM = ROOT / "data" / "vllm_v1_scheduler" / "mm.jsonl.gz"
QWEN3_VL = ROOT.parent.parent / "shared" / "data" / "models" / "Qwen3-VL-8B-Instruct.json"


@pytest.fixture(scope="module")
def mm_cases() -> list[Case]:
    return read_cases(MM)


@pytest.mark.parametrize("fast", [False, True])
def test_every_mm_case_replays_step_for_step(mm_cases: list[Case], fast: bool) -> None:
    report = check_cases(mm_cases, "vllm-v1", fast=fast)
    assert report.num_cases == 300 and {c.kind for c in mm_cases} == {"mm"}
    assert [d.describe() for d in report.divergences] == []
    # the recording exercises what it should: encodings, evictions, cut chunks
    steps = [s for c in mm_cases for s in c.steps]
    assert sum(len(v) for s in steps for v in s["encoder"].values()) == 2274
    assert sum(len(s["encoder_freed"]) for s in steps) > 1000


def test_the_replay_is_not_vacuous(mm_cases: list[Case]) -> None:
    """Without its items, or with a cache of half the size, most cases diverge."""
    sample = mm_cases[:40]
    bare = [
        dataclasses.replace(c, requests=tuple(dataclasses.replace(r, mm=()) for r in c.requests))
        for c in sample
    ]
    small = [
        dataclasses.replace(
            c,
            config={**c.config, "encoder_cache_size": max(1, c.config["encoder_cache_size"] // 2)},
        )
        for c in sample
    ]
    for cases in (bare, small):
        differ = 0
        for case in cases:
            try:
                differ += first_divergence(case, replay(case, "vllm-v1")) is not None
            except ValueError:  # an item no longer fits the smaller cache: refused
                differ += 1
        assert differ >= 20


def test_fast_path_takes_steps_once_no_image_is_pending(mm_cases: list[Case]) -> None:
    """The fast path declines while images wait for their encoder, and takes steps after."""
    case = next(c for c in mm_cases if len(c.steps) > 200)
    c = case.config
    sched = StepScheduler.vllm_v1(
        c["num_blocks"],
        c["block_size"],
        c["max_num_seqs"],
        c["max_num_batched_tokens"],
        lambda s: 1,
        sample_many=lambda s, k: [1] * k,
        encoder=EncoderInputs(c["max_num_encoder_input_tokens"], c["encoder_cache_size"], False),
    )
    seq = Sequence(0, 40, 30, mm_items=((4, 10, "img"),))
    sched.add(seq)
    assert sched.fast_step() is None  # pending: declined
    plan = sched.schedule()
    sched.update()
    assert plan.encoder == {seq: [0]} and plan.encoder_tokens == 10
    fast = 0
    while sched.has_work():
        if sched.fast_step() is not None:
            fast += 1
            sched.finish_fast_step()
        else:
            sched.schedule()
            sched.update()
    assert fast > 20


def test_encoder_cache_evicts_oldest_and_reports_only_what_stays_evicted() -> None:
    cache = EncoderCache(10)
    a, b = object(), object()
    assert cache.can_allocate(4, 100, 0)
    cache.allocate("x", 4, a, 0)
    cache.allocate("y", 4, b, 0)
    cache.release("x", a, 0)
    cache.release("y", b, 0)  # freeable: x, then y
    assert cache.num_free_slots == 2 and cache.num_freeable_slots == 10
    assert not cache.can_allocate(4, 3, 0)  # over the step's budget
    assert cache.can_allocate(4, 100, 0)  # evicts x only
    cache.allocate("z", 4, a, 0)
    assert cache.can_allocate(4, 100, 0)  # evicts y
    cache.allocate("x", 4, b, 1)  # x back: not reported as freed
    assert cache.take_freed() == ["y"] and cache.take_freed() == []
    assert cache.num_free_slots == 2 and "x" in cache and "y" not in cache


def test_a_repeated_item_is_held_until_its_last_occurrence() -> None:
    cache = EncoderCache(10)
    seq = object()
    cache.allocate("x", 3, seq, 0)
    assert cache.check_and_update("x", seq, 2)
    cache.release("x", seq, 0)
    assert cache.num_freeable_slots == 7  # still needed for item 2
    cache.release("x", seq, 2)
    assert cache.num_freeable_slots == 10


def test_items_must_lie_in_order_inside_the_prompt() -> None:
    with pytest.raises(ValueError, match="mm_items of 3"):
        Sequence(3, 20, 5, mm_items=((0, 10, 1), (5, 3, 2)))
    with pytest.raises(ValueError, match="prompt_len 20"):
        Sequence(3, 20, 5, mm_items=((15, 10, 1),))


# -- Qwen3-VL-8B from its config.json -----------------------------------------------------------


def _scenario(**mm: Any) -> dict[str, Any]:
    multimodal = {"items_per_request": 1, "image_size": [1024, 768], **mm}
    return {
        "name": "qwen3-vl",
        "seed": 3,
        "workload": {
            "num_requests": 120,
            "arrival": {"rate": 6},
            "prompt_len": {"dist": "uniform", "low": 50, "high": 400},
            "output_len": {"dist": "fixed", "value": 16},
            "multimodal": multimodal,
        },
        "cost_model": {"type": "roofline", "model": str(QWEN3_VL), "hardware": "h100-sxm"},
        "scheduler": {"policy": "vllm-v1", "max_num_batched_tokens": 2048},
    }


def test_qwen3_vl_reads_its_language_and_vision_models() -> None:
    lm = read_hf_config(QWEN3_VL)
    assert (lm.num_layers, lm.hidden_size, lm.num_kv_heads) == (36, 4096, 8)
    vit = VisionEncoder.from_config(QWEN3_VL)
    assert (vit.depth, vit.hidden, vit.patch_size, vit.merge, vit.num_mergers) == (
        27,
        1152,
        16,
        2,
        4,
    )
    # 1024 x 768 pixels: multiples of 32 (patch 16 x merge 2) -> 32 x 24 tokens
    assert vit.image_tokens(1024, 768, 65536, 16777216) == 768
    assert vit.image_tokens(100, 100, 65536, 16777216) == 64  # scaled up to min_pixels
    # ~0.57 B parameters (Qwen3-VL's ViT with its four mergers), bf16
    assert 1.1e9 < vit.weight_bytes < 1.2e9


def test_no_step_exceeds_the_encoder_budget() -> None:
    scenario = _scenario(items_per_request=3, position="random", distinct_items=40)
    scenario["scheduler"]["max_num_encoder_input_tokens"] = 1600
    result = run(scenario)
    steps = result.steps
    assert result.scenario.scheduler.max_num_encoder_input_tokens == 1600
    assert steps["encoder_tokens"].max() <= 1600
    assert steps["encoder_tokens"].sum() > 0
    assert (steps["encoder_tokens"] > 0).sum() > 50
    # the encoder's work is where the requests table says, and no more than their images
    req = result.request_table
    assert int(np.sum(req["encoder_tokens"])) == int(steps["encoder_tokens"].sum())
    assert (np.asarray(req["encoder_tokens"]) <= np.asarray(req["mm_tokens"]) * 2).all()


def test_each_image_twice_back_to_back_halves_the_encoder_work() -> None:
    big = {"encoder_cache_size": 200_000}
    once = _scenario(items_per_request=2)
    twice = _scenario(items_per_request=2, requests_per_item=2)
    for s in (once, twice):
        s["scheduler"].update(big)
    a, b = run(once), run(twice)
    ta, tb = int(a.steps["encoder_tokens"].sum()), int(b.steps["encoder_tokens"].sum())
    assert ta == 120 * 2 * 768
    assert tb / ta == pytest.approx(0.5, abs=0.01)
    assert b.summary["encoder_cache_hit_rate"] == pytest.approx(0.5, abs=0.01)
    assert a.summary["encoder_cache_hit_rate"] == 0


def test_an_image_adds_at_least_its_encoding_to_ttft() -> None:
    base = _scenario()
    base["workload"].update(num_requests=1, prompt_len={"dist": "fixed", "value": 300})
    with_image = run(base)
    without = dict(base, workload={**base["workload"], "multimodal": {"items_per_request": 0}})
    without["workload"]["multimodal"] = {"items_per_request": 0, "tokens_per_item": 1}
    text = run(without)
    hw = load_hardware("h100-sxm")
    encoding = EncoderCost(VisionEncoder.from_config(QWEN3_VL), hw).time([768])
    gap = float(with_image.request_table["ttft_s"][0]) - float(text.request_table["ttft_s"][0])
    assert encoding > 1e-3
    assert gap >= encoding
    assert gap < encoding + 0.05  # and the rest is the 768 placeholder tokens' prefill


def test_same_seed_same_tables() -> None:
    s = _scenario(items_per_request=2, position="random", distinct_items=7)
    a, b = run(s), run(s)
    assert a.steps.equals(b.steps)
    assert (np.asarray(a.request_table["ttft_s"]) == np.asarray(b.request_table["ttft_s"])).all()


@pytest.mark.parametrize(
    ("scheduler", "field"),
    [
        ({"encoder_cache_size": 500}, "scheduler.encoder_cache_size"),
        ({"max_num_encoder_input_tokens": 500}, "scheduler.max_num_encoder_input_tokens"),
        (
            {"disable_chunked_mm_input": True, "max_num_batched_tokens": 512},
            "scheduler.disable_chunked_mm_input",
        ),
    ],
)
def test_what_cannot_be_encoded_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheduler: dict[str, Any], field: str
) -> None:
    import yaml

    s = _scenario()
    s["scheduler"].update(scheduler)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(s))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "768" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_trace_carries_images(tmp_path: Path) -> None:
    """CSV columns mm_items, mm_tokens, mm_content: images at the start of the prompt,
    counted in prompt_len, equal contents served from the encoder cache; rows re-sorted by
    arrival keep their images; a row whose images exceed its prompt is refused."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,prompt_len,output_len,mm_items,mm_tokens,mm_content\n"
        "0.0,900,20,1,768,5\n0.5,900,20,1,768,5\n0.2,300,20,0,1,0\n1.0,1700,20,2,768,5\n"
    )
    scenario = {
        "name": "trace",
        "workload": {"trace": {"path": str(trace), "format": "csv"}},
        "cost_model": {"type": "roofline", "model": str(QWEN3_VL), "hardware": "h100-sxm"},
        "scheduler": {"policy": "vllm-v1"},
    }
    result = run(scenario)
    req = result.request_table
    assert list(req["mm_items"]) == [1, 0, 1, 2]
    assert list(req["encoder_tokens"]) == [768, 0, 0, 768]
    assert list(req["encoder_cache_hits"]) == [0, 0, 1, 1]
    assert result.scenario.scheduler.encoder_cache_size == 8192
    trace.write_text("arrival_s,prompt_len,output_len,mm_items,mm_tokens\n0,700,20,1,768\n")
    with pytest.raises(InputError, match="t.csv:2: column mm_items: 1 images of 768 tokens"):
        run(scenario)


def test_kernel_based_models_take_the_measured_encoder_attention() -> None:
    """aiconfigurator-core measures Qwen3-VL's ViT attention (16 heads of 72) on an H100, not
    on an A100; measured, one layer over a 768-token image's 3,072 patches takes longer than
    its FLOPs at the roofline's efficiency, and a physics scenario prices its images so."""
    from simulator.cost.encoder_attention import MeasuredEncoderAttention

    vit = VisionEncoder.from_config(QWEN3_VL)
    h100 = load_hardware("h100-sxm")
    measured = MeasuredEncoderAttention.load(h100, 16, 72)
    assert (
        measured is not None
        and MeasuredEncoderAttention.load(load_hardware("a100-80gb"), 16, 72) is None
    )
    flops_s = vit.attention_flops(768) / vit.depth / (h100.peak_flops * 0.6)
    assert 1.0 < measured.seconds(3072) / flops_s < 3.0
    assert measured.seconds(2 * 65536) == pytest.approx(4 * measured.seconds(65536))
    with_table = EncoderCost(vit, h100, attention=measured).time([768])
    assert with_table > EncoderCost(vit, h100).time([768])
    s = _scenario()
    s["workload"]["num_requests"] = 20
    s["cost_model"] = {"type": "physics", "model": str(QWEN3_VL), "hardware": "h100-sxm"}
    assert int(run(s).steps["encoder_tokens"].sum()) == 20 * 768
