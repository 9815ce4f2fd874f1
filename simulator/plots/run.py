"""Figures of one run: latency CDFs, E2E latency vs prompt length, and the KV-cache and step
timelines (long runs drawn from time bins, not step by step)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from simulator.plots.prefix_cache import has_prefix_cache, plot_prefix_cache
from simulator.plots.step_bins import bin_steps, bin_steps_file
from simulator.plots.style import (
    LEGEND,
    P50_STYLE,
    P99_STYLE,
    SLO_STYLE,
    TICKS,
    axes_note,
    check_fmt,
    column_values,
    count_status,
    fmt_num,
    is_wide,
    new_figure,
    no_data,
    save_figure,
    set_log_x,
    set_log_y,
    tick_label,
    with_status,
)

RUN_PLOTS = ("ttft_tpot_cdf", "e2e_vs_prompt", "kv_timeline", "step_timeline")

# Beyond these sizes a CDF or a timeline is drawn from a summary, not point by point: the
# screen cannot show more, and 10^6-point lines make savefig slow.
_MAX_CDF_POINTS = 2000
_HEXBIN_THRESHOLD = 5000


def _ecdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF, thinned to at most ``_MAX_CDF_POINTS``."""
    x = np.sort(values)
    y = np.arange(1, x.size + 1) / x.size
    if x.size > _MAX_CDF_POINTS:
        idx = np.unique(np.linspace(0, x.size - 1, _MAX_CDF_POINTS).round().astype(int))
        x, y = x[idx], y[idx]
    return x, y


def _cdf_panel(
    ax: Axes,
    values_ms: np.ndarray,
    name: str,
    empty_reason: str,
    slo_ms: float | None = None,
    model: dict[str, Any] | None = None,
) -> None:
    """One CDF panel with its p50 and p99 drawn as vertical lines, and the SLO's target (if
    any) with the share of the drawn requests within it; ``model``, a run's ``uncertainty``,
    adds the p50's and p99's model intervals as bands."""
    v = values_ms[np.isfinite(values_ms)]
    ax.set_title(f"{name} CDF (n={v.size:,})")
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of requests ≤ x")
    if v.size == 0:
        no_data(ax, empty_reason)
        return
    x, y = _ecdf_points(v)
    ax.plot(x, y, drawstyle="steps-post", color="C0", lw=1.8, label=f"{name} CDF")
    p50, p99 = np.percentile(v, [50, 99])
    ax.axvline(p50, color="C1", ls=P50_STYLE, lw=1.3, label=f"p50 = {fmt_num(p50)} ms")
    ax.axvline(p99, color="C3", ls=P99_STYLE, lw=1.3, label=f"p99 = {fmt_num(p99)} ms")
    _model_bands(ax, name.lower(), model)
    if slo_ms is not None:
        within = float(np.mean(v <= slo_ms)) * 100
        label = f"SLO {fmt_num(slo_ms)} ms ({within:.1f}% within)"
        ax.axvline(slo_ms, color="k", ls=SLO_STYLE, lw=1.6, label=label)
    if is_wide(v) or (slo_ms is not None and is_wide(np.append(v, slo_ms))):
        set_log_x(ax)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3, which="major")
    ax.legend(loc="lower right", **LEGEND)


def _model_bands(ax: Axes, metric: str, model: dict[str, Any] | None) -> None:
    """The p50's and p99's model intervals (``explore.uncertainty``) as shaded bands."""
    if not model or not model.get("available"):
        return
    level = f"{model['level']:.0%}"
    for p, color in (("p50", "C1"), ("p99", "C3")):
        span = model.get(f"{metric}_{p}_s")
        if span is None:
            continue
        lo, hi = (v * 1e3 for v in span)
        label = f"{p} {level} model interval {fmt_num(lo)}-{fmt_num(hi)} ms"
        ax.axvspan(lo, hi, color=color, alpha=0.15, lw=0, label=label)


