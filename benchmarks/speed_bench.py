"""Whole ``servesim run --no-plots`` processes, this tree against another checkout ("today"),
side by side: wall time, CPU time and peak memory (issue 15; benchmarks/README.md).

Cases:

- ``blis``: issue 15's workload, on which BLIS (llm-d's Go simulator) was measured: 100,000
  requests, Poisson 30 req/s, 512-token prompts and 256-token outputs, Llama-3-8B roofline on
  one H100, budget 2048, 256 sequences, 26,312 blocks of 16.
- ``quickstart-N``: ``scenarios/quickstart.yaml`` with N requests at a stable 6 req/s (issue
  12's million-request case is ``quickstart-1000000``).
- any case with ``:POLICY`` after it (``blis-10000:vllm-v1``): that scheduling policy, with
  its default prefix caching; ``+async`` after it (``quickstart-100000:vllm-v1+async``):
  with ``scheduler.async_scheduling`` (vLLM's default).

Each run is a fresh process (its peak RSS is its own), the engines interleaved run by run,
medians of ``--repeat``; CPU time is the child's user + system time (steadier than wall time on
a shared machine). Children cache their bytecode (``child_env``) and each checkout first makes
a 10-request run, whose CPU time is the fixed cost of a run. The other checkout runs with
the same Python and ``PYTHONPATH`` pointing at it, e.g. ``--today /work/baseline`` (a worktree
of commit b49a3ca). With both engines, the requests tables of their first runs are compared.

Run by hand: ``.venv/bin/python benchmarks/speed_bench.py blis --today /work/baseline``.
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
from typing import Any

import yaml

HERE = Path(__file__).resolve().parents[1]

BLIS: dict[str, Any] = {
    "name": "blis-workload",
    "seed": 0,
    "scheduler": {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256,
        "num_blocks": 26_312,
        "block_size": 16,
        # BLIS was given 26,312 blocks and checks no memory; at vLLM's default 0.9 they are
        # 0.1 GB more than an H100 holds, which servesim now refuses
        "gpu_memory_utilization": 0.91,
    },
    "cost_model": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm", "tp": 1},
    "workload": {
        "num_requests": 100_000,
        "arrival": {"process": "poisson", "rate": 30},
        "prompt_len": {"dist": "fixed", "value": 512},
        "output_len": {"dist": "fixed", "value": 256},
    },
}
"""Issue 15's workload, as BLIS was run on it."""


def scenario(case: str) -> dict[str, Any]:
    """The scenario of ``case``: ``blis``, ``blis-N`` or ``quickstart-N``, then ``:POLICY``
    if it names a scheduling policy, then ``+async`` for async scheduling."""
    case, _, policy = case.partition(":")
    policy, _, flag = policy.partition("+")
    name, _, n = case.partition("-")
    if name == "blis":
        out = yaml.safe_load(yaml.safe_dump(BLIS))
    elif name == "quickstart":
        out = yaml.safe_load((HERE / "scenarios" / "quickstart.yaml").read_text())
        out["workload"]["arrival"]["rate"] = 6  # a stable rate: the queue does not grow
    else:
        raise SystemExit(f"unknown case {case!r}: blis, blis-N or quickstart-N")
    if n:
        out["workload"]["num_requests"] = int(n)
    if policy:
        out["scheduler"]["policy"] = policy
    if flag == "async":
        out["scheduler"]["async_scheduling"] = True
    elif flag:
        raise SystemExit(f"unknown flag {flag!r} of case {case!r}: async")
    return out


PYCACHE = Path(tempfile.gettempdir()) / "servesim-bench-pycache"
"""Where the children keep their compiled bytecode (any checkout, even a read-only one)."""


