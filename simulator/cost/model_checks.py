"""The checks a model shape must pass: heads, experts, MLA and layer kinds that agree (a typo
in a preset or a config.json is refused here, naming the fields)."""

from __future__ import annotations

from typing import Any


def check_shape(m: Any) -> None:
    """Raise ``ValueError`` naming the fields of a ``ModelSpec`` that contradict each other."""
    # GQA groups query heads evenly over KV heads; anything else is a typo in the preset.
    if m.num_heads % m.num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({m.num_heads}) must be a multiple of num_kv_heads ({m.num_kv_heads})"
        )
    moe = (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size)
    if any(v is not None for v in moe) and any(v is None for v in moe):
        raise ValueError(
            "an MoE model needs num_experts, num_experts_per_tok and moe_intermediate_size"
        )
    e, k = m.num_experts, m.num_experts_per_tok
    if e is not None and k is not None and k > e:
        raise ValueError(f"num_experts_per_tok ({k}) exceeds num_experts ({e})")
    mla = (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim)
    if any(v is not None for v in mla) and any(v is None for v in mla):
        raise ValueError(
            "MLA attention needs kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim"
        )
    if m.layers is not None and len(m.layers.kinds) != m.num_layers:
        raise ValueError(f"layers: {len(m.layers.kinds)} kinds for {m.num_layers}")
