"""The ``physics`` cost model on what dense Llamas lack: routed and shared experts (the
grouped GEMM fitted on moe.csv, the experts a batch touches, EP's share and all-to-all), MLA
attention (its compressed KV and its decode FLOPs), FP8 weights (bytes and the GPU's FP8
peak), and the one-line refusals (a dtype the GPU lacks, an MoE config.json missing its
expert counts, an architecture it cannot price), through the CLI with exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import TypeAdapter

from simulator.cli import main
from simulator.cost import CostModelConfig, PhysicsCostModel, build_cost_model
from simulator.cost.all_to_all import all_to_all_time
from simulator.cost.batch import Batch, StepSums
from simulator.cost.learn.sources import default_sources_path, load_sources, read_source
from simulator.cost.physics_params import load_params
from simulator.cost.physics_terms import attention_time, moe_time, routed
from simulator.errors import InputError
from tests.paths import DATA, MISSING, ROOT
from tests.test_hf_config import DEEPSEEK_V3

CONFIG = TypeAdapter(CostModelConfig)
QWEN3 = DATA / "llmservingsim" / "models" / "Qwen3-30B-A3B-Instruct-2507.json"

# DeepSeek-V2-Lite's config.json fields as its model card gives them (15.7B total, 2.4B
# active: 27 layers, hidden 2048, 16 heads, MLA with kv_lora_rank 512 and no query latent,
# first layer dense, 2 shared + 64 routed experts of 1408, 6 per token). Written here.
V2_LITE: dict[str, Any] = {
    **DEEPSEEK_V3,
    "model_type": "deepseek_v2",
    "architectures": ["DeepseekV2ForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "q_lora_rank": None,
    "vocab_size": 102400,
}


def write(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return path


def physics(model: str | Path, hardware: str = "h100-sxm", **kw: object) -> PhysicsCostModel:
    fields: dict[str, object] = {"type": "physics", "model": str(model), "hardware": hardware}
    fields.update(kw)
    built = build_cost_model(CONFIG.validate_python(fields))
    assert isinstance(built, PhysicsCostModel)
    return built


def test_experts_are_priced_from_the_shape() -> None:
    """A decode step's MoE part is the router's matmul plus the grouped GEMM over the experts
    its tokens touch: more tokens touch more experts (1 - (1 - k/E)^T each), and the cost of
    the layer's experts grows with them until all 128 are read."""
    assert QWEN3.is_file(), MISSING
    model = physics(QWEN3, "rtx-pro-6000")
    s = model.shape
    assert (s.moe_layers, s.local_experts, s.top_k, s.n_dense) == (48, 128, 8, 0)
    pairs, experts = routed(np.array([1.0, 8.0, 64.0]), s)
    assert list(pairs) == [8.0, 64.0, 512.0]
    assert experts[0] == pytest.approx(8.0)
    assert experts[2] == pytest.approx(128 * (1 - (1 - 8 / 128) ** 64))
    t = moe_time(pairs, experts, s, model._mm_flops, model._bw, model._p)
    assert t[0] < t[1] < t[2]
    # the expert part of a 64-token step is more than a dense model's whole MLP would read:
    # ~96% of 128 experts' weights at the fitted bandwidth
    weights = experts[2] * s.expert_weight_elements * 2 / model._bw
    assert t[2] > weights


def test_the_fitted_grouped_gemm_reproduces_moe_csv() -> None:
    """The shipped parameters price LLMServingSim's moe.csv (the MoE block by tokens and
    experts touched) within 10% median, 30% worst (in sample)."""
    src = next(s for s in load_sources(default_sources_path()).sources if "qwen3" in s.name)
    data = Path(str(DATA / "llmservingsim")).parent
    sets, files = read_source(src, data)
    assert any(f.name == "moe.csv" for f in files)
    (moe,) = [s for s in sets if s.op == "moe"]
    p, c, m = load_params(None).for_gpu("rtx-pro-6000")
    pred = moe.predict(p, moe.hardware.peak_flops * c, moe.hardware.hbm_bandwidth * m)
    err = np.abs(pred / moe.measured - 1)
    assert np.median(err) < 0.10 and err.max() < 0.30


