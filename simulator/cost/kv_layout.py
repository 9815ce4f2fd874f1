"""The KV-cache groups and blocks vLLM derives for a model (``get_kv_cache_configs`` and the
platform's block-size rules, vLLM 0.33), as plain data: which layers share a group, each
group's tokens per block and page bytes, the bytes of one block of the one pool, and so how
many blocks a memory holds.

The rules (``tools/vllm_recorder/README.md``, "What the real scheduler does with hybrid groups",
"Mamba block-size rule"; ``docs/hybrid-kv.md``):

1. Mamba / linear-attention layers: the attention block grows to ``A * ceil(M / (A * P))``
   tokens (``P`` attention bytes per token, ``M`` one request's state bytes, ``A`` the
   attention backend's kernel block, in ``align`` mode lcm'd with the scan's chunk), and the
   state page is padded to that attention page; the Mamba block size is the attention block
   (``align``, prefix caching on) or ``max_model_len`` (``none``).
2. Pages of different sizes are unified by scaling the smaller pages' block sizes.
3. Layers with one spec form a bucket; the group size is the smallest bucket's layer count
   (the largest if it is under 1.5x the smallest); a bucket of ``n`` layers gives
   ``ceil(n / size)`` groups, group ``i`` taking every ``ceil(n / size)``-th layer from ``i``.
4. A block is one page of every layer of a group: bytes per block = the largest group's
   layers x the page; ``num_blocks = memory // bytes per block``.

``tests/test_kv_layout.py`` checks every derived row of vLLM's own figures
(``tests/data/vllm_v1_scheduler/kv_blocks.json``) against this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from simulator.cost.model_spec import ModelSpec
from simulator.errors import InputError

__all__ = [
    "CPU",
    "FLASH_ATTENTION",
    "FLASHMLA_SPARSE",
    "Backend",
    "GroupLayout",
    "KVLayout",
    "LayerCache",
    "derive_layout",
    "layer_caches",
]

CacheKind = Literal["full", "sliding_window", "chunked_local", "mamba"]


@dataclass(frozen=True)
class Backend:
    """An attention backend's block sizes: the smallest kernel block it runs and the block
    size vLLM uses when ``--block-size`` is not given."""

    name: str
    kernel_block: int
    default_block: int


FLASH_ATTENTION = Backend("FlashAttention (GPU)", 16, 16)
"""A GPU's default: kernel blocks ``MultipleOf(16)``, block 16."""
CPU = Backend("CPU attention", 32, 128)
"""vLLM's CPU backend (what ``kv_blocks.json`` was derived on): ``MultipleOf(32)``, block 128."""
FLASHMLA_SPARSE = Backend("FlashMLA sparse (GPU)", 64, 64)
"""DeepSeek-V3.2's sparse MLA: kernel blocks of 64."""


@dataclass(frozen=True)
class LayerCache:
    """What one layer keeps per request on one GPU: attention bytes per token (with anything
    packed beside them, such as DeepSeek-V3.2's indexer keys), or a Mamba / linear-attention
    state of fixed bytes."""

    kind: CacheKind
    bytes_per_token: int = 0
    state_bytes: int = 0
    window: int | None = None
    """Sliding window or local-attention chunk, tokens."""


@dataclass(frozen=True)
class GroupLayout:
    """One KV-cache group: its kind, layers, tokens per block and bytes of one layer's page."""

    kind: CacheKind
    num_layers: int
    block_size: int
    page_bytes: int
    window: int | None = None
    mamba_mode: Literal["none", "align"] | None = None


