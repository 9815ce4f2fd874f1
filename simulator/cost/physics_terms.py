"""The `physics` cost model's roofline terms, one per operator kind, vectorised over numpy
arrays: the fit (``cost/learn``) evaluates them on thousands of profiled points at once, and
the model (``physics.py``) tabulates them once per run. Every term is a roofline (FLOPs
against the GPU's peak, bytes against its memory bandwidth) bent by a small learned
efficiency curve of its own shape; the parameter names are ``SHARED`` and ``PER_GPU``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from simulator.cost.physics_shape import RankShape

__all__ = [
    "GPU_CURVES",
    "PER_GPU",
    "Q_ROWS",
    "SHARED",
    "RankShape",
    "attention_time",
    "decode_seq_time",
    "chunk_wave",
    "gpu_params",
    "moe_time",
    "token_time",
]

Array = NDArray[np.float64]

SHARED = (
    "gemm_launch_us",
    "gemm_compute",
    "gemm_ramp_tokens",
    "gemm_memory",
    "gemm_tiled_memory",
    "gemm_sharpness",
    "elem_launch_us",
    "norm_memory",
    "rotary_memory",
    "act_memory",
    "embedding_memory",
    "attn_launch_us",
    "prefill_compute",
    "prefill_causal",
    "prefill_memory",
    "attn_sharpness",
    "decode_memory",
    "decode_occupancy",
    "decode_seq_us",
    "decode_step_us",
    "decode_units",
    "mixed_decode",
    "sampler_us",
    "sampler_memory",
    "moe_launch_us",
    "moe_compute",
    "moe_ramp_tokens",
    "moe_memory",
    "moe_sharpness",
)
"""Parameters of the serving stack, the same on every GPU (see ``docs/cost_models.md``)."""
PER_GPU = (
    "compute_scale",
    "memory_scale",
    "tiled_scale",
    "ridge_scale",
    "decode_scale",
)
"""Per measured GPU: achieved peak FLOPs and bandwidth relative to its spec sheet, and its
own value of the curves in ``GPU_CURVES`` relative to the stack's (1 for a GPU with no
measurements)."""
GPU_CURVES = {
    "tiled_scale": "gemm_tiled_memory",
    "ridge_scale": "gemm_sharpness",
    "decode_scale": "decode_memory",
}
"""The per-GPU scales that multiply a shared curve parameter (the rest scale the spec sheet):
where GPUs of one stack differ by more than their peak and bandwidth (the step from the
skinny to the tiled matmul kernels: ~7% on the RTX 4090, ~3% on the RTX PRO 6000; how
sharply a matmul turns compute-bound; decode attention's bandwidth against the matmuls')."""

Params = Mapping[str, float]

_US = 1e-6
GEMV_TOKENS = 16
"""Most rows the matmul library serves with its skinny (GEMV-like) kernels (LLMServingSim's
RTX 4090 and RTX PRO 6000 profiles: every matmul steps up by 5-8% from 16 to 20 tokens)."""


def gpu_params(shared: Params, scales: Mapping[str, float]) -> dict[str, float]:
    """The curve parameters of one GPU: the stack's, each in ``GPU_CURVES`` times the GPU's
    scale for it (a scale not given: 1)."""
    out = dict(shared)
    for scale, name in GPU_CURVES.items():
        out[name] = out[name] * scales.get(scale, 1.0)
    return out


def smooth_max(a: Array, b: Array, sharpness: float) -> Array:
    """``(a^p + b^p)^(1/p)``: the roofline's max, rounded near the ridge."""
    return np.asarray((a**sharpness + b**sharpness) ** (1.0 / sharpness))


def gemm_time(
    m: Array,
    k: int,
    n: int,
    flops: float,
    bw: float,
    p: Params,
    dt: float,
    wdt: float | None = None,
) -> Array:
    """Seconds of an ``m x k`` by ``k x n`` matmul: a launch plus the smooth max of compute
    (efficiency rising with ``m`` to the plateau ``gemm_compute``: ``m / (m + ramp)``) and
    memory (weights read once at ``wdt`` bytes each, default ``dt``; activations in and out
    at ``dt``; less well by tiled kernels); 0 at ``m = 0``. ``flops``: the peak at the
    weights' dtype (an fp8 matmul runs at the fp8 peak)."""
    m = np.asarray(m, dtype=float)
    compute = 2.0 * k * n * (m + p["gemm_ramp_tokens"]) / (flops * p["gemm_compute"])
    w = dt if wdt is None else wdt
    memory = (w * k * n + dt * m * (k + n)) / (bw * p["gemm_memory"])
    # above GEMV_TOKENS rows the library switches from its skinny kernels to tiled ones,
    # which stream the weights less well (a step seen at 16 -> 20 tokens on both GPUs)
    memory = np.where(m > GEMV_TOKENS, memory / p["gemm_tiled_memory"], memory)
    t = p["gemm_launch_us"] * _US + smooth_max(compute, memory, p["gemm_sharpness"])
    return np.where(m > 0, t, 0.0)


