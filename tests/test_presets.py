"""Model/hardware presets: parameter counts against published sizes, loading and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cost.presets import (
    HardwareSpec,
    ModelSpec,
    activation_peak_bytes,
    configs_dir,
    derive_num_blocks,
    list_presets,
    load_hardware,
    load_model,
)
from simulator.errors import InputError

# Published parameter counts (model cards / papers), in billions.
PUBLISHED_B = {
    "llama-2-7b": 6.74,
    "llama-2-70b": 68.98,
    "llama-3-8b": 8.03,
    "llama-3.1-8b": 8.03,
    "llama-3-70b": 70.55,
    "bloom-176b": 176.2,
    "qwen-2.5-7b": 7.61,
    "qwen3-30b-a3b": 30.5,  # the model card's 30.5B in total (3.3B activated)
}


def test_list_presets_has_every_required_name_sorted() -> None:
    presets = list_presets()
    assert presets["models"] == sorted(PUBLISHED_B)
    assert presets["hardware"] == [
        "a100-80gb",
        "b200",
        "b300",
        "gb200",
        "gb300",
        "h100-sxm",
        "h200",
        "l4",
        "l40s",
        "mi300x",
        "rtx-4090",
        "rtx-pro-6000",
    ]


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_num_params_matches_published_size(name: str) -> None:
    spec = load_model(name)
    assert spec.name == name
    assert spec.source
    assert spec.num_params / 1e9 == pytest.approx(PUBLISHED_B[name], rel=0.03)
    assert spec.weight_bytes == 2 * spec.num_params


def test_llama2_7b_counts_by_hand() -> None:
    spec = load_model("llama-2-7b")
    embed = 32000 * 4096
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert spec.num_params == 2 * embed + 32 * per_layer == 6_738_149_376
    assert spec.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524_288
    # embeddings are a lookup, the LM head is a matmul
    assert spec.flops_per_token_matmul == 2 * (32 * per_layer + embed)


def test_gqa_shrinks_kv_and_attention_weights() -> None:
    spec = load_model("llama-3-8b")
    assert spec.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 8 KV heads, not 32
    q_and_o = 2 * 4096 * 4096
    k_and_v = 2 * 4096 * 8 * 128
    assert spec.attn_params_per_layer == q_and_o + k_and_v


def test_bloom_tied_embeddings_and_ungated_mlp() -> None:
    spec = load_model("bloom-176b")
    assert not spec.gated_mlp and spec.tie_embeddings
    assert spec.mlp_params_per_layer == 2 * 14336 * 4 * 14336
    embed = 250880 * 14336
    layers = 70 * (4 * 14336 * 14336 + 8 * 14336 * 14336)
    assert spec.num_params == embed + layers  # embedding counted once
    assert spec.flops_per_token_matmul == 2 * (layers + embed)  # the tied head still multiplies


def test_hardware_presets_are_datasheet_figures() -> None:
    a100 = load_hardware("a100-80gb")
    assert (a100.peak_flops, a100.hbm_bandwidth, a100.memory_bytes) == (312e12, 2.039e12, 80e9)
    h100 = load_hardware("h100-sxm")
    assert (h100.peak_flops, h100.hbm_bandwidth, h100.memory_bytes) == (989e12, 3.35e12, 80e9)
    h200 = load_hardware("h200")
    assert (h200.peak_flops, h200.hbm_bandwidth, h200.memory_bytes) == (989e12, 4.8e12, 141e9)
    rtx = load_hardware("rtx-4090")  # memory: what the driver reported in a real run
    assert (rtx.peak_flops, rtx.hbm_bandwidth) == (165.2e12, 1.008e12)
    assert rtx.memory_bytes == 25_250_627_584
    pro = load_hardware("rtx-pro-6000")  # memory: 95.0 GiB as vLLM reports the card
    assert (pro.peak_flops, pro.hbm_bandwidth, pro.memory_bytes) == (503.8e12, 1.597e12, 95 * 2**30)
    # the Blackwell presets of the kernel database's GPUs (per GPU: the system's figure / GPUs)
    for name, peak, memory in (("b300", 2.25e15, 288e9), ("gb200", 2.5e15, 186e9)):
        hw = load_hardware(name)
        assert (hw.peak_flops, hw.hbm_bandwidth, hw.memory_bytes) == (peak, 8e12, memory)
        assert hw.kernels_gpu and {"peak_flops", "hbm_bandwidth"} <= set(hw.sources)
    assert load_hardware("gb300").kernels_gpu == "gb300"


def test_derive_num_blocks_by_hand() -> None:
    model, hw = load_model("llama-2-7b"), load_hardware("a100-80gb")
    # (80e9 * 0.9 - 6_738_149_376 * 2) / (524_288 * 16) = 58_523_701_248 / 8_388_608 = 6976.6
    assert derive_num_blocks(model, hw, tp=1, block_size=16) == 6976
    # tp=2 adds a whole GPU of memory for KV: (144e9 - 13_476_298_752) / 8_388_608 = 15559.9
    assert derive_num_blocks(model, hw, tp=2, block_size=16) == 15559


def test_activation_peak_by_hand() -> None:
    model = load_model("llama-3.1-8b")
    # forward of 2048 tokens: 2048 x 2 bytes x (2 x 4096 + 6144 QKV + 3 x 14336 MLP)
    forward = 2048 * 2 * (2 * 4096 + 6144 + 3 * 14336)
    # sampler warm-up on 256 rows: 256 x 128256 x (2 + 16 + 8) bytes, plus 2048 hidden states
    sampler = 256 * 128256 * 26 + 2048 * 4096 * 2
    assert activation_peak_bytes(model, 1, 2048, 256) == max(forward, sampler) == sampler
    assert activation_peak_bytes(model, 1, 8192, 8) == forward * 4  # long steps: the forward
    assert activation_peak_bytes(model, 2, 2048, 256) == sampler  # logits are all-gathered


def test_derived_kv_budget_subtracts_the_activation_peak() -> None:
    model, hw = load_model("llama-3.1-8b"), load_hardware("rtx-4090")
    plain = derive_num_blocks(model, hw, tp=1, block_size=16)
    with_peak = derive_num_blocks(
        model, hw, tp=1, block_size=16, max_num_batched_tokens=2048, max_num_seqs=256
    )
    block = 16 * model.kv_bytes_per_token
    assert with_peak == int((hw.memory_bytes * 0.9 - model.weight_bytes - 870_449_152) // block)
    assert plain - with_peak == pytest.approx(870_449_152 / block, abs=1)


def test_derive_num_blocks_rejects_model_that_does_not_fit() -> None:
    model, hw = load_model("llama-2-70b"), load_hardware("a100-80gb")
    with pytest.raises(InputError, match="llama-2-70b"):
        derive_num_blocks(model, hw, tp=1, block_size=16)
    assert derive_num_blocks(model, hw, tp=4, block_size=16) > 0


@pytest.mark.parametrize(
    ("tp", "block_size", "util"), [(0, 16, 0.9), (1, 0, 0.9), (1, 16, 0.0), (1, 16, 1.5)]
)
def test_derive_num_blocks_rejects_bad_arguments(tp: int, block_size: int, util: float) -> None:
    model, hw = load_model("llama-2-7b"), load_hardware("a100-80gb")
    with pytest.raises(InputError):
        derive_num_blocks(model, hw, tp=tp, block_size=block_size, gpu_memory_utilization=util)


def test_unknown_preset_names_it_and_lists_known() -> None:
    with pytest.raises(InputError) as exc:
        load_model("gpt-5")
    msg = str(exc.value)
    assert "gpt-5" in msg and "llama-2-7b" in msg and "\n" not in msg
    with pytest.raises(InputError, match="tpu-v9.*a100-80gb"):
        load_hardware("tpu-v9")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_load_by_path(tmp_path: Path) -> None:
    src = (configs_dir() / "hardware" / "h200.yaml").read_text()
    path = _write(tmp_path / "mine.yaml", src.replace("name: h200", "name: mine"))
    assert load_hardware(str(path)).name == "mine"


def test_missing_path_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_model(str(tmp_path / "nope.yaml"))


def test_bad_yaml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "broken.yaml", "name: [unclosed\n  x: 1\n")
    with pytest.raises(InputError) as exc:
        load_model(str(path))
    assert "broken.yaml" in str(exc.value) and "\n" not in str(exc.value)


def test_non_mapping_yaml_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="mapping"):
        load_hardware(str(_write(tmp_path / "list.yaml", "- 1\n- 2\n")))


def test_bad_field_names_file_and_field(tmp_path: Path) -> None:
    src = (configs_dir() / "models" / "llama-2-7b.yaml").read_text()
    path = _write(tmp_path / "neg.yaml", src.replace("num_layers: 32", "num_layers: -1"))
    with pytest.raises(InputError, match=r"neg\.yaml.*num_layers"):
        load_model(str(path))
    path = _write(tmp_path / "extra.yaml", src + "rope_theta: 10000\n")
    with pytest.raises(InputError, match="rope_theta"):
        load_model(str(path))
    path = _write(tmp_path / "gqa.yaml", src.replace("num_kv_heads: 32", "num_kv_heads: 5"))
    with pytest.raises(InputError, match="num_kv_heads"):
        load_model(str(path))


def test_preset_strictness_booleans_duplicates_and_encoding(tmp_path: Path) -> None:
    src = (configs_dir() / "models" / "llama-2-7b.yaml").read_text()
    path = _write(tmp_path / "flag.yaml", src.replace("num_layers: 32", "num_layers: true"))
    with pytest.raises(InputError, match=r"flag\.yaml: field num_layers: expected a number"):
        load_model(str(path))
    path = _write(tmp_path / "twice.yaml", src + "num_layers: 40\n")
    with pytest.raises(
        InputError, match=r"twice\.yaml:\d+: invalid YAML: key 'num_layers' given twice"
    ):
        load_model(str(path))
    path = tmp_path / "bytes.yaml"
    path.write_bytes(src.encode() + b"# \xff\n")
    with pytest.raises(InputError, match=r"bytes\.yaml:\d+: not UTF-8"):
        load_model(str(path))


def test_env_overrides_configs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "hardware").mkdir()
    src = (configs_dir() / "models" / "llama-3-8b.yaml").read_text()
    _write(tmp_path / "models" / "tiny.yaml", src.replace("name: llama-3-8b", "name: tiny"))
    monkeypatch.setenv("SERVESIM_CONFIGS", str(tmp_path))
    assert configs_dir() == tmp_path
    assert list_presets() == {"models": ["tiny"], "hardware": []}
    assert load_model("tiny").name == "tiny"
    with pytest.raises(InputError, match="llama-3-8b"):
        load_model("llama-3-8b")


def test_specs_forbid_extra_fields() -> None:
    fields = {"name": "x", "source": "y", "peak_flops": 1, "hbm_bandwidth": 1, "memory_bytes": 1}
    assert HardwareSpec.model_validate(fields).peak_flops == 1
    with pytest.raises(ValueError):
        HardwareSpec.model_validate({**fields, "z": 1})
    assert "tie_embeddings" in ModelSpec.model_fields


def _copy_presets(tmp_path: Path, model: str, hardware: str) -> tuple[str, str]:
    """A model and a GPU servesim does not ship: the presets' schema, under other names."""
    m = (configs_dir() / "models" / f"{model}.yaml").read_text()
    h = (configs_dir() / "hardware" / f"{hardware}.yaml").read_text()
    mp = _write(tmp_path / "my-model.yaml", m.replace(f"name: {model}", "name: my-model"))
    hp = _write(tmp_path / "my-gpu.yaml", h.replace(f"name: {hardware}", "name: my-gpu"))
    return str(mp), str(hp)


