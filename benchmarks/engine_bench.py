"""Wall time of a whole ``servesim run`` against a bare loop that only drives the scheduler.

Workloads:

- ``issue``: 20,000 requests, Poisson 20 req/s, lognormal prompts (mu 6.5, sigma 1, max 4096)
  and outputs (mu 5, sigma 1, max 1024); budget 2048, 256 seqs, 8000 blocks of 16; linear cost
  4 ms + 0.02 ms/token + 0.05 ms/seq.
- ``vidur``: Vidur's published point: 10,000 requests of 2048 prompt + 512 output tokens,
  Poisson 1 req/s (about 30 running sequences).

Run by hand: ``.venv/bin/python benchmarks/engine_bench.py [issue|vidur]``; each case runs in a
fresh process so peak memory (ru_maxrss) is its own. Record results in benchmarks/README.md.

``engine_bench.py --today CHECKOUT [--repeat N]``: issue 19's check, the in-process run of
each case under this tree and under another checkout, interleaved, medians of CPU time.

``engine_bench.py policies [--repeat N]``: the issue's workload as a whole ``servesim run``
under each scheduling policy (spec; vllm-v1 without and with prefix caching; spec with prefix
caching), interleaved in fresh processes, best of N, as ratios to the spec policy.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ISSUE: dict[str, Any] = {
    "name": "bench-issue",
    "seed": 0,
    "scheduler": {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256,
        "num_blocks": 8000,
        "block_size": 16,
    },
    "cost_model": {"type": "linear", "base_ms": 4, "per_token_ms": 0.02, "per_seq_ms": 0.05},
    "workload": {
        "num_requests": 20_000,
        "arrival": {"process": "poisson", "rate": 20},
        "prompt_len": {"dist": "lognormal", "mu": 6.5, "sigma": 1.0, "max": 4096},
        "output_len": {"dist": "lognormal", "mu": 5.0, "sigma": 1.0, "max": 1024},
    },
}
VIDUR: dict[str, Any] = {
    **ISSUE,
    "name": "bench-vidur",
    # ~56 ms decode steps at 30 sequences, so about 30 requests are running at once, as in
    # Vidur's published run (its own step times came from a profiled A100 model).
    "cost_model": {"type": "linear", "base_ms": 40, "per_token_ms": 0.02, "per_seq_ms": 0.5},
    "workload": {
        "num_requests": 10_000,
        "arrival": {"process": "poisson", "rate": 1},
        "prompt_len": {"dist": "fixed", "value": 2048},
        "output_len": {"dist": "fixed", "value": 512},
    },
}
CASES = {"issue": ISSUE, "vidur": VIDUR}
POLICIES: dict[str, dict[str, Any]] = {
    "spec": {"policy": "spec"},
    "vllm-v1": {"policy": "vllm-v1", "enable_prefix_caching": False},
    "vllm-v1+cache": {"policy": "vllm-v1", "enable_prefix_caching": True},
    "spec+cache": {"policy": "spec", "enable_prefix_caching": True},
}


def with_policy(scenario: dict[str, Any], policy: str) -> dict[str, Any]:
    """``scenario`` with the scheduler keys of ``POLICIES[policy]``."""
    return {**scenario, "scheduler": {**scenario["scheduler"], **POLICIES[policy]}}


def bare_loop(scenario: dict[str, Any]) -> tuple[float, int]:
    """Drive only the scheduler over the same arrivals, with the same step times (no simpy,
    no Batch, no recording): the floor any engine built on this scheduler pays."""
    from simulator.scenario.runner import build, resolve
    from simulator.scheduling import Sequence, StepScheduler

    cfg = resolve(scenario)
    workload, _ = build(cfg)
    c = cfg.cost_model
    s = cfg.scheduler
    assert s.num_blocks is not None
    base, per_tok, per_seq = c.base_ms / 1e3, c.per_token_ms / 1e3, c.per_seq_ms / 1e3  # type: ignore[union-attr]
    sched = StepScheduler(
        s.num_blocks, s.block_size, s.max_num_seqs, s.max_num_batched_tokens, keep_finished=False
    )
    arrival = workload.arrival_s.tolist()
    prompt = workload.prompt_len.tolist()
    output = workload.output_len.tolist()
    start = time.perf_counter()
    now, i, n, steps = 0.0, 0, len(arrival), 0
    while i < n or sched.has_work():
        while i < n and arrival[i] <= now:
            sched.add(Sequence(i, prompt[i], output[i]))
            i += 1
        if not sched.has_work():
            now = arrival[i]
            continue
        # the scheduler's own fast paths: stretches of pure decodes, then fast steps
        stretch = sched.decode_stretch()
        if stretch is not None:
            k = 0
            for m, contexts, _, _, _ in stretch.segments:
                for _ in contexts:
                    now += base + (per_tok + per_seq) * m
                    k += 1
                    if i < n and arrival[i] <= now:
                        break
                else:
                    continue
                break
            sched.take_decodes(k)
            steps += k
            continue
        steps += 1
        plan = sched.fast_step()
        if plan is not None:
            now += base + per_tok * plan.total_num_scheduled_tokens + per_seq * len(plan)
            sched.finish_fast_step()
            continue
        plan = sched.schedule()
        now += base + per_tok * sum(plan.num_new_tokens) + per_seq * len(plan)
        sched.update()
    elapsed = time.perf_counter() - start
    return elapsed, steps


def full_run(scenario: dict[str, Any]) -> tuple[float, int, float]:
    """``servesim run`` in-process, writing its outputs (no plots) into a temporary folder:
    wall s, steps, mean batch."""
    import tempfile

    from simulator.results.outdir import atomic_dir
    from simulator.results.writer import write_result
    from simulator.scenario.runner import resolve, run

    cfg = resolve(scenario)
    start = time.perf_counter()
    result = run(cfg)
    with (
        tempfile.TemporaryDirectory() as folder,
        atomic_dir(Path(folder) / "out", overwrite=False) as tmp,
    ):
        write_result(result, tmp, plots=False)
    wall = time.perf_counter() - start
    return wall, int(result.summary["num_steps"]), float(result.steps["num_seqs"].mean())


def time_cli(scenario: dict[str, Any]) -> float:
    """Wall time of the whole ``servesim run`` process (start-up, imports, writing, no plots)."""
    import tempfile

    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(scenario))
        cmd = [sys.executable, "-m", "simulator", "run", str(path), "--out", f"{tmp}/out"]
        start = time.perf_counter()
        subprocess.run([*cmd, "--no-plots"], check=True, capture_output=True)
        return time.perf_counter() - start


def one(case: str, what: str) -> None:
    """Child process: run one measurement and print it as JSON."""
    scenario = CASES[case]
    if what in POLICIES:
        start = time.process_time()
        wall, steps, _ = full_run(with_policy(scenario, what))
        cpu = time.process_time() - start
        print(json.dumps({"wall_s": wall, "cpu_s": cpu, "steps": steps}))
        return
    start = time.process_time()
    if what == "bare":
        wall, steps = bare_loop(scenario)
        extra: dict[str, Any] = {}
    else:
        wall, steps, batch = full_run(scenario)
        extra = {"mean_batch": batch}
    cpu = time.process_time() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "steps": steps, "maxrss_mib": rss, **extra}))


def against(today: Path, repeat: int) -> None:
    """Issue 19's check: the in-process ``servesim run`` of each case under this tree and
    under the checkout ``today`` (this script run with its code first on the path),
    interleaved, medians of CPU time."""
    import os
    from statistics import median

    trees = {"today": today.resolve(), "this tree": Path(__file__).resolve().parents[1]}
    for case in CASES:
        cpu: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(repeat):
            for name, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", case, "full"],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                )
                cpu[name].append(json.loads(proc.stdout)["cpu_s"])
        before, after = (median(cpu[name]) for name in trees)
        runs = "; ".join(f"{name} {', '.join(f'{c:.2f}' for c in cs)}" for name, cs in cpu.items())
        print(
            f"{case}: today {before:.2f} s, this tree {after:.2f} s of CPU: {after / before:.3f}x"
        )
        print(f"  ({runs})")


def main() -> None:
    """Run each case as bare loop and full run, in fresh processes, and print a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "cases", nargs="*", default=[], help="issue, vidur (default: both), or policies"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--today", type=Path, help="with no case: each case against it")
    args = parser.parse_args()
    if args.child:
        one(*args.child)
        return
    if args.today and not args.cases:
        against(args.today, args.repeat)
        return
    if args.cases == ["policies"]:
        compare_policies(args.repeat)
        return
    for case in args.cases or list(CASES):
        res: dict[str, list[dict[str, Any]]] = {"bare": [], "full": []}
        for _ in range(args.repeat):
            for what in res:
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", case, what],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                res[what].append(json.loads(proc.stdout))
        cli = min(time_cli(CASES[case]) for _ in range(args.repeat))
        bare = min(r["wall_s"] for r in res["bare"])
        full = min(res["full"], key=lambda r: r["wall_s"])
        steps = full["steps"]
        print(
            f"{case}: {steps:,} steps | bare scheduler loop {bare:.2f} s "
            f"({steps / bare:,.0f} steps/s) | servesim run {full['wall_s']:.2f} s "
            f"({steps / full['wall_s']:,.0f} steps/s) | ratio {full['wall_s'] / bare:.2f}x | "
            f"mean batch {full['mean_batch']:.1f} seqs | peak RSS {full['maxrss_mib']:.0f} MiB "
            f"(bare loop {min(r['maxrss_mib'] for r in res['bare']):.0f} MiB) | "
            f"whole CLI process {cli:.2f} s"
        )


def compare_policies(repeat: int) -> None:
    """The issue's workload under each policy, interleaved, best of ``repeat``."""
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    for _ in range(repeat):
        for policy in POLICIES:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", "issue", policy],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[policy].append(json.loads(proc.stdout))
    base = min(r["wall_s"] for r in runs["spec"])
    base_cpu = min(r["cpu_s"] for r in runs["spec"])
    for policy, results in runs.items():
        wall = min(r["wall_s"] for r in results)
        cpu = min(r["cpu_s"] for r in results)
        print(
            f"{policy:<14} {results[0]['steps']:>7,} steps | whole run {wall:6.2f} s "
            f"({wall / base:.2f}x spec) | CPU {cpu:6.2f} s ({cpu / base_cpu:.2f}x spec)"
        )


if __name__ == "__main__":
    main()
