"""A cluster: replicas (each a ``Server``) behind a router on one simpy clock, optionally with
prefill and decode on separate replicas and the KV moving between them over a link.

When a request is routed, and what the router sees (also in docs/cluster.md):

- A request is routed ``routing_delay_ms`` after it arrives and handed to its replica at once.
- A router that reads no state (``round_robin``, ``random``) is asked for every request before
  the run: each replica then gets its share through its own arrival process, exactly as a
  single server gets its workload (one replica behind such a router *is* a single server);
  when nothing else passes between them, one replica after the other (``apart.py``).
- A router that reads state decides at the routing instant, behind the step boundaries then
  (a zero-delay timeout if any; simpy runs same-time events first in, first out), and sees
  each replica as a step-by-step run shows it then: a step in flight is planned.
- A replica's fast steps never start at or after an instant something may be handed to it:
  its own next request, or behind a router that reads state the next routing instant, but
  there decode stretches are timed ahead and held (``Held``), taken when a request comes or
  they end; a decode replica stops where a prefill could end and at each KV landing.
- Disaggregated: the prefill replica samples the first token (TTFT ends there); the decode
  replica is chosen when the prefill ends; the KV (``prompt_len`` tokens) then takes
  ``bytes / bandwidth + latency`` on the link after the transfers booked before it; the
  request joins the decode replica's queue when it lands (after that instant's step
  boundaries) and decodes once that replica has blocks for it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Hashable
from typing import ClassVar

import numpy as np
import simpy

from simulator.cluster.apart import run_apart
from simulator.cluster.config import GroupSpec, SharedKVConfig
from simulator.cluster.handover import Handover
from simulator.cluster.kv_link import KVLink
from simulator.cluster.replica import Replica
from simulator.cluster.router import Request, Router, prefix_keys
from simulator.cluster.routers import PrefixAffinity, make_router
from simulator.cluster.shared_tier import SharedTier
from simulator.cluster.tables import ClusterRecords, cluster_result
from simulator.cost import CostModelConfig, build_cost_model
from simulator.cost.interface import CostModel
from simulator.engine.clock import sleep_until
from simulator.engine.result import SimulationResult
from simulator.engine.server import Server
from simulator.engine.serving import ServingConfig, StepWithCpu
from simulator.engine.step_sink import make_sink
from simulator.engine.tokens import sample, sample_many
from simulator.errors import InputError
from simulator.metrics import DEFAULT_PERCENTILES
from simulator.scheduling import make_scheduler
from simulator.scheduling.sequence import Sequence
from simulator.workload.workload import Workload

INF = math.inf


class Cluster:
    """One run of a workload through a cluster; results like a ``Simulation``'s, plus the
    replica of each request and step and a table of per-replica figures."""

    resizes: ClassVar[bool] = False
    """Whether replicas come and go during the run (an autoscaled fleet): a state-reading
    router then routes at each routing instant even behind one replica."""

    def __init__(
        self,
        workload: Workload,
        groups: list[GroupSpec],
        router: str,
        seed: int,
        *,
        routing_delay_s: float = 0.0,
        affinity_margin: int = 0,
        link: KVLink | None = None,
        kv_bytes_per_token: int = 0,
        slo: dict[str, float | None] | None = None,
        progress: Callable[[int], object] | None = None,
        fast_decode: bool = True,
        percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
        steps: str = "full",
        shared_kv: SharedKVConfig | None = None,
        apart: bool = True,
        serving: ServingConfig | None = None,
    ) -> None:
        self.workload, self.slo, self.link = workload, slo, link
        self._args = {k: v for k, v in locals().items() if k not in ("self", "apart")}
        # the fleet's shared KV tier (``shared_tier.py``), below every replica's GPU KV
        self.shared = (
            None if shared_kv is None else SharedTier(shared_kv, groups[0].scheduler.block_size)
        )
        self.kv_bytes_per_token, self.percentiles = kv_bytes_per_token, percentiles
        self.env, self.progress = simpy.Environment(), progress
        # the replica's front end follows the router's delay: routed as its engine takes it in
        self.serving = serving or ServingConfig()
        self.routing_delay_s = routing_delay_s + self.serving.frontend_delay_ms * 1e-3
        delays = (self.routing_delay_s, self.serving.response_delay_ms * 1e-3)
        disaggregated = any(g.role != "colocated" for g in groups)
        self.records = ClusterRecords(workload, disaggregated, *delays)
        self.handover = Handover(workload, self.records)
        """Each request as a replica takes it, and a replica's share on its clock."""
        self._routers(router, seed, affinity_margin, shared_kv)
        num_entry = sum(g.count for g in groups if g.role != "decode")
        self.by_state = self.router.reads_state and (num_entry > 1 or self.resizes)
        """Route at each routing instant (the router reads state) rather than up front."""
        # the replicas one after the other, each on its own clock (``apart.py``)
        self.apart = apart and not (self.by_state or link or shared_kv or self.resizes)
        num_replicas = sum(g.count for g in groups)
        self._next_at = [INF] * num_replicas  # per replica: its next request's instant
        self._next_route = INF  # the next routing instant (routing by state)
        self._pending: list[list[float]] = [[] for _ in range(num_replicas)]  # KV landings
        self._transfers, self._prefill_over = 0, False  # KV on links; all prefills done
        self.replicas: list[Replica] = []
        for spec in groups:
            self._add_group(spec, progress, fast_decode, steps)
        self.entry = [r for r in self.replicas if r.role != "decode"]
        """The replicas requests are routed to at arrival."""
        self.decode = [r for r in self.replicas if r.role == "decode"]
        groups_of: dict[str, list[Replica]] = {}
        for r in self.entry:
            groups_of.setdefault(r.group, []).append(r)
        self._entry_groups = list(groups_of.values())

    def _routers(
        self, router: str, seed: int, margin: int, shared_kv: SharedKVConfig | None
    ) -> None:
        """The router of arrivals and that of prefilled requests, each with its stream."""
        # the workload's stream is child 0, as in a single-server run
        streams = np.random.SeedSequence(seed).spawn(3)
        self.router = make_router(router, np.random.default_rng(streams[1]), margin)
        self.decode_router = make_router(router, np.random.default_rng(streams[2]), margin)
        for router_ in (self.router, self.decode_router):
            if isinstance(router_, PrefixAffinity) and shared_kv is not None:
                router_.shared_margin = shared_kv.affinity_margin  # it asks the shared tier

    def _add_group(
        self,
        spec: GroupSpec,
        progress: Callable[[int], object] | None,
        fast_decode: bool,
        steps: str,
    ) -> None:
        try:
            cost = self.cost_model(spec.cost_model)
        except InputError as err:
            raise InputError(f"{spec.field}.{err}") from None
        for _ in range(spec.count):
            self.replicas.append(self._replica(spec, cost, progress, fast_decode, steps))

    def cost_model(self, config: CostModelConfig) -> CostModel:
        """A replica's step times: its GPUs', with the CPU's share of each step (``serving``)."""
        cost = build_cost_model(config)
        return StepWithCpu(cost, self.serving) if self.serving.changes_steps else cost

    def _replica(
        self,
        spec: GroupSpec,
        cost: CostModel,
        progress: Callable[[int], object] | None,
        fast_decode: bool,
        steps: str,
    ) -> Replica:
        """The next replica of group ``spec``: its scheduler, recorder and server."""
        k = len(self.replicas)
        # tokens are drawn only where a decode replica takes a prefill's first token with its
        # KV; elsewhere they are counted (engine/tokens.py: the same tables, as a single
        # server's run, without building each request's output)
        if self.link is not None:
            scheduler = make_scheduler(spec.scheduler, sample, sample_many)
        else:
            scheduler = make_scheduler(spec.scheduler)
        if self.shared is not None:
            try:
                self.shared.attach(scheduler, f"{spec.field}.scheduler")
            except ValueError as err:
                raise InputError(f"cluster.shared_kv: {err}") from None
        rec = self.records.recorder_for(scheduler.num_blocks, make_sink(steps, None))
        counts = self.by_state or self.decode_router.reads_state and spec.role == "decode"
        retire = self._prefill_retire(k) if spec.role == "prefill" else None
        retire = self._counting_retire(k) if counts and retire is None else retire
        server = Server(
            simpy.Environment() if self.apart else self.env,
            scheduler,
            cost,
            rec,
            next_arrival=self._bound(k, spec.role),
            retire=retire,
            progress=progress,
            # a prefill replica hands each finished prompt on at the clock's instant (its
            # transfer starts then), so its steps must not run ahead of the clock
            fast_decode=fast_decode and spec.role != "prefill",
            # decode steps held ahead where only the router hands work over or reads
            holds=self.by_state and not (self.link or self.shared),
        )
        return Replica(k, spec.name, spec.role, server)

    # -- what bounds a replica's deferred decode steps -------------------------------------

    def _bound(self, k: int, role: str) -> Callable[[], float]:
        if role == "decode":
            return lambda: self._decode_bound(k)
        if self.by_state:
            return lambda: self._next_route
        nxt = self._next_at
        return lambda: nxt[k]

    def _decode_bound(self, k: int) -> float:
        """When decode replica ``k`` may next get a request: a KV landing, a prefill's end."""
        pending = self._pending[k]
        bound = min(pending) if pending else INF
        now = self.env.now
        for p in self.entry:
            s = p.server
            if s.busy_until >= now:
                soonest = s.busy_until
            elif s.has_work():
                soonest = now
            else:  # idle: its next prefill ends after its next request comes
                soonest = self._next_route if self.by_state else self._next_at[p.index]
            bound = min(bound, soonest)
        return bound

    # -- retiring ----------------------------------------------------------------------------

    def _counting_retire(self, k: int) -> Callable[[list[Sequence], float], None]:
        def retire(done: list[Sequence], end: float) -> None:
            r = self.replicas[k]
            r.server.record_finished(done, end)
            r.finished(len(done), sum(s.prompt_len for s in done))

        return retire

    def _prefill_retire(self, k: int) -> Callable[[list[Sequence], float], None]:
        output_len = self.records.output_len

        def retire(done: list[Sequence], end: float) -> None:
            r = self.replicas[k]
            finished = [s for s in done if output_len[s.seq_id] == 1]
            if finished:
                r.server.record_finished(finished, end)
            r.finished(len(done), sum(s.prompt_len for s in done))
            for seq in done:
                if output_len[seq.seq_id] > 1:
                    self._transfers += 1
                    self.env.process(self._transfer(r, seq))

        return retire

    # -- arrivals ----------------------------------------------------------------------------

    def _eligible(self, i: int) -> list[Replica] | None:
        """The replicas request ``i`` fits in (None: none; its rejection is recorded)."""
        rec = self.records
        seq = self.handover.sequence(i, rec.output_len[i])
        if self.decode:  # it must fit a decode replica to be worth a prefill
            reason = self.decode[0].server.rejection_reason(seq)
            if reason is not None:
                self._reject(i, f"decode replicas: {reason}")
                return None
            seq = self.handover.sequence(i, 1)
        fits: list[Replica] = []
        reasons: list[tuple[int, str]] = []
        for group in self._entry_groups:
            reason = group[0].server.rejection_reason(seq)
            if reason is None:
                fits.extend(group)
            else:
                s = group[0].server
                reasons.append((s.num_blocks * s.block_size, reason))
        if not fits:
            why = max(reasons)[1]
            self._reject(i, why if len(reasons) == 1 else f"fits no replica: {why}")
            return None
        return fits

    def _reject(self, i: int, reason: str) -> None:
        self.records.reject(i, reason)
        if self.progress is not None:
            self.progress(1)

    def _route_instants(self) -> array[float]:
        routed = np.asarray(self.workload.arrival_s, dtype=np.float64) + self.routing_delay_s
        return array("d", routed.tobytes())  # 8 bytes a request, not a float object

    def _request(self, i: int, router: Router) -> Request:
        rec, runs = self.records, self.workload.prompt_runs
        prefix: tuple[Hashable, ...] = ()
        shared = 0
        if router.uses_prefix and runs is not None:
            prefix = prefix_keys(runs.runs(i), self.entry[0].server.block_size)
            if self.shared is not None:  # the router may ask the shared tier what it holds
                shared = self.shared.prefix_blocks(self.handover.sequence(i, 1))
        return Request(i, rec.arrival_s[i], rec.prompt_len[i], rec.output_len[i], prefix, shared)

    def share(self, r: Replica, items: list[tuple[float, int]]) -> simpy.events.ProcessGenerator:
        """Replica ``r``'s requests, routed up front, as a single server's arrivals."""
        return self.handover.share(r, items, self._next_at)

    def _shares(self) -> list[list[tuple[float, int]]]:
        shares: list[list[tuple[float, int]]] = [[] for _ in self.replicas]
        for i, t in enumerate(self._route_instants()):
            fits = self._eligible(i)
            if fits is not None:
                shares[self.router.choose(self._request(i, self.router), fits).index].append((t, i))
        for r, items in zip(self.replicas, shares, strict=True):
            self._next_at[r.index] = items[0][0] if items else INF
        return shares

    def _routing(self) -> simpy.events.ProcessGenerator:
        """Route each request at its routing instant, from the state visible then."""
        env = self.env
        instants = self._route_instants()
        self._next_route = instants[0] if instants else INF
        for i, t in enumerate(instants):
            if t > env.now:
                self._next_route, wake = sleep_until(env, t)
                yield wake
                if env.peek() <= env.now:  # behind the step boundaries at this instant
                    yield env.timeout(0)
            elif i == 0:
                yield env.timeout(0)
            fits = self._eligible(i)
            if fits is not None:
                self.handover.submit(self.router.choose(self._request(i, self.router), fits), i)
        self._next_route = INF
        for r in self.entry:
            r.server.close()

    # -- disaggregation ----------------------------------------------------------------------

    def _transfer(self, prefill: Replica, seq: Sequence) -> simpy.events.ProcessGenerator:
        """Hand a prefilled request to a decode replica: route, move its KV, submit."""
        env, rec = self.env, self.records
        assert self.link is not None
        yield env.timeout(0)  # behind the decode replicas' step boundaries at this instant
        i = seq.seq_id
        dec = self.decode_router.choose(self._request(i, self.decode_router), self.decode)
        dec.routed(seq.prompt_len, rec.output_len[i] - len(seq.output))
        dec.num_incoming += 1
        ready = env.now
        start, end = self.link.book(ready, seq.prompt_len * self.kv_bytes_per_token)
        landing, wake = sleep_until(env, end)
        self._pending[dec.index].append(landing)
        rec.handoff(i, prefill.index, dec.index, seq.num_preemptions, ready, start, end)
        yield wake
        yield env.timeout(0)  # behind the decode replica's step boundaries at this instant
        self._pending[dec.index].remove(landing)
        dec.num_incoming -= 1
        rec.routed_to[i] = dec.index
        decode_seq = self.handover.sequence(i, rec.output_len[i], seq.output)
        dec.submit(decode_seq, prefilled=True)
        self._transfers -= 1
        if self._prefill_over and not self._transfers:
            self._close_decode()

    def _close_decode(self) -> None:
        for r in self.decode:
            r.server.close()

    def _after_prefill(self, procs: list[simpy.Process]) -> simpy.events.ProcessGenerator:
        yield self.env.all_of(procs)
        self._prefill_over = True
        if not self._transfers:
            self._close_decode()

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        """Simulate until every request has finished or been rejected."""
        env = self.env
        if self.apart:  # interleaved after all if two replicas' gaps met at an instant
            result = run_apart(self, self._shares())
            return result if result is not None else Cluster(**self._args, apart=False).run()
        if self.by_state:
            env.process(self._routing())
        else:
            for r, items in zip(self.replicas, self._shares(), strict=True):
                if r.role != "decode":
                    env.process(self.share(r, items))
        procs = [env.process(r.server.run()) for r in self.replicas]
        if self.decode:
            env.process(self._after_prefill(procs[: len(self.entry)]))
        env.run()
        return cluster_result(self.records, self.replicas, self.slo, self.percentiles)
