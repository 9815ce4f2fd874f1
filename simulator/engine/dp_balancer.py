"""vLLM's data-parallel load balancer: which rank a new request goes to.

As ``DPLBAsyncMPClient.get_core_engine_for_request`` (vllm/v1/engine/core_client.py, vLLM
0.33 as installed beside the project) with one API client: each rank's score is the larger of
its requests in flight (routed, not finished) and its ``waiting + running``, plus
``waiting x 6 x max(0, kv_usage - 0.5)``; the lowest score wins, the scan starting at a
rotating index so that ties go round robin. vLLM reads ``waiting``, ``running`` and the KV
usage from a coordinator snapshot every 100 ms; here they are exact at the arrival instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class RankLoad(Protocol):
    """What the balancer reads of a rank."""

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission."""
        ...

    @property
    def num_running(self) -> int:
        """Sequences running."""
        ...

    @property
    def num_blocks_used(self) -> int:
        """KV blocks held."""
        ...

    @property
    def num_blocks(self) -> int:
        """KV blocks in the cache."""
        ...


class DPBalancer:
    """Chooses a rank per request from the ranks' loads and its own in-flight counts."""

    def __init__(self, num_ranks: int) -> None:
        self.in_flight = [0] * num_ranks
        """Requests routed to each rank and not finished."""
        self._start = 0

    def choose(self, ranks: Sequence[RankLoad]) -> int:
        """The rank for the next request (its in-flight count is raised)."""
        n = len(ranks)
        best, best_score = 0, float("inf")
        for i in range(n):
            idx = (self._start + i) % n
            r = ranks[idx]
            waiting = r.num_waiting
            score = float(max(self.in_flight[idx], waiting + r.num_running))
            if waiting:
                # a queue on a KV-bound rank drains slowly: penalize it
                score += waiting * 6.0 * max(0.0, r.num_blocks_used / r.num_blocks - 0.5)
            if score < best_score:
                best, best_score = idx, score
        self._start = (self._start + 1) % n
        self.in_flight[best] += 1
        return best

    def finished(self, rank: int, num: int) -> None:
        """``num`` requests of ``rank`` finished."""
        self.in_flight[rank] -= num
