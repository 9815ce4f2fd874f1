"""Expert parallelism's all-to-all: the time one MoE layer spends sending each rank's tokens
to the ranks holding their experts (dispatch) and their outputs back (combine)."""

from __future__ import annotations

from simulator.errors import InputError

__all__ = ["all_to_all_bytes", "all_to_all_time"]


def all_to_all_bytes(
    tokens: float, hidden_size: int, ranks: int, top_k: int = 1, bytes_per_element: float = 2
) -> float:
    """Expected bytes one rank sends in one dispatch of ``tokens`` tokens: each token's hidden
    vector goes once to every other rank holding at least one of its ``top_k`` experts (experts
    spread evenly, chosen uniformly: a given rank is hit with probability
    ``1 - (1 - 1/ranks)^top_k``), as DeepEP-style kernels send one copy per rank."""
    if ranks < 1 or top_k < 1 or hidden_size < 1:
        raise InputError(
            f"all-to-all: ranks ({ranks}), top_k ({top_k}) and hidden_size ({hidden_size}) "
            "must be >= 1"
        )
    hit = 1.0 - (1.0 - 1.0 / ranks) ** top_k
    return tokens * hidden_size * bytes_per_element * (ranks - 1) * hit


def all_to_all_time(
    tokens: float,
    hidden_size: int,
    ranks: int,
    bandwidth: float,
    latency_us: float = 0.0,
    *,
    top_k: int = 1,
    bytes_per_element: float = 2,
) -> float:
    """Seconds of one MoE layer's dispatch and combine on one rank: two all-to-alls of
    ``all_to_all_bytes`` each over a link of ``bandwidth`` bytes/s one way per GPU, each with
    a fixed ``latency_us``; 0 with one rank."""
    if ranks == 1:
        return 0.0
    if bandwidth <= 0 or latency_us < 0:
        raise InputError(f"all-to-all: bandwidth ({bandwidth}) must be > 0, latency >= 0")
    nbytes = all_to_all_bytes(tokens, hidden_size, ranks, top_k, bytes_per_element)
    return 2.0 * (latency_us * 1e-6 + nbytes / bandwidth)
