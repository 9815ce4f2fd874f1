"""The figure of an autoscaled fleet: the load, the replica count and the p99 TTFT over time,
on one time axis (object-oriented matplotlib only, like ``plots/run.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator.plots.style import DPI, save_figure

FLEET_PLOTS = ("fleet",)
_TIME_BINS = 120


def _p99_by_bin(t: np.ndarray, ttft: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The p99 TTFT of the requests arriving in each bin (NaN where none finished)."""
    which = np.digitize(t, edges) - 1
    out = np.full(len(edges) - 1, np.nan)
    order = np.argsort(which, kind="stable")
    bins, starts = np.unique(which[order], return_index=True)
    for b, chunk in zip(bins, np.split(ttft[order], starts[1:]), strict=True):
        if 0 <= b < len(out) and chunk.size:
            out[b] = np.percentile(chunk, 99)
    return out


def plot_fleet(requests: pd.DataFrame, fleet: pd.DataFrame) -> Figure:
    """Three panels over time: arrivals per second, replicas live and starting (a step plot
    of ``fleet.parquet``), and the p99 TTFT of the requests arriving in each time bin."""
    fig = Figure(figsize=(10, 7.5), dpi=DPI, layout="constrained")
    axes = fig.subplots(3, 1, sharex=True, squeeze=False)[:, 0]
    arrival = requests["arrival_s"].to_numpy(dtype=float)
    end = max(float(arrival.max()) if arrival.size else 0.0, float(fleet["time_s"].max()), 1e-9)
    edges = np.linspace(0.0, end, _TIME_BINS + 1)
    counts, _ = np.histogram(arrival, bins=edges)
    mid = 0.5 * (edges[1:] + edges[:-1])
    axes[0].plot(mid, counts / np.diff(edges), color="C0")
    axes[0].set_ylabel("arrivals (req/s)")
    times = np.append(fleet["time_s"].to_numpy(), end)
    for col, color in (("live", "C2"), ("starting", "C1"), ("draining", "C7")):
        if col in fleet:
            values = np.append(fleet[col].to_numpy(), fleet[col].to_numpy()[-1:])
            axes[1].step(times, values, where="post", color=color, label=col)
    axes[1].set_ylabel("replicas")
    axes[1].legend(fontsize=9)
    done = (requests["status"] == "finished").to_numpy()
    p99 = _p99_by_bin(arrival[done], requests["ttft_s"].to_numpy(dtype=float)[done], edges)
    axes[2].plot(mid, p99 * 1e3, color="C3")
    axes[2].set_ylabel("p99 TTFT (ms)")
    if np.nanmax(p99, initial=0.0) > 50 * max(np.nanmin(p99, initial=1.0), 1e-3):
        axes[2].set_yscale("log")
    axes[2].set_xlabel("time (s)")
    fig.suptitle("Load, replicas and p99 TTFT (by arrival time) of an autoscaled fleet")
    return fig


def save_fleet_plots(
    requests: pd.DataFrame, fleet: pd.DataFrame, out_dir: Path, fmt: str = "png"
) -> list[Path]:
    """Write the fleet figure into ``out_dir`` and return its path."""
    fig = plot_fleet(requests, fleet)
    return [save_figure(fig, Path(out_dir) / f"{FLEET_PLOTS[0]}.{fmt}", fmt)]
