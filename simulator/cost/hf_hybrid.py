"""The 2025-2026 families whose layers are not all full attention, read from their
``config.json``: gpt-oss (sliding window on every other layer, attention sinks, MoE), Gemma 4
(5 sliding : 1 global, other head shapes on the global layers, a dense MLP beside the
experts), Qwen3.5-MoE (Gated DeltaNet on 3 of 4 layers), Nemotron-H (Mamba2 layers,
``hybrid_override_pattern``) and DeepSeek-V3.2 (MLA with a lightning indexer,
``index_topk``: ``dsa_layout``).

Each family's keys are read as its ``transformers`` / vLLM configuration reads them (field by
field: ``docs/hybrid-kv.md``). A layer kind servesim cannot hold is refused in one line naming
the field and the value.
"""

from __future__ import annotations

from typing import Any, Protocol

from simulator.cost.layer_layout import LayerKind, LayerLayout
from simulator.errors import InputError

__all__ = ["HYBRID", "dsa_layout", "hybrid_fields", "layer_kinds", "windowed"]

HYBRID = ("gpt_oss", "gemma4_text", "qwen3_5_moe_text", "nemotron_h")
"""``model_type`` values (of the text model) read here; ``deepseek_v32`` is read as
DeepSeek-V3 plus ``dsa_layout``."""


class HFConfig(Protocol):
    """What of ``hf_config.HFConfig`` these read (a protocol: that module uses this one)."""

    raw: dict[str, Any]

    def fail(self, key: str, why: str) -> InputError: ...
    def integer(self, key: str, default: int | None = None, *, why: str = "") -> int: ...
    def optional(self, key: str) -> int | None: ...


LAYER_TYPES: dict[str, LayerKind] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "linear_attention": "linear",
}
"""``layer_types`` values servesim holds, and the kind each is."""

_PATTERN: dict[str, LayerKind | None] = {"M": "mamba", "*": "full", "-": None}
"""``hybrid_override_pattern`` characters: Mamba2, attention, MLP-only (no token mixer)."""


def layer_kinds(cfg: HFConfig, num_layers: int) -> tuple[LayerKind, ...] | None:
    """The kinds ``layer_types`` lists (None when absent); an unknown value -> error."""
    types = cfg.raw.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise cfg.fail("layer_types", f"expected a list of {num_layers} layer kinds")
    for value in types:
        if value not in LAYER_TYPES:
            known = ", ".join(LAYER_TYPES)
            raise cfg.fail("layer_types", f"{value!r} layers cannot be held (known: {known})")
    return tuple(LAYER_TYPES[t] for t in types)


def hybrid_fields(cfg: HFConfig, model_type: str) -> dict[str, Any]:
    """``ModelSpec`` fields of a family in ``HYBRID`` (all but name, source, dtypes)."""
    read = {
        "gpt_oss": _gpt_oss,
        "gemma4_text": _gemma4,
        "qwen3_5_moe_text": _qwen3_5,
        "nemotron_h": _nemotron_h,
    }[model_type]
    fields = read(cfg)
    fields.setdefault("vocab_size", cfg.integer("vocab_size"))
    fields.setdefault("hidden_size", cfg.integer("hidden_size"))
    fields.setdefault("num_heads", cfg.integer("num_attention_heads"))
    fields.setdefault("num_kv_heads", cfg.integer("num_key_value_heads"))
    tie = cfg.raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise cfg.fail("tie_word_embeddings", f"expected true or false, got {tie!r}")
    fields.setdefault("tie_embeddings", tie)
    return fields


def _window(cfg: HFConfig, kinds: tuple[LayerKind, ...]) -> int | None:
    if "sliding" not in kinds:
        return None
    return cfg.integer("sliding_window", why="the sliding layers' window")


def windowed(
    kinds: tuple[LayerKind, ...], window: int | None
) -> tuple[tuple[LayerKind, ...], int | None]:
    """Sliding layers without a window (``sliding_window`` null or absent) attend to every
    token, as ``transformers`` and vLLM run them: full layers."""
    if window is None:
        kinds = tuple("full" if k == "sliding" else k for k in kinds)
    return kinds, window


