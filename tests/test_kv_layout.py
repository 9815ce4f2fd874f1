"""The KV groups and blocks servesim derives for real models equal vLLM 0.33's own, for every
derived point of tests/data/vllm_v1_scheduler/kv_blocks.json (8 models x TP 1/2/4/8 x prefix
caching on/off x 4/16/60 GiB, derived by vLLM's code on CPU: tools/vllm_recorder/README.md,
"KV blocks of real models"), with the CPU backend's block rules; and DeepSeek-V3.2, which vLLM
cannot build on CPU, derived from its code (docs/hybrid-kv.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulator.cost.hf_config import read_hf_config
from simulator.cost.kv_layout import (
    CPU,
    FLASH_ATTENTION,
    FLASHMLA_SPARSE,
    KVLayout,
    LayerCache,
    derive_layout,
    layer_caches,
)
from simulator.errors import InputError

DATA = Path(__file__).parent / "data" / "vllm_v1_scheduler" / "kv_blocks.json"
MODELS = Path(__file__).parents[2] / "shared" / "data" / "models"
KINDS = {
    "FullAttentionSpec": "full",
    "SlidingWindowSpec": "sliding_window",
    "MambaSpec": "mamba",
    "ChunkedLocalAttentionSpec": "chunked_local",
}


def _llama4_caches(tp: int) -> list[LayerCache]:
    """Llama 4 Scout's text layers (not a family servesim prices: built here from its
    config.json): local attention in chunks of ``attention_chunk_size``, every 4th layer
    global (vLLM's default ``no_rope_layers``)."""
    text = json.loads((MODELS / "Llama-4-Scout-17B-16E-Instruct.json").read_text())["text_config"]
    per_token = 2 * max(1, text["num_key_value_heads"] // tp) * text["head_dim"] * 2
    chunk = text["attention_chunk_size"]
    return [
        LayerCache("full", per_token)
        if (i + 1) % 4 == 0
        else LayerCache("chunked_local", per_token, 0, chunk)
        for i in range(text["num_hidden_layers"])
    ]


def _layout(row: dict[str, Any]) -> KVLayout:
    if row["model"].startswith("Llama-4"):
        caches, chunk = _llama4_caches(row["tp"]), 64
    else:
        model = read_hf_config(MODELS / f"{row['model']}.json")
        caches = layer_caches(model, row["tp"])
        chunk = model.layers.chunk_size if model.layers is not None else 64
    return derive_layout(
        caches,
        backend=CPU,
        prefix_caching=row["enable_prefix_caching"],
        max_model_len=row["max_model_len"],
        mamba_chunk=chunk,
    )


def _vllm_groups(point: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            KINDS[g["type"]],
            g["layers"],
            g["block_size"],
            g["page_size_bytes"],
            g.get("sliding_window"),
            g.get("mamba_cache_mode"),
        )
        for g in point["groups"]
    )


def _ours(layout: KVLayout) -> list[tuple[Any, ...]]:
    return sorted(
        (
            g.kind,
            g.num_layers,
            g.block_size,
            g.page_bytes,
            g.window if g.kind == "sliding_window" else None,  # the chunk is not recorded
            g.mamba_mode,
        )
        for g in layout.groups
    )


def test_every_derived_point_equals_vllms() -> None:
    data = json.loads(DATA.read_text())
    matched = refused = 0
    for row in data["cases"]:
        if "error" in row:  # DeepSeek-V3.2: vLLM's CPU platform refuses sparse attention
            continue
        layout = _layout(row)
        where = (row["model"], row["tp"], row["enable_prefix_caching"])
        for point in row["by_memory"]:
            memory = point["kv_memory_bytes"]
            fits = layout.request_bytes(row["max_model_len"], 8192) <= memory
            if "error" in point:  # too little memory for one max_model_len request
                assert not fits, where
                refused += 1
                continue
            assert fits, where
            assert _ours(layout) == _vllm_groups(point), where
            assert layout.num_blocks(memory) == point["num_blocks"], where
            assert layout.scheduler_block_size == point["scheduler_block_size"], where
            assert layout.hash_block_size == point["hash_block_size"], where
            matched += 1
    assert (matched, refused) == (166, 2)


@pytest.mark.parametrize(
    ("prefix_caching", "block", "mamba_block"), [(False, 4128, 8192), (True, 4224, 4224)]
)
def test_nemotron_on_a_gpu(prefix_caching: bool, block: int, mamba_block: int) -> None:
    """The Mamba rule with FlashAttention's kernel block 16: 16 x ceil(M / (16 P)) without
    prefix caching; lcm(16, chunk 128) = 128 in ``align`` mode."""
    model = read_hf_config(MODELS / "Nemotron-H-56B-Base-8K.json")
    layout = derive_layout(
        layer_caches(model, 1),
        backend=FLASH_ATTENTION,
        prefix_caching=prefix_caching,
        max_model_len=8192,
        mamba_chunk=128,
    )
    full = [g for g in layout.groups if g.kind == "full"]
    mamba = [g for g in layout.groups if g.kind == "mamba"]
    assert [g.block_size for g in full] == [block] and len(mamba) == 6
    assert {g.block_size for g in mamba} == {mamba_block}
    assert layout.bytes_per_block == 10 * block * 4096  # 8 KV heads x 128 x K,V x bf16


@pytest.mark.parametrize(("kv_dtype", "mla_bytes"), [(None, 1152), ("fp8", 656)])
def test_deepseek_v32_packs_its_indexer(kv_dtype: str | None, mla_bytes: int) -> None:
    """Not derivable on CPU: from vLLM's code, each of the 61 layers keeps MLA's 576-wide
    latent (bf16 1,152 B/token; fp8_ds_mla 656) and the indexer's 132 B/token, packed into
    one group of block 64 (FlashMLA sparse)."""
    model = read_hf_config(MODELS / "DeepSeek-V3.2.json").with_dtypes(None, kv_dtype)  # type: ignore[arg-type]
    for tp in (1, 8):  # the latent is not split over TP
        layout = derive_layout(
            layer_caches(model, tp),
            backend=FLASHMLA_SPARSE,
            prefix_caching=True,
            max_model_len=8192,
        )
        assert [(g.kind, g.num_layers, g.block_size) for g in layout.groups] == [("full", 61, 64)]
        assert layout.bytes_per_block == 61 * 64 * (mla_bytes + 132)


def test_pages_that_cannot_share_a_pool_are_refused() -> None:
    caches = [LayerCache("full", 96), LayerCache("sliding_window", 64, 0, 128)]
    with pytest.raises(InputError, match="cannot share one pool"):
        derive_layout(caches, backend=FLASH_ATTENTION, prefix_caching=False, max_model_len=4096)
