"""What a hybrid model's layers cost in one step, as the roofline and physics models see it:
its attention FLOPs and KV reads split into full-context layers and layers that see at most a
window of tokens (sliding-window layers; DeepSeek-V3.2's top-``index_topk`` sparse attention),
the lightning indexer's full-context scores, and the recurrent layers' state (read and written
once per sequence and step, updated per token; a chunked scan in prefill).

The cost models keep their one "attention FLOPs per pair" and "KV bytes per token" constants
(every attention layer at full context) and take from here the step's *effective* pair and
context counts: the figures those constants turn into the hybrid's true FLOPs and bytes.
Formulas: ``docs/cost_models.md`` ("Hybrid layers").
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.batch import Batch, StepSums
from simulator.cost.layer_layout import STATE_KINDS
from simulator.cost.model_spec import ModelSpec

__all__ = ["HybridTerms", "effective_sums", "window_pairs"]


def window_pairs(new: int, ctx: int, window: int) -> int:
    """Causal (query, key) pairs of ``new`` queries after ``ctx`` cached tokens when each
    query sees at most ``window`` keys (itself included): ``sum min(p, window)`` over the
    queries' positions ``p = ctx + 1 .. ctx + new``."""
    lo, hi = ctx + 1, ctx + new
    if hi <= window:
        return (lo + hi) * new // 2
    if lo > window:
        return new * window
    return (lo + window) * (window - lo + 1) // 2 + (hi - window) * window


@dataclass(frozen=True)
class HybridTerms:
    """Per-GPU shares of a hybrid model's attention and state costs (see the module doc)."""

    window: int
    """Tokens a windowed layer sees (sliding window, or DeepSeek-V3.2's ``index_topk``)."""
    window_flops_share: float
    """Share of the attention FLOPs per pair in windowed layers."""
    window_kv_share: float
    """Share of the KV bytes per token in windowed layers."""
    index_flops_ratio: float
    """Indexer FLOPs per pair over all layers, as a multiple of the attention's."""
    index_bytes_ratio: float
    """Indexer key bytes per token over all layers, as a multiple of the KV's."""
    state_bytes_ratio: float
    """One sequence's recurrent states on this GPU, read and written once a step, in tokens of
    KV (bytes / KV bytes per token)."""
    state_flops_ratio: float
    """Recurrent update FLOPs per token, in pairs of attention FLOPs."""
    scan_flops_ratio: float
    """Chunked-scan FLOPs per prefill token beyond the update, in pairs of attention FLOPs."""

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> HybridTerms | None:
        """The terms of ``model`` on one GPU of ``tp``; None for a model without layer kinds."""
        lay = model.layers
        if lay is None:
            return None
        pair = model.attention_flops_per_pair
        kv = model.kv_bytes_per_token_per_gpu(tp)
        if model.is_mla:  # DeepSeek-V3.2: every layer sparse over the top-k, plus the indexer
            heads, dim = lay.index_n_heads or 0, lay.index_head_dim or 0
            index_flops = 2.0 * model.num_layers * heads * dim
            index_bytes = model.num_layers * lay.indexer_bytes_per_token
            return cls(lay.index_topk or 1, 1.0, 1.0, index_flops / pair, index_bytes / kv, 0, 0, 0)
        window = lay.sliding_window or 1
        win_flops = sum(lay.pair_flops(model, k) for k in lay.kinds if k == "sliding")
        win_kv = sum(lay.kv_bytes_per_token(model, k, tp) for k in lay.kinds if k == "sliding")
        states = [k for k in lay.kinds if k in STATE_KINDS]
        state_bytes = sum(lay.state_bytes(model, k, tp) for k in states)
        update = sum(lay.state_flops_per_token(k) for k in states) / tp
        scan = sum(_scan_flops(model, k) for k in states) / tp
        return cls(
            window=window,
            window_flops_share=win_flops / pair if pair else 0.0,
            window_kv_share=win_kv / kv if kv else 0.0,
            index_flops_ratio=0.0,
            index_bytes_ratio=0.0,
            state_bytes_ratio=2.0 * state_bytes / kv if kv else 0.0,
            state_flops_ratio=update / (pair / tp) if pair else 0.0,
            scan_flops_ratio=scan / (pair / tp) if pair else 0.0,
        )

    def effective(self, batch: Batch) -> tuple[float, float, float]:
        """(context tokens, attention pairs, decode pairs) that, priced as full attention of
        every layer, cost what this step of the hybrid costs; for the roofline's
        ``_time(tokens, ctx, pairs, decode_pairs)``."""
        w, ws, ks = self.window, self.window_flops_share, self.window_kv_share
        full_pairs = win_pairs = decode_win = 0
        ctx_all = ctx_win = prefill = decode_all = 0
        for n, c in zip(batch.new_tokens, batch.context_lens, strict=True):
            full_pairs += n * c + n * (n + 1) // 2
            win_pairs += window_pairs(n, c, w)
            ctx_all += c
            ctx_win += min(c, w - 1)
            if n == 1:
                decode_all += c + 1
                decode_win += min(c + 1, w)
            else:
                prefill += n
        tokens = sum(batch.new_tokens)
        pairs = (1 - ws) * full_pairs + ws * win_pairs + self.index_flops_ratio * full_pairs
        pairs += self.state_flops_ratio * tokens + self.scan_flops_ratio * prefill
        ctx = (1 - ks) * ctx_all + ks * ctx_win + self.index_bytes_ratio * (ctx_all + tokens)
        ctx += self.state_bytes_ratio * batch.num_seqs
        decode = (1 - ws) * decode_all + ws * decode_win
        return ctx, pairs, decode