def _kinds(cfg: HFConfig, num_layers: int) -> tuple[LayerKind, ...]:
    kinds = layer_kinds(cfg, num_layers)
    if kinds is None:
        raise cfg.fail("layer_types", "missing (which layers are which)")
    return kinds


def _gpt_oss(cfg: HFConfig) -> dict[str, Any]:
    """gpt-oss: alternating sliding (128) and full layers, sinks, top-4 of 32/128 experts
    whose width is ``intermediate_size``."""
    n = cfg.integer("num_hidden_layers")
    kinds, window = windowed(_kinds(cfg, n), cfg.optional("sliding_window"))
    width = cfg.integer("intermediate_size")
    layout = LayerLayout(
        kinds=kinds,
        sliding_window=window,
        attention_sinks=True,
        max_position_embeddings=cfg.optional("max_position_embeddings"),
    )
    return {
        "num_layers": n,
        "head_dim": cfg.integer("head_dim"),
        "intermediate_size": width,
        "num_experts": cfg.integer("num_local_experts", why="experts of an MoE model"),
        "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
        "moe_intermediate_size": width,
        "layers": layout,
    }


def _gemma4(cfg: HFConfig) -> dict[str, Any]:
    """Gemma 4: sliding layers of ``head_dim`` x ``num_key_value_heads``, global ones of
    ``global_head_dim`` x ``num_global_key_value_heads``; each layer a dense MLP of
    ``intermediate_size`` and (``enable_moe_block``) routed experts beside it."""
    n = cfg.integer("num_hidden_layers")
    if cfg.raw.get("num_kv_shared_layers"):
        raise cfg.fail("num_kv_shared_layers", "layers sharing another's KV cannot be held")
    kinds = _kinds(cfg, n)
    layout = LayerLayout(
        kinds=kinds,
        sliding_window=_window(cfg, kinds),
        global_num_kv_heads=cfg.optional("num_global_key_value_heads"),
        global_head_dim=cfg.optional("global_head_dim"),
        global_k_eq_v=bool(cfg.raw.get("attention_k_eq_v", False)),
        max_position_embeddings=cfg.optional("max_position_embeddings"),
    )
    dense = cfg.integer("intermediate_size")
    fields: dict[str, Any] = {
        "num_layers": n,
        "head_dim": cfg.integer("head_dim"),
        "intermediate_size": dense,
        "layers": layout,
        "qk_norm": True,
    }
    if cfg.raw.get("enable_moe_block"):
        # the dense MLP runs beside the experts for every token: a shared expert of its width
        fields.update(
            num_experts=cfg.integer("num_experts", why="experts of an MoE model"),
            num_experts_per_tok=cfg.integer("top_k_experts", why="experts per token"),
            moe_intermediate_size=cfg.integer("moe_intermediate_size"),
            num_shared_experts=1,
            shared_expert_intermediate_size=dense,
        )
    return fields


