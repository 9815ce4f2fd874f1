"""The Hugging Face config.json reader: the shared configs against published sizes, a synthetic
DeepSeek-V3 (MLA, shared experts, first_k_dense_replace, FP8), and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulator.cli import main
from simulator.cost.hf_config import read_hf_config
from simulator.cost.presets import load_model
from simulator.errors import InputError
from tests.paths import DATA, MISSING

MODELS = DATA / "llmservingsim/models"

# Published totals / active parameters (model cards), in billions.
PUBLISHED = {
    "Llama-3.1-8B": (8.03, 8.03),
    "Llama-3.1-70B": (70.6, 70.6),
    "Qwen3-30B-A3B-Instruct-2507": (30.5, 3.3),
    "Mixtral-8x7B-v0.1": (46.7, 12.9),
    "Phi-mini-MoE-instruct": (7.6, 2.4),
}

# DeepSeek-V3's config.json fields as its model card and technical report give them
# (arXiv 2412.19437, section 4.2: 61 layers, hidden 7168, 128 heads, MLA with d_c = 512,
# d_c' = 1536, rope 64, nope 128; first 3 layers dense; 1 shared + 256 routed experts of 2048,
# 8 active; FP8 weights). Written here, not copied from the checkpoint.
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


def write(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shared_configs_match_published_sizes(name: str) -> None:
    path = MODELS / f"{name}.json"
    assert path.is_file(), MISSING
    spec = load_model(str(path))
    total, active = PUBLISHED[name]
    assert spec.num_params / 1e9 == pytest.approx(total, rel=0.02)
    assert spec.active_params / 1e9 == pytest.approx(active, rel=0.03)


def test_dense_config_equals_the_preset() -> None:
    path = MODELS / "Llama-3.1-8B.json"
    assert path.is_file(), MISSING
    ours, preset = load_model(str(path)), load_model("llama-3.1-8b")
    shape = {"name", "source"}
    assert ours.model_dump(exclude=shape) == preset.model_dump(exclude=shape)
    assert ours.weight_bytes == preset.weight_bytes
    assert ours.kv_bytes_per_token == preset.kv_bytes_per_token


def test_qwen3_moe_by_hand() -> None:
    path = MODELS / "Qwen3-30B-A3B-Instruct-2507.json"
    assert path.is_file(), MISSING
    m = load_model(str(path))
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (128, 8, 768)
    assert m.moe_layers == tuple(range(48)) and m.head_dim == 128 and m.num_kv_heads == 4
    # head_dim 128 x 32 heads = 4096 != hidden 2048: the explicit head_dim is used
    assert m.attn_params_per_layer == 2048 * (4096 + 2 * 512) + 4096 * 2048
    assert m.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2
    assert m.expert_bytes == 3 * 2048 * 768 * 2


def test_mixtral_experts_are_intermediate_size_wide() -> None:
    path = MODELS / "Mixtral-8x7B-v0.1.json"
    assert path.is_file(), MISSING
    m = load_model(str(path))
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (8, 2, 14336)
    assert m.num_dense_layers == 0


def test_deepseek_v3(tmp_path: Path) -> None:
    m = read_hf_config(write(tmp_path, DEEPSEEK_V3))
    assert m.is_mla and m.is_moe and m.weight_dtype == "fp8"
    assert m.moe_layers == tuple(range(3, 61)) and m.num_shared_experts == 1
    # 671B total, 37B activated (model card; the MTP module's 14B is not part of the main model)
    assert m.num_params / 1e9 == pytest.approx(671, rel=0.01)
    assert m.active_params / 1e9 == pytest.approx(37, rel=0.03)
    # MLA caches the 512-wide latent and the 64-wide rotary key: 576 elements per layer
    assert m.kv_bytes_per_token == 61 * 576 * 2
    assert m.with_dtypes(None, "fp8").kv_bytes_per_token == 61 * 576
    # FP8 weights: about a byte per parameter (embedding, LM head and routers stay bf16)
    assert m.weight_bytes / m.num_params == pytest.approx(1.0, abs=0.01)
    v2_lite = {**DEEPSEEK_V3, "model_type": "deepseek_v2", "q_lora_rank": None}
    assert read_hf_config(write(tmp_path, v2_lite)).q_lora_rank is None


def test_config_dtype_keys_override(tmp_path: Path) -> None:
    path = write(tmp_path, DEEPSEEK_V3)
    m = load_model(str(path), weight_dtype="fp4", kv_dtype="fp8")
    assert (m.weight_dtype, m.kv_dtype) == ("fp4", "fp8")


@pytest.mark.parametrize(
    ("update", "needle"),
    [
        ({"model_type": "gemma2"}, "field 'model_type': 'gemma2' cannot be priced"),
        ({"n_routed_experts": None}, "field 'n_routed_experts': missing (routed experts"),
        ({"num_experts_per_tok": None}, "field 'num_experts_per_tok': missing"),
        ({"kv_lora_rank": None}, "field 'kv_lora_rank': missing"),
        ({"hidden_size": "7168"}, "field 'hidden_size': expected a positive integer"),
        ({"moe_layer_freq": 2}, "field 'moe_layer_freq'"),
        ({"layer_types": ["full_attention", "linear_attention"]}, "field 'layer_types'"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method"),
    ],
)
def test_what_cannot_be_priced_is_one_line(
    tmp_path: Path, update: dict[str, Any], needle: str
) -> None:
    config = {k: v for k, v in {**DEEPSEEK_V3, **update}.items() if v is not None}
    with pytest.raises(InputError) as err:
        read_hf_config(write(tmp_path, config))
    message = str(err.value)
    assert needle in message and str(tmp_path) in message
    assert "\n" not in message


def test_qwen_moe_missing_expert_count(tmp_path: Path) -> None:
    path = MODELS / "Qwen3-30B-A3B-Instruct-2507.json"
    assert path.is_file(), MISSING
    config = json.loads(path.read_text())
    del config["num_experts"]
    with pytest.raises(InputError, match="field 'num_experts': missing"):
        read_hf_config(write(tmp_path, config))


def test_unknown_architecture_without_model_type(tmp_path: Path) -> None:
    config = {k: v for k, v in DEEPSEEK_V3.items() if k != "model_type"}
    assert read_hf_config(write(tmp_path, config)).is_mla  # known from architectures
    config["architectures"] = ["MambaForCausalLM"]
    with pytest.raises(InputError, match="field 'architectures': 'MambaForCausalLM'"):
        read_hf_config(write(tmp_path, config))


def test_broken_json_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    with pytest.raises(InputError, match=f"{broken}: not a readable JSON file"):
        load_model(str(broken))
    with pytest.raises(InputError, match="not found"):
        load_model(str(tmp_path / "missing.json"))


def scenario(tmp_path: Path, model: str, **cost: object) -> Path:
    text = {
        "name": "hf",
        "seed": 0,
        "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 16},
        "cost_model": {"type": "roofline", "model": model, "hardware": "h100-sxm", **cost},
        "workload": {
            "num_requests": 20,
            "arrival": {"process": "poisson", "rate": 5},
            "prompt_len": {"dist": "fixed", "value": 100},
            "output_len": {"dist": "fixed", "value": 10},
        },
    }
    path = tmp_path / "scenario.json.yaml"
    path.write_text(json.dumps(text))
    return path


def test_cli_runs_a_config_json_and_refuses_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = MODELS / "Qwen3-30B-A3B-Instruct-2507.json"
    assert path.is_file(), MISSING
    out = tmp_path / "out"
    assert main(["run", str(scenario(tmp_path, str(path))), "--out", str(out), "--no-plots"]) == 0
    bad = write(tmp_path, {**DEEPSEEK_V3, "model_type": "gemma2"}, "bad.json")
    never = tmp_path / "never"
    capsys.readouterr()
    assert main(["run", str(scenario(tmp_path, str(bad))), "--out", str(never), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert "model_type" in err and len(err.splitlines()) == 1 and not never.exists()
    # fp8 weights on a GPU without fp8 tensor cores
    a100 = scenario(tmp_path, str(path), hardware="a100-80gb", weight_dtype="fp8")
    assert main(["run", str(a100), "--out", str(never), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cost_model.weight_dtype" in err and "fp8" in err and len(err.splitlines()) == 1
