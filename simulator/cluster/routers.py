"""The routers ``cluster.router`` names. Ties go to the lowest replica index, so a choice
depends on nothing but the state and the router's own random stream. A router is asked at
every arrival, over every replica, so the least loaded is found by a plain loop over the
replicas' counters, which this module compiled reads as C fields (simulator/native.py)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Sequence
from operator import attrgetter

import numpy as np
from mypy_extensions import mypyc_attr

from simulator.cluster.replica import Replica
from simulator.cluster.router import Request, Router
from simulator.registry import Registry

INDEX = attrgetter("index")


def fewest_outstanding(replicas: Sequence[Replica]) -> Replica:
    """The first replica with the fewest outstanding requests (``min``'s choice)."""
    best = replicas[0]
    least = best.num_outstanding
    for r in replicas:
        if r.num_outstanding < least:
            best, least = r, r.num_outstanding
    return best


def fewest_tokens(replicas: Sequence[Replica]) -> Replica:
    """The first replica with the fewest tokens of work in flight."""
    best = replicas[0]
    least = best.num_tokens
    for r in replicas:
        tokens = r.num_tokens
        if tokens < least:
            best, least = r, tokens
    return best


def lowest_kv(replicas: Sequence[Replica]) -> Replica:
    """The first replica with the lowest KV utilization, then the fewest outstanding."""
    best = replicas[0]
    kv, outstanding = best.kv_utilization, best.num_outstanding
    for r in replicas:
        u = r.kv_utilization
        if u < kv or (u == kv and r.num_outstanding < outstanding):
            best, kv, outstanding = r, u, r.num_outstanding
    return best


@mypyc_attr(allow_interpreted_subclasses=True)
class RoundRobin(Router):
    """Each replica in turn (skipping those a request does not fit in)."""

    reads_state = False

    def __init__(self, rng: np.random.Generator, affinity_margin: int = 0) -> None:
        super().__init__(rng, affinity_margin)
        self._next = 0  # the replica index whose turn it is

    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """The first replica at or after the one whose turn it is."""
        at = bisect_left(replicas, self._next, key=INDEX)  # replicas come in index order
        pick = replicas[at] if at < len(replicas) else replicas[0]
        self._next = pick.index + 1
        return pick


@mypyc_attr(allow_interpreted_subclasses=True)
class Random(Router):
    """A replica drawn uniformly from the router's own stream."""

    reads_state = False

    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """A uniform draw."""
        return replicas[int(self.rng.integers(len(replicas)))]


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastOutstanding(Router):
    """The replica with the fewest requests in flight (running, waiting or on their way)."""

    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """Fewest outstanding requests."""
        return fewest_outstanding(replicas)


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastTokens(Router):
    """The replica with the fewest tokens of work in flight: prompt plus output still to
    sample, over its outstanding requests."""

    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """Fewest tokens of work."""
        return fewest_tokens(replicas)


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastKV(Router):
    """The replica with the lowest KV-cache utilization (then the fewest outstanding)."""

    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """Lowest share of KV blocks in use."""
        return lowest_kv(replicas)


@mypyc_attr(allow_interpreted_subclasses=True)
class PowerOfTwo(Router):
    """Two replicas drawn at random; the one with fewer requests in flight (the first drawn on
    a tie)."""

    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """The less loaded of two random picks."""
        if len(replicas) == 1:
            return replicas[0]
        i, j = self.rng.choice(len(replicas), size=2, replace=False)
        a, b = replicas[int(i)], replicas[int(j)]
        return b if b.num_outstanding < a.num_outstanding else a


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixAffinity(Router):
    """The replica that has served the longest prefix of the request, unless it has more
    than ``affinity_margin`` requests in flight above the least loaded one; then the least
    loaded. Which replica holds which prefix is the router's own index of the prefixes it
    sent where (as llm-d's approximate prefix scorer keeps), keyed by ``Request.prefix``.
    When the fleet's shared KV tier holds as much of the prefix (``Request.shared_blocks``),
    any replica can load it from there, and ``shared_margin`` (if set) is the margin instead:
    0 sends the request to the holder only when no other replica has fewer in flight."""

    uses_prefix = True

    def __init__(self, rng: np.random.Generator, affinity_margin: int = 0) -> None:
        super().__init__(rng, affinity_margin)
        self._holder: dict[Hashable, int] = {}  # prefix key -> replica that got it last
        self.shared_margin: int | None = None
        """The margin for a request whose prefix the shared KV tier holds as deep as its
        holder does (``cluster.shared_kv.affinity_margin``); None: ``affinity_margin``."""

    def choose(self, request: Request, replicas: Sequence[Replica]) -> Replica:
        """Cache affinity within the load margin."""
        least = fewest_outstanding(replicas)
        by_index = {r.index: r for r in replicas}
        best: Replica | None = None
        depth = 0
        for key in request.prefix:  # keys chain, so the deepest hit is the longest prefix
            holder = by_index.get(self._holder.get(key, -1))
            if holder is None:
                break
            best, depth = holder, depth + 1
        margin = self.affinity_margin
        if self.shared_margin is not None and 0 < depth <= request.shared_blocks:
            margin = self.shared_margin
        pick = least
        if best is not None and best.num_outstanding <= least.num_outstanding + margin:
            pick = best
        for key in request.prefix:
            self._holder[key] = pick.index
        return pick


ROUTERS: Registry[type[Router]] = Registry(
    "router",
    {
        "round_robin": RoundRobin,
        "random": Random,
        "least_outstanding": LeastOutstanding,
        "least_tokens": LeastTokens,
        "least_kv": LeastKV,
        "power_of_two": PowerOfTwo,
        "prefix_affinity": PrefixAffinity,
    },
    check=Router,
)
"""Router name (``cluster.router``) -> its class; a scenario may also name a ``Router``
subclass by import path (``module:Class``)."""


def make_router(name: str, rng: np.random.Generator, affinity_margin: int = 0) -> Router:
    """The router ``name`` (registered or ``module:Class``) with its random stream."""
    return ROUTERS.resolve(name)(rng, affinity_margin)