@pytest.mark.parametrize("kind", ["roofline", "profiled"])
def test_every_cost_model_takes_preset_paths(tmp_path: Path, kind: str) -> None:
    """cost_model.model/hardware by path time steps and derive the KV budget as by name."""
    from simulator.cost import build_cost_model
    from simulator.cost.batch import Batch
    from simulator.scenario.runner import resolve
    from tests.paths import DATA

    model_path, hw_path = _copy_presets(tmp_path, "llama-3.1-8b", "rtx-4090")
    cost: dict[str, object] = {"type": kind, "model": "llama-3.1-8b", "hardware": "rtx-4090"}
    if kind == "profiled":
        cost["profile"] = str(DATA / "llmservingsim" / "profiles" / "RTX4090" / "Llama-3.1-8B")
    scenario = {
        "name": "paths",
        "scheduler": {"max_num_batched_tokens": 2048, "max_num_seqs": 256},
        "cost_model": cost,
        "workload": {
            "num_requests": 1,
            "arrival": {"rate": 1},
            "prompt_len": {"dist": "fixed", "value": 8},
            "output_len": {"dist": "fixed", "value": 2},
        },
    }
    by_path = {**scenario, "cost_model": {**cost, "model": model_path, "hardware": hw_path}}
    a, b = resolve(scenario), resolve(by_path)
    assert a.scheduler.num_blocks == b.scheduler.num_blocks > 0
    batch = Batch([100, 1, 1], [0, 500, 900])
    assert build_cost_model(a.cost_model).step_time(batch) == build_cost_model(
        b.cost_model
    ).step_time(batch)


def test_fitted_preset_may_name_its_presets_by_path(tmp_path: Path) -> None:
    from simulator.scenario.runner import resolve

    model_path, hw_path = _copy_presets(tmp_path, "llama-2-70b", "h100-sxm")
    src = (configs_dir() / "fitted" / "llama-2-70b_h100-sxm_tp4.yaml").read_text()
    src = src.replace("model: llama-2-70b", f"model: {model_path}")
    fitted = _write(
        tmp_path / "fit.yaml", src.replace("hardware: h100-sxm", f"hardware: {hw_path}")
    )
    scenario = {
        "name": "fitted-paths",
        "scheduler": {"max_num_batched_tokens": 2048, "max_num_seqs": 64},
        "cost_model": {"type": "fitted", "path": "llama-2-70b_h100-sxm_tp4"},
        "workload": {
            "num_requests": 1,
            "arrival": {"rate": 1},
            "prompt_len": {"dist": "fixed", "value": 8},
            "output_len": {"dist": "fixed", "value": 2},
        },
    }
    by_path = {**scenario, "cost_model": {"type": "fitted", "path": str(fitted)}}
    assert resolve(scenario).scheduler.num_blocks == resolve(by_path).scheduler.num_blocks
