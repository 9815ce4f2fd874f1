"""What a cluster costs: a run of N replicas against the sum of single-server runs of each
replica's share of the same requests.

The workload is engine_bench.py's ``issue`` case per replica (Poisson 20 req/s per replica,
lognormal prompts and outputs, budget 2048, 256 sequences, 8000 blocks, linear cost), 100,000
requests in all, on 1, 4, 16 and 64 replicas. For each N, the cluster runs once behind
``round_robin`` (decided up front: each replica runs its share as a single server would) and
once behind ``least_outstanding`` (decided at each arrival from the replicas' state), or
behind each of ``--routers``; then each replica's share of that router's run is simulated
alone, and those times summed (each router against its own shares: a router that spreads
the load unevenly gives its replicas other work).
Timings are CPU seconds of this process (``time.process_time``: the machine is shared, and
CPU time is what other processes disturb least), alternate cluster and shares, and keep the
best of ``--repeat``.

Run by hand: ``.venv/bin/python benchmarks/cluster_bench.py [--repeat 3] [--replicas 1 4 16 64]
[--routers round_robin least_outstanding ...]``.

``--floors``: for each router, also the same routing decisions replayed by a router that
reads no state (so nothing is decided during the run), once with the replicas interleaved on
one clock and once apart (each on its own, as ``round_robin``'s are): how much of a
state-reading router's cost is interleaving 64 replicas at all, whatever the router does.

``--day ROUTER [--day-requests N]``: instead, a simulated day through an autoscaled fleet
(``day_scenario``: the issue workload's lengths and step times, 5 million requests arriving
at a diurnal rate from 16 to 100 req/s, a target-utilization policy that may grow it to 64 at
the peak, cold starts of 120 s); prints its CPU and wall seconds, the peak resident memory of
this process and the fleet's figures. Run it in a process of its own (the memory is the
process's peak). Record results in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import numpy as np
from engine_bench import ISSUE, VIDUR  # run as a script: benchmarks/ is on sys.path

NUM_REQUESTS = 100_000
RATE_PER_REPLICA = 20.0


def scenario(num_replicas: int, router: str) -> dict[str, Any]:
    """The issue workload at ``num_replicas`` times the rate, behind a cluster."""
    cfg = copy.deepcopy(ISSUE)
    cfg["name"] = f"bench-cluster-{num_replicas}"
    cfg["workload"]["num_requests"] = NUM_REQUESTS
    cfg["workload"]["arrival"]["rate"] = RATE_PER_REPLICA * num_replicas
    cfg["cluster"] = {"replicas": num_replicas, "router": router}
    return cfg


def time_cluster(cfg: dict[str, Any]) -> tuple[float, Any]:
    """CPU time of the cluster's simulation and tables (workload built beforehand)."""
    from simulator.scenario.cluster import build_cluster
    from simulator.scenario.runner import build, resolve

    resolved = resolve(cfg)
    workload, _ = build(resolved)
    cluster = build_cluster(resolved, workload, None, None, True)
    start = time.process_time()
    result = cluster.run()
    return time.process_time() - start, result


def time_shares(cfg: dict[str, Any], replica: np.ndarray) -> float:
    """Summed CPU times of single-server runs of each replica's share."""
    from simulator.engine.simulation import Simulation
    from simulator.scenario.runner import build, resolve
    from simulator.scheduling import make_scheduler
    from simulator.workload.workload import Workload

    resolved = resolve({k: v for k, v in cfg.items() if k != "cluster"})
    workload, cost_model = build(resolved)
    total = 0.0
    for k in np.unique(replica[replica >= 0]):
        mine = replica == k
        share = Workload(
            workload.arrival_s[mine], workload.prompt_len[mine], workload.output_len[mine]
        )
        # no sampler: tokens only counted, as in ``servesim run`` and the cluster's replicas
        sim = Simulation(share, cost_model, make_scheduler(resolved.scheduler))
        start = time.process_time()
        sim.run()
        total += time.process_time() - start
    return total


def replayed_router(assigned: np.ndarray) -> type:
    """A router that reads no state and sends request ``i`` to replica ``assigned[i]``."""
    from simulator.cluster.router import Request, Router

    class Replayed(Router):
        reads_state = False

        def choose(self, request: Request, replicas: Any) -> Any:
            return replicas[assigned[request.index]]

    return Replayed


def time_replayed(cfg: dict[str, Any], assigned: np.ndarray, interleaved: bool) -> float:
    """CPU time of the cluster run with ``assigned`` replayed up front (``replayed_router``),
    its replicas interleaved on one clock or apart; checks that the decisions held."""
    from simulator.cluster.cluster import Cluster
    from simulator.cluster.routers import ROUTERS
    from simulator.scenario.cluster import build_cluster
    from simulator.scenario.runner import build, resolve

    ROUTERS["replayed"] = replayed_router(assigned)
    resolved = resolve({**cfg, "cluster": {**cfg["cluster"], "router": "replayed"}})
    workload, _ = build(resolved)
    cluster = build_cluster(resolved, workload, None, None, True)
    if interleaved:  # the same cluster, told not to run its replicas apart
        cluster = Cluster(**cluster._args, apart=False)
    start = time.process_time()
    result = cluster.run()
    cpu = time.process_time() - start
    assert (result.requests["replica"].to_numpy() == assigned).all()
    return cpu