def plot_latency_cdfs(
    requests: pd.DataFrame,
    slo_ms: dict[str, float] | None = None,
    model: dict[str, Any] | None = None,
) -> Figure:
    """TTFT and TPOT CDFs of finished requests side by side, with p50 and p99 marked, and
    the scenario's SLO targets (``slo_ms``: ``{"ttft": ms, "tpot": ms}``, either optional);
    ``model``, the run's ``uncertainty``, adds the percentiles' model intervals."""
    slo_ms = slo_ms or {}
    fig = new_figure(1, 2, (11, 4.2))
    ax_ttft, ax_tpot = fig.axes
    done = with_status(requests, "finished")
    rejected = count_status(requests, "rejected")
    why = "all requests rejected" if rejected and done.empty else "no finished requests"
    why_tpot = why if done.empty else "no finished request has output_len > 1"
    ttft, tpot = (column_values(done, c) * 1e3 for c in ("ttft_s", "tpot_s"))
    _cdf_panel(ax_ttft, ttft, "TTFT", why, slo_ms.get("ttft"), model)
    _cdf_panel(ax_tpot, tpot, "TPOT", why_tpot, slo_ms.get("tpot"), model)
    note = f", {rejected:,} rejected" if rejected else ""
    fig.suptitle(f"Request latency: {len(done):,} finished{note}")
    return fig


def _bin_edges(x: np.ndarray, log: bool, nbins: int = 20) -> np.ndarray:
    """Bin edges covering ``x``: log-spaced on a log axis, linear otherwise."""
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        return np.array([lo - 0.5, hi + 0.5])
    if log:
        return np.geomspace(lo, hi, nbins + 1)
    return np.linspace(lo, hi, nbins + 1)


