"""The figure of a capacity search: the probed latency statistics against load, the SLO's
bounds as horizontal lines and the capacity found as a vertical one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simulator.plots.style import LEGEND, check_fmt, is_wide, new_figure, save_figure, set_log_y

_STATS = ("p50", "p90", "p99")
"""Percentiles drawn for context beside the SLO's own statistics."""


def _panels(found: dict[str, Any]) -> list[str]:
    """One panel per metric the SLO names (TTFT and TPOT for attainment), then attainment."""
    metrics = [b["metric"] for b in found["slo"]["bounds"]]
    metrics += [k[: -len("_ms")] for k in found["slo"]["limits"]]
    panels = list(dict.fromkeys(metrics or ["ttft", "tpot"]))
    if found["slo"]["attain"] is not None:
        panels.append("attain")
    return panels


def _x(probes: pd.DataFrame, found: dict[str, Any]) -> np.ndarray:
    """Load of each simulation: req/s, or a trace's speed (1 / time_scale)."""
    return probes["level"].to_numpy(dtype=float)


def _per_level(probes: pd.DataFrame, col: str) -> pd.Series:
    """Mean over seeds of ``col`` per load (runs cut short have no value)."""
    if col not in probes:
        return pd.Series(dtype=float)
    values = pd.to_numeric(probes[col], errors="coerce")
    return values.groupby(probes["level"]).mean().dropna().sort_index()


def _latency_panel(ax: Axes, probes: pd.DataFrame, metric: str, found: dict[str, Any]) -> None:
    bounds = [b for b in found["slo"]["bounds"] if b["metric"] == metric]
    stats = list(dict.fromkeys([*_STATS, *(b["stat"] for b in bounds)]))
    for i, stat in enumerate(stats):
        line = _per_level(probes, f"{metric}_{stat}_s") * 1e3
        if len(line):
            ax.plot(line.index, line.to_numpy(), marker="o", ms=4, color=f"C{i}", label=stat)
    for b in bounds:
        color = f"C{stats.index(b['stat'])}"
        ax.axhline(b["bound_ms"], color=color, ls="--", lw=1.2, label=f"SLO {b['stat']}")
    for k, limit in found["slo"]["limits"].items():
        if k == f"{metric}_ms":
            ax.axhline(limit, color="0.3", ls="--", lw=1.2, label="per-request limit")
    ax.set_ylabel(f"{metric.upper().replace('_', ' ')} (ms)")
    _y_range(ax)


def _y_range(ax: Axes) -> None:
    """Log y for values spanning decades, else linear from 0; room above the highest line
    for the marks of runs cut short."""
    lines = [np.asarray(ln.get_ydata(), dtype=float) for ln in ax.get_lines()]
    values = np.concatenate(lines) if lines else np.zeros(0)
    values = values[np.isfinite(values)]
    if not len(values):
        return
    if is_wide(values):
        set_log_y(ax)
        ax.set_ylim(top=float(values.max()) * 2.0)
    else:
        ax.set_ylim(0, float(values.max()) * 1.15)


def _attain_panel(ax: Axes, probes: pd.DataFrame, found: dict[str, Any]) -> None:
    line = _per_level(probes, "slo_attainment") * 100
    ax.plot(line.index, line.to_numpy(), marker="o", ms=4, color="C0", label="within SLO")
    ax.axhline(found["slo"]["attain"] * 100, color="C0", ls="--", lw=1.2, label="--attain")
    ax.set_ylabel("requests within the SLO (%)")
    values = np.append(line.to_numpy(), found["slo"]["attain"] * 100)
    low = float(np.nanmin(values))
    ax.set_ylim(low - (100 - low) * 0.3, 100 + (100 - low) * 0.15)


def _interval(ax: Axes, found: dict[str, Any], trace: bool) -> None:
    """The 95% confidence interval of the capacity as a band, each seed's capacity a tick."""

    def at(value: float) -> float:
        return 1.0 / value if trace else value

    ci = found.get("interval")
    if ci:
        lo, hi = sorted((at(ci["low"]), at(ci["high"])))
        ax.axvspan(lo, hi, color="k", alpha=0.12, lw=0, label="95% CI of the capacity")
    seeds = [s["capacity"] for s in found.get("per_seed") or [] if s["capacity"]]
    for i, value in enumerate(seeds):
        ax.axvline(
            at(value), color="k", lw=0.8, ls=":", label="one seed's capacity" if i == 0 else None
        )


def _model_interval(ax: Axes, found: dict[str, Any], trace: bool) -> None:
    """The capacity's model interval (the cost model's error band) as a hatched band."""
    model = found.get("model_interval") or {}
    if model.get("low") is None:
        return
    lo, hi = (1.0 / v if trace else v for v in (model["low"], model["high"]))
    label = f"{model['level']:.0%} model interval ({model['cost_model']})"
    ax.axvspan(min(lo, hi), max(lo, hi), fill=False, hatch="//", ec="C2", lw=0, label=label)


def plot_capacity(found: dict[str, Any]) -> Figure:
    """Panels of the SLO's statistics against load (a ``capacity.json`` as ``found``)."""
    probes = pd.DataFrame(found["probes"])
    panels = _panels(found)
    fig = new_figure(len(panels), 1, (8.0, 3.0 * len(panels) + 0.8), sharex=True)
    cut = probes[probes["cut_short"].notna()] if len(probes) else probes
    trace = found["unit"] == "time_scale"
    capacity = found["capacity"]
    level = None if capacity is None else (1.0 / capacity if trace else capacity)
    for ax, panel in zip(fig.axes, panels, strict=True):
        if panel == "attain":
            _attain_panel(ax, probes, found)
        else:
            _latency_panel(ax, probes, panel, found)
        if len(cut):
            top = ax.get_ylim()[1]
            ax.plot(_x(cut, found), np.full(len(cut), top), "x", color="C3", ms=8,
                    clip_on=False, label="cut short (SLO already missed)")  # fmt: skip
        if level is not None:
            ax.axvline(level, color="k", lw=1.5, label="capacity (mean of seeds)")
            _interval(ax, found, trace)
            _model_interval(ax, found, trace)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", **LEGEND)
    fig.axes[-1].set_xlabel("trace speed (1 / time_scale)" if trace else "arrival rate (req/s)")
    where = "none found" if capacity is None else f"{capacity:.4g} {found['unit']}"
    ci = found.get("interval")
    if capacity is not None and ci:
        where += f", 95% CI {ci['low']:.3g}-{ci['high']:.3g}"
    model = found.get("model_interval") or {}
    if capacity is not None and model.get("low") is not None:
        where += f", {model['level']:.0%} model interval {model['low']:.3g}-{model['high']:.3g}"
    fig.suptitle(
        f"Capacity of {found['scenario_name']}: {where} ({found['status']})\n"
        f"{found['slo']['text']}; {found['num_simulations']} simulations"
    )
    return fig


def save_capacity_plot(found: dict[str, Any], out_dir: Path, fmt: str = "png") -> Path:
    """Write the capacity figure as ``capacity.<fmt>`` in ``out_dir``."""
    check_fmt(fmt)
    return save_figure(plot_capacity(found), Path(out_dir) / f"capacity.{fmt}", fmt)
