"""The figure of ``servesim compare``: measured and simulated CDFs of TTFT, TPOT and E2E."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from simulator.plots.style import DPI
from simulator.validation.compare import SimulatedRun
from simulator.validation.measured import MeasuredRun

_PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))
_STYLE: dict[str, dict[str, object]] = {
    "measured": {"color": "k", "lw": 2.2, "alpha": 0.55},
    "simulated": {"color": "C1", "lw": 1.4},
}


def _ecdf(values: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(values[~np.isnan(values)]) * scale
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def plot_compare_cdfs(sim: SimulatedRun, meas: MeasuredRun, title: str = "") -> Figure:
    """One panel per metric, the measured CDF under the simulated one, each legend with the
    means (milliseconds, or seconds where the values pass 10 s)."""
    # placed by hand: constrained layout costs a third of the figure's drawing time here
    fig = Figure(figsize=(13, 4), dpi=DPI)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.13, top=0.9, wspace=0.2)
    axes = fig.subplots(1, 3, squeeze=False)[0]
    since = ", from the engine queue" if meas.reference == "queued" else ""
    for ax, (metric, label) in zip(axes, _PANELS, strict=True):
        sides = ((meas, "measured"), (sim, "simulated"))
        top = max(float(np.nanmax(getattr(run, metric), initial=0.0)) for run, _ in sides)
        unit, scale = ("s", 1.0) if top > 10.0 else ("ms", 1e3)
        for run, side in sides:
            values = getattr(run, metric)
            x, y = _ecdf(values, scale)
            mean = f"{np.nanmean(values) * scale:,.1f} {unit}" if x.size else "-"
            ax.step(x, y, where="post", label=f"{side} (mean {mean})", **_STYLE[side])
        ax.set_xlabel(f"{label} ({unit}{since if metric != 'tpot' else ''})")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    fig.suptitle(title or f"Measured vs simulated: {len(meas):,} requests")
    return fig