def binned_median(
    x: np.ndarray, y: np.ndarray, edges: np.ndarray, min_count: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Median of ``y`` per ``x`` bin, at the median ``x`` of the bin; sparse bins dropped."""
    codes = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    frame = pd.DataFrame({"b": codes, "x": x, "y": y})
    g = frame.groupby("b").agg(x=("x", "median"), y=("y", "median"), n=("y", "size"))
    g = g[g["n"] >= min(min_count, len(x))]
    return g["x"].to_numpy(), g["y"].to_numpy()


def _e2e_points(ax: Axes, fig: Figure, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
    """Requests as a hexbin density when many, else as dots coloured by output length."""
    log_x, log_y = is_wide(x), is_wide(y)
    if x.size > _HEXBIN_THRESHOLD:
        xs: Literal["log", "linear"] = "log" if log_x else "linear"
        ys: Literal["log", "linear"] = "log" if log_y else "linear"
        hb = ax.hexbin(x, y, gridsize=60, bins="log", mincnt=1, cmap="Blues", xscale=xs, yscale=ys)
        fig.colorbar(hb, ax=ax, label="requests per cell")
    elif np.isfinite(out).all() and out.size:
        # E2E is dominated by the output length, so colour makes its bands readable.
        norm = LogNorm(out.min(), out.max()) if is_wide(out) else Normalize(out.min(), out.max())
        alpha = float(np.clip(400 / x.size, 0.35, 0.85))
        sc = ax.scatter(x, y, c=out, s=10, alpha=alpha, cmap="viridis", norm=norm, lw=0)
        sc.set_label("request")
        fig.colorbar(sc, ax=ax, label="output length (tokens)")
    else:
        ax.scatter(x, y, s=10, alpha=0.5, color="C0", lw=0, label="request")
    if log_x:
        set_log_x(ax)
    if log_y:
        set_log_y(ax)


def plot_e2e_vs_prompt(requests: pd.DataFrame) -> Figure:
    """End-to-end latency against prompt length: points (hexbin when many) and a binned median."""
    fig = new_figure(1, 1, (8, 5))
    ax = fig.axes[0]
    done = with_status(requests, "finished")
    x, y, out = (column_values(done, c) for c in ("prompt_len", "e2e_s", "output_len"))
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, out = x[ok], y[ok], out[ok]
    ax.set_title(f"End-to-end latency vs prompt length (n={x.size:,} finished)")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("E2E latency (s)")
    if x.size == 0:
        no_data(ax, "no finished requests")
        return fig
    _e2e_points(ax, fig, x, y, out)
    mx, my = binned_median(x, y, _bin_edges(x, is_wide(x)))
    ax.plot(mx, my, color="C3", lw=2, marker="o", ms=4, label="binned median")
    ax.grid(True, alpha=0.3, which="major")
    ax.legend(loc="upper left", **LEGEND)
    return fig


def _is_binned(binned: pd.DataFrame) -> bool:
    """Whether some bin holds more than one step (lines show bin aggregates)."""
    return len(binned) > 0 and int(binned["n"].max()) > 1


def _time_plot(ax: Axes, t: np.ndarray, y: np.ndarray, **kw: object) -> None:
    """A timeline line; few points also get markers so a single step stays visible."""
    if t.size < 30:
        kw.setdefault("marker", "o")
        kw.setdefault("ms", 4)
    ax.plot(t, y, **kw)  # type: ignore[arg-type]


def _agg_note(binned: pd.DataFrame) -> str:
    """Subtitle part saying whether lines are per step or per time bin."""
    num_steps = int(binned.attrs["num_steps"])
    if _is_binned(binned):
        width = tick_label(float(f"{binned.attrs['bin_width_s']:.2g}"))
        return f"{num_steps:,} steps in {len(binned):,} time bins of {width} s"
    return f"{num_steps:,} step{'' if num_steps == 1 else 's'}"


def _timeline_axes(fig: Figure, binned: pd.DataFrame, what: str) -> bool:
    """Common finishing of a timeline figure; False (with notes drawn) when there are no steps."""
    fig.suptitle(f"{what} over time ({_agg_note(binned)})")
    fig.axes[-1].set_xlabel("simulated time (s)")
    for ax in fig.axes:
        ax.grid(True, alpha=0.3)
    if len(binned) == 0:
        for ax in fig.axes:
            no_data(ax, "no steps")
        return False
    fig.axes[-1].xaxis.set_major_formatter(TICKS)
    return True


def _panel(ax: Axes, title: str, ylabel: str, binned: pd.DataFrame, column: str) -> bool:
    """Head a timeline panel; False, noting which step column is missing, when ``binned``
    lacks ``column`` (a step column's aggregate, e.g. ``duration_s_mean``)."""
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if column not in binned:
        no_data(ax, f"no {column.rsplit('_', 1)[0]} column")
        return False
    return True


def _kv_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """KV-block utilization in percent."""
    if not _panel(ax, "KV-cache utilization", "KV blocks used (%)", binned, "kv_utilization_mean"):
        return
    label = "time-weighted mean per bin" if _is_binned(binned) else "per step"
    util = 100 * binned["kv_utilization_mean"].to_numpy()
    _time_plot(ax, t, util, color="C0", lw=1.4, label=f"KV utilization ({label})")
    ax.set_ylim(0, 105)
    ax.legend(loc="lower right", **LEGEND)


def _queue_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """Running and waiting sequence counts."""
    ax.set_title("Running and waiting sequences")
    ax.set_ylabel("sequences")
    for col, color, label in (("num_running", "C2", "running"), ("num_waiting", "C1", "waiting")):
        if f"{col}_mean" in binned:
            _time_plot(ax, t, binned[f"{col}_mean"].to_numpy(), color=color, lw=1.4, label=label)
    if not ax.lines:
        no_data(ax, "no num_running / num_waiting columns")
        return
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", **LEGEND)


def _preemption_panel(ax: Axes, binned: pd.DataFrame, total: int) -> None:
    """Preemptions per time bin (or per step) as vertical bars at the times they happened."""
    per = "per time bin" if _is_binned(binned) else "per step"
    title = f"Preemptions ({total:,} total, {per})"
    if not _panel(ax, title, "preemptions", binned, "num_preemptions_sum"):
        return
    if total == 0:
        axes_note(ax, "no preemptions in this run")
        return
    hit = binned[binned["num_preemptions_sum"] > 0]
    ax.vlines(hit["t"], 0, hit["num_preemptions_sum"], color="C3", lw=1.2, label="preemptions")
    ax.plot(hit["t"], hit["num_preemptions_sum"], ls="none", marker="v", ms=3, color="C3")
    ax.set_ylim(0, float(hit["num_preemptions_sum"].max()) * 1.15)


def plot_kv_timeline(steps: pd.DataFrame) -> Figure:
    """KV-block utilization, running/waiting counts and preemptions over time."""
    return kv_timeline_figure(bin_steps(steps))


def kv_timeline_figure(binned: pd.DataFrame) -> Figure:
    """``plot_kv_timeline`` from the steps already binned (``bin_steps``/``bin_steps_file``)."""
    fig = new_figure(3, 1, (10, 7.2), sharex=True, height_ratios=(3, 3, 1.6))
    ax_kv, ax_q, ax_pre = fig.axes
    if not _timeline_axes(fig, binned, "KV cache and queues"):
        return fig
    t = binned["t"].to_numpy()
    _kv_panel(ax_kv, t, binned)
    _queue_panel(ax_q, t, binned)
    _preemption_panel(ax_pre, binned, int(binned.attrs["num_preemptions"]))
    return fig


def _duration_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """Mean step time per bin with the bin's min-max range shaded."""
    if not _panel(ax, "Step duration", "step time (ms)", binned, "duration_s_mean"):
        return
    if _is_binned(binned):
        lo, hi = 1e3 * binned["duration_s_min"], 1e3 * binned["duration_s_max"]
        ax.fill_between(t, lo, hi, color="C0", alpha=0.18, lw=0, label="min-max in bin")
    label = "mean per bin" if _is_binned(binned) else "per step"
    ms = 1e3 * binned["duration_s_mean"].to_numpy()
    _time_plot(ax, t, ms, color="C0", lw=1.2, label=f"step time ({label})")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", **LEGEND)


def _tokens_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """Mean tokens per step: decode and prefill stacked, the total as a line; on a log axis
    when the decode band would be a sliver under the prefills (30 tokens under 2,000)."""
    ax.set_title("Tokens per step")
    ax.set_ylabel("tokens / step")
    decode = binned.get("num_decode_seqs_mean")
    prefill = binned.get("num_prefill_tokens_mean")
    if decode is not None and prefill is not None:
        d, p = decode.to_numpy(), prefill.to_numpy()
        ax.fill_between(t, 0, d, color="C2", alpha=0.45, lw=0, label="decode tokens")
        ax.fill_between(t, d, d + p, color="C1", alpha=0.45, lw=0, label="prefill tokens")
    if "num_tokens_mean" in binned:
        total = binned["num_tokens_mean"].to_numpy()
        _time_plot(ax, t, total, color="C0", lw=0.9, label="all tokens")
    if not ax.lines and not ax.collections:
        no_data(ax, "no token columns")
        return
    if decode is not None and prefill is not None and _decode_is_a_sliver(d, d + p):
        set_log_y(ax)
        ax.set_ylim(bottom=max(0.5, 0.5 * float(np.nanmin(d[d > 0]))))
        ax.set_ylabel("tokens / step (log)")
    else:
        ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", **LEGEND)


def _decode_is_a_sliver(decode: np.ndarray, total: np.ndarray) -> bool:
    """Whether the decode band is under 5% of the panel's height on a linear axis (and there
    is a decode to show)."""
    d = decode[np.isfinite(decode) & (decode > 0)]
    top = np.nanmax(total) if np.isfinite(total).any() else 0.0
    return bool(d.size and top > 0 and np.median(d) < 0.05 * top)


def plot_step_timeline(steps: pd.DataFrame) -> Figure:
    """Step duration and tokens computed per step (prefill vs decode) over time."""
    return step_timeline_figure(bin_steps(steps))


def step_timeline_figure(binned: pd.DataFrame) -> Figure:
    """``plot_step_timeline`` from the steps already binned."""
    fig = new_figure(2, 1, (10, 6.2), sharex=True)
    ax_dt, ax_tok = fig.axes
    if not _timeline_axes(fig, binned, "Scheduler steps"):
        return fig
    t = binned["t"].to_numpy()
    _duration_panel(ax_dt, t, binned)
    _tokens_panel(ax_tok, t, binned)
    return fig


def save_run_plots(
    requests: pd.DataFrame,
    steps: pd.DataFrame | Path,
    out_dir: Path,
    fmt: str = "png",
    slo_ms: dict[str, float] | None = None,
    model: dict[str, Any] | None = None,
) -> list[Path]:
    """Write the four per-run figures (and the prefix cache's, when the run kept one) into
    ``out_dir`` and return their paths; ``steps`` is the step table or its parquet file (read
    a batch at a time); ``slo_ms`` the SLO targets the CDFs draw; ``model`` the run's
    ``uncertainty`` (their percentiles' model intervals)."""
    check_fmt(fmt)
    binned = bin_steps_file(steps) if isinstance(steps, Path) else bin_steps(steps)
    makers: tuple[Callable[[], Figure], ...] = (
        lambda: plot_latency_cdfs(requests, slo_ms, model),
        lambda: plot_e2e_vs_prompt(requests),
        lambda: kv_timeline_figure(binned),
        lambda: step_timeline_figure(binned),
    )
    paths = [
        save_figure(make(), Path(out_dir) / f"{name}.{fmt}", fmt)
        for name, make in zip(RUN_PLOTS, makers, strict=True)
    ]
    if has_prefix_cache(requests, binned):
        fig = plot_prefix_cache(requests, binned)
        paths.append(save_figure(fig, Path(out_dir) / f"prefix_cache.{fmt}", fmt))
    return paths
