"""Running the replicas of a cluster one after the other, each on a clock of its own, when
nothing passes between them: a router that reads no state (each replica's share is decided
before the run), no disaggregation, no shared KV tier, no autoscaler. Each replica then runs
its share as a single server does, alone (64 replicas interleaved on one clock took 1.3-1.6
times as long for the same calls, measured; presumably their data sharing the caches).

The tables are those of the interleaved run: a replica's events keep their order (its own
events are all there are on its clock), the per-request records are each written by one
replica, the step table is sorted at the end. The one thing the replicas share is the ITL
distribution, whose mean is a float sum in the order chunks of gaps came; the chunks each
replica passes on during its run are logged with their instant and replayed in time order,
which is the interleaved run's order unless two replicas passed one on at the same instant
(then simpy's tie order is not known here, and the caller runs the replicas interleaved).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import simpy

from simulator.cluster.replica import Replica
from simulator.cluster.tables import ClusterRecords, cluster_result
from simulator.engine.result import SimulationResult
from simulator.metrics import Distribution

Share = list[tuple[float, int]]
"""A replica's requests, routed up front: (routing instant, request)."""


class Cluster(Protocol):
    """What of a cluster (``cluster.py``, which calls this module) runs apart."""

    replicas: list[Replica]
    records: ClusterRecords
    slo: dict[str, float | None] | None
    percentiles: tuple[float, ...]

    def share(self, r: Replica, items: Share) -> simpy.events.ProcessGenerator:
        """Replica ``r``'s arrivals, on its server's clock."""


Chunk = tuple[float, int, int, np.ndarray, "np.ndarray | None"]
"""A chunk of gaps a replica passed on: its instant, the replica, its place in the log, the
gaps and their weights."""


class ChunkLog(Distribution):
    """Stands in for the shared ITL distribution while one replica runs alone: keeps what it
    is given, with the instant, for ``replay``."""

    def __init__(self, env: simpy.Environment, replica: int, log: list[Chunk]) -> None:
        super().__init__()
        self.env, self.replica, self.log = env, replica, log

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Log a chunk of gaps (added to the real distribution by ``replay``; an empty one
        adds nothing there, so it is not logged and cannot meet another)."""
        if len(values):
            self.log.append((self.env.now, self.replica, len(self.log), values, weights))


def replay(log: list[Chunk], itl: Distribution) -> bool:
    """Add the logged chunks to ``itl`` in the order the interleaved run would have; False
    (nothing added) if two replicas passed chunks on at the same instant."""
    by_instant: dict[float, int] = {}
    for t, k, _, _, _ in log:
        if by_instant.setdefault(t, k) != k:
            return False
    for _, _, _, values, weights in sorted(log, key=lambda c: (c[0], c[2])):
        itl.add(values, weights)
    return True


def run_apart(cluster: Cluster, shares: list[list[tuple[float, int]]]) -> SimulationResult | None:
    """Run each replica's share on its own clock, one replica after the other: the run's
    tables, or None if they would not be the interleaved run's (``replay``; the cluster is
    spent then)."""
    rec = cluster.records.recorder
    assert rec is not None
    itl = rec.itl
    log: list[Chunk] = []
    for r, items in zip(cluster.replicas, shares, strict=True):
        env = r.server.env
        r.server.recorder.pass_gaps_to(ChunkLog(env, r.index, log))
        env.process(cluster.share(r, items))
        env.process(r.server.run())
        env.run()
    for r in cluster.replicas:
        r.server.recorder.pass_gaps_to(itl)
    if not replay(log, itl):
        return None
    return cluster_result(cluster.records, cluster.replicas, cluster.slo, cluster.percentiles)
