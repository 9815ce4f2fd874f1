"""The README's capacity and design-search figures, and the local vs Ray timing of one search.

    .venv/bin/python benchmarks/explore_figures.py [--repeat N]

Runs (each as the README shows it):
- ``servesim capacity scenarios/quickstart.yaml`` -> docs/img/capacity_quickstart.png
- ``servesim search scenarios/load-sweep.yaml`` over hardware x tp -> docs/img/search_pareto.png
- the same search with ``--backend local --jobs 2`` and ``--backend ray --jobs 2`` (a local
  Ray instance of 2 CPUs, started by the command), interleaved, best of ``--repeat``; prints
  the wall times and checks that both give the same table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
SERVESIM = [sys.executable, "-m", "simulator"]

CAPACITY = ["capacity", "scenarios/quickstart.yaml"]
SEARCH = [
    "search",
    "scenarios/load-sweep.yaml",
    "--grid",
    "cost_model.hardware=a100-80gb,h100-sxm,h200",
    "--grid",
    "cost_model.tp=1,2",
    "--slo",
    "ttft_p99_ms=1000,tpot_p99_ms=40",
]


def servesim(argv: list[str], out: Path) -> float:
    """Run ``servesim ARGV --out OUT``; its wall time in seconds."""
    started = time.perf_counter()
    subprocess.run([*SERVESIM, *argv, "--out", str(out), "--overwrite"], cwd=ROOT, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="servesim-explore-"))
    try:
        took = servesim(CAPACITY, work / "capacity")
        found = json.loads((work / "capacity" / "capacity.json").read_text())
        shutil.copy(work / "capacity" / "plots" / "capacity.png", IMG / "capacity_quickstart.png")
        print(
            f"capacity {found['capacity']:.3f} req/s in {found['num_simulations']} simulations "
            f"({took:.1f} s)"
        )
        times: dict[str, list[float]] = {"local": [], "ray": []}
        for _ in range(args.repeat):
            for backend in times:
                out = work / f"search-{backend}"
                times[backend].append(servesim([*SEARCH, "--backend", backend, "--jobs", "2"], out))
        local = pd.read_parquet(work / "search-local" / "search.parquet")
        on_ray = pd.read_parquet(work / "search-ray" / "search.parquet")
        pd.testing.assert_frame_equal(local, on_ray)
        shutil.copy(work / "search-local" / "plots" / "pareto.png", IMG / "search_pareto.png")
        runs = int(local["num_simulations"].sum())
        print(f"search: {len(local)} deployments, {runs} simulations; tables identical")
        for backend, ts in times.items():
            print(f"  {backend:>5}: best {min(ts):.1f} s of {[round(t, 1) for t in ts]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
