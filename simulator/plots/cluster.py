"""Figures of a cluster run: each replica's load and KV over time, and TTFT by replica.

Object-oriented matplotlib only (no pyplot), like ``plots/run.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from simulator.plots.style import DPI, save_figure

CLUSTER_PLOTS = ("replica_load", "ttft_by_replica")
_TIME_BINS = 200


def _time_average(steps: pd.DataFrame, column: str, edges: np.ndarray, replicas: int) -> np.ndarray:
    """``[replica, bin]``: the time average of ``column`` over each bin (an idle replica
    counts as 0), each step's value weighted by its duration and put in the bin it starts in."""
    out = np.zeros((replicas, len(edges) - 1))
    width = np.diff(edges)
    for k, own in steps.groupby("replica"):
        weights = own[column].to_numpy(dtype=float) * own["duration_s"].to_numpy()
        sums, _ = np.histogram(own["start_s"].to_numpy(), bins=edges, weights=weights)
        out[int(k)] = sums / width  # type: ignore[arg-type]
    return out


def plot_replica_load(steps: pd.DataFrame, num_replicas: int | None = None) -> Figure:
    """Two heat maps over time, one row per replica: requests queued or running, and the
    share of KV blocks in use."""
    fig = Figure(figsize=(10, 6.5), dpi=DPI, layout="constrained")
    axes = fig.subplots(2, 1, sharex=True, squeeze=False)[:, 0]
    n = num_replicas or (int(steps["replica"].max()) + 1 if len(steps) else 1)
    end = float((steps["start_s"] + steps["duration_s"]).max()) if len(steps) else 1.0
    edges = np.linspace(0.0, end, _TIME_BINS + 1)
    load = steps.assign(load=steps["num_running"] + steps["num_waiting"])
    panels = (
        ("load", "requests queued or running", "viridis", None),
        ("kv_utilization", "KV blocks in use (share)", "magma", 1.0),
    )
    for ax, (col, label, cmap, vmax) in zip(axes, panels, strict=True):
        grid = _time_average(load, col, edges, n)
        image = ax.imshow(
            grid,
            aspect="auto",
            origin="lower",
            extent=(0.0, end, -0.5, n - 0.5),
            cmap=cmap,
            vmin=0.0,
            vmax=vmax,
            interpolation="nearest",
        )
        ax.set_ylabel("replica")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label, fontsize=10, loc="left")
        fig.colorbar(image, ax=ax, pad=0.01)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle("Load and KV cache per replica (time averages)")
    return fig


def plot_ttft_by_replica(requests: pd.DataFrame) -> Figure:
    """TTFT of the finished requests, one box per replica that produced first tokens (the
    prefill replica when disaggregated)."""
    fig = Figure(figsize=(10, 4), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    col = "prefill_replica" if "prefill_replica" in requests else "replica"
    done = requests[requests["status"] == "finished"]
    groups = sorted(int(k) for k in done[col].unique())
    data = [done.loc[done[col] == k, "ttft_s"].to_numpy() * 1e3 for k in groups]
    if data:
        ax.boxplot(data, positions=groups, showfliers=False, whis=(1, 99))
        means = [d.mean() for d in data]
        ax.plot(groups, means, "o", color="C3", markersize=4, label="mean")
        ax.legend(fontsize=9)
        if max(np.max(d) for d in data) > 50 * max(min(np.min(d) for d in data), 1e-3):
            ax.set_yscale("log")
    ax.set_xlabel("prefill replica" if col == "prefill_replica" else "replica")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT by replica (box: quartiles, whiskers: p1-p99)", fontsize=10, loc="left")
    return fig


def save_cluster_plots(
    requests: pd.DataFrame, steps: pd.DataFrame, out_dir: Path, fmt: str = "png"
) -> list[Path]:
    """Write the cluster figures into ``out_dir`` and return their paths."""
    figures = (plot_replica_load(steps), plot_ttft_by_replica(requests))
    return [
        save_figure(fig, Path(out_dir) / f"{name}.{fmt}", fmt)
        for name, fig in zip(CLUSTER_PLOTS, figures, strict=True)
    ]