def child_env(tree: Path) -> dict[str, str]:
    """The environment of a run of the checkout at ``tree``: its code first on the path, and
    bytecode cached as Python does by default (a shell with ``PYTHONDONTWRITEBYTECODE`` set
    would otherwise compile every module of every run: about 0.2 s of each)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def warm_up(tree: Path, folder: Path) -> dict[str, float]:
    """A 10-request run of the checkout at ``tree`` (its bytecode compiled, if it was not):
    the fixed cost of a run, start-up and writing."""
    path = folder / "warm-up.yaml"
    case = scenario("blis-10")
    path.write_text(yaml.safe_dump(case))
    return run_once(tree, path, folder / f"warm-up-{abs(hash(str(tree)))}")


def run_once(tree: Path, scenario_file: Path, out: Path) -> dict[str, float]:
    """One ``servesim run --no-plots`` process of the checkout at ``tree``."""
    env = child_env(tree)
    cmd = [sys.executable, "-m", "simulator", "run", str(scenario_file), "--out", str(out)]
    if (tree / "simulator" / "explore" / "uncertainty.py").exists():
        cmd += ["--uncertainty", "off"]  # one simulation a run, as before the model intervals
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [*cmd, "--no-plots"], cwd=out.parent, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"{tree}: exit {proc.returncode}\n{err.read().decode()[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_gb": usage.ru_maxrss * 1024 / 1e9,
    }


def same_requests(a: Path, b: Path) -> bool:
    """Whether two runs wrote the same requests table (every column both have, exactly)."""
    import pandas as pd

    x, y = pd.read_parquet(a / "requests.parquet"), pd.read_parquet(b / "requests.parquet")
    cols = [c for c in x.columns if c in y.columns]
    return len(x) == len(y) and x[cols].equals(y[cols])


def bench(case: str, engines: dict[str, Path], repeat: int) -> dict[str, list[dict[str, float]]]:
    """``repeat`` runs of ``case`` per engine, interleaved; prints each run."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / f"{case.replace(':', '-')}.yaml"
        path.write_text(yaml.safe_dump(scenario(case)))
        for name, tree in engines.items():
            res = warm_up(tree, folder)
            print(f"  {name}: a 10-request run takes {res['cpu_s']:.2f} s of CPU", flush=True)
        for i in range(repeat):
            for name, tree in engines.items():
                res = run_once(tree, path, folder / f"{name}-{i}")
                runs[name].append(res)
                print(
                    f"  {case} {name} run {i + 1}: wall {res['wall_s']:.2f} s, "
                    f"CPU {res['cpu_s']:.2f} s, peak {res['maxrss_gb']:.3f} GB",
                    flush=True,
                )
        if len(engines) == 2:
            a, b = (folder / f"{name}-0" for name in engines)
            print(f"  {case}: requests tables identical: {same_requests(a, b)}")
    return runs


def report(case: str, runs: dict[str, list[dict[str, float]]]) -> None:
    """A markdown row per engine: median wall, median CPU, largest peak memory, CPU ratio to
    the first engine."""
    first = next(iter(runs))
    med = {
        name: (median(r["wall_s"] for r in rs), median(r["cpu_s"] for r in rs))
        for name, rs in runs.items()
    }
    print(f"\n| {case} | wall (median) | CPU (median) | peak RSS | CPU vs {first} |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in runs.items():
        wall, cpu = med[name]
        peak = max(r["maxrss_gb"] for r in rs)
        print(
            f"| {name} | {wall:.1f} s | {cpu:.2f} s | {peak:.2f} GB | {cpu / med[first][1]:.2f}x |"
        )


def main() -> None:
    """Benchmark the cases named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="blis, blis-N or quickstart-N")
    parser.add_argument("--today", type=Path, help="another checkout to compare against")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    engines = {"today": args.today.resolve()} if args.today else {}
    engines["this tree"] = HERE
    print(f"python {sys.version.split()[0]}; load average {os.getloadavg()[0]:.1f} at start")
    results = {case: bench(case, engines, args.repeat) for case in args.cases}
    for case, runs in results.items():
        report(case, runs)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
