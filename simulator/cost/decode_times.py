"""The times of a stretch of decode steps, for the cost models whose step time is affine in the
KV the batch holds: most steps of a run are timed here, so it is compiled
(simulator/native.py). Each is the same float operations, in the same order, as the model's
``time_sums`` of each step."""

from __future__ import annotations


def roofline_decodes(
    pairs: range,
    matmul: float,
    attn: float,
    weights: float,
    kv: float,
    compute: float,
    memory: float,
    tail: tuple[float, float, float],
    memory_bound: bool,
) -> list[float]:
    """``max(t_memory, t_compute) + fixed + per_token + overhead`` at each of ``pairs``
    (``memory_bound``: the memory time is known to win at every one)."""
    fixed, per_token, overhead = tail
    out: list[float] = []
    if memory_bound:
        for p in range(pairs.start, pairs.stop, pairs.step):
            out.append((weights + kv * p) / memory + fixed + per_token + overhead)
        return out
    for p in range(pairs.start, pairs.stop, pairs.step):
        tm = (weights + kv * p) / memory
        tc = (matmul + attn * p) / compute
        out.append((tm if tm > tc else tc) + fixed + per_token + overhead)
    return out


def linear_decodes(head: float, per_ctx: float, contexts: range) -> list[float]:
    """``head + per_ctx * c`` at each of ``contexts``."""
    return [head + per_ctx * c for c in range(contexts.start, contexts.stop, contexts.step)]
