"""The figure of a design search: each deployment's cost per million tokens against its p99
TTFT at its capacity (or, with ``--replicas-for``, at the requested load with the fewest
replicas that serve it, each point labelled with that count), the Pareto front (no other
point is both cheaper and faster), and the cheapest point that meets the SLO."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator.plots.style import (
    LEGEND,
    check_fmt,
    is_wide,
    new_figure,
    no_data,
    save_figure,
    set_log_y,
)


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indexes of the points no other point beats on both ``x`` and ``y`` (lower is better),
    by increasing ``x``."""
    order = np.lexsort((y, x))
    front, best = [], np.inf
    for i in order:
        if y[i] < best:
            front.append(i)
            best = y[i]
    return np.asarray(front, dtype=int)


def _label(row: pd.Series, keys: list[str]) -> str:
    text = ", ".join(f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in keys)
    replicas = row.get("replicas")
    if replicas is not None and pd.notna(replicas):  # --replicas-for: the count it found
        n = int(replicas)
        text += f"{', ' if text else ''}{n} replica{'' if n == 1 else 's'}"
    return text


def _where(ok: pd.DataFrame) -> tuple[str, str]:
    """(legend, axis wording) of where the points were measured: at each deployment's
    capacity, or (``--replicas-for``) at the load asked for."""
    if "replicas" not in ok:
        return "deployment at its capacity", "at capacity"
    loads: list[float] = ok["load"].dropna().unique().tolist() if "load" in ok else []
    units: list[str] = ok["unit"].dropna().unique().tolist() if "unit" in ok else []
    if len(loads) == 1 and len(units) == 1:
        at = f"at {loads[0]:g} {units[0]}"
    else:
        at = "at the requested load"
    return f"fewest replicas serving it, {at}", at


def plot_search(table: pd.DataFrame, keys: list[str], title: str = "Design search") -> Figure:
    """Cost per million tokens against p99 TTFT at capacity (or at the load ``--replicas-for``
    asked for), one point per deployment."""
    fig = new_figure(1, 1, (9.0, 6.0))
    ax = fig.axes[0]
    ok = table[table["status"].isin(["found", "max_probes"])] if len(table) else table
    cols = ["ttft_p99_s", "usd_per_million_tokens"]
    ok = ok[ok[cols].notna().all(axis=1)] if len(ok) and set(cols) <= set(ok) else ok.iloc[:0]
    fig.suptitle(f"{title}\n{len(ok)} of {len(table)} deployments serve the SLO")
    if ok.empty:
        no_data(ax, "no deployment meets the SLO")
        return fig
    x = ok["ttft_p99_s"].to_numpy(dtype=float) * 1e3
    y = ok["usd_per_million_tokens"].to_numpy(dtype=float)
    legend, at = _where(ok)
    ax.scatter(x, y, s=30, color="C0", zorder=3, label=legend)
    front = pareto_front(x, y)
    ax.step(x[front], y[front], where="post", color="C1", lw=1.5, label="Pareto front")
    for xi, yi, (_, row) in zip(x, y, ok.iterrows(), strict=True):
        ax.annotate(_label(row, keys), (xi, yi), xytext=(4, 3), textcoords="offset points",
                    fontsize=7, color="0.3")  # fmt: skip
    cheapest = ok["cheapest"].to_numpy(dtype=bool) if "cheapest" in ok else np.zeros(len(ok), bool)
    if cheapest.any():
        i = int(np.flatnonzero(cheapest)[0])
        ax.scatter(x[i], y[i], s=220, marker="*", color="C3", zorder=4,
                   label=f"cheapest: ${y[i]:.3g} per million tokens")  # fmt: skip
    if is_wide(y):
        set_log_y(ax)
    ax.set_xlabel(f"p99 TTFT {at} (ms)")
    ax.set_ylabel(f"$ per million tokens (prompt + output) {at}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", **LEGEND)
    return fig


def save_search_plot(
    table: pd.DataFrame, keys: list[str], out_dir: Path, fmt: str = "png", title: str = ""
) -> Path:
    """Write the search figure as ``pareto.<fmt>`` in ``out_dir``."""
    check_fmt(fmt)
    fig = plot_search(table, keys, title or "Design search")
    return save_figure(fig, Path(out_dir) / f"pareto.{fmt}", fmt)
