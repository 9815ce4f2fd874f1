"""The `physics` cost model's roofline terms, one per operator kind, vectorised over numpy
arrays: the fit (``cost/learn``) evaluates them on thousands of profiled points at once, and
the model (``physics.py``) tabulates them once per run. Every term is a roofline (FLOPs
against the GPU's peak, bytes against its memory bandwidth) bent by a small learned
efficiency curve of its own shape; the parameter names are ``SHARED`` and ``PER_GPU``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from simulator.cost.presets import ModelSpec

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
    "mixed_decode",
    "sampler_us",
    "sampler_memory",
)
"""Parameters of the serving stack, the same on every GPU (see ``docs/cost_models.md``)."""
PER_GPU = ("compute_scale", "memory_scale")
"""Per measured GPU: achieved peak FLOPs and bandwidth relative to its spec sheet (1 for a GPU
with no measurements)."""

Params = Mapping[str, float]

_US = 1e-6
GEMV_TOKENS = 16
"""Most rows the matmul library serves with its skinny (GEMV-like) kernels (LLMServingSim's
RTX 4090 and RTX PRO 6000 profiles: every matmul steps up by 5-8% from 16 to 20 tokens)."""


@dataclass(frozen=True)
class RankShape:
    """One tensor-parallel rank's share of a dense transformer: what its operators compute."""

    layers: int
    """Transformer blocks."""
    hidden: int
    """Residual width (not sharded)."""
    q_heads: int
    """Query heads on this rank."""
    kv_heads: int
    """KV heads on this rank (at least 1: replicated when ``tp`` exceeds them)."""
    head_dim: int
    """Width of one head."""
    intermediate: int
    """MLP width on this rank."""
    vocab: int
    """LM-head rows on this rank."""
    full_vocab: int
    """Vocabulary size: the sampler sees every logit (the LM head all-gathers them)."""
    dtype_bytes: int
    """Bytes per weight, activation and KV element."""
    gated: bool
    """Gate, up and down matrices (else up and down)."""

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> RankShape:
        """The shard of ``model`` one of ``tp`` ranks holds."""
        return cls(
            layers=model.num_layers,
            hidden=model.hidden_size,
            q_heads=model.num_heads // tp,
            kv_heads=max(1, model.num_kv_heads // tp),
            head_dim=model.head_dim,
            intermediate=model.intermediate_size // tp,
            vocab=model.vocab_size // tp,
            full_vocab=model.vocab_size,
            dtype_bytes=model.dtype_bytes,
            gated=model.gated_mlp,
        )

    def gemms(self) -> dict[str, tuple[int, int]]:
        """(k, n) of each per-layer matmul: the token count is its M."""
        h, d = self.hidden, self.head_dim
        up = (2 if self.gated else 1) * self.intermediate
        return {
            "qkv_proj": (h, (self.q_heads + 2 * self.kv_heads) * d),
            "o_proj": (self.q_heads * d, h),
            "gate_up_proj": (h, up),
            "down_proj": (self.intermediate, h),
        }

    def elementwise(self) -> dict[str, tuple[str, int, int]]:
        """Per-token memory-bound operators: name -> (efficiency parameter's kind, elements
        moved per token, calls per layer; 0 calls: once per step)."""
        h, qk = self.hidden, (self.q_heads + self.kv_heads) * self.head_dim
        act = (3 if self.gated else 2) * self.intermediate
        return {
            # fused residual add + RMSNorm: reads x and the residual, writes both
            "layernorm": ("norm", 4 * h, 2),
            "rotary_emb": ("rotary", 2 * qk, 1),
            "act_fn": ("act", act, 1),
            "embedding": ("embedding", 2 * h, 0),
            "final_layernorm": ("norm", 4 * h, 0),
        }

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token in one layer on this rank."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes


def smooth_max(a: Array, b: Array, sharpness: float) -> Array:
    """``(a^p + b^p)^(1/p)``: the roofline's max, rounded near the ridge."""
    return np.asarray((a**sharpness + b**sharpness) ** (1.0 / sharpness))


def gemm_time(m: Array, k: int, n: int, flops: float, bw: float, p: Params, dt: int) -> Array:
    """Seconds of an ``m x k`` by ``k x n`` matmul: a launch plus the smooth max of compute
    (efficiency rising with ``m`` to the plateau ``gemm_compute``: ``m / (m + ramp)``) and
    memory (weights read once, activations in and out; less well by tiled kernels); 0 at
    ``m = 0``."""
    m = np.asarray(m, dtype=float)
    compute = 2.0 * k * n * (m + p["gemm_ramp_tokens"]) / (flops * p["gemm_compute"])
    memory = dt * (k * n + m * (k + n)) / (bw * p["gemm_memory"])
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


Q_TILE = 128
"""Query rows of one attention tile (FlashAttention's block): a chunk shorter than this still
computes a whole tile against its context."""


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
    KV read, the causal triangle at its own efficiency, a short chunk padded to a tile); the
    decodes' part (``nd`` decodes over ``kvd`` cached tokens in all: a cost per decode and the
    KV read, slower with little parallel work, ``nd`` x KV heads), dearer in a step that also
    prefills (the decodes then run in the prefill's kernel)."""
    pc, kvp, pairs, nd, kvd = (np.asarray(x, dtype=float) for x in (pc, kvp, pairs, nd, kvd))
    kvb = shape.kv_bytes_per_token
    qflops = 4.0 * shape.q_heads * shape.head_dim
    # the triangle of one chunk of pc tokens; several chunks have less, and at most the pairs
    tri = np.minimum(pc * (pc + 1) / 2, pairs)
    pad = np.maximum(Q_TILE - pc, 0.0) * kvp
    work = pairs - tri + pad + tri / p["prefill_causal"]
    compute = qflops * work / (flops * p["prefill_compute"])
    memory = kvb * (kvp + pc) / (bw * p["prefill_memory"])
    prefill = np.where(pc > 0, smooth_max(compute, memory, p["attn_sharpness"]), 0.0)
    units = np.maximum(nd, 1.0) * shape.kv_heads
    read = (
        kvb
        * (kvd + nd)
        / (bw * p["decode_memory"])
        * (1.0 + p["decode_occupancy"] / np.sqrt(units))
    )
    decode = read + nd * p["decode_seq_us"] * _US
    decode = np.where(nd > 0, decode * np.where(pc > 0, p["mixed_decode"], 1.0), 0.0)
    busy = (pc > 0) | (nd > 0)
    return np.where(busy, p["attn_launch_us"] * _US + prefill + decode, 0.0)


def token_time(
    m: Array, shape: RankShape, flops: float, bw: float, p: Params, spec_bw: float
) -> Array:
    """Seconds of every token-parallel operator of a step of ``m`` tokens: each layer's
    matmuls and memory-bound operators, times the layers, and the once-per-step ones. The
    small memory-bound operators move their data at the spec sheet's ``spec_bw`` times their
    own efficiency: they live in L2 as much as in DRAM, so the GPU's fitted DRAM scale (in
    ``bw``) is not theirs."""
    m = np.asarray(m, dtype=float)
    dt = shape.dtype_bytes
    per_layer = sum(
        (gemm_time(m, k, n, flops, bw, p, dt) for k, n in shape.gemms().values()),
        start=np.zeros_like(m),
    )
    per_step = np.zeros_like(m)
    for kind, elems, calls in shape.elementwise().values():
        t = elementwise_time(m, kind, elems, spec_bw, p, dt)
        if calls:
            per_layer = per_layer + calls * t
        else:
            per_step = per_step + t
    return np.asarray(shape.layers * per_layer + per_step)


def sequence_time(
    seqs: Array, shape: RankShape, flops: float, bw: float, p: Params, spec_bw: float
) -> Array:
    """Seconds of the per-sequence operators: the LM head's matmul and the sampler (at the
    spec sheet's bandwidth, as the memory-bound operators of ``token_time``)."""
    head = gemm_time(seqs, shape.hidden, shape.vocab, flops, bw, p, shape.dtype_bytes)
    return np.asarray(head + sampler_time(seqs, shape.full_vocab, spec_bw, p))