def test_expert_parallelism_splits_the_experts_and_adds_the_all_to_all() -> None:
    """With EP 2 a rank holds half the experts and sees the tokens of both ranks; its link
    time is the all-to-all of every MoE layer (cost/all_to_all.py) on top of TP's none."""
    assert QWEN3.is_file(), MISSING
    one, two = physics(QWEN3, "rtx-pro-6000"), physics(QWEN3, "rtx-pro-6000", expert_parallel=2)
    assert two.shape.local_experts == 64
    _, e1 = routed(np.array([4.0]), one.shape)
    _, e2 = routed(np.array([4.0]), two.shape)
    assert e2[0] == pytest.approx(64 * (1 - (1 - 8 / 128) ** 8))  # 8 tokens of 2 ranks
    assert e2[0] < e1[0] * 2
    hw = two.hw
    assert hw.interconnect_bandwidth is not None
    a2a = all_to_all_time(
        100, 2048, 2, hw.interconnect_bandwidth, hw.allreduce_latency_us or 0.0, top_k=8
    )
    assert two.allreduce_time(100) == pytest.approx(48 * a2a, rel=1e-9)
    assert one.allreduce_time(100) == 0.0
    with pytest.raises(InputError, match="expert-parallel degree 3 does not divide"):
        physics(QWEN3, "rtx-pro-6000", expert_parallel=3)
    with pytest.raises(InputError, match="expert_parallel: 2, but model llama-3.1-8b has no"):
        physics("llama-3.1-8b", "rtx-pro-6000", expert_parallel=2)


def test_mla_attention_scalar_form_matches_the_term(tmp_path: Path) -> None:
    """MLA: the KV of a token is its 576-element latent (whole on every TP rank), decodes
    compute over it; the per-step scalar form equals the vectorised term times the layers."""
    model = physics(write(tmp_path, V2_LITE), tp=2)
    s = model.shape
    assert s.kv_bytes_per_token == (512 + 64) * 2 and s.q_heads == 8 and s.kv_heads == 1
    assert s.decode_flops_per_pair == 2.0 * 8 * (2 * 512 + 64)
    assert (s.moe_layers, s.n_dense, s.shared_intermediate) == (26, 1, 1408)
    for pc, kvp, nd, kvd in [(0, 0, 40, 3000), (700, 2000, 0, 0), (128, 4000, 30, 1500)]:
        batch = Batch(((pc,) if pc else ()) + (1,) * nd, ((kvp,) if pc else ()) + (kvd,) * nd)
        sums = StepSums.of(batch)
        rest = model.step_time(batch) - model._tokens(sums.num_tokens)
        rest -= model._sequences(sums.num_seqs)
        pairs = pc * kvp + pc * (pc + 1) / 2
        term = attention_time(
            *(np.array([x], dtype=float) for x in (pc, kvp, pairs, nd, nd * kvd)),
            s,
            model._flops,
            model._bw,
            model._p,
        )[0]
        assert rest == pytest.approx(s.layers * term, rel=1e-12)


def test_fp8_weights_read_half_the_bytes_at_the_fp8_peak(tmp_path: Path) -> None:
    """FP8 weights: a memory-bound decode step is faster than at bf16 (half the weight bytes),
    a compute-bound prefill too (the FP8 peak); KV in fp8 halves the latent read."""
    fp8 = write(tmp_path, V2_LITE)  # quantization_config fp8
    bf16 = write(tmp_path, {**V2_LITE, "quantization_config": None}, "bf16.json")
    q, b = physics(fp8), physics(bf16)
    # each fp8 matmul's input is quantized first (vLLM's fp8 linear and fused-MoE paths)
    quant = {k for k in q.shape.elementwise() if k.startswith("quant:")}
    assert "quant:q_proj" in quant and "quant:experts" in quant and "quant:router" not in quant
    assert not any(k.startswith("quant:") for k in b.shape.elementwise())
    assert q._mm_flops == pytest.approx(2 * b._mm_flops, rel=1e-3)  # 1,979 vs 989 TFLOPS
    decode, prefill = Batch.uniform(8, 1, 1000), Batch((2048,), (0,))
    assert q.step_time(decode) < 0.8 * b.step_time(decode)
    assert q.step_time(prefill) < 0.85 * b.step_time(prefill)
    kv8 = physics(fp8, kv_dtype="fp8")
    assert kv8.shape.kv_bytes_per_token == 576
    long = Batch.uniform(64, 1, 8000)
    assert kv8.step_time(long) < q.step_time(long)


