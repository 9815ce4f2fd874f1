"""Figures of a sweep: latency, throughput and preemptions against each grid key (one line
per value of another key, medians over the rest), and the token-budget trade-off."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter, NullLocator
from matplotlib.typing import ColorType

from simulator.errors import InputError
from simulator.plots.style import (
    LEGEND,
    P50_STYLE,
    P99_STYLE,
    check_fmt,
    column_values,
    is_wide,
    new_figure,
    no_data,
    save_figure,
    set_log_y,
    tick_label,
    with_status,
)

BUDGET_KEY = "scheduler.max_num_batched_tokens"


@dataclass(frozen=True)
class _Metric:
    """A sweep panel: which summary columns, how to scale them, what to call it."""

    title: str
    ylabel: str
    columns: tuple[tuple[str, str, str], ...]  # (summary column, legend tag, line style)
    scale: float = 1.0


_TTFT = (("ttft_p50_s", "p50", P50_STYLE), ("ttft_p99_s", "p99", P99_STYLE))


_TPOT = (("tpot_p50_s", "p50", P50_STYLE), ("tpot_p99_s", "p99", P99_STYLE))


_SWEEP_METRICS = (
    _Metric("TTFT", "TTFT (ms)", _TTFT, 1e3),
    _Metric("TPOT", "TPOT (ms)", _TPOT, 1e3),
    _Metric(
        "Output throughput", "output tokens / s", (("output_token_throughput", "output", "-"),)
    ),
    _Metric("Preemptions", "preemptions (count)", (("num_preemptions", "preemptions", "-"),)),
)


_GOODPUT_METRICS = (
    _Metric(
        "Goodput",
        "requests / s",
        (("goodput", "goodput", "-"), ("request_throughput", "throughput", "--")),
    ),
    _Metric(
        "SLO attainment", "requests within the SLO (%)", (("slo_attainment", "SLO", "-"),), 100
    ),
)
"""Panels added when the scenario sets an SLO (the table has ``goodput``)."""

UNITS = {
    "rate": "req/s",
    "time_scale": "x trace time",
    "max_num_batched_tokens": "tokens / step",
    "max_num_seqs": "sequences",
    "num_blocks": "KV blocks",
    "block_size": "tokens / block",
    "num_requests": "requests",
    "max_concurrency": "requests in flight",
    "gpu_memory_utilization": "share of GPU memory",
    "tp": "GPUs / replica",
    "replicas": "replicas",
    "value": "tokens",
    "low": "tokens",
    "high": "tokens",
    "min": "tokens",
    "max": "tokens",
    "max_requests": "requests",
}
"""The unit of a grid key, by its last dotted part (keys ending ``_ms`` are in ms)."""


def axis_label(key: str) -> str:
    """A grid key with its unit, for an axis: ``workload.arrival.rate (req/s)``."""
    last = key.rsplit(".", 1)[-1]
    unit = "ms" if last.endswith("_ms") else UNITS.get(last)
    return f"{key} ({unit})" if unit else key


_BUDGET_METRICS = (
    _SWEEP_METRICS[0],
    _SWEEP_METRICS[1],
    _Metric(
        "Throughput",
        "tokens / s",
        (("output_token_throughput", "output", "-"), ("total_token_throughput", "total", "--")),
    ),
)


@dataclass(frozen=True)
class _Axis:
    """How a grid key maps to x: numeric (maybe log) or categorical positions."""

    positions: np.ndarray
    ticks: list[float]
    labels: list[str]
    log_base: float | None


@dataclass(frozen=True)
class _Lines:
    """How runs split into lines: a group label per run, the group order and colours."""

    groups: np.ndarray
    order: list[str]
    colors: dict[str, ColorType]
    split_key: str | None
    agg_keys: list[str]


def _label(v: object) -> str:
    """Grid value as a short label."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _natural_key(s: str) -> tuple[float, str]:
    """Sort numbers numerically and words alphabetically."""
    try:
        return (float(s), "")
    except ValueError:
        return (float("inf"), s)


def _x_axis(col: pd.Series, force_log2: bool = False) -> _Axis:
    """Numeric x when every value is a number, categorical positions otherwise."""
    num = pd.to_numeric(col, errors="coerce")
    if len(col) and not pd.api.types.is_bool_dtype(col) and num.notna().all():
        uniq = np.unique(num.to_numpy(dtype=float))
        base: float | None = None
        if uniq.min() > 0 and uniq.max() > uniq.min():
            pow2 = np.allclose(np.log2(uniq), np.round(np.log2(uniq)))
            if force_log2:
                base = 2
            elif uniq.max() / uniq.min() >= 8:
                base = 2 if pow2 else 10
        return _Axis(num.to_numpy(dtype=float), list(uniq), [tick_label(u) for u in uniq], base)
    text = col.map(_label)
    cats = sorted(text.unique(), key=_natural_key)
    pos = {c: float(i) for i, c in enumerate(cats)}
    return _Axis(text.map(pos).to_numpy(dtype=float), list(pos.values()), cats, None)


