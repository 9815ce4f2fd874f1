"""Learn sources from NVIDIA's database of measured vLLM kernels (``cost/kernel_db.py``, the
installed ``aiconfigurator-core``): per measured GPU, its bf16 GEMMs against the matmul term
and its context and generation attention against the attention term, each at the GPU preset's
spec-sheet peaks. Read in place (never copied), subsampled deterministically to the widths
and head layouts ``sources.yaml`` names, so that ``servesim learn`` stays within minutes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost import physics_terms as terms
from simulator.cost.kernel_attention import streaming_bandwidth
from simulator.cost.kernel_db import KernelDatabase
from simulator.cost.physics_terms import Array, Params, RankShape
from simulator.cost.presets import HardwareSpec, load_hardware, load_model
from simulator.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

_MS = 1e-3
DECODE_TOKENS = 256
"""GEMMs of up to this many rows are the memory-bound end of the curve (a set of their own,
as in the bundles' sources)."""

GEMV_ROWS = 17
"""Every measured ``m`` up to this is read (where the library's skinny kernels give way to
tiled ones); above, only multiples of 16."""

Predict = Callable[[Params, float, float], Array]
"""A term: (parameters, achieved peak FLOP/s, achieved bandwidth) -> predicted seconds."""
KernelSet = tuple[str, Array, Predict, float]
"""(operator name, measured seconds, the term predicting them, the set's share of
``weight``: 1 for each GEMM set, and each head layout's share of the prefills' and of the
decodes' 1, so that reading more layouts does not outweigh the matmuls)."""


class KernelDbSources(BaseModel):
    """Which GPUs, tables and rows of the kernel database the fit reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    """The package and version the tables come from (as installed: ``servesim[kernels]``)."""
    gpus: list[str] = Field(min_length=1)
    """Hardware presets (each with ``kernels_gpu``) whose tables are read, at the newest vLLM
    version measured on each."""
    gemm_widths: list[int] = Field(min_length=1)
    """GEMM ``n`` and ``k`` values read (every measured ``m`` of each pair up to
    ``max_tokens``): the widths of current models' layers, not the table's whole grid."""
    max_tokens: int = Field(gt=0)
    """Largest GEMM ``m`` and prefill tokens (batch x prompt) read: vLLM's step budgets."""
    attention_models: list[str] = Field(min_length=1)
    """Model presets whose head layouts (at each of ``tp``) are read from the attention
    tables (bf16 KV, full attention, the kernel vLLM measured most)."""
    tp: list[int] = Field(min_length=1)
    """TP degrees of those layouts."""
    max_context: int = Field(gt=0)
    """Longest decode context read from the generation table."""
    weight: float = Field(default=1.0, gt=0)
    """Weight of each of a GPU's sets (GEMM decode end, GEMM tiled, prefill, decode)."""


def kernel_sets(cfg: KernelDbSources, hw: HardwareSpec) -> list[KernelSet]:
    """The measured sets of one GPU preset's tables (its newest measured vLLM version)."""
    db = KernelDatabase.open(hw.kernels_gpu, None, hw.name)
    layouts: dict[tuple[int, int, int], RankShape] = {}
    for name in cfg.attention_models:
        model = load_model(name)
        for tp in cfg.tp:
            shape = RankShape.of(model.deployed(tp, None, None), tp)
            layouts.setdefault((shape.q_heads, shape.kv_heads, shape.head_dim), shape)
    attention = [s for shape in layouts.values() for s in attention_sets(cfg, db, shape)]
    share = 2.0 / max(len(attention), 1)  # the prefills' 1 and the decodes' 1, shared
    return gemm_sets(cfg, db) + [(op, t, f, share) for op, t, f, _ in attention]


def gemm_sets(cfg: KernelDbSources, db: KernelDatabase) -> list[KernelSet]:
    """bf16 GEMMs of the configured widths: the memory-bound end and the tiled rest."""
    df = db.read("gemm/gemm_perf", gemm_dtype="bfloat16")
    if df is None or df.empty:
        raise InputError(f"kernel database {db.gpu}: no bf16 GEMMs measured")
    widths = set(cfg.gemm_widths)
    # the grid measures most m twice, at 16j and 16j + 1: one of each pair is enough
    every = (df.m <= GEMV_ROWS) | (df.m % 16 == 0)
    rows = df[df.n.isin(widths) & df.k.isin(widths) & (df.m <= cfg.max_tokens) & every]
    rows = rows.sort_values(["n", "k", "m"]).drop_duplicates(["n", "k", "m"])
    out = []
    for part, keep in (("decode", rows.m <= DECODE_TOKENS), ("large", rows.m > DECODE_TOKENS)):
        sub = rows[keep]
        m, k, n = (sub[c].to_numpy(float) for c in ("m", "k", "n"))
        out.append((f"gemm:{part}", sub.latency.to_numpy(float) * _MS, _gemm(m, k, n), 1.0))
    return out


def _gemm(m: Array, k: Array, n: Array) -> Predict:
    def predict(p: Params, f: float, b: float) -> Array:
        # the term is written for one shape; numpy broadcasts it over the rows' widths
        return np.asarray(terms.gemm_time(m, k, n, f, b, p, 2))  # type: ignore[arg-type]

    return predict


def _layout(db: KernelDatabase, table: str, shape: RankShape) -> pd.DataFrame | None:
    """Rows of one head layout (bf16 KV, no window) of the kernel with the most rows."""
    rows = db.read(
        f"attention/{table}", head_dim=shape.head_dim, kv_cache_dtype="bfloat16", window_size=0
    )
    if rows is None:
        return None
    rows = rows[(rows.num_heads == shape.q_heads) & (rows.num_key_value_heads == shape.kv_heads)]
    if rows.empty:
        return None
    lane = rows.kernel_source.value_counts().sort_index().idxmax()
    return rows[rows.kernel_source == lane]


def attention_sets(cfg: KernelDbSources, db: KernelDatabase, shape: RankShape) -> list[KernelSet]:
    """One head layout's prefills from empty (``context_attention_perf``) and decode-only
    steps (``generation_attention_perf``); a layout not measured: none."""
    tag = f"{shape.q_heads}q{shape.kv_heads}kv{shape.head_dim}"
    out: list[KernelSet] = []
    ctx = _layout(db, "context_attention_perf", shape)
    if ctx is not None:
        ctx = ctx[ctx.batch_size * ctx.isl <= cfg.max_tokens]
        b, s = ctx.batch_size.to_numpy(float), ctx.isl.to_numpy(float)
        a = (b * s, np.zeros_like(b), b * s * (s + 1) / 2, np.zeros_like(b), np.zeros_like(b))
        t = ctx.latency.to_numpy(float) * _MS
        out.append((f"attention:prefill:{tag}", t, _attn(a, shape), 1.0))
    gen = _layout(db, "generation_attention_perf", shape)
    if gen is not None:
        token_bytes = 2 * shape.kv_heads * shape.head_dim * 2  # K and V of a layer, bf16
        rate = streaming_bandwidth(gen, token_bytes)
        gen = gen[(gen.isl == 1) & (gen.step <= cfg.max_context)]
        b, s = gen.batch_size.to_numpy(float), gen.step.to_numpy(float)
        measured = gen.latency.to_numpy(float) * _MS
        if rate is not None:
            # the table repeats one batch on one KV cache, which stays in L2 when it fits; a
            # forward pass reads it from memory (the `kernels` model's floor, the same rate)
            measured = np.maximum(measured, b * (s + 1) * token_bytes / rate)
        zero = np.zeros_like(b)
        a = (zero, zero, zero, b, b * s)
        out.append((f"attention:decode:{tag}", measured, _attn(a, shape), 1.0))
    return out


def _attn(a: tuple[Array, ...], shape: RankShape) -> Predict:
    def predict(p: Params, f: float, b: float) -> Array:
        pc, kvp, pairs, nd, kvd = a
        return terms.attention_time(pc, kvp, pairs, nd, kvd, shape, f, b, p)

    return predict


def load_gpu(name: str) -> HardwareSpec:
    """A database GPU's preset (it must name its ``kernels_gpu``)."""
    hw = load_hardware(name)
    if hw.kernels_gpu is None:
        raise InputError(f"kernels.gpus: {name}: the preset names no kernels_gpu")
    return hw