def _qwen3_5(cfg: HFConfig) -> dict[str, Any]:
    """Qwen3.5-MoE: Gated DeltaNet layers with a full-attention layer every
    ``full_attention_interval``; every layer MoE with one shared expert."""
    n = cfg.integer("num_hidden_layers")
    listed = layer_kinds(cfg, n)
    if listed is None:
        every = cfg.integer("full_attention_interval", why="which layers are full attention")
        full: LayerKind = "full"
        linear: LayerKind = "linear"
        listed = tuple(full if (i + 1) % every == 0 else linear for i in range(n))
    kinds: tuple[LayerKind, ...] = listed
    ssm = str(cfg.raw.get("mamba_ssm_dtype", "float32"))
    if ssm not in ("float32", "bfloat16", "float16"):
        raise cfg.fail("mamba_ssm_dtype", f"{ssm!r} is not a state dtype servesim holds")
    layout = LayerLayout(
        kinds=kinds,
        sliding_window=_window(cfg, kinds),
        attn_output_gate=bool(cfg.raw.get("attn_output_gate", False)),
        linear_num_key_heads=cfg.integer("linear_num_key_heads"),
        linear_num_value_heads=cfg.integer("linear_num_value_heads"),
        linear_key_head_dim=cfg.integer("linear_key_head_dim"),
        linear_value_head_dim=cfg.integer("linear_value_head_dim"),
        conv_kernel=cfg.integer("linear_conv_kernel_dim", 4),
        state_dtype_bytes=4 if ssm == "float32" else 2,
        max_position_embeddings=cfg.optional("max_position_embeddings"),
    )
    width = cfg.integer("moe_intermediate_size")
    shared = cfg.optional("shared_expert_intermediate_size")
    mlp_only = cfg.raw.get("mlp_only_layers") or []
    if mlp_only:
        raise cfg.fail("mlp_only_layers", f"dense layers {mlp_only} in Qwen3.5 are not read")
    return {
        "num_layers": n,
        "head_dim": cfg.integer("head_dim"),
        # no dense layer: the MLP width stands for nothing but is required
        "intermediate_size": cfg.integer("intermediate_size", width),
        "num_experts": cfg.integer("num_experts", why="experts of an MoE model"),
        "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
        "moe_intermediate_size": width,
        "num_shared_experts": 1 if shared else 0,
        "shared_expert_intermediate_size": shared,
        "qk_norm": True,
        "layers": layout,
    }


def _nemotron_h(cfg: HFConfig) -> dict[str, Any]:
    """Nemotron-H: blocks of one kind each (``hybrid_override_pattern``: ``M`` Mamba2, ``*``
    attention, ``-`` MLP). Held as one layer per token mixer; the MLP blocks' weights and
    FLOPs are spread over them (``intermediate_size`` x MLP blocks / mixers), which keeps
    every total the same."""
    pattern = cfg.raw.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise cfg.fail("hybrid_override_pattern", "missing (which blocks are which)")
    bad = sorted(set(pattern) - set(_PATTERN))
    if bad:
        raise cfg.fail("hybrid_override_pattern", f"blocks {bad} cannot be held (M, *, -)")
    if len(pattern) != cfg.integer("num_hidden_layers"):
        raise cfg.fail("hybrid_override_pattern", "length differs from num_hidden_layers")
    kinds = tuple(k for c in pattern if (k := _PATTERN[c]) is not None)
    mlps = pattern.count("-")
    hidden = cfg.integer("hidden_size")
    heads, head_dim = cfg.integer("mamba_num_heads"), cfg.integer("mamba_head_dim")
    if heads * head_dim != cfg.integer("expand", 2) * hidden:
        raise cfg.fail("mamba_num_heads", "mamba_num_heads x mamba_head_dim != expand x hidden")
    layout = LayerLayout(
        kinds=kinds,
        mamba_num_heads=heads,
        mamba_head_dim=head_dim,
        ssm_state_size=cfg.integer("ssm_state_size"),
        mamba_n_groups=cfg.integer("n_groups", 1),
        conv_kernel=cfg.integer("conv_kernel", 4),
        chunk_size=cfg.integer("chunk_size", 128),
        max_position_embeddings=cfg.optional("max_position_embeddings"),
    )
    return {
        "num_layers": len(kinds),
        "head_dim": cfg.integer("attention_head_dim", cfg.integer("head_dim", 128)),
        "intermediate_size": max(1, round(cfg.integer("intermediate_size") * mlps / len(kinds))),
        "gated_mlp": False,  # squared-ReLU MLP: up and down only
        "layers": layout,
    }


def dsa_layout(cfg: HFConfig, num_layers: int) -> LayerLayout:
    """DeepSeek-V3.2's layers: DeepSeek-V3's MLA, plus a lightning indexer per layer whose top
    ``index_topk`` tokens are all the attention reads."""
    full: LayerKind = "full"
    return LayerLayout(
        kinds=(full,) * num_layers,
        index_topk=cfg.integer("index_topk"),
        index_n_heads=cfg.integer("index_n_heads"),
        index_head_dim=cfg.integer("index_head_dim"),
        max_position_embeddings=cfg.optional("max_position_embeddings"),
    )
