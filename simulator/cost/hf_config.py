"""A model shape from a Hugging Face ``config.json``: dense Llama, Mistral, Qwen2 and Qwen3;
MoE Qwen2-MoE, Qwen3-MoE, Mixtral, Phi-MoE, DeepSeek-V2/V3 (with MLA attention); GQA,
``head_dim``, tied embeddings, and ``quantization_config`` for fp8/fp4 weights.

Each family's keys are read as its ``transformers`` configuration class defines them (field
by field: ``docs/cost_models.md``, "Models from a Hugging Face config.json"). What the cost
models cannot price (another architecture, sliding-window or linear-attention layers, an
integer quantization) is refused in one line naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.cost.hf_hybrid import HYBRID, dsa_layout, hybrid_fields, layer_kinds, windowed
from simulator.cost.layer_layout import LayerLayout
from simulator.cost.model_spec import Dtype, ModelSpec
from simulator.errors import InputError, reason_of

__all__ = ["ARCHITECTURES", "read_hf_config"]

DENSE = ("llama", "mistral", "qwen2", "qwen3")
MOE = ("qwen2_moe", "qwen3_moe", "mixtral", "phimoe", "deepseek_v2", "deepseek_v3", "deepseek_v32")
DEEPSEEK = ("deepseek_v2", "deepseek_v3", "deepseek_v32")
TEXT_MODELS = {"qwen3_vl_text": "qwen3", "qwen2_5_vl_text": "qwen2", "qwen2_vl_text": "qwen2"}
"""A multimodal model's language model (``text_config``) read as this family."""

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "PhiMoEForCausalLM": "phimoe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "GptOssForCausalLM": "gpt_oss",
    "NemotronHForCausalLM": "nemotron_h",
}
"""``architectures`` entry -> the ``model_type`` it is read as (when ``model_type`` is absent)."""


class HFConfig:
    """The raw mapping and its path, with typed, one-line-error getters."""

    def __init__(self, path: Path, raw: dict[str, Any]) -> None:
        self.path, self.raw = path, raw

    def fail(self, key: str, why: str) -> InputError:
        """An error naming the file and the key."""
        return InputError(f"{self.path}: field {key!r}: {why}")

    def integer(self, key: str, default: int | None = None, *, why: str = "") -> int:
        """A positive integer at ``key`` (``default`` if absent and given)."""
        value = self.raw.get(key)
        if value is None:
            if default is not None:
                return default
            raise self.fail(key, f"missing{f' ({why})' if why else ''}")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, f"expected a positive integer, got {value!r}")
        return value

    def optional(self, key: str) -> int | None:
        """A positive integer at ``key``, or None when absent or null."""
        return None if self.raw.get(key) is None else self.integer(key)


