"""Arrival times of a changing rate (issue 22 item 1; benchmarks/README.md): CPU time and
peak memory of drawing N arrivals for each kind of schedule, against a constant rate, each in
a fresh process (its peak RSS is its own).

Run by hand: ``.venv/bin/python benchmarks/arrival_bench.py --n 5000000``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = {
    "constant rate": {"rate": 58.0},
    "rate_schedule (24 hourly steps)": {
        "rate_schedule": [
            [3600 * h, 20.0 + 8.0 * h if h < 12 else 212.0 - 8.0 * h] for h in range(24)
        ]
    },
    "rate_schedule_csv (1440 rows, linear)": "CSV",
    "diurnal, trough 0": {"diurnal": {"peak": 116.0, "trough": 0.0}},
    "diurnal, gamma cv 2": {
        "process": "gamma",
        "cv": 2.0,
        "diurnal": {"peak": 100.0, "trough": 16.0},
    },
}

CHILD = """
import json, math, resource, sys, tempfile, time
import numpy as np
from simulator.workload import arrival_times
from simulator.workload.config import ArrivalConfig
spec, n = json.loads(sys.argv[1]), int(sys.argv[2])
if spec == "CSV":  # a minute-by-minute day
    path = tempfile.mktemp(suffix=".csv")
    rows = [f"{60 * m},{58 + 50 * math.sin(2 * math.pi * m / 1440):.6f}" for m in range(1440)]
    open(path, "w").write("time_s,rate\\n" + "\\n".join(rows) + "\\n")
    spec = {"rate_schedule_csv": path}
cfg = ArrivalConfig.model_validate(spec)
start = time.process_time()
t = arrival_times(cfg, n, np.random.default_rng(0))
cpu = time.process_time() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(json.dumps({"cpu_s": cpu, "peak_gb": peak, "span_h": float(t[-1]) / 3600}))
"""


def main() -> None:
    """Print one Markdown row per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5_000_000, help="arrivals per case")
    args = parser.parse_args()
    print(f"| {args.n:,} arrivals | CPU s | peak RSS GB | simulated hours |")
    print("|---|---:|---:|---:|")
    for name, spec in CASES.items():
        out = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(spec), str(args.n)],
            check=True,
            capture_output=True,
            text=True,
        )
        got = json.loads(out.stdout)
        print(f"| {name} | {got['cpu_s']:.2f} | {got['peak_gb']:.2f} | {got['span_h']:.1f} |")


if __name__ == "__main__":
    main()