def _scenario(tmp_path: Path, cost: dict[str, Any], **top: Any) -> Path:
    text = {
        "name": "physics-moe",
        "seed": 0,
        "scheduler": {"max_num_batched_tokens": 1024, "max_num_seqs": 32},
        "cost_model": {"type": "physics", "hardware": "h100-sxm", **cost},
        "workload": {
            "num_requests": 30,
            "arrival": {"process": "poisson", "rate": 5},
            "prompt_len": {"dist": "fixed", "value": 300},
            "output_len": {"dist": "fixed", "value": 20},
        },
        **top,
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(text))
    return path


def test_a_deepseek_config_runs_and_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An FP8 MLA MoE config.json runs on an H100 (also as DP 2 + EP 2); each refusal is one
    line naming the field, exit 2, nothing written."""
    path = write(tmp_path, V2_LITE)
    out = tmp_path / "out"
    assert main(["run", str(_scenario(tmp_path, {"model": str(path)})), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 30 and summary["tpot_mean_s"] > 0
    dp = {"data_parallel_size": 2, "enable_expert_parallel": True}
    ep = _scenario(tmp_path, {"model": str(path)}, parallel=dp)
    assert main(["run", str(ep), "--out", str(tmp_path / "ep"), "--no-plots"]) == 0
    cases = [
        ({"model": str(path), "hardware": "a100-80gb"}, "no fp8 tensor cores"),
        (
            {"model": str(write(tmp_path, {**V2_LITE, "n_routed_experts": None}, "m.json"))},
            "field 'n_routed_experts': missing",
        ),
        (
            {"model": str(write(tmp_path, {**V2_LITE, "model_type": "gemma3"}, "g.json"))},
            "field 'model_type': 'gemma3' cannot be priced",
        ),
        (
            {
                "model": str(
                    write(tmp_path, {**V2_LITE, "layer_types": ["sliding_attention"]}, "l.json")
                )
            },
            "field 'layer_types'",
        ),
        (
            {"model": "llama-3-8b", "weight_dtype": "fp8", "hardware": "a100-80gb"},
            "cost_model.weight_dtype",
        ),
    ]
    for cost, needle in cases:
        never = tmp_path / "never"
        capsys.readouterr()
        assert main(["run", str(_scenario(tmp_path, cost)), "--out", str(never)]) == 2, needle
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
        assert not never.exists()


def test_the_qwen3_ep_replay_runs_with_physics() -> None:
    """The shared Qwen3-30B-A3B DP 2 + EP 2 run replayed with `physics` (its config.json and
    the GPU preset): every mean figure within 15% of the measurement (docs/fidelity.md)."""
    from simulator.scenario.config import load_scenario, read_yaml
    from simulator.scenario.runner import run as simulate
    from simulator.validation.compare import compare, simulated
    from simulator.validation.measured import read_measured

    data = DATA / "llmservingsim"
    assert QWEN3.is_file(), MISSING
    path = ROOT / "scenarios" / "real-rtxpro6000-qwen3-30b-a3b.yaml"
    sc = read_yaml(path)
    cfg = load_scenario(
        path,
        {
            "cost_model.type": "physics",
            "cost_model.model": str(QWEN3),
            "cost_model.hardware": "rtx-pro-6000",
            "workload.trace.path": str(data / sc["workload"]["trace"]["path"].split("/", 2)[2]),
        },
    )
    result = simulate(cfg)
    folder = "runs/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/requests.jsonl"
    meas = read_measured(data / folder, "llmservingsim")
    m = compare(simulated(result.requests, result.summary, meas.reference, "qwen3"), meas)
    for metric in ("ttft", "tpot", "e2e"):
        assert abs(m[metric]["mean"]["error_pct"]) < 15, metric