@dataclass(frozen=True)
class KVLayout:
    """The groups of one pool, the bytes of one block and the block sizes the scheduler sees."""

    groups: tuple[GroupLayout, ...]
    layers: tuple[tuple[LayerCache, int, int], ...]
    """Each layer's cache with its final (block size, page bytes), for the start-up check."""
    bytes_per_block: int
    scheduler_block_size: int
    hash_block_size: int
    mamba_mode: Literal["none", "align"] = "none"
    """How the state layers keep states: one per request (``none``) or at block boundaries
    (``align``, prefix caching on)."""

    def num_blocks(self, memory_bytes: float) -> int:
        """Blocks ``memory_bytes`` of KV memory holds (vLLM: ``memory // bytes_per_block``)."""
        return int(memory_bytes // self.bytes_per_block)

    def blocks_held(self, tokens: int) -> int:
        """Blocks of the pool one request of ``tokens`` computed tokens holds once its
        prefill is done: every block of a full group, the window's (plus the block it
        starts in) of a sliding group, one state (``none``) or two (``align``) of a Mamba
        group."""
        total = 0
        for g in self.groups:
            whole = -(-tokens // g.block_size)
            if g.kind == "mamba":
                total += 1 if g.mamba_mode == "none" else min(2, whole)
            elif g.kind == "full":
                total += whole
            else:
                total += min(whole, -(-((g.window or 1) - 1) // g.block_size) + 1)
        return total

    def request_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Bytes one request of ``max_model_len`` tokens may need, summed over layers (vLLM's
        start-up check ``max_memory_usage_bytes``): every block of a full layer; the window
        plus a step's tokens and one block of a sliding layer; one (``none``) or two
        (``align``) states of a Mamba layer."""
        total = 0
        for cache, block, page in self.layers:
            if cache.kind == "mamba":
                total += page * (2 if self.mamba_mode == "align" else 1)
            elif cache.kind == "full":
                total += -(-max_model_len // block) * page
            else:
                tokens = min((cache.window or 1) - 1 + max_num_batched_tokens, max_model_len)
                total += (-(-tokens // block) + 1) * page
        return total


def derive_layout(
    layers: Sequence[LayerCache],
    *,
    backend: Backend,
    prefix_caching: bool,
    max_model_len: int,
    block_size: int | None = None,
    mamba_chunk: int = 64,
) -> KVLayout:
    """The groups vLLM derives for these layers (rules in the module docstring):
    ``block_size`` is ``--block-size`` (None: the backend's default), ``mamba_chunk`` the
    state layers' prefill chunk (their cached states are aligned to it)."""
    attention = [c for c in layers if c.kind != "mamba"]
    if not attention:
        raise InputError("a model without attention layers cannot be held (no KV pages)")
    block = block_size or backend.default_block
    mode: Literal["none", "align"] = "align" if prefix_caching else "none"
    mamba_block, mamba_page = max_model_len, 0
    if any(c.kind == "mamba" for c in layers):
        per_token = attention[0].bytes_per_token
        state = max(c.state_bytes for c in layers)
        align = max(backend.kernel_block, block)
        if prefix_caching:
            align = math.lcm(align, mamba_chunk)
        block = max(block, align * -(-state // (align * per_token)))
        mamba_page = block * per_token
        mamba_block = block if prefix_caching else max_model_len
    specs = [
        (c, mamba_block, mamba_page) if c.kind == "mamba" else (c, block, block * c.bytes_per_token)
        for c in layers
    ]
    specs = _unify_pages(specs)
    groups = _groups(specs, mode)
    sizes = [g.block_size for g in groups]
    scheduler = math.lcm(*sizes)
    cacheable = prefix_caching and not any(g.kind == "mamba" and mode == "none" for g in groups)
    return KVLayout(
        groups=tuple(groups),
        layers=tuple(specs),
        bytes_per_block=max(g.num_layers * g.page_bytes for g in groups),
        scheduler_block_size=scheduler,
        hash_block_size=math.gcd(*sizes) if cacheable else scheduler,
        mamba_mode=mode,
    )


def _unify_pages(
    specs: list[tuple[LayerCache, int, int]],
) -> list[tuple[LayerCache, int, int]]:
    """One page size for every layer: smaller pages' block sizes scaled up to the largest
    page (``unify_kv_cache_spec_page_size``); a page that does not divide it -> error."""
    largest = max(page for _, _, page in specs)
    out = []
    for cache, block, page in specs:
        if page != largest:
            if largest % page:
                raise InputError(
                    f"KV pages of {page} and {largest} bytes cannot share one pool "
                    "(vLLM cannot unify them either)"
                )
            block, page = block * (largest // page), largest
        out.append((cache, block, page))
    return out


def _groups(
    specs: list[tuple[LayerCache, int, int]], mode: Literal["none", "align"]
) -> list[GroupLayout]:
    """Buckets of equal specs cut into groups of about one size
    (``_get_kv_cache_groups_uniform_page_size``)."""
    buckets: dict[tuple[str, int, int, int | None], int] = {}
    for cache, block, page in specs:
        key = (cache.kind, block, page, cache.window)
        buckets[key] = buckets.get(key, 0) + 1
    counts = list(buckets.values())
    smallest, largest = min(counts), max(counts)
    size = largest if largest < 1.5 * smallest else smallest
    groups = []
    for (kind, block, page, window), n in buckets.items():
        cuts = -(-n // size)
        for i in range(cuts):
            groups.append(
                GroupLayout(
                    kind=kind,  # type: ignore[arg-type]
                    num_layers=len(range(i, n, cuts)),
                    block_size=block,
                    page_bytes=page,
                    window=window,
                    mamba_mode=mode if kind == "mamba" else None,
                )
            )
    return groups


def layer_caches(model: ModelSpec, tp: int) -> list[LayerCache]:
    """Each layer's cache on one GPU of ``tp``, from the model's shape: its share of the KV
    heads (a whole head past them), MLA's latent whole, DeepSeek-V3.2's indexer keys packed
    beside it (MLA at fp8 is vLLM's ``fp8_ds_mla``: 512 fp8 + 4 float32 scales + 64 bf16 rope
    = 656 bytes), a state layer's state (``LayerLayout.state_bytes``)."""
    lay = model.layers
    if model.is_mla:
        assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        per_token = round(latent * float(model.kv_dtype_bytes))
        if lay is not None and lay.index_topk and model.kv_dtype == "fp8":
            per_token = (
                model.kv_lora_rank + model.kv_lora_rank // 128 * 4 + 2 * model.qk_rope_head_dim
            )
        packed = lay.indexer_bytes_per_token if lay is not None else 0
        return [LayerCache("full", per_token + packed)] * model.num_layers
    if lay is None:
        per_token = round(model.kv_bytes_per_token_per_gpu(tp) / model.num_layers)
        return [LayerCache("full", per_token)] * model.num_layers
    out = []
    for kind in lay.kinds:
        if kind in ("linear", "mamba"):
            out.append(LayerCache("mamba", state_bytes=lay.state_bytes(model, kind, tp)))
        else:
            per_token = round(lay.kv_bytes_per_token(model, kind, tp))
            window = lay.sliding_window if kind == "sliding" else None
            out.append(LayerCache("sliding_window" if window else "full", per_token, 0, window))
    return out
