"""BLIS (llm-d's Go simulator, built as benchmarks/README.md says) against whole ``servesim run
--no-plots`` processes of this tree and of another checkout, interleaved, on issue 24's
workload: Poisson 30 req/s, 512-token prompts, 256-token outputs, Llama-3.1-8B roofline on one
H100, budget 2048, 256 sequences, 26,312 blocks of 16 (``speed_bench.BLIS``).

Per repeat and request count: one BLIS run (``--cache-signal-delay 0``), then the ``spec``
and ``vllm-v1`` (its prefix caching on) policies under each checkout. CPU time is the child's
user + system time; medians of ``--repeat`` (a shared machine: the load is printed).

Run by hand: ``.venv/bin/python benchmarks/blis_bench.py --blis /work/blis-src/blis
--today /work/main 10000 100000``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_bench import HERE, run_once, scenario, warm_up  # noqa: E402


def blis_args(n: int) -> list[str]:
    """BLIS's ``run`` arguments for ``n`` requests of the workload."""
    return [
        "run",
        "--model", "meta-llama/llama-3.1-8b-instruct",
        "--latency-model", "roofline",
        "--hardware", "H100",
        "--tp", "1",
        "--num-requests", str(n),
        "--rate", "30",
        "--prompt-tokens", "512", "--prompt-tokens-stdev", "0",
        "--prompt-tokens-min", "512", "--prompt-tokens-max", "512",
        "--output-tokens", "256", "--output-tokens-stdev", "0",
        "--output-tokens-min", "256", "--output-tokens-max", "256",
        "--max-num-batched-tokens", "2048",
        "--max-num-seqs", "256",
        "--total-kv-blocks", "26312",
        "--block-size-in-tokens", "16",
        "--cache-signal-delay", "0",
    ]  # fmt: skip


def run_blis(binary: Path, n: int) -> dict[str, float]:
    """One BLIS process (run from its source tree, where its defaults.yaml is)."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [str(binary), *blis_args(n)], cwd=binary.parent, stdout=out, stderr=out
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status):
            out.seek(0)
            raise SystemExit(f"BLIS failed:\n{out.read().decode()[-2000:]}")
        out.seek(0)
        if f'"completed_requests": {n},' not in out.read().decode():
            raise SystemExit(f"BLIS did not complete {n} requests")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_gb": usage.ru_maxrss * 1024 / 1e9,
    }


def bench(n: int, blis: Path, trees: dict[str, Path], repeat: int) -> dict[str, list[dict]]:
    """``repeat`` interleaved rounds of BLIS and both policies under every tree."""
    runs: dict[str, list[dict]] = {"BLIS": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = {}
        for policy in ("spec", "vllm-v1"):
            files[policy] = folder / f"blis-{n}-{policy}.yaml"
            files[policy].write_text(yaml.safe_dump(scenario(f"blis-{n}:{policy}")))
        for name, tree in trees.items():
            res = warm_up(tree, folder)
            print(f"  {name}: a 10-request run takes {res['cpu_s']:.2f} s of CPU", flush=True)
        for i in range(repeat):
            res = run_blis(blis, n)
            runs["BLIS"].append(res)
            print(f"  {n} BLIS run {i + 1}: CPU {res['cpu_s']:.2f} s", flush=True)
            for name, tree in trees.items():
                for policy, path in files.items():
                    key = f"{name}, {policy}"
                    res = run_once(tree, path, folder / f"{name}-{policy}-{i}".replace(" ", "_"))
                    runs.setdefault(key, []).append(res)
                    print(f"  {n} {key} run {i + 1}: CPU {res['cpu_s']:.2f} s", flush=True)
    return runs


def report(n: int, runs: dict[str, list[dict]]) -> None:
    """A markdown row per engine: medians, peak memory, CPU against BLIS and against spec."""
    cpu = {k: median(r["cpu_s"] for r in rs) for k, rs in runs.items()}
    print(f"\n| {n:,} requests | wall (median) | CPU (median) | peak RSS | CPU / BLIS |")
    print("|---|---:|---:|---:|---:|")
    for key, rs in runs.items():
        wall = median(r["wall_s"] for r in rs)
        peak = max(r["maxrss_gb"] for r in rs)
        print(
            f"| {key} | {wall:.1f} s | {cpu[key]:.2f} s | {peak:.2f} GB | "
            f"{cpu[key] / cpu['BLIS']:.2f}x |"
        )
    for key in runs:
        if key.endswith("vllm-v1"):
            spec = key.replace("vllm-v1", "spec")
            print(f"{key} / spec: {cpu[key] / cpu[spec]:.2f}x")


def main() -> None:
    """Benchmark the request counts named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("counts", nargs="+", type=int, help="numbers of requests")
    parser.add_argument("--blis", type=Path, required=True, help="the built BLIS binary")
    parser.add_argument("--today", type=Path, help="another checkout to compare against")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    trees = {"this tree": HERE}
    if args.today:
        trees["today"] = args.today.resolve()
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    results = {n: bench(n, args.blis.resolve(), trees, args.repeat) for n in args.counts}
    for n, runs in results.items():
        report(n, runs)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