def elementwise_time(m: Array, kind: str, elems: int, bw: float, p: Params, dt: int) -> Array:
    """Seconds of a memory-bound per-token operator moving ``elems`` elements per token."""
    m = np.asarray(m, dtype=float)
    t = p["elem_launch_us"] * _US + m * elems * dt / (bw * p[f"{kind}_memory"])
    return np.where(m > 0, t, 0.0)


def sampler_time(seqs: Array, vocab: int, bw: float, p: Params) -> Array:
    """Seconds of sampling ``seqs`` rows of ``vocab`` float32 logits (a fixed part and the
    logits' passes through memory)."""
    seqs = np.asarray(seqs, dtype=float)
    t = p["sampler_us"] * _US + seqs * vocab * 4.0 / (bw * p["sampler_memory"])
    return np.where(seqs > 0, t, 0.0)


Q_ROWS = 8192
"""Query rows (chunk tokens x query heads on the rank) the prefill kernel computes in one
pass over the cached context: a chunk of fewer rows costs as much as a full pass, a longer
one whole passes (LLMServingSim's RTX 4090 and RTX PRO 6000 attention profiles, Llama-3.1-8B
TP 1 and 2 and Qwen3-30B-A3B: over 16k cached tokens, time flat in the chunk up to 8,192
rows, then a step per 8,192)."""


def chunk_wave(q_heads: int) -> float:
    """Chunk tokens in one of the prefill kernel's passes (``Q_ROWS`` over the rank's query
    heads)."""
    return Q_ROWS / max(q_heads, 1)


def decode_seq_time(nd: Array | float, kv_heads: int, p: Params) -> Array:
    """Seconds of the decodes' per-sequence work in one layer of a decode-only step:
    ``decode_seq_us`` each while few, levelling off once their work units (decodes x KV
    heads) pass ``decode_units``, as the GPU overlaps them (LLMServingSim's decode profiles:
    the part of a decode step not proportional to the KV read grows ~0.8 us per decode up
    to ~32 decodes on an RTX 4090, then stays near 40-60 us)."""
    nd = np.asarray(nd, dtype=float)
    return np.asarray(p["decode_seq_us"] * _US * nd / (1.0 + nd * kv_heads / p["decode_units"]))


def attention_time(
    pc: Array,
    kvp: Array,
    pairs: Array,
    nd: Array,
    kvd: Array,
    shape: RankShape,
    flops: float,
    bw: float,
    p: Params,
) -> Array:
    """Seconds of one layer's attention: one launch; the prefill chunks' part (``pc`` tokens
    over ``kvp`` cached ones, ``pairs`` causal query-key pairs: the smooth max of compute and
    KV read, the causal triangle at its own efficiency, a chunk padded to whole passes of the
    kernel, ``Q_ROWS``; MLA also decompresses the cached latent); the decodes' part (``nd``
    decodes over ``kvd`` cached tokens in all: a cost per decode and the KV read, slower with
    little parallel work, ``nd`` x KV heads; MLA's decodes also compute over the latent, at
    the prefill's efficiency), with a fixed cost of its own in a decode-only step and dearer
    in a step that also prefills (the decodes then run in the prefill's kernel)."""
    pc, kvp, pairs, nd, kvd = (np.asarray(x, dtype=float) for x in (pc, kvp, pairs, nd, kvd))
    kvb = shape.kv_bytes_per_token
    rate = flops * p["prefill_compute"]
    # the triangle of one chunk of pc tokens; several chunks have less, and at most the pairs
    tri = np.minimum(pc * (pc + 1) / 2, pairs)
    wave = chunk_wave(shape.q_heads)
    pad = (np.ceil(pc / wave) * wave - pc) * kvp
    work = pairs - tri + pad + tri / p["prefill_causal"]
    compute = (shape.prefill_flops_per_pair * work + shape.context_flops_per_token * kvp) / rate
    memory = kvb * (kvp + pc) / (bw * p["prefill_memory"])
    prefill = np.where(pc > 0, smooth_max(compute, memory, p["attn_sharpness"]), 0.0)
    units = np.maximum(nd, 1.0) * shape.kv_heads
    read = (
        kvb
        * (kvd + nd)
        / (bw * p["decode_memory"])
        * (1.0 + p["decode_occupancy"] / np.sqrt(units))
    )
    if shape.decode_flops_per_pair:
        dcompute = shape.decode_flops_per_pair * (kvd + nd) / rate
        read = smooth_max(read, dcompute, p["attn_sharpness"])
    # a decode-only step runs the decode kernel: a fixed part of its own (splitting the KV
    # and merging the splits) and its per-sequence work levelling off as the GPU overlaps
    # it; in a step that also prefills, the decodes run in the prefill's kernel, each at
    # ``decode_seq_us`` and every byte dearer
    alone = read + decode_seq_time(nd, shape.kv_heads, p) + p["decode_step_us"] * _US
    mixed = (read + nd * p["decode_seq_us"] * _US) * p["mixed_decode"]
    decode = np.where(nd > 0, np.where(pc > 0, mixed, alone), 0.0)
    busy = (pc > 0) | (nd > 0)
    return np.where(busy, p["attn_launch_us"] * _US + prefill + decode, 0.0)


