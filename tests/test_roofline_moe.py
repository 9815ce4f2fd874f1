"""The roofline with MoE experts, weight/KV dtypes and MLA: dense presets bit-exact with the
formula as it was, expert bytes from the distinct experts a step touches, FLOPs at the dtype's
peak, the hardware presets' sources and the dtypes a GPU lacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter

from simulator.cost import CostModelConfig, RooflineCostModel, build_cost_model
from simulator.cost.batch import Batch, StepSums
from simulator.cost.model_spec import ModelSpec
from simulator.cost.presets import derive_num_blocks, list_presets, load_hardware, load_model
from simulator.errors import InputError
from tests.paths import DATA, MISSING

CONFIG = TypeAdapter(CostModelConfig)
QWEN_MOE = DATA / "llmservingsim/models/Qwen3-30B-A3B-Instruct-2507.json"
BATCHES = [
    Batch.uniform(1, 1, 100),
    Batch.uniform(64, 1, 1500),
    Batch((512,), (0,)),
    Batch((300, 1, 1, 1), (1000, 20, 4000, 7)),
]


def roofline(model: str, hardware: str = "h100-sxm", **kw: object) -> RooflineCostModel:
    fields: dict[str, object] = {"type": "roofline", "model": model, "hardware": hardware}
    cost = build_cost_model(CONFIG.validate_python({**fields, **kw}))
    assert isinstance(cost, RooflineCostModel)
    return cost


def old_formula(m: ModelSpec, peak: float, bw: float, tp: int, batch: Batch) -> float:
    """The dense roofline as it was before MoE and dtypes (default efficiencies, no link)."""
    tokens, ctx, pairs = sum(batch.new_tokens), sum(batch.context_lens), batch.attention_pairs()
    flops = m.flops_per_token_matmul / tp * tokens + m.attention_flops_per_pair / tp * pairs
    nbytes = m.weight_bytes / tp + m.kv_bytes_per_token / tp * (ctx + tokens)
    t_c, t_m = flops / (peak * 0.6), nbytes / (bw * 0.8)
    return (t_m if t_m > t_c else t_c) + 2.0e-3


@pytest.mark.parametrize("name", [n for n in list_presets()["models"] if not load_model(n).is_moe])
def test_dense_presets_are_bit_exact(name: str) -> None:
    m, hw = load_model(name), load_hardware("h100-sxm")
    tp = 8 if m.num_params > 60e9 else 1
    cost = roofline(name, tp=tp)
    for batch in BATCHES:
        assert cost.step_time(batch) == old_formula(m, hw.peak_flops, hw.hbm_bandwidth, tp, batch)


def test_moe_reads_only_the_experts_a_step_touches() -> None:
    assert QWEN_MOE.is_file(), MISSING
    cost = roofline(str(QWEN_MOE))
    m = cost.model
    rest = m.weight_bytes - m.routed_expert_bytes
    one = cost.breakdown(Batch.uniform(1, 1, 0))
    # one decode token: 8 of 128 experts in each of the 48 layers
    assert one["bytes_experts"] == pytest.approx(48 * 8 * m.expert_bytes, rel=1e-12)
    assert one["bytes_weights"] == pytest.approx(rest + 48 * 8 * m.expert_bytes, rel=1e-12)
    many = cost.breakdown(Batch((2048,), (0,)))
    assert many["bytes_experts"] == pytest.approx(m.routed_expert_bytes, rel=1e-9)
    # FLOPs per token use the 8 active experts only
    assert one["flops_matmul"] == 2.0 * m.matmul_params
    assert m.matmul_params < 0.15 * m.num_params
    # a decode step gets slower as more experts are touched, up to all of them
    times = [cost.time_sums(StepSums.decode(n, 500 * n)) for n in (1, 4, 16, 64)]
    assert times == sorted(times) and times[0] < times[-1]


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen3moe", "deepseek"])
def test_fast_paths_equal_step_time(model: str, tmp_path: Path) -> None:
    from tests.test_hf_config import DEEPSEEK_V3, write

    path = {"qwen3moe": str(QWEN_MOE), "deepseek": str(write(tmp_path, DEEPSEEK_V3))}
    cost = roofline(path.get(model, model), tp=8 if model == "deepseek" else 1)
    for batch in BATCHES:
        assert cost.time_sums(StepSums.of(batch)) == cost.step_time(batch)
        assert cost.breakdown(batch)["t"] == pytest.approx(cost.step_time(batch), rel=1e-12)
    decode = Batch((1, 1, 1), (10, 200, 3000))
    assert cost.time_sums(StepSums.decode(3, 3210)) == cost.step_time(decode)


def test_fp8_weights_run_at_the_fp8_peak_and_read_half_the_bytes() -> None:
    bf16, fp8 = roofline("llama-3-8b"), roofline("llama-3-8b", weight_dtype="fp8")
    prefill = Batch((2048,), (0,))  # compute-bound
    a, b = bf16.breakdown(prefill), fp8.breakdown(prefill)
    # matmuls at twice the rate, attention still at the bf16 peak
    t_mm, t_attn = a["flops_matmul"] / (1979e12 * 0.6), a["flops_attn"] / (989e12 * 0.6)
    assert b["t_compute"] == pytest.approx(t_mm + t_attn, rel=1e-12)
    decode = Batch.uniform(1, 1, 10)  # memory-bound: the weights, halved but for embeddings
    m = fp8.model
    kept = 2 * m.embedding_params
    assert b["bytes_weights"] == (m.num_params - kept) + 2 * kept
    assert fp8.step_time(decode) < 0.6 * bf16.step_time(decode) + 2e-3
    kv8 = roofline("llama-3-8b", kv_dtype="fp8")
    assert kv8.breakdown(decode)["bytes_kv"] == bf16.breakdown(decode)["bytes_kv"] / 2


def test_mla_kv_is_whole_on_every_tp_rank(tmp_path: Path) -> None:
    from tests.test_hf_config import DEEPSEEK_V3, write

    path = str(write(tmp_path, DEEPSEEK_V3))
    cost = roofline(path, hardware="h200", tp=8)
    batch = Batch.uniform(4, 1, 1000)
    assert cost.breakdown(batch)["bytes_kv"] == 61 * 576 * 2 * 4 * 1001
    # the absorbed decode's attention FLOPs per pair (latent-wide), at the bf16 peak (counted
    # in fp8-matmul-rate units: x 1979/989)
    m = cost.model
    per_pair = 2.0 * 61 * 128 * (2 * 512 + 64) / 8
    expected = per_pair * 4 * 1001 * 1979 / 989
    assert cost.breakdown(batch)["flops_attn"] == pytest.approx(expected, rel=1e-12)
    # DeepSeek-V3 in FP8 fits 8 x H200 with room for KV; not 8 x A100 (no fp8 tensor cores)
    assert derive_num_blocks(m, load_hardware("h200"), tp=8, block_size=16) > 0
    with pytest.raises(InputError, match="a100-80gb has no fp8 tensor cores"):
        roofline(path, hardware="a100-80gb", tp=8)


@pytest.mark.parametrize(
    ("hardware", "dtype", "ok"),
    [
        ("a100-80gb", "fp8", False),
        ("h100-sxm", "fp8", True),
        ("h100-sxm", "fp4", False),
        ("b200", "fp4", True),
        ("rtx-pro-6000", "fp4", True),
        ("mi300x", "fp4", False),
        ("l4", "fp8", True),
    ],
)
def test_a_dtype_the_gpu_lacks_is_one_line(hardware: str, dtype: str, ok: bool) -> None:
    if ok:
        cost = roofline("llama-3-8b", hardware, weight_dtype=dtype)
        assert cost.step_time(Batch.uniform(1, 1, 10)) > 0
        return
    with pytest.raises(InputError) as err:
        roofline("llama-3-8b", hardware, weight_dtype=dtype)
    message = str(err.value)
    assert message.startswith("cost_model.weight_dtype: ")
    assert f"{hardware} has no {dtype} tensor cores" in message and "\n" not in message


def test_every_hardware_preset_cites_each_value() -> None:
    needed = {"peak_flops", "hbm_bandwidth", "memory_bytes", "interconnect_bandwidth"}
    for name in list_presets()["hardware"]:
        hw = load_hardware(name)
        given = {f for f in ("peak_flops_fp8", "peak_flops_fp4", "allreduce_latency_us")}
        given = {f for f in given if getattr(hw, f) is not None}
        assert needed | given <= set(hw.sources), name
        for field in needed | given:
            assert len(hw.sources[field]) > 20, (name, field)
        assert any("https://" in s for s in hw.sources.values()), name
        if hw.cost_per_hour is not None:  # none checked (b300, gb200, gb300): search asks for one
            assert hw.cost_source and "$" in hw.cost_source, name
        assert hw.interconnect, name
        # dense peaks: fp8 twice bf16, fp4 twice fp8, where the GPU has them
        if hw.peak_flops_fp8 is not None:
            assert hw.peak_flops_fp8 == pytest.approx(2 * hw.peak_flops, rel=0.02), name
        if hw.peak_flops_fp4 is not None:
            assert hw.peak_flops_fp8 is not None
            assert hw.peak_flops_fp4 == pytest.approx(2 * hw.peak_flops_fp8, rel=0.02), name


def test_a_missing_spec_names_the_field() -> None:
    hw = load_hardware("b200")
    assert hw.require("interconnect_bandwidth", "tp > 1") == 900e9
    with pytest.raises(InputError, match="b200: allreduce_latency_us not given .the all-reduce"):
        hw.require("allreduce_latency_us", "the all-reduce latency")


def test_a_source_for_an_unknown_field_is_refused(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "configs/hardware/l4.yaml").read_text()
    bad = tmp_path / "l4.yaml"
    bad.write_text(text.replace("  hbm_bandwidth:", "  hbm_bandwith:"))
    with pytest.raises(InputError, match=r"field 'sources': .*unknown fields \['hbm_bandwith'\]"):
        load_hardware(str(bad))