def _apply_x(ax: Axes, xa: _Axis, label: str) -> None:
    """Ticks at the swept values, log scale when the values span a wide range."""
    if xa.log_base is not None:
        ax.set_xscale("log", base=xa.log_base)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
    ticks, labels = xa.ticks, xa.labels
    if len(ticks) > 12:
        step = int(np.ceil(len(ticks) / 12))
        ticks, labels = ticks[::step], labels[::step]
    ax.set_xticks(ticks, labels)
    if sum(len(s) for s in labels) > 40:
        ax.tick_params(axis="x", labelrotation=30)
    ax.set_xlabel(label)


def _palette(n: int, parts: Sequence[pd.Series] = ()) -> list[ColorType]:
    """``n`` distinguishable colours: the default cycle, or viridis when there are many; for
    lines split by two keys the second of which takes two values, a dark and a light shade
    of one colour per value of the first."""
    if len(parts) == 2 and parts[1].nunique() == 2 and n == 2 * parts[0].nunique() <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    return [colormaps["viridis"](v) for v in np.linspace(0, 0.95, n)]


def _lines_for(ok: pd.DataFrame, others: Sequence[str]) -> _Lines:
    """One line per combination of the varying other keys (``seed`` aside) when they make
    at most ten, else per value of the first; medians over the keys not split by."""
    varying = [k for k in others if ok[k].map(_label).nunique() > 1]
    split = [k for k in varying if k != "seed"] or varying[:1]
    if not split:
        return _Lines(np.full(len(ok), "all"), ["all"], {"all": "C0"}, None, [])
    if len(split) > 1 and len(ok[split].map(_label).drop_duplicates()) > 10:
        split = split[:1]
    parts = [ok[k].map(_label) for k in split]
    groups = pd.Series([" / ".join(t) for t in zip(*parts, strict=True)], index=ok.index)
    order = sorted(groups.unique(), key=lambda g: [_natural_key(v) for v in g.split(" / ")])
    colors = dict(zip(order, _palette(len(order), parts), strict=True))
    agg = [k for k in varying if k not in split]
    return _Lines(groups.to_numpy(), order, colors, " / ".join(split), agg)


def _per_x(x: np.ndarray, y: np.ndarray) -> pd.DataFrame:
    """Median, min, max and count of finite ``y`` per distinct ``x`` (index: x, sorted)."""
    ok = np.isfinite(x) & np.isfinite(y)
    frame = pd.DataFrame({"x": x[ok], "y": y[ok]})
    g = frame.groupby("x", sort=True)["y"]
    return pd.DataFrame({"med": g.median(), "lo": g.min(), "hi": g.max(), "n": g.size()})


def _metric_panel(ax: Axes, ok: pd.DataFrame, x: np.ndarray, lines: _Lines, m: _Metric) -> bool:
    """Median (and min-max band when runs repeat) of each metric column per x and group."""
    ax.set_title(m.title)
    ax.set_ylabel(m.ylabel)
    multi = len(lines.order) > 1
    plotted: list[np.ndarray] = []
    for gi, g in enumerate(lines.order):
        in_g = lines.groups == g
        for ci, (col, tag, style) in enumerate(m.columns):
            stats = _per_x(x[in_g], column_values(ok, col)[in_g] * m.scale)
            if stats.empty:
                continue
            color = lines.colors[g] if multi else ("C0", "C3", "C2")[ci % 3]
            if int(stats["n"].max()) > 1:
                band = (stats.index, stats["lo"], stats["hi"])
                ax.fill_between(*band, color=color, alpha=0.12, lw=0)
            label = f"{g} {tag}" if multi else tag
            ax.plot(stats.index, stats["med"], ls=style, marker="o", ms=4, color=color, lw=1.6,
                    label=label, zorder=3 + gi)  # fmt: skip
            plotted.append(stats[["lo", "hi"]].to_numpy().ravel())
    if not plotted:
        present = any(c in ok.columns for c, _, _ in m.columns)
        no_data(ax, "no finite values" if present else "metric not in sweep table")
        return False
    _metric_y(ax, np.concatenate(plotted))
    ax.grid(True, alpha=0.3)
    return True


def _metric_y(ax: Axes, values: np.ndarray) -> None:
    """Log y for values spanning decades, else a linear axis from 0."""
    if is_wide(values):
        set_log_y(ax)
        return
    top = float(np.nanmax(values))
    ax.set_ylim(min(0.0, float(np.nanmin(values))), top * 1.08 if top > 0 else 1.0)


def _legends(fig: Figure, metrics: Sequence[_Metric], lines: _Lines) -> None:
    """One figure legend (colour = group, style = percentile) or per-panel legends."""
    if len(lines.order) <= 1:
        for ax in fig.axes:
            if len(ax.get_lines()) > 1:
                ax.legend(loc="best", **LEGEND)
        return
    handles = [
        Line2D([], [], color=lines.colors[g], marker="o", ms=4, label=g) for g in lines.order
    ]
    handles += [Line2D([], [], color="0.3", ls=st, label=tag) for _, tag, st in _TTFT]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 9),
               title=lines.split_key, **LEGEND)  # fmt: skip
    for ax, m in zip(fig.axes, metrics, strict=True):
        # Panels whose line styles mean something else than p50/p99 explain them locally.
        if len(m.columns) > 1 and [tag for _, tag, _ in m.columns] != ["p50", "p99"]:
            styles = [Line2D([], [], color="0.3", ls=st, label=tag) for _, tag, st in m.columns]
            ax.legend(handles=styles, loc="best", **LEGEND)


