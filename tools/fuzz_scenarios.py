"""Random whole scenarios through servesim, run by hand to find what the tests do not.

Two modes, each for ``--seconds`` from ``--seed`` (the same seed draws the same scenarios):

- ``engine``: small scenarios of any shape the engine runs (both policies, prefix caching, KV
  offload, speculation, async scheduling, data parallelism, clusters behind every router,
  prefill/decode, autoscaling, serving overheads, closed loops), each simulated to its end.
  A scenario the configuration refuses (``InputError``) is counted, not a failure; any other
  exception, a run longer than ``--timeout`` seconds, a request neither finished nor rejected
  exactly once, or a negative KV block count is one. With ``--plain``, a share of them is run
  again on the plain path and its tables compared with the fast path's.
- ``cli``: the same scenarios with one or two values replaced by a bad one (negative, NaN,
  infinite, huge, a string, a list, a key removed or misspelt), through ``servesim validate``
  or ``run``: the exit code must be 0, 1 or 2, exit 2 must be one line, and nothing may print
  a traceback or hang.

Each failure is written to ``--out`` (default ``fuzz-failures/``) as the scenario and what
went wrong; a line per failure and a summary go to stdout. Session 32 found four bugs with it
in its first half hour (docs: benchmarks/README.md, "Session 32").

Run: ``.venv/bin/python tools/fuzz_scenarios.py engine --seconds 300 --seed 1 --plain``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

ROUTERS = ["round_robin", "random", "least_outstanding", "least_tokens", "least_kv",
           "power_of_two", "prefix_affinity"]  # fmt: skip
BAD = [-1, 0, 1.5, -0.5, "abc", None, [], {}, True, 10**12, float("nan"), float("inf"), [1, 2]]


class Stuck(Exception):
    """A run took longer than the timeout."""


def _stuck(signum: int, frame: object) -> None:
    raise Stuck("no end within the timeout")


def _scheduler(r: random.Random) -> dict[str, Any]:
    policy = r.choice(["spec", "vllm-v1"])
    out: dict[str, Any] = {
        "policy": policy,
        "max_num_batched_tokens": r.choice([16, 64, 256, 2048]),
        "max_num_seqs": r.choice([1, 4, 16, 256]),
        "num_blocks": r.choice([20, 60, 400, 4000]),
        "block_size": r.choice([1, 4, 16]),
    }
    if r.random() < 0.3:
        out["max_model_len"] = r.choice([64, 512, 4096])
    if policy == "vllm-v1":
        out["enable_prefix_caching"] = r.random() < 0.6
        for key, values in (("priority_policy", ["priority"]), ("reserve_full_isl", [True, False]),
                            ("long_prefill_token_threshold", [8, 64]),
                            ("admit_after_preemption", [True, False])):  # fmt: skip
            if r.random() < 0.3:
                out[key] = r.choice(values)
        if r.random() < 0.15:
            out["async_scheduling"] = True
        if out["enable_prefix_caching"] and r.random() < 0.3:
            cpu = {"size_gb": r.choice([0.0, 0.001, 1.0]), "bandwidth_gb_s": 10.0}
            cpu["host_memory_gb"] = 100
            out["kv_offload"] = {"cpu": cpu, "kv_bytes_per_token": 131072}
    return out


def _workload(r: random.Random, caching: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "num_requests": r.randint(20, 250),
        "arrival": {"process": r.choice(["poisson", "gamma", "constant"]),
                    "rate": r.choice([0.5, 5.0, 50.0, "inf"])},
        "prompt_len": r.choice([{"dist": "uniform", "low": 1, "high": 300},
                                {"dist": "lognormal", "mu": 4.0, "sigma": 1.0, "max": 2000},
                                {"dist": "fixed", "value": r.choice([1, 16, 33])}]),
        "output_len": r.choice([{"dist": "uniform", "low": 1, "high": 100},
                                {"dist": "lognormal", "mu": 3.0, "sigma": 1.0, "max": 500},
                                {"dist": "fixed", "value": r.choice([1, 2, 17])}]),
    }  # fmt: skip
    if caching and r.random() < 0.6:
        out["shared_prefix"] = {"num_prefixes": r.choice([1, 3]), "prefix_len": r.choice([16, 100]),
                                "users_per_prefix": r.choice([1, 4]),
                                "multi_turn": r.random() < 0.5}  # fmt: skip
    return out


def _cluster(r: random.Random, roofline: bool, caching: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"replicas": r.randint(2, 4), "router": r.choice(ROUTERS)}
    if roofline and r.random() < 0.25:
        link = {"bandwidth_gbps": 400, "latency_ms": 0.1}
        out = {"router": out["router"], "disaggregation": {
            "prefill": {"count": r.randint(1, 2)}, "decode": {"count": r.randint(1, 2)},
            "kv_transfer": link}}  # fmt: skip
    elif r.random() < 0.3:
        out["autoscaler"] = {"policy": r.choice(["target_utilization", "target_queue"]),
                             "target": r.choice([0.3, 1.0]), "interval_s": 5,
                             "metrics_delay_s": 1, "max_replicas": 5,
                             "startup_s": r.choice([0.0, 10.0]),
                             "scale_down_stabilization_s": 10}  # fmt: skip
    if caching and r.random() < 0.3:
        out["shared_kv"] = {"size_gb": r.choice([0.0, 1.0]), "bandwidth_gb_s": 50,
                            "kv_bytes_per_token": 131072, "host_memory_gb": 1000}  # fmt: skip
    return out


def scenario(r: random.Random) -> dict[str, Any]:
    """A small random scenario (it may be one the configuration refuses)."""
    sched = _scheduler(r)
    caching = bool(sched.get("enable_prefix_caching"))
    roofline = r.random() < 0.5
    cost = ({"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"} if roofline
            else {"type": "linear", "base_ms": r.choice([1.0, 5.0]),
                  "per_token_ms": r.choice([0.0, 0.01, 0.1]), "per_seq_ms": 0.1})  # fmt: skip
    cfg: dict[str, Any] = {"name": "fuzz", "seed": r.randint(0, 10**6), "scheduler": sched,
                           "cost_model": cost, "workload": _workload(r, caching)}  # fmt: skip
    layout = r.random()
    if layout < 0.15 and cfg["workload"]["arrival"]["rate"] != "inf":
        cfg["workload"]["max_concurrency"] = r.choice([1, 3, 20])
    elif layout < 0.45:
        cfg["cluster"] = _cluster(r, roofline, caching)
    elif layout < 0.6:
        cfg["parallel"] = {"data_parallel_size": r.choice([2, 4])}
    if "cluster" not in cfg and sched["policy"] == "vllm-v1" and r.random() < 0.25:
        cfg["speculative"] = {"num_speculative_tokens": r.choice([1, 3]),
                              "acceptance": {"rate": 0.7}}  # fmt: skip
    if r.random() < 0.3:
        cfg["serving"] = {"frontend_delay_ms": r.choice([0.0, 2.0]), "step_cpu_ms": 0.5,
                          "response_delay_ms": r.choice([0.0, 1.0]),
                          "async_scheduling": r.random() < 0.5}  # fmt: skip
    return cfg


def _check(cfg: dict[str, Any], result: Any) -> None:
    n = cfg["workload"]["num_requests"]
    requests = result.requests
    status = set(requests["status"])
    assert len(requests) == n and status <= {"finished", "rejected"}, f"statuses {status}"
    counted = result.summary["num_finished"] + result.summary["num_rejected"]
    assert counted == n, f"{counted} of {n} requests counted"
    if "blocks_used" in result.steps and len(result.steps):
        assert result.steps["blocks_used"].min() >= 0, "negative blocks_used"


def _engine(r: random.Random, plain: bool) -> str | None:
    """Run one scenario; what went wrong, or None (refused counts as fine)."""
    import pandas as pd

    from simulator.errors import InputError
    from simulator.scenario.runner import run

    cfg = scenario(r)
    try:
        result = run(cfg)
        _check(cfg, result)
        if plain and r.random() < 0.3:
            slow = run(cfg, fast_decode=False)
            for name in ("requests", "steps"):
                pd.testing.assert_frame_equal(getattr(result, name), getattr(slow, name))
    except InputError:
        return None
    except (Exception, Stuck):
        return json.dumps({"cfg": cfg, "error": traceback.format_exc()[-3000:]}, indent=1)
    return None


def _mutate(r: random.Random, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    for _ in range(r.randint(1, 2)):
        paths: list[tuple[str, ...]] = []
        todo: list[tuple[tuple[str, ...], dict[str, Any]]] = [((), cfg)]
        while todo:
            prefix, node = todo.pop()
            for key, value in node.items():
                paths.append((*prefix, key))
                if isinstance(value, dict):
                    todo.append(((*prefix, key), value))
        *parents, last = r.choice(paths)  # a key path
        node = cfg
        for key in parents:
            node = node[key]
        pick = r.random()
        if pick < 0.7:
            node[last] = r.choice(BAD)
        elif pick < 0.85:
            node.pop(last)
        else:
            node[last + "x"] = 1
    return cfg


def _cli(r: random.Random, folder: Path) -> str | None:
    """Run one mutated scenario through the CLI; what went wrong, or None."""
    from simulator.cli import main

    cfg = _mutate(r, scenario(r))
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = r.choice([["validate", str(path)], ["run", str(path), "--no-plots"]])
    if argv[0] == "run":
        argv += ["--out", str(Path(tempfile.mkdtemp(dir=folder)) / "out")]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code: Any = main(argv)
    except (Exception, Stuck, SystemExit) as exc:
        code = f"{type(exc).__name__}: {exc}"
    text = err.getvalue()
    lines = [x for x in text.strip().splitlines() if not x.startswith("servesim: warning")]
    wrong = None
    if code not in (0, 1, 2):
        wrong = f"exit {code}"
    elif "Traceback" in text:
        wrong = "a traceback"
    elif code == 2 and len(lines) != 1:
        wrong = f"{len(lines)} lines on exit 2"
    if wrong is None:
        return None
    return json.dumps({"cfg": cfg, "command": argv[0], "wrong": wrong, "stderr": text[-2000:]},
                      indent=1, default=str)  # fmt: skip


def main() -> int:
    """Fuzz for ``--seconds``; exit 1 if anything failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["engine", "cli"])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=40, help="seconds one run may take")
    parser.add_argument("--plain", action="store_true", help="engine: compare with the plain path")
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"))
    args = parser.parse_args()
    r, end = random.Random(args.seed), time.monotonic() + args.seconds
    signal.signal(signal.SIGALRM, _stuck)
    folder = Path(tempfile.mkdtemp())
    num = failed = 0
    while time.monotonic() < end:
        num += 1
        signal.alarm(args.timeout)
        try:
            wrong = _engine(r, args.plain) if args.mode == "engine" else _cli(r, folder)
        finally:
            signal.alarm(0)
        if wrong is not None:
            failed += 1
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{args.mode}-{args.seed}-{num}.json").write_text(wrong + "\n")
            print(f"scenario {num}: failed, {args.out}/{args.mode}-{args.seed}-{num}.json")
    print(f"{num} scenarios, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
