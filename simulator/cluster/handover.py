"""How a cluster hands its requests to replicas: each as the ``Sequence`` a replica's scheduler
takes, with where it went recorded, and a replica's requests routed up front submitted on its
clock. The per-request path of a cluster, compiled with the hot path (``native.py``), as a
single server's arrivals are (``engine/simulation.py``)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from simulator.cluster.replica import Replica
from simulator.cluster.tables import ClusterRecords
from simulator.engine.clock import sleep_until
from simulator.scheduling.sequence import Sequence
from simulator.workload.workload import Workload

INF = float("inf")


class Handover:
    """A cluster's requests, as its replicas take them."""

    def __init__(self, workload: Workload, records: ClusterRecords) -> None:
        self.workload = workload
        self.records = records
        """Where each request went (``routed_to``; on a prefill replica ``prefill_replica``)."""

    def sequence(self, i: int, max_tokens: int, output: list[int] | None = None) -> Sequence:
        """Request ``i`` as a replica's scheduler takes it (``max_tokens`` 1 on a prefill
        replica; on a decode replica with the ``output`` sampled at the prefill)."""
        w = self.workload
        return Sequence(
            i,
            self.records.prompt_len[i],
            max_tokens,
            priority=0 if w.priority is None else int(w.priority[i]),
            prompt_runs=None if w.prompt_runs is None else w.prompt_runs.runs(i),
            output=output or (),
        )

    def submit(self, r: Replica, i: int) -> None:
        """Hand request ``i`` to replica ``r``: its prefill only, on a prefill replica."""
        rec = self.records
        p, o = rec.prompt_len[i], rec.output_len[i]
        rec.routed_to[i] = r.index
        if r.role == "prefill":
            rec.prefill_replica[i] = r.index
            r.routed(p, 1)
            r.submit(self.sequence(i, 1))
        else:
            r.routed(p, o)
            r.submit(self.sequence(i, o))

    def share(
        self, r: Replica, items: list[tuple[float, int]], next_at: list[float]
    ) -> Generator[simpy.Event, Any, None]:
        """Replica ``r``'s requests, routed up front, submitted as a single server's arrivals
        are; ``next_at[r.index]`` is the instant simpy will resume it next, where the
        replica's fast windows stop."""
        env, k = r.server.env, r.index
        for t, i in items:
            if t > env.now:
                next_at[k], wake = sleep_until(env, t)
                yield wake
            self.submit(r, i)
        next_at[k] = INF
        r.server.close()