def effective_sums(terms: HybridTerms, batch: Batch, flops: float, kv: float) -> StepSums:
    """``StepSums`` whose contexts and pairs, priced by a model that counts every layer as
    full attention of its base shape, cost what this hybrid step costs: the step's decodes and
    prefills apart (the physics model prices them apart), pairs scaled by ``flops`` and
    contexts by ``kv`` (true attention FLOPs per pair and KV bytes per token over those of
    every layer at the base shape). Fields are floats here, not exact integers."""
    decodes = [(n, c) for n, c in zip(batch.new_tokens, batch.context_lens, strict=True) if n == 1]
    chunks = [(n, c) for n, c in zip(batch.new_tokens, batch.context_lens, strict=True) if n > 1]
    d_ctx, d_pairs, _ = terms.effective(Batch([1] * len(decodes), [c for _, c in decodes]))
    p_ctx, p_pairs, _ = terms.effective(Batch([n for n, _ in chunks], [c for _, c in chunks]))
    nd = len(decodes)
    decode_kv = (d_ctx + nd) * kv  # the decodes' KV tokens, as the model reads them
    return StepSums(
        num_seqs=batch.num_seqs,
        num_decodes=nd,
        num_tokens=sum(batch.new_tokens),
        context=decode_kv - nd + p_ctx * kv,  # type: ignore[arg-type]
        decode_context=decode_kv - nd,  # type: ignore[arg-type]
        pairs=decode_kv + p_pairs * flops,  # type: ignore[arg-type]
    )


def _scan_flops(model: ModelSpec, kind: str) -> float:
    """FLOPs per prefill token of the chunked scan's intra-chunk part in one state layer: each
    token against the ``chunk_size`` tokens of its chunk, over keys and values (Mamba2's SSD,
    Gated DeltaNet's chunked delta rule, as FLA and vLLM's kernels run them)."""
    lay = model.layers
    assert lay is not None
    chunk = lay.chunk_size
    if kind == "linear":
        dk = lay.linear_key_head_dim or 0
        dv = lay.linear_value_head_dim or dk
        return 2.0 * (lay.linear_num_value_heads or 0) * chunk * (dk + dv)
    n, p = lay.ssm_state_size or 0, lay.mamba_head_dim or 0
    return 2.0 * (lay.mamba_num_heads or 0) * chunk * (n + p)
