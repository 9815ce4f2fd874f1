"""An autoscaled cluster: the replicas of one group come and go as an ``Autoscaler`` decides,
on the cluster's simpy clock (docs/autoscaling.md).

One control process walks a merged timeline of instants, and at each, after the replicas'
step boundaries there (a zero-delay timeout), does in this order:

1. replicas whose cold start ends now become ready and join the router's list;
2. at every ``k * scrape_interval_s``: each ready replica's gauges are read (running, waiting,
   KV use), and the TTFT of each request whose first token has come since the last reading
   is stamped with that first token's time;
3. at every ``k * interval_s``: a decision from the window that ended ``metrics_delay_s``
   ago; replicas asked for start (ready after ``startup``), starting ones are cancelled
   (youngest first), ready ones retire (the most recently ready first, as a ReplicaSet
   scales down): they receive nothing more and drain;
4. the requests routed at this instant are handed to their replicas.

A router that reads state picks from the ready replicas at each routing instant. One that does
not (round robin, random) sees the same list until the fleet next changes, so it is asked for
all the requests up to that change at once, and each replica's deferred decode steps run up to
its own next request (or the change, or the next reading), as in a fixed cluster.

The decisions stop with the last request's routing: replicas still starting are cancelled
then, and the ready ones serve until every request is done; each is billed from its request
until it has drained (those still ready until the run's end).
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import insort
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import pandas as pd
import simpy

from simulator.cluster.autoscale_policies import MetricsWindow
from simulator.cluster.autoscaler import Autoscaler, AutoscalerConfig, plan
from simulator.cluster.cluster import Cluster
from simulator.cluster.config import GroupSpec
from simulator.cluster.fleet_ledger import FleetLedger
from simulator.cluster.gauge import Gauge
from simulator.cluster.replica import Replica
from simulator.cluster.tables import cluster_result
from simulator.cluster.timed_samples import TimedSamples
from simulator.engine.result import SimulationResult
from simulator.workload.workload import Workload

INF = math.inf
GAUGES = ("running", "waiting", "kv_use")
"""What a replica's gauge reads, in this order."""


def land_at(env: simpy.Environment, t: float) -> Generator[simpy.Event, Any, None]:
    """Sleep until exactly ``t``: a timeout of ``t - now`` lands on ``now + (t - now)``, which
    is ``t`` whenever ``now >= t / 2`` (Sterbenz); from earlier, hop to ``3t/4`` first."""
    now = env.now
    if now + (t - now) != t:
        yield env.timeout(0.75 * t - now)
    yield env.timeout(t - env.now)


