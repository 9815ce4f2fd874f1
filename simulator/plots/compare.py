"""The figure of ``servesim compare``: measured and simulated CDFs of TTFT, TPOT and E2E."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from simulator.plots.style import DPI
from simulator.validation.compare import SimulatedRun
from simulator.validation.measured import MeasuredRun

_PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(values[~np.isnan(values)]) * 1e3
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def plot_compare_cdfs(sim: SimulatedRun, meas: MeasuredRun, title: str = "") -> Figure:
    """One panel per metric, the measured CDF under the simulated one, each legend with the
    means."""
    fig = Figure(figsize=(13, 4), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, 3, squeeze=False)[0]
    since = "from the engine queue" if meas.reference == "queued" else "from arrival"
    for ax, (metric, label) in zip(axes, _PANELS, strict=True):
        for side, values, style in (
            ("measured", getattr(meas, metric), {"color": "k", "lw": 2.2, "alpha": 0.55}),
            ("simulated", getattr(sim, metric), {"color": "C1", "lw": 1.4}),
        ):
            x, y = _ecdf(values)
            mean = f"{np.nanmean(values) * 1e3:,.1f} ms" if x.size else "-"
            ax.step(x, y, where="post", label=f"{side} (mean {mean})", **style)
        unit = f"{label} (ms, {since})" if metric != "tpot" else f"{label} (ms)"
        ax.set_xlabel(unit)
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    fig.suptitle(title or f"Measured vs simulated: {len(meas):,} requests")
    return fig