def moe_time(
    pairs: Array, experts: Array, shape: RankShape, flops: float, bw: float, p: Params
) -> Array:
    """Seconds of one MoE layer's routed experts on one rank (a fused grouped GEMM):
    ``pairs`` (token, expert) pairs over ``experts`` distinct experts touched. A launch
    plus the smooth max of compute (each expert's rows ramping as a matmul's do, at
    ``moe_compute`` times the dense matmuls' plateau) and memory (the touched experts'
    weights, the pairs' activations in and out, at ``moe_memory`` times the dense matmuls'
    efficiency); 0 without pairs. ``flops``: the peak at the weights' dtype."""
    pairs, experts = np.asarray(pairs, dtype=float), np.asarray(experts, dtype=float)
    w = shape.expert_weight_elements
    rows = pairs + experts * p["moe_ramp_tokens"]
    compute = 2.0 * w * rows / (flops * p["gemm_compute"] * p["moe_compute"])
    # in: the hidden vector; gate/up out, activation out, down out (per pair)
    act = shape.dtype_bytes * pairs * (2 * shape.hidden + 3 * shape.expert_intermediate)
    memory = (shape.wdt * w * experts + act) / (bw * p["gemm_memory"] * p["moe_memory"])
    t = p["moe_launch_us"] * _US + smooth_max(compute, memory, p["moe_sharpness"])
    return np.where(pairs > 0, t, 0.0)


def routed(m: Array, shape: RankShape) -> tuple[Array, Array]:
    """(pairs, expected distinct experts) a rank's MoE layer computes in a step of ``m``
    tokens on the rank, under uniform routing: the pairs its share of the tokens' top-k
    picks, and of its ``local_experts`` those hit by the tokens of every rank routing to
    it (``1 - (1 - k/E)^T`` each: ``ModelSpec.expected_distinct_experts``)."""
    m = np.asarray(m, dtype=float)
    if not shape.moe_layers:
        return np.zeros_like(m), np.zeros_like(m)
    k, e = shape.top_k, shape.experts
    seen = m * shape.ep * shape.pair_share  # tokens of all ranks sending to these experts
    return m * k * shape.pair_share, shape.local_experts * (1.0 - (1.0 - k / e) ** seen)


def token_time(
    m: Array,
    shape: RankShape,
    flops: float,
    bw: float,
    p: Params,
    spec_bw: float,
    mm_flops: float | None = None,
) -> Array:
    """Seconds of every token-parallel operator of a step of ``m`` tokens: each matmul and
    memory-bound operator times the layers it runs in, the routed experts of the MoE layers,
    and the once-per-step operators. Matmuls at quantized weights run at ``mm_flops`` (the
    peak at their dtype; default ``flops``), routers at ``flops``. The small memory-bound
    operators move their data at the spec sheet's ``spec_bw`` times their own efficiency:
    they live in L2 as much as in DRAM, so the GPU's fitted DRAM scale (in ``bw``) is not
    theirs."""
    m = np.asarray(m, dtype=float)
    dt, mmf = shape.dtype_bytes, flops if mm_flops is None else mm_flops
    out = np.zeros_like(m)
    for name, (k, n) in shape.gemms().items():
        f = flops if name == "router" else mmf
        t = gemm_time(m, k, n, f, bw, p, dt, shape.gemm_weight_bytes(name))
        out = out + shape.gemm_calls(name) * t
    for kind, elems, calls in shape.elementwise().values():
        out = out + calls * elementwise_time(m, kind, elems, spec_bw, p, dt)
    if shape.moe_layers:
        pairs, experts = routed(m, shape)
        out = out + shape.moe_layers * moe_time(pairs, experts, shape, mmf, bw, p)
    return np.asarray(out)


def sequence_time(
    seqs: Array, shape: RankShape, flops: float, bw: float, p: Params, spec_bw: float
) -> Array:
    """Seconds of the per-sequence operators: the LM head's matmul and the sampler (at the
    spec sheet's bandwidth, as the memory-bound operators of ``token_time``)."""
    head = gemm_time(seqs, shape.hidden, shape.vocab, flops, bw, p, shape.dtype_bytes)
    return np.asarray(head + sampler_time(seqs, shape.full_vocab, spec_bw, p))
