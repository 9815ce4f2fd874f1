"""Expert parallelism's all-to-all: the time one MoE layer spends sending each rank's tokens
to the ranks holding their experts (dispatch) and their outputs back (combine).

Two schemes: DeepEP-style kernels (``all_to_all_time``: each token goes only to the ranks
holding its experts) and vLLM's default for data-parallel ranks, ``all2all_backend:
allgather_reducescatter`` (``allgather_reducescatter_time``: every rank gathers every rank's
tokens, then the experts' partial outputs are reduce-scattered back)."""

from __future__ import annotations

from collections.abc import Sequence

from simulator.errors import InputError

__all__ = ["all_to_all_bytes", "all_to_all_time", "allgather_reducescatter_time"]

_ROUTING_BYTES = 8
"""Per token and routed expert, what vLLM's dispatch gathers besides the hidden vector: the
fp32 top-k weight and the int32 top-k id (``AgRsAll2AllManager.dispatch``)."""


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


def allgather_reducescatter_time(
    chunks: Sequence[float],
    hidden_size: int,
    bandwidth: float,
    latency_us: float = 0.0,
    *,
    top_k: int = 1,
    bytes_per_element: float = 2,
) -> float:
    """Seconds of one MoE layer's dispatch and combine as vLLM's default DP/EP backend does
    them (``AgRsAll2AllManager``, vllm/distributed/device_communicators/all2all.py): an
    all-gather of every rank's hidden vectors and top-k routing, then a reduce-scatter of
    the experts' outputs, ``chunks[i]`` tokens from DP rank ``i``. Each is a ring over the
    ranks: ``ranks - 1`` steps, each as long as the largest chunk takes on a link of
    ``bandwidth`` bytes/s one way, plus a fixed ``latency_us``; 0 with one rank."""
    ranks = len(chunks)
    if ranks <= 1:
        return 0.0
    if bandwidth <= 0 or latency_us < 0 or hidden_size < 1 or top_k < 1:
        raise InputError(
            f"all-to-all: bandwidth ({bandwidth}) must be > 0, latency >= 0, hidden_size "
            f"({hidden_size}) and top_k ({top_k}) >= 1"
        )
    largest = max(chunks)
    hidden = hidden_size * bytes_per_element
    dispatch = (ranks - 1) * largest * (hidden + top_k * _ROUTING_BYTES) / bandwidth
    combine = (ranks - 1) * largest * hidden / bandwidth
    return 2.0 * latency_us * 1e-6 + dispatch + combine
