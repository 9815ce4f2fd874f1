"""ModelSpec's MoE, MLA and dtype arithmetic against hand counts and published sizes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from simulator.cost.model_spec import DTYPE_BYTES, ModelSpec
from simulator.cost.presets import list_presets, load_model
from simulator.errors import InputError

BASE = {
    "name": "toy",
    "source": "test",
    "num_layers": 4,
    "hidden_size": 64,
    "num_heads": 8,
    "num_kv_heads": 2,
    "head_dim": 8,
    "intermediate_size": 256,
    "vocab_size": 1000,
}
MOE = {**BASE, "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def test_dense_presets_keep_every_number() -> None:
    # the MoE/MLA/dtype fields default to a dense bf16 model: the old formulas, term for term
    for name in list_presets()["models"]:
        m = load_model(name)
        if m.is_moe:  # the MoE presets (qwen3-30b-a3b) have their own formulas
            continue
        layers = m.num_layers * (m.attn_params_per_layer + m.mlp_params_per_layer)
        head = 0 if m.tie_embeddings else m.embedding_params
        assert m.num_params == m.embedding_params + layers + head
        assert m.active_params == m.num_params
        assert m.matmul_params == layers + m.vocab_size * m.hidden_size
        assert m.weight_bytes == m.num_params * m.dtype_bytes
        assert isinstance(m.weight_bytes, int) and isinstance(m.kv_bytes_per_token, int)
        assert m.kv_bytes_per_token == 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2
        assert m.weight_bytes_per_gpu(4) == m.weight_bytes / 4
        assert m.kv_bytes_per_token_per_gpu(4) == m.kv_bytes_per_token / 4
        assert m.decode_attention_flops_per_pair == m.attention_flops_per_pair
        assert m.moe_layers == () and m.expected_distinct_experts(100) == 0.0
        parts = m.matmul_flops_per_token()
        assert sum(parts.values()) == pytest.approx(m.flops_per_token_matmul, rel=1e-12)


def test_moe_counts_by_hand() -> None:
    m = ModelSpec(**MOE)
    attn = 64 * (64 + 2 * 16) + 64 * 64
    expert = 3 * 64 * 32
    router = 64 * 16
    assert m.moe_layers == (0, 1, 2, 3) and m.num_dense_layers == 0
    assert m.num_params == 2 * 64_000 + 4 * (attn + 16 * expert + router)
    assert m.active_params == 2 * 64_000 + 4 * (attn + 2 * expert + router)
    assert m.matmul_params == 64_000 + 4 * (attn + 2 * expert + router)
    assert m.routed_expert_params == 4 * 16 * expert
    # experts split over the EP ranks, the rest over the TP group
    rest = m.weight_bytes - m.routed_expert_bytes
    assert m.weight_bytes_per_gpu(1, ep=4) == rest + m.routed_expert_bytes / 4
    assert m.weight_bytes_per_gpu(2) == m.weight_bytes / 2
    assert m.experts_per_rank(4) == 4
    with pytest.raises(InputError, match="expert-parallel degree 3 does not divide num_experts=16"):
        m.weight_bytes_per_gpu(1, ep=3)


def test_layer_selection_rules() -> None:
    deepseek = ModelSpec(**{**MOE, "first_k_dense_replace": 1, "num_layers": 6})
    assert deepseek.moe_layers == (1, 2, 3, 4, 5)
    qwen = ModelSpec(**{**MOE, "num_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": (3,)})
    assert qwen.moe_layers == (1, 5) and qwen.num_dense_layers == 4
    expert, mlp = 3 * 64 * 32, 3 * 64 * 256
    assert (
        qwen.num_params - qwen.embedding_params * 2
        == 6 * qwen.attn_params_per_layer + 4 * mlp + 2 * (16 * expert + 64 * 16)
    )


def test_expected_distinct_experts_against_uniform_routing() -> None:
    m = ModelSpec(**MOE)
    e, k = 16, 2
    for t in (1, 3, 10, 200):
        assert m.expected_distinct_experts(t) == pytest.approx(e * (1 - (1 - k / e) ** t))
    assert m.expected_distinct_experts(1) == pytest.approx(k)
    assert m.expected_distinct_experts(10_000) == pytest.approx(e)
    assert m.expected_distinct_experts(5, ep=4) == pytest.approx(m.expected_distinct_experts(5) / 4)
    assert m.touched_expert_bytes(1) == pytest.approx(4 * 2 * m.expert_bytes)


def test_expected_distinct_experts_by_simulation() -> None:
    # uniform top-k routing without replacement, drawn: the closed form is its mean
    import numpy as np

    m, rng = ModelSpec(**MOE), np.random.default_rng(7)
    for tokens in (1, 4, 12):
        seen = [
            len({int(x) for _ in range(tokens) for x in rng.choice(16, size=2, replace=False)})
            for _ in range(4000)
        ]
        assert np.mean(seen) == pytest.approx(m.expected_distinct_experts(tokens), rel=0.02)


def test_shared_experts() -> None:
    one = ModelSpec(**{**MOE, "num_shared_experts": 2})
    assert one.shared_expert_params_per_layer == 2 * 3 * 64 * 32
    wide = ModelSpec(**{**MOE, "num_shared_experts": 1, "shared_expert_intermediate_size": 100})
    assert wide.shared_expert_params_per_layer == 3 * 64 * 100
    base = ModelSpec(**MOE)
    assert wide.active_params - base.active_params == 4 * 3 * 64 * 100
    assert wide.matmul_flops_per_token()["shared_experts"] == 2.0 * 4 * 3 * 64 * 100


def test_mla_kv_and_attention() -> None:
    mla = ModelSpec(
        **{
            **BASE,
            "num_kv_heads": 8,
            "head_dim": 12,
            "kv_lora_rank": 32,
            "q_lora_rank": 48,
            "qk_rope_head_dim": 4,
            "qk_nope_head_dim": 8,
            "v_head_dim": 8,
        }
    )
    # the latent and the shared rotary key per token and layer, whole on every TP rank
    assert mla.kv_bytes_per_token == 4 * (32 + 4) * 2
    assert mla.kv_bytes_per_token_per_gpu(4) == mla.kv_bytes_per_token
    q = 48 * (64 + 8 * 12)
    kv = 64 * (32 + 4) + 32 * 8 * (8 + 8)
    assert mla.attn_params_per_layer == q + kv + 8 * 8 * 64
    assert mla.attention_flops_per_pair == 2.0 * 4 * 8 * (8 + 4 + 8)
    assert mla.decode_attention_flops_per_pair == 2.0 * 4 * 8 * (2 * 32 + 4)


def test_dtypes() -> None:
    assert DTYPE_BYTES == {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
    m = ModelSpec(**MOE)
    fp8 = m.with_dtypes("fp8", "fp8")
    kept = 2 * 64_000 + 4 * 64 * 16  # embedding, LM head and routers stay bf16
    assert fp8.weight_bytes == kept * 2 + (m.num_params - kept)
    assert fp8.kv_bytes_per_token == m.kv_bytes_per_token // 2
    fp4 = m.with_dtypes("fp4", None)
    assert fp4.weight_bytes == kept * 2 + (m.num_params - kept) // 2
    assert fp4.kv_bytes_per_token == m.kv_bytes_per_token
    assert fp4.expert_bytes == 3 * 64 * 32 // 2
    assert m.with_dtypes(None, None) is m


@pytest.mark.parametrize(
    ("update", "needle"),
    [
        ({"num_experts": 8}, "num_experts_per_tok and moe_intermediate_size"),
        ({**MOE, "num_experts_per_tok": 17}, "exceeds num_experts"),
        ({"kv_lora_rank": 8}, "qk_rope_head_dim"),
        ({"weight_dtype": "int4"}, "weight_dtype"),
    ],
)
def test_bad_shapes_are_refused(update: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        ModelSpec(**{**BASE, **update})