DAY_S = 86_400.0
DAY_REQUESTS = 5_000_000


def day_scenario(router: str, num_requests: int = DAY_REQUESTS) -> dict[str, Any]:
    """The issue workload's lengths through a day of diurnal load on an autoscaled fleet of
    replicas of a larger model (engine_bench.py's ``vidur`` step times: 40 ms + 0.5 ms per
    sequence + 0.02 ms per token): the rate goes from 16 req/s at 02:00 to 100 req/s at
    14:00 (``num_requests`` cut the day short); a policy holding each replica at 0.45 of 64
    sequences was meant to ask for about 60 replicas at the peak (at most 64); the whole day
    peaked at 48 (benchmarks/README.md, "Session 27")."""
    cfg = copy.deepcopy(ISSUE)
    cfg["name"] = "bench-fleet-day"
    cfg["cost_model"] = copy.deepcopy(VIDUR["cost_model"])
    cfg["scheduler"]["max_num_seqs"] = 64
    cfg["workload"]["num_requests"] = num_requests
    cfg["workload"]["arrival"] = {
        "process": "poisson",
        "diurnal": {"peak": 100, "trough": 16, "period_s": DAY_S, "peak_at_s": 50_400},
    }
    cfg["cluster"] = {
        "replicas": 8,
        "router": router,
        "autoscaler": {
            "policy": "target_utilization",
            "metric": "running",
            "target": 0.45,
            "interval_s": 30,
            "metrics_delay_s": 15,
            "window_s": 60,
            "min_replicas": 1,
            "max_replicas": 64,
            "startup_s": 120,
            "scale_down_stabilization_s": 300,
            "scrape_interval_s": 5,
            "cost_per_hour": 2.0,
        },
    }
    return cfg


def run_day(router: str, num_requests: int) -> None:
    """Time one autoscaled day (``--steps none``: the step table is not kept) and print it."""
    import resource

    from simulator.scenario.cluster import build_cluster
    from simulator.scenario.runner import build, resolve

    resolved = resolve(day_scenario(router, num_requests))
    workload, _ = build(resolved)
    cluster = build_cluster(resolved, workload, None, None, True, steps="none")
    cpu, wall = time.process_time(), time.perf_counter()
    result = cluster.run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    s = result.summary
    print(
        f"{router} | {num_requests:,} | {s['duration_s'] / 3600:.1f} h | {s['num_steps']:,} | "
        f"{s['replicas_peak']} | {s['replicas_live_mean']:.1f} | {cpu:.0f} s | {wall:.0f} s | "
        f"{rss_gb:.2f} GB",
        flush=True,
    )


def main() -> None:
    """Print one row per replica count and router (or the autoscaled day's row)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--replicas", type=int, nargs="*", default=[1, 4, 16, 64])
    parser.add_argument("--routers", nargs="*", default=["round_robin", "least_outstanding"])
    parser.add_argument("--floors", action="store_true")
    parser.add_argument("--day", metavar="ROUTER", default=None)
    parser.add_argument("--day-requests", type=int, default=DAY_REQUESTS)
    args = parser.parse_args()
    if args.day is not None:
        print("router | requests | simulated | steps | peak | mean live | CPU | wall | peak RSS")
        run_day(args.day, args.day_requests)
        return
    floors = " | replayed, interleaved s | replayed, apart s" if args.floors else ""
    print(f"replicas | router | steps | cluster s{floors} | sum of its shares s | ratio")
    for n in args.replicas:
        for router in args.routers:
            best = {"cluster": np.inf, "interleaved": np.inf, "apart": np.inf, "shares": np.inf}
            steps = 0
            for _ in range(args.repeat):  # cluster and its shares alternate
                cpu, result = time_cluster(scenario(n, router))
                best["cluster"] = min(best["cluster"], cpu)
                steps = len(result.steps)
                # each replica's share of this router's run, simulated alone
                replica = result.requests["replica"].to_numpy()
                if args.floors:
                    for mode in ("interleaved", "apart"):
                        cpu = time_replayed(scenario(n, router), replica, mode == "interleaved")
                        best[mode] = min(best[mode], cpu)
                best["shares"] = min(best["shares"], time_shares(scenario(n, router), replica))
            shown = ["cluster", "interleaved", "apart"] if args.floors else ["cluster"]
            cells = " | ".join(f"{best[k]:.2f}" for k in shown)
            print(
                f"{n} | {router} | {steps:,} | {cells} | {best['shares']:.2f} | "
                f"{best['cluster'] / best['shares']:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
