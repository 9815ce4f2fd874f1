"""The README's cluster figures: scenarios/cluster-routing.yaml under each router, and
scenarios/pd-disaggregation.yaml as 1 prefill : 3 decode, 2 : 2 and 4 colocated replicas,
all on Azure's conversation trace from ``../shared/data``. Writes docs/img/cluster_routing.png,
docs/img/pd_disaggregation.png and prints the tables the README quotes.

Run by hand (a few minutes): ``.venv/bin/python benchmarks/cluster_figures.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import simulator
from simulator.engine.result import SimulationResult
from simulator.scenario.config import apply_overrides, read_yaml

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "azure2023_conv.csv"
ROUTERS = ["round_robin", "random", "least_outstanding", "least_tokens", "least_kv", "power_of_two"]
PD_LAYOUTS: dict[str, dict[str, Any]] = {
    "1 prefill : 3 decode": {},
    "2 prefill : 2 decode": {
        "cluster.disaggregation.prefill.count": 2,
        "cluster.disaggregation.decode.count": 2,
    },
    "4 colocated": {"cluster.disaggregation": None, "cluster.replicas": 4},
}
COLUMNS = ["ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "goodput", "load_imbalance"]


def run(name: str, overrides: dict[str, Any]) -> SimulationResult:
    """A scenario of scenarios/ on the shared copy of the trace."""
    data = read_yaml(ROOT / "scenarios" / f"{name}.yaml")
    over = {"workload.trace.path": str(TRACE), **overrides}
    return simulator.run(apply_overrides(data, over, name))


def table(results: dict[str, SimulationResult]) -> pd.DataFrame:
    """One row per run: the headline figures, latencies in ms."""
    rows = {}
    for label, res in results.items():
        s = res.summary
        rows[label] = {
            "TTFT p50 ms": s["ttft_p50_s"] * 1e3,
            "TTFT p99 ms": s["ttft_p99_s"] * 1e3,
            "TPOT p50 ms": s["tpot_p50_s"] * 1e3,
            "TPOT p99 ms": s["tpot_p99_s"] * 1e3,
            "goodput req/s": s["goodput"],
            "SLO met %": s["slo_attainment"] * 100,
        }
    return pd.DataFrame(rows).T


def bars(frame: pd.DataFrame, title: str, path: Path) -> None:
    """TTFT and TPOT p50/p99 per run, as grouped bars on two panels."""
    fig = Figure(figsize=(10, 4.2), dpi=120, layout="constrained")
    axes = fig.subplots(1, 2)
    x = np.arange(len(frame))
    for ax, metric in zip(axes, ("TTFT", "TPOT"), strict=True):
        for j, p in enumerate(("p50", "p99")):
            ax.bar(x + (j - 0.5) * 0.38, frame[f"{metric} {p} ms"], width=0.38, label=p)
        ax.set_xticks(x, frame.index, rotation=20, ha="right", fontsize=9)
        ax.set_ylabel(f"{metric} (ms)")
        ax.legend(fontsize=9)
        if metric == "TTFT" and frame["TTFT p99 ms"].max() > 20 * frame["TTFT p50 ms"].min():
            ax.set_yscale("log")
    fig.suptitle(title)
    fig.savefig(path)


def main() -> None:
    """Run both comparisons and write the figures."""
    img = ROOT / "docs" / "img"
    routing = {r: run("cluster-routing", {"cluster.router": r}) for r in ROUTERS}
    frame = table(routing)
    frame["load imbalance"] = [routing[r].summary["load_imbalance"] for r in ROUTERS]
    print(frame.to_string(float_format=lambda v: f"{v:.2f}"))
    bars(
        frame,
        "8 x Llama-2-70B (TP 8, H100) on Azure conversations at 5.3x: routers",
        img / "cluster_routing.png",
    )
    pd_runs = {label: run("pd-disaggregation", over) for label, over in PD_LAYOUTS.items()}
    frame = table(pd_runs)
    print(frame.to_string(float_format=lambda v: f"{v:.2f}"))
    for label, res in pd_runs.items():
        if "kv_transfer_mean_s" in res.summary:
            print(f"{label}: KV transfer mean {res.summary['kv_transfer_mean_s'] * 1e3:.2f} ms")
    bars(
        frame,
        "4 x Llama-2-70B (TP 8, H100) on Azure conversations at 2x: disaggregated or not",
        img / "pd_disaggregation.png",
    )


if __name__ == "__main__":
    main()