class AutoscaledCluster(Cluster):
    """A cluster of one group of identical replicas whose count an autoscaler sets."""

    resizes = True

    def __init__(
        self,
        workload: Workload,
        group: GroupSpec,
        router: str,
        seed: int,
        scaling: AutoscalerConfig,
        startup_s: float,
        gpus_per_replica: int = 1,
        cost_per_hour: float | None = None,
        **options: Any,
    ) -> None:
        self._next_read = INF  # the next instant the control process reads or hands over
        self._fast_decode = bool(options.get("fast_decode", True))
        self._steps = str(options.get("steps", "full"))
        super().__init__(workload, [group], router, seed, **options)
        self.group, self.startup_s = group, startup_s
        self.gpus_per_replica, self.cost_per_hour = gpus_per_replica, cost_per_hour
        """GPUs one replica holds (tensor parallel) and dollars per GPU-hour (None: no cost)."""
        self._next_decision = scaling.interval_s
        self.scaler = Autoscaler(scaling)
        self.ledger = FleetLedger(group.count)
        self.live: list[Replica] = list(self.replicas)
        """The ready replicas the router picks from, in index order."""
        self.ready_at = [0.0] * group.count
        keep = scaling.metrics_delay_s + (scaling.window_s or scaling.interval_s)
        keep += scaling.scrape_interval_s
        self._keep_s = keep
        self.gauges = [Gauge(GAUGES, keep) for _ in self.replicas]
        self.ttft = TimedSamples(keep)
        self._awaiting: list[int] = []  # requests handed over without a first token yet
        self._starting: list[int] = []  # replicas starting, in order of request
        self._ready_heap: list[tuple[float, int]] = []  # (ready instant, replica)
        self._draining: set[int] = set()
        self._epoch_end = -INF  # routing up front: the requests before it are routed
        self._queue: deque[tuple[float, int, Replica]] = deque()  # ... and wait here
        self._times: list[deque[float]] = [deque() for _ in self.replicas]  # per replica
        self._cost = self.cost_model(group.cost_model)

    # -- replicas ------------------------------------------------------------------------------

    def _bound(self, k: int, role: str) -> Callable[[], float]:
        nxt = self._next_at
        return lambda: min(nxt[k], self._next_read)

    def _start(self, now: float) -> None:
        """Ask for one more replica: ready after the cold start."""
        r = self._replica(self.group, self._cost, self.progress, self._fast_decode, self._steps)
        self.replicas.append(r)
        self._next_at.append(INF)
        self._times.append(deque())
        self.gauges.append(Gauge(GAUGES, self._keep_s))
        self.ready_at.append(INF)
        k = self.ledger.request(now)
        assert k == r.index
        self._starting.append(k)
        heapq.heappush(self._ready_heap, (now + self.startup_s, k))

    def _ready(self, k: int, now: float) -> None:
        self._starting.remove(k)
        self.ledger.ready(k, now)
        self.ready_at[k] = now
        r = self.replicas[k]
        insort(self.live, r, key=lambda x: x.index)
        self.gauges[k].record(now, 0.0, 0.0, 0.0)  # a fresh server holds nothing
        self.env.process(self._serve(r))

    def _retire(self, r: Replica, now: float) -> None:
        self.live.remove(r)
        self.ledger.retire(r.index, now)
        self._draining.add(r.index)
        self._next_at[r.index] = INF
        r.server.close()

    def _serve(self, r: Replica) -> simpy.events.ProcessGenerator:
        """A replica's server; a retired one is gone once it has drained."""
        yield from r.server.run()
        if r.index in self._draining:
            self._draining.discard(r.index)
            self.ledger.gone(r.index, self.env.now)
            # its buffered rows go now, not at the day's end: a day starts and retires
            # hundreds of replicas, each holding up to a chunk of rows in Python lists
            r.server.recorder.settle()

    # -- readings and decisions ------------------------------------------------------------

    def _scrape(self, now: float) -> None:
        for r in self.live:
            self.gauges[r.index].record(now, r.num_running, r.num_waiting, r.kv_utilization)
        first = self.records.recorder.first_token  # type: ignore[union-attr]
        came = [i for i in self._awaiting if first[i] <= now]  # NaN: not yet
        if came:
            self._awaiting = [i for i in self._awaiting if not first[i] <= now]
            arrival = self.records.arrival_s
            for t, i in sorted((first[i], i) for i in came):
                self.ttft.add(t, t - arrival[i])

    def window(self, now: float) -> MetricsWindow:
        """What a decision at ``now`` reads: the replicas ready over the whole window."""
        lo, hi = self.scaler.window_bounds(now)
        rows = []
        for r in self.live:
            if self.ready_at[r.index] <= lo:
                avg = self.gauges[r.index].average(lo, hi)
                if not np.isnan(avg).any():
                    rows.append(avg)
        values = np.array(rows, dtype=np.float64).reshape(-1, len(GAUGES))
        seqs = float(self.group.scheduler.budgets()[1])
        return MetricsWindow(
            now_s=now,
            start_s=lo,
            end_s=hi,
            current=len(self.live) + len(self._starting),
            starting=len(self._starting),
            running=values[:, 0],
            max_num_seqs=np.full(len(values), seqs),
            kv_use=values[:, 2],
            waiting=values[:, 1],
            ttft_s=self.ttft.between(lo, hi),
        )

    def _decide(self, now: float) -> None:
        desired = self.scaler.decide(self.window(now))
        step = plan(desired, len(self.live), len(self._starting))
        for _ in range(step.start):
            self._start(now)
        for _ in range(step.cancel):
            k = self._starting.pop()  # the youngest
            self._ready_heap = [x for x in self._ready_heap if x[1] != k]
            heapq.heapify(self._ready_heap)
            self.ledger.cancel(k, now)
        if step.retire:
            newest = sorted(self.live, key=lambda r: (self.ready_at[r.index], r.index))
            for r in newest[-step.retire :]:
                self._retire(r, now)

    # -- routing ---------------------------------------------------------------------------

    def _eligible(self, i: int) -> list[Replica] | None:
        return None if super()._eligible(i) is None else self.live

    def _route_ahead(self, instants: array[float], i: int, end: float) -> int:
        """Route (a router that reads no state) the requests before ``end`` from ``i``; the
        first not routed."""
        queue, times, n = self._queue, self._times, len(instants)
        while i < n and instants[i] < end:
            fits = self._eligible(i)
            if fits is not None:
                r = self.router.choose(self._request(i, self.router), fits)
                queue.append((instants[i], i, r))
                times[r.index].append(instants[i])
            i += 1
        self._epoch_end = end
        for r in self.live:
            own = times[r.index]
            self._next_at[r.index] = own[0] if own else end
        return i

    def _hand(self, r: Replica, i: int) -> None:
        self.handover.submit(r, i)
        self._awaiting.append(i)
        if not self.by_state:
            own = self._times[r.index]
            own.popleft()
            self._next_at[r.index] = own[0] if own else self._epoch_end

    def _fleet_change(self) -> float:
        """The next instant the list of ready replicas may change."""
        soonest = self._ready_heap[0][0] if self._ready_heap else INF
        return min(soonest, self._next_decision)

    def _control(self) -> simpy.events.ProcessGenerator:
        env, cfg = self.env, self.scaler.cfg
        instants = self._route_instants()
        n, i = len(instants), 0
        scrapes = decisions = 0
        next_scrape, self._next_decision = 0.0, cfg.interval_s
        if not self.by_state:
            i = self._route_ahead(instants, 0, self._fleet_change())
        while True:
            queue = self._queue
            t_req = (
                (instants[i] if i < n else INF) if self.by_state else queue[0][0] if queue else INF
            )
            if t_req == INF and i >= n:
                break
            t = min(t_req, next_scrape, self._fleet_change())
            self._next_read = t if self.by_state else min(next_scrape, self._epoch_end)
            if t > env.now:
                yield from land_at(env, t)
            yield env.timeout(0)  # behind the replicas' step boundaries at this instant
            while self._ready_heap and self._ready_heap[0][0] <= t:
                self._ready(heapq.heappop(self._ready_heap)[1], t)
            if t == next_scrape:
                self._scrape(t)
                scrapes += 1
                next_scrape = scrapes * cfg.scrape_interval_s
            if t == self._next_decision:
                self._decide(t)
                decisions += 1
                self._next_decision = (decisions + 1) * cfg.interval_s
            if not self.by_state and t >= self._epoch_end:
                i = self._route_ahead(instants, i, self._fleet_change())
            if self.by_state:
                while i < n and instants[i] <= t:
                    fits = self._eligible(i)
                    if fits is not None:
                        self._hand(self.router.choose(self._request(i, self.router), fits), i)
                    i += 1
            else:
                while queue and queue[0][0] <= t:
                    _, j, r = queue.popleft()
                    self._hand(r, j)
        self._wind_down()

    def _wind_down(self) -> None:
        """The last request is routed: cancel what is starting, let the ready ones finish."""
        now = self.env.now
        self._next_read = INF
        for k in reversed(self._starting):
            self.ledger.cancel(k, now)
        self._starting, self._ready_heap = [], []
        for r in self.live:
            self._next_at[r.index] = INF
            r.server.close()

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        """Simulate until every request has finished or been rejected."""
        env = self.env
        for r in self.replicas:
            env.process(self._serve(r))
        env.process(self._control())
        env.run()
        end = env.now
        for r in self.live:  # billed until the run's end
            self.ledger.retire(r.index, end)
            self.ledger.gone(r.index, end)
        lives = self.ledger.lifetimes()
        # each replica's figures over its own time serving, not the whole run's
        serving = np.zeros(len(self.replicas))
        serving[lives["replica"].to_numpy()] = np.nan_to_num(
            lives["gone_s"].to_numpy() - lives["ready_s"].to_numpy()
        )
        args = (self.records, self.replicas, self.slo, self.percentiles, serving)
        result = cluster_result(*args)
        self._books(result, end, lives)
        return result

    def _books(self, result: SimulationResult, end: float, lives: pd.DataFrame) -> None:
        """The fleet's tables (``lives``: the ledger's lifetimes) and its cost in ``result``."""
        ledger, gpus, price = self.ledger, self.gpus_per_replica, self.cost_per_hour
        fleet = ledger.frame()
        held = lives["gone_s"].to_numpy() - lives["requested_s"].to_numpy()
        lives["gpu_seconds"] = held * gpus
        result.tables.update(fleet=fleet, replica_lifetimes=lives)
        times = np.append(fleet["time_s"].to_numpy(), end)
        span = np.diff(times)
        live = fleet["live"].to_numpy()
        total = end - times[0]
        gpu_s = ledger.replica_seconds(end) * gpus
        result.summary.update(
            {
                "replicas_peak": int((live + fleet["starting"].to_numpy()).max()),
                "replicas_live_mean": float(span @ live / total) if total > 0 else float("nan"),
                "replica_starts": int(len(lives) - self.group.count),
                "startup_s": self.startup_s,
                "gpus_per_replica": gpus,
                "gpu_seconds": gpu_s,
                "cost_per_hour": price,
                "cost_usd": gpu_s * price / 3600.0 if price is not None else None,
            }
        )
