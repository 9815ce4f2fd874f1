"""What a router is: it picks a replica for a request from what it can see at that instant.

A router sees, for each candidate replica, only the counters a real load balancer reads
(``Replica``: requests running, waiting and on their way, tokens of work left, KV blocks
used), as a step-by-step run shows them at the routing instant. Adding one takes a few lines
in a module of your own, named by import path in the scenario (``cluster.router:
mypkg.routers:FewestWaiting``)::

    from simulator.cluster.router import Router

    class FewestWaiting(Router):
        def choose(self, request, replicas):
            return min(replicas, key=lambda r: (r.num_waiting, r.index))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from mypy_extensions import mypyc_attr

from simulator.scheduling.sequence import PromptRuns

if TYPE_CHECKING:
    from simulator.cluster.replica import Replica


class Request:
    """What a router knows of a request when it routes it."""

    __slots__ = ("index", "arrival_s", "prompt_len", "output_len", "prefix", "shared_blocks")

    def __init__(
        self,
        index: int,
        arrival_s: float,
        prompt_len: int,
        output_len: int,
        prefix: tuple[Hashable, ...] = (),
        shared_blocks: int = 0,
    ) -> None:
        self.index = index
        """Row of the request in the workload (its ``request_id``)."""
        self.arrival_s = arrival_s
        """When it arrived."""
        self.prompt_len = prompt_len
        """Prompt tokens."""
        self.output_len = output_len
        """Output tokens it will sample."""
        self.prefix = prefix
        """Keys of its full prompt blocks, each standing for that block and all before it
        (a chained content hash of the workload's token identity, ``prefix_keys``); equal
        keys mean a shared prefix. Empty without token identity, or for a router that does
        not ask for it (``Router.uses_prefix``)."""
        self.shared_blocks = shared_blocks
        """How many of its first prompt blocks the fleet's shared KV tier holds (any replica
        can load them from there); 0 without one, or for a router that does not ask."""


MAX_PREFIX_BLOCKS = 1024
"""Prompt blocks a request's ``prefix`` covers at most (16k tokens of 16-token blocks)."""


def prefix_keys(runs: PromptRuns | None, block_size: int) -> tuple[Hashable, ...]:
    """Chained keys of a prompt's full blocks from its token identity (``(segment, tokens)``
    runs, each the first ``tokens`` tokens of its segment): two prompts get the same first
    ``k`` keys exactly when they share their first ``k`` blocks."""
    keys: list[Hashable] = []
    if not runs:
        return ()
    key: Hashable = None
    piece: list[tuple[Hashable, int, int]] = []
    filled = 0
    for segment, tokens in runs:
        pos = 0
        while pos < tokens and len(keys) < MAX_PREFIX_BLOCKS:
            take = min(block_size - filled, tokens - pos)
            piece.append((segment, pos, take))
            pos, filled = pos + take, filled + take
            if filled == block_size:
                key = hash((key, tuple(piece)))
                keys.append(key)
                piece, filled = [], 0
    return tuple(keys)


@mypyc_attr(allow_interpreted_subclasses=True)  # a router of the user's
class Router(ABC):
    """Picks the replica a request goes to. Subclass it and implement ``choose``."""

    uses_prefix: ClassVar[bool] = False
    """Whether ``choose`` reads ``Request.prefix`` (computed for such routers only)."""
    reads_state: ClassVar[bool] = True
    """Whether ``choose`` reads the replicas' counters. A router that never does (round
    robin, random) is asked for every request before the run starts, so each replica runs
    its share like a single server (and as fast); ``choose`` then must not read them."""

    def __init__(self, rng: np.random.Generator, affinity_margin: int = 0) -> None:
        self.rng = rng
        """This router's own random stream (from the scenario's seed)."""
        self.affinity_margin = affinity_margin
        """``cluster.affinity_margin`` (for routers that weigh cache hits against load)."""

    @abstractmethod
    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """One of ``replicas`` (never empty: the replicas ``request`` fits in, in index
        order) for ``request``."""
