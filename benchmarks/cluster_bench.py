"""What a cluster costs: a run of N replicas against the sum of single-server runs of each
replica's share of the same requests.

The workload is engine_bench.py's ``issue`` case per replica (Poisson 20 req/s per replica,
lognormal prompts and outputs, budget 2048, 256 sequences, 8000 blocks, linear cost), 100,000
requests in all, on 1, 4, 16 and 64 replicas. For each N, the cluster runs once behind
``round_robin`` (decided up front: each replica runs its share as a single server would) and
once behind ``least_outstanding`` (decided at each arrival from the replicas' state); then
each replica's share of the round-robin run is simulated alone, and those wall times summed.
Timings are CPU seconds of this process (``time.process_time``: the machine is shared, and
CPU time is what other processes disturb least), alternate cluster and shares, and keep the
best of ``--repeat``.

Run by hand: ``.venv/bin/python benchmarks/cluster_bench.py [--repeat 3] [--replicas 1 4 16 64]``.
Record results in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import numpy as np
from engine_bench import ISSUE  # run as a script: benchmarks/ is on sys.path

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
    from simulator.cluster_scenario import build_cluster
    from simulator.runner import build, resolve

    resolved = resolve(cfg)
    workload, _ = build(resolved)
    cluster = build_cluster(resolved, workload, None, None, True)
    start = time.process_time()
    result = cluster.run()
    return time.process_time() - start, result


def time_shares(cfg: dict[str, Any], replica: np.ndarray) -> float:
    """Summed CPU times of single-server runs of each replica's share."""
    from simulator.engine.simulation import Simulation
    from simulator.engine.tokens import sample, sample_many
    from simulator.runner import build, resolve
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
        sim = Simulation(share, cost_model, make_scheduler(resolved.scheduler, sample, sample_many))
        start = time.process_time()
        sim.run()
        total += time.process_time() - start
    return total


def main() -> None:
    """Print one row per replica count."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--replicas", type=int, nargs="*", default=[1, 4, 16, 64])
    args = parser.parse_args()
    print(
        "replicas | steps | round_robin s | least_outstanding s | sum of shares s | "
        "rr ratio | lo ratio"
    )
    for n in args.replicas:
        best: dict[str, float] = {"rr": np.inf, "lo": np.inf, "shares": np.inf}
        steps = 0
        for _ in range(args.repeat):
            wall, result = time_cluster(scenario(n, "round_robin"))
            best["rr"] = min(best["rr"], wall)
            steps = len(result.steps)
            replica = result.requests["replica"].to_numpy()
            best["shares"] = min(best["shares"], time_shares(scenario(n, "round_robin"), replica))
            best["lo"] = min(best["lo"], time_cluster(scenario(n, "least_outstanding"))[0])
        print(
            f"{n} | {steps:,} | {best['rr']:.2f} | {best['lo']:.2f} | {best['shares']:.2f} | "
            f"{best['rr'] / best['shares']:.2f}x | {best['lo'] / best['shares']:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