def read_hf_config(path: str | Path) -> ModelSpec:
    """The shape a Hugging Face ``config.json`` describes; anything it cannot price ->
    ``InputError`` naming the file and the key."""
    cfg = HFConfig(Path(path), _text_model(_read_json(Path(path))))
    model_type = _model_type(cfg)
    if model_type in HYBRID:
        fields = {"name": _name(cfg), "dtype_bytes": 2, **hybrid_fields(cfg, model_type)}
    else:
        fields = _attention(cfg, model_type)
        fields.update(_common(cfg))
    if model_type in MOE:
        fields.update(_experts(cfg, model_type))
    if model_type == "deepseek_v32":
        fields["layers"] = dsa_layout(cfg, fields["num_layers"])
    fields["weight_dtype"] = _quantized_dtype(cfg)
    fields["source"] = _source(cfg, model_type, fields.get("layers") is not None)
    try:
        return ModelSpec(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "shape"
        raise InputError(f"{cfg.path}: {loc}: {' '.join(first['msg'].split())}") from None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        # a real run's model: the files the real-* scenarios read, not fetched yet
        fetch = (
            "; `servesim fetch llmservingsim` downloads it" if "llmservingsim" in path.parts else ""
        )
        raise InputError(f"model file {path}: not found (relative to {Path.cwd()}){fetch}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not a readable JSON file ({reason_of(err)})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object of config keys")
    return data


def _text_model(raw: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's language model (``text_config``; the vision tower keeps no KV
    and is not priced), with the keys it inherits from the top level."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return raw
    out = dict(text)
    for key in ("quantization_config", "tie_word_embeddings", "_name_or_path"):
        if key in raw and key not in out:
            out[key] = raw[key]
    return out


def _model_type(cfg: HFConfig) -> str:
    """The family: ``model_type``, else the first ``architectures`` entry; unknown -> error."""
    known = ", ".join((*DENSE, *MOE, *HYBRID, *TEXT_MODELS))
    model_type = TEXT_MODELS.get(str(cfg.raw.get("model_type")), cfg.raw.get("model_type"))
    if model_type is None:
        archs = cfg.raw.get("architectures") or []
        first = archs[0] if isinstance(archs, list) and archs else None
        if first not in ARCHITECTURES:
            raise cfg.fail("architectures", f"{first!r} cannot be priced (known: {known})")
        return ARCHITECTURES[first]
    if model_type not in (*DENSE, *MOE, *HYBRID):
        raise cfg.fail("model_type", f"{model_type!r} cannot be priced (known: {known})")
    return str(model_type)


def _common(cfg: HFConfig) -> dict[str, Any]:
    """Fields every family shares: layers, widths, vocabulary, tying, activation dtype."""
    num_layers = cfg.integer("num_hidden_layers")
    kinds = layer_kinds(cfg, num_layers)
    layers = None
    if kinds is not None:  # e.g. Qwen2's sliding layers
        kinds, window = windowed(kinds, cfg.optional("sliding_window"))
        if set(kinds) != {"full"}:
            window = window if "sliding" in kinds else None
            context = cfg.optional("max_position_embeddings")
            layers = LayerLayout(
                kinds=kinds, sliding_window=window, max_position_embeddings=context
            )
    tie = cfg.raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise cfg.fail("tie_word_embeddings", f"expected true or false, got {tie!r}")
    return {
        "name": _name(cfg),
        "num_layers": num_layers,
        "layers": layers,
        "hidden_size": cfg.integer("hidden_size"),
        "intermediate_size": cfg.integer("intermediate_size"),
        "vocab_size": cfg.integer("vocab_size"),
        "tie_embeddings": tie,
        "qk_norm": str(cfg.raw.get("model_type")) in ("qwen3", "qwen3_moe")
        or _architecture(cfg) in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        "gated_mlp": True,  # every family read here has a SwiGLU MLP / SwiGLU experts
        "dtype_bytes": 2,  # bf16/fp16 activations (vLLM's dtype "auto" for these checkpoints)
    }


def _attention(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """Heads and head widths: GQA (``num_key_value_heads``, ``head_dim``) or DeepSeek's MLA."""
    heads = cfg.integer("num_attention_heads")
    kv_heads = cfg.integer("num_key_value_heads", heads)
    if model_type in DEEPSEEK:
        rope = cfg.integer("qk_rope_head_dim", why="MLA's rotary key width")
        nope = cfg.integer("qk_nope_head_dim", why="MLA's non-rotary query/key width")
        return {
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": nope + rope,
            "kv_lora_rank": cfg.integer("kv_lora_rank", why="MLA's compressed KV width"),
            "q_lora_rank": cfg.optional("q_lora_rank"),
            "qk_rope_head_dim": rope,
            "qk_nope_head_dim": nope,
            "v_head_dim": cfg.integer("v_head_dim", why="MLA's value head width"),
        }
    hidden = cfg.integer("hidden_size")
    if cfg.raw.get("head_dim") is None and hidden % heads:
        raise cfg.fail(
            "head_dim", f"missing, and hidden_size {hidden} is not a multiple of {heads}"
        )
    return {
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": cfg.integer("head_dim", hidden // heads),
    }


def _experts(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """Routed and shared experts, and which layers have them, in the family's own keys."""
    top_k = cfg.integer("num_experts_per_tok", why="routed experts per token of an MoE model")
    if model_type in ("mixtral", "phimoe"):  # every layer MoE; intermediate_size is an expert's
        return {
            "num_experts": cfg.integer("num_local_experts", why="experts of an MoE model"),
            "num_experts_per_tok": top_k,
            "moe_intermediate_size": cfg.integer("intermediate_size"),
        }
    width = cfg.integer("moe_intermediate_size", why="width of one expert of an MoE model")
    if model_type in DEEPSEEK:
        if cfg.integer("moe_layer_freq", 1) != 1:
            raise cfg.fail("moe_layer_freq", "only 1 (every layer after the dense ones) is priced")
        return {
            "num_experts": cfg.integer("n_routed_experts", why="routed experts of an MoE model"),
            "num_experts_per_tok": top_k,
            "moe_intermediate_size": width,
            "num_shared_experts": _count(cfg, "n_shared_experts"),
            "first_k_dense_replace": _count(cfg, "first_k_dense_replace"),
        }
    fields: dict[str, Any] = {
        "num_experts": cfg.integer("num_experts", why="routed experts of an MoE model"),
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": width,
        "decoder_sparse_step": cfg.integer("decoder_sparse_step", 1),
        "mlp_only_layers": _layer_list(cfg, "mlp_only_layers"),
    }
    shared = cfg.optional("shared_expert_intermediate_size")
    if model_type == "qwen2_moe" and shared:  # one shared expert of that width
        fields.update(num_shared_experts=1, shared_expert_intermediate_size=shared)
    return fields


def _architecture(cfg: HFConfig) -> str | None:
    """The first ``architectures`` entry, if any."""
    archs = cfg.raw.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else None


def _count(cfg: HFConfig, key: str) -> int:
    """A non-negative integer at ``key`` (0 when absent or null)."""
    value = cfg.raw.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise cfg.fail(key, f"expected a non-negative integer, got {value!r}")
    return value


def _layer_list(cfg: HFConfig, key: str) -> tuple[int, ...]:
    value = cfg.raw.get(key) or []
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise cfg.fail(key, f"expected a list of layer indices, got {value!r}")
    return tuple(value)


def _quantized_dtype(cfg: HFConfig) -> Dtype | None:
    """Weight dtype of a quantized checkpoint (``quantization_config``); None if unquantized."""
    quant = cfg.raw.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise cfg.fail("quantization_config", "expected an object")
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    if method == "mxfp4":
        return "fp4"
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        if algo in ("FP8", "NVFP4"):
            return "fp8" if algo == "FP8" else "fp4"
        raise cfg.fail("quantization_config.quant_algo", f"{algo!r} cannot be priced (FP8, NVFP4)")
    if method == "compressed-tensors":
        return _compressed_tensors_dtype(cfg, quant)
    raise cfg.fail(
        "quantization_config.quant_method",
        f"{method!r} cannot be priced (known: fp8, fbgemm_fp8, mxfp4, modelopt, "
        "compressed-tensors with float weights)",
    )


def _compressed_tensors_dtype(cfg: HFConfig, quant: dict[str, Any]) -> Dtype:
    """fp8 or fp4 from the weights of a compressed-tensors scheme (all groups must agree)."""
    groups = quant.get("config_groups") or {}
    found: set[tuple[Any, Any]] = set()
    for group in groups.values() if isinstance(groups, dict) else []:
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict):
            found.add((weights.get("num_bits"), weights.get("type")))
    if found == {(8, "float")}:
        return "fp8"
    if found == {(4, "float")}:
        return "fp4"
    raise cfg.fail(
        "quantization_config.config_groups",
        f"weights {sorted(map(str, found)) or 'not given'} cannot be priced (8- or 4-bit float)",
    )


def _name(cfg: HFConfig) -> str:
    """``_name_or_path``'s last part, else the file's (or, for ``config.json``, its folder's)."""
    given = cfg.raw.get("_name_or_path")
    if isinstance(given, str) and given.strip("/"):
        return given.rstrip("/").rsplit("/", 1)[-1]
    return cfg.path.parent.name if cfg.path.stem == "config" else cfg.path.stem


def _source(cfg: HFConfig, model_type: str, layered: bool) -> str:
    window = cfg.raw.get("sliding_window")
    sliding = cfg.raw.get("use_sliding_window", window is not None) and not layered
    note = f"; sliding_window {window} not modelled (full attention)" if sliding and window else ""
    return f"Hugging Face config.json {cfg.path} (model_type {model_type}){note}"