def _subtitle(lines: _Lines, n_runs: int, n_failed: int, repeats: bool) -> str:
    """Second title line: how runs were split into lines and aggregated."""
    parts = [f"{n_runs} runs"]
    if lines.split_key:
        parts.append(f"one line per {lines.split_key}")
    if lines.agg_keys:
        parts.append(f"median over {', '.join(lines.agg_keys)} (band: min-max)")
    elif repeats:
        parts.append("median of repeated runs (band: min-max)")
    if n_failed:
        parts.append(f"{n_failed} failed run(s) omitted")
    return "; ".join(parts)


def _sweep_figure(
    sweep: pd.DataFrame,
    key: str,
    others: Sequence[str],
    metrics: Sequence[_Metric],
    layout: tuple[int, int, tuple[float, float]],
    title: str,
    force_log2: bool = False,
) -> Figure:
    """Panels of ``metrics`` against ``key``, split into lines by one of ``others``."""
    rows, cols, size = layout
    fig = new_figure(rows, cols, size)
    ok = with_status(sweep, "ok")
    n_failed = len(sweep) - len(ok)
    if ok.empty:
        fig.suptitle(f"{title}\n0 successful runs; {n_failed} failed")
        for ax, m in zip(fig.axes, metrics, strict=True):
            ax.set_title(m.title)
            no_data(ax, "no successful runs")
        return fig
    lines = _lines_for(ok, others)
    xa = _x_axis(ok[key], force_log2)
    repeats = bool(pd.DataFrame({"x": xa.positions, "g": lines.groups}).duplicated().any())
    fig.suptitle(f"{title}\n{_subtitle(lines, len(ok), n_failed, repeats)}")
    for ax, m in zip(fig.axes, metrics, strict=True):
        if _metric_panel(ax, ok, xa.positions, lines, m):
            _apply_x(ax, xa, axis_label(key))
    _legends(fig, metrics, lines)
    return fig


def _require_columns(sweep: pd.DataFrame, cols: Sequence[str]) -> None:
    """Fail with one line naming the first requested key the sweep table lacks."""
    for c in cols:
        if c not in sweep.columns:
            known = ", ".join(str(k) for k in sweep.columns if "." in str(k)) or "none"
            raise InputError(f"sweep has no column {c!r} (grid columns: {known})")


def plot_sweep(sweep: pd.DataFrame, keys: list[str]) -> dict[str, Figure]:
    """One figure per grid key: p50/p99 TTFT and TPOT, throughput, preemptions vs the key,
    and goodput and SLO attainment when the table has them (the scenario set an SLO).

    With two keys each panel has one line per value of the other key. With more, lines
    follow the first other key (in ``keys`` order) and points are medians over the rest,
    with the min-max range shaded.
    """
    _require_columns(sweep, keys)
    metrics: tuple[_Metric, ...] = _SWEEP_METRICS
    layout = (2, 2, (11.0, 8.0))
    if "goodput" in sweep.columns:
        metrics, layout = (*_SWEEP_METRICS, *_GOODPUT_METRICS), (2, 3, (15.0, 8.0))
    return {
        key: _sweep_figure(
            sweep, key, [k for k in keys if k != key], metrics, layout, f"Sweep over {key}"
        )
        for key in keys
    }


def plot_budget_comparison(sweep: pd.DataFrame, budget_key: str = BUDGET_KEY) -> Figure:
    """TTFT and TPOT p50/p99 and token throughput against the step token budget (log2 x).

    Other grid keys (dotted column names) that vary split the runs into lines as in
    :func:`plot_sweep`.
    """
    _require_columns(sweep, [budget_key])
    others = [str(c) for c in sweep.columns if "." in str(c) and c != budget_key]
    title = "Token budget trade-off: latency vs throughput"
    layout = (1, 3, (13, 4.8))
    return _sweep_figure(sweep, budget_key, others, _BUDGET_METRICS, layout, title, True)


def _slug(key: str) -> str:
    """A file-name-safe form of a dotted grid key."""
    return re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_") or "key"


def save_sweep_plots(
    sweep: pd.DataFrame, keys: list[str], out_dir: Path, fmt: str = "png"
) -> list[Path]:
    """Write one figure per grid key (plus the budget comparison when it is swept)."""
    check_fmt(fmt)
    out = Path(out_dir)
    paths = [
        save_figure(fig, out / f"sweep_{_slug(k)}.{fmt}", fmt)
        for k, fig in plot_sweep(sweep, keys).items()
    ]
    if BUDGET_KEY in keys:
        fig = plot_budget_comparison(sweep)
        paths.append(save_figure(fig, out / f"budget_comparison.{fmt}", fmt))
    return paths
