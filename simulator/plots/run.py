"""Figures for one run (latency CDFs, E2E vs prompt, KV and step timelines) and for sweeps.

Everything uses the object-oriented matplotlib API (``Figure`` with the Agg canvas), never
pyplot, so plotting holds no global state and is safe in threads and worker processes.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator
from matplotlib.typing import ColorType

from simulator.errors import InputError

DPI = 120
FORMATS = ("png", "svg")
BUDGET_KEY = "scheduler.max_num_batched_tokens"
RUN_PLOTS = ("ttft_tpot_cdf", "e2e_vs_prompt", "kv_timeline", "step_timeline")

# Beyond these sizes a CDF or a timeline is drawn from a summary, not point by point: the
# screen cannot show more, and 10^6-point lines make savefig slow.
_MAX_CDF_POINTS = 2000
_MAX_TIME_BINS = 800
_HEXBIN_THRESHOLD = 5000
# A positive range wider than this ratio reads better on a log axis.
_LOG_RATIO = 50.0
_P50_STYLE = "-"
_P99_STYLE = "--"
_LEGEND = {"fontsize": 9, "framealpha": 0.9}


# --------------------------------------------------------------------------- small helpers


def _new_figure(
    nrows: int,
    ncols: int,
    size: tuple[float, float],
    sharex: bool = False,
    height_ratios: Sequence[float] | None = None,
) -> Figure:
    """A constrained-layout figure with its axes grid created."""
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    fig.subplots(nrows, ncols, squeeze=False, sharex=sharex, height_ratios=height_ratios)
    return fig


def _note(ax: Axes, text: str) -> None:
    """Write a centred grey note in an axes and drop its ticks."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")
    # A shared x axis shares its ticks: clearing them here would blank the sibling panels.
    if len(ax.get_shared_x_axes().get_siblings(ax)) == 1:
        ax.set_xticks([])
    ax.set_yticks([])


def _no_data(ax: Axes, reason: str) -> None:
    """Mark an axes that has nothing to show."""
    _note(ax, f"no data\n({reason})")


def _values(df: pd.DataFrame, col: str) -> np.ndarray:
    """A column as a float array (all NaN when the column is missing)."""
    if col not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _with_status(df: pd.DataFrame, status: str) -> pd.DataFrame:
    """Rows whose ``status`` is ``status`` (all rows when there is no status column)."""
    if "status" not in df.columns:
        return df
    return df[df["status"].astype(str) == status]


def _count_status(df: pd.DataFrame, status: str) -> int:
    """How many rows have the given status (0 without a status column)."""
    return 0 if "status" not in df.columns else len(_with_status(df, status))


def _fmt_num(v: float) -> str:
    """A short human number for legends: 3 significant digits, thousands separators."""
    if not np.isfinite(v):
        return "n/a"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _tick(v: float) -> str:
    """A tick label without trailing zeros: 0.1, 4, 1,024."""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


_TICKS = FuncFormatter(lambda v, _pos: _tick(v))


def _wide(values: np.ndarray) -> bool:
    """Whether positive finite values span enough orders of magnitude for a log axis."""
    v = values[np.isfinite(values)]
    if v.size < 2 or v.min() <= 0:
        return False
    return bool(v.max() / v.min() > _LOG_RATIO)


def _log_x(ax: Axes, base: float = 10) -> None:
    """Log x axis with plain-number major labels and unlabeled minor ticks."""
    ax.set_xscale("log", base=base)
    ax.xaxis.set_major_formatter(_TICKS)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _log_y(ax: Axes) -> None:
    """Log y axis with plain-number major labels and unlabeled minor ticks."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_TICKS)
    ax.yaxis.set_minor_formatter(NullFormatter())


def _check_fmt(fmt: str) -> str:
    """Validate an output format name."""
    if fmt not in FORMATS:
        choices = ", ".join(FORMATS)
        raise InputError(f"plot format {fmt!r} is not supported (choose one of {choices})")
    return fmt


def save_figure(fig: Figure, path: Path, fmt: str = "png") -> Path:
    """Write ``fig`` to ``path`` atomically (temp file in the same folder, then rename)."""
    _check_fmt(fmt)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder so os.replace is a rename; unique so parallel writers never collide.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        fig.savefig(tmp, format=fmt, dpi=DPI)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- latency CDFs


def _ecdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF, thinned to at most ``_MAX_CDF_POINTS``."""
    x = np.sort(values)
    y = np.arange(1, x.size + 1) / x.size
    if x.size > _MAX_CDF_POINTS:
        idx = np.unique(np.linspace(0, x.size - 1, _MAX_CDF_POINTS).round().astype(int))
        x, y = x[idx], y[idx]
    return x, y


def _cdf_panel(ax: Axes, values_ms: np.ndarray, name: str, empty_reason: str) -> None:
    """One CDF panel with its p50 and p99 drawn as vertical lines."""
    v = values_ms[np.isfinite(values_ms)]
    ax.set_title(f"{name} CDF (n={v.size:,})")
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of requests ≤ x")
    if v.size == 0:
        _no_data(ax, empty_reason)
        return
    x, y = _ecdf_points(v)
    ax.plot(x, y, drawstyle="steps-post", color="C0", lw=1.8, label=f"{name} CDF")
    p50, p99 = np.percentile(v, [50, 99])
    ax.axvline(p50, color="C1", ls=_P50_STYLE, lw=1.3, label=f"p50 = {_fmt_num(p50)} ms")
    ax.axvline(p99, color="C3", ls=_P99_STYLE, lw=1.3, label=f"p99 = {_fmt_num(p99)} ms")
    if _wide(v):
        _log_x(ax)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3, which="major")
    ax.legend(loc="lower right", **_LEGEND)


def plot_latency_cdfs(requests: pd.DataFrame) -> Figure:
    """TTFT and TPOT CDFs of finished requests side by side, with p50 and p99 marked."""
    fig = _new_figure(1, 2, (11, 4.2))
    ax_ttft, ax_tpot = fig.axes
    done = _with_status(requests, "finished")
    rejected = _count_status(requests, "rejected")
    why = "all requests rejected" if rejected and done.empty else "no finished requests"
    why_tpot = why if done.empty else "no finished request has output_len > 1"
    _cdf_panel(ax_ttft, _values(done, "ttft_s") * 1e3, "TTFT", why)
    _cdf_panel(ax_tpot, _values(done, "tpot_s") * 1e3, "TPOT", why_tpot)
    note = f", {rejected:,} rejected" if rejected else ""
    fig.suptitle(f"Request latency: {len(done):,} finished{note}")
    return fig


# --------------------------------------------------------------------------- E2E vs prompt


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
    log_x, log_y = _wide(x), _wide(y)
    if x.size > _HEXBIN_THRESHOLD:
        xs: Literal["log", "linear"] = "log" if log_x else "linear"
        ys: Literal["log", "linear"] = "log" if log_y else "linear"
        hb = ax.hexbin(x, y, gridsize=60, bins="log", mincnt=1, cmap="Blues", xscale=xs, yscale=ys)
        fig.colorbar(hb, ax=ax, label="requests per cell")
    elif np.isfinite(out).all() and out.size:
        # E2E is dominated by the output length, so colour makes its bands readable.
        norm = LogNorm(out.min(), out.max()) if _wide(out) else Normalize(out.min(), out.max())
        alpha = float(np.clip(400 / x.size, 0.35, 0.85))
        sc = ax.scatter(x, y, c=out, s=10, alpha=alpha, cmap="viridis", norm=norm, lw=0)
        sc.set_label("request")
        fig.colorbar(sc, ax=ax, label="output length (tokens)")
    else:
        ax.scatter(x, y, s=10, alpha=0.5, color="C0", lw=0, label="request")
    if log_x:
        _log_x(ax)
    if log_y:
        _log_y(ax)


def plot_e2e_vs_prompt(requests: pd.DataFrame) -> Figure:
    """End-to-end latency against prompt length: points (hexbin when many) and a binned median."""
    fig = _new_figure(1, 1, (8, 5))
    ax = fig.axes[0]
    done = _with_status(requests, "finished")
    x, y, out = (_values(done, c) for c in ("prompt_len", "e2e_s", "output_len"))
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, out = x[ok], y[ok], out[ok]
    ax.set_title(f"End-to-end latency vs prompt length (n={x.size:,} finished)")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("E2E latency (s)")
    if x.size == 0:
        _no_data(ax, "no finished requests")
        return fig
    _e2e_points(ax, fig, x, y, out)
    mx, my = binned_median(x, y, _bin_edges(x, _wide(x)))
    ax.plot(mx, my, color="C3", lw=2, marker="o", ms=4, label="binned median")
    ax.grid(True, alpha=0.3, which="major")
    ax.legend(loc="upper left", **_LEGEND)
    return fig


# --------------------------------------------------------------------------- step timelines


def _is_num(s: pd.Series) -> bool:
    """Numeric (not boolean) column."""
    return pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)


def bin_steps(steps: pd.DataFrame, max_bins: int = _MAX_TIME_BINS) -> pd.DataFrame:
    """Aggregate steps into at most ``max_bins`` equal time bins (empty bins dropped).

    Columns: ``t`` (mean start time of the bin's steps, s), ``n`` (steps), ``<col>_mean``
    for every numeric column, ``duration_s_min``/``_max`` and ``num_preemptions_sum``.
    KV utilization, running and waiting are averaged weighted by step duration, so a long
    step counts for the time it lasts. ``attrs["bin_width_s"]`` holds the bin width.
    """
    t = _values(steps, "start_s")
    keep = np.isfinite(t)
    t = t[keep]
    frame = pd.DataFrame({"t": t, "d": np.nan_to_num(_values(steps, "duration_s")[keep])})
    if t.size == 0:
        out = frame.assign(n=np.zeros(0, dtype=int))
        out.attrs["bin_width_s"] = 0.0
        return out
    lo, hi = float(t.min()), float(t.max())
    width = (hi - lo) / max_bins if hi > lo else 1.0
    frame["b"] = np.minimum(((t - lo) / width).astype(np.int64), max_bins - 1)
    cols = [c for c in steps.columns if c not in ("step", "start_s") and _is_num(steps[c])]
    for c in cols:
        frame[c] = _values(steps, c)[keep]
    state = [c for c in ("kv_utilization", "num_running", "num_waiting") if c in cols]
    for c in state:
        frame[f"{c}_w"] = frame[c] * frame["d"]
    g = frame.groupby("b", sort=True)
    out = pd.DataFrame({"t": g["t"].mean(), "n": g["t"].size()})
    for c in cols:
        out[f"{c}_mean"] = g[c].mean()
    dsum = g["d"].sum()
    for c in state:
        weighted = g[f"{c}_w"].sum() / dsum.where(dsum > 0)
        # Bins whose steps all last 0 s (degenerate input) fall back to the plain mean.
        out[f"{c}_mean"] = weighted.fillna(out[f"{c}_mean"])
    if "duration_s" in cols:
        out["duration_s_max"] = g["duration_s"].max()
        out["duration_s_min"] = g["duration_s"].min()
    if "num_preemptions" in cols:
        out["num_preemptions_sum"] = g["num_preemptions"].sum()
    out = out.reset_index(drop=True)
    out.attrs["bin_width_s"] = width
    return out


def _is_binned(binned: pd.DataFrame) -> bool:
    """Whether some bin holds more than one step (lines show bin aggregates)."""
    return len(binned) > 0 and int(binned["n"].max()) > 1


def _time_plot(ax: Axes, t: np.ndarray, y: np.ndarray, **kw: object) -> None:
    """A timeline line; few points also get markers so a single step stays visible."""
    if t.size < 30:
        kw.setdefault("marker", "o")
        kw.setdefault("ms", 4)
    ax.plot(t, y, **kw)  # type: ignore[arg-type]


def _agg_note(steps: pd.DataFrame, binned: pd.DataFrame) -> str:
    """Subtitle part saying whether lines are per step or per time bin."""
    if _is_binned(binned):
        width = _tick(float(f"{binned.attrs['bin_width_s']:.2g}"))
        return f"{len(steps):,} steps in {len(binned):,} time bins of {width} s"
    return f"{len(steps):,} step{'' if len(steps) == 1 else 's'}"


def _timeline_axes(fig: Figure, steps: pd.DataFrame, binned: pd.DataFrame, what: str) -> bool:
    """Common finishing of a timeline figure; False (with notes drawn) when there are no steps."""
    fig.suptitle(f"{what} over time ({_agg_note(steps, binned)})")
    fig.axes[-1].set_xlabel("simulated time (s)")
    for ax in fig.axes:
        ax.grid(True, alpha=0.3)
    if len(binned) == 0:
        for ax in fig.axes:
            _no_data(ax, "no steps")
        return False
    fig.axes[-1].xaxis.set_major_formatter(_TICKS)
    return True


def _kv_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """KV-block utilization in percent."""
    ax.set_title("KV-cache utilization")
    ax.set_ylabel("KV blocks used (%)")
    if "kv_utilization_mean" not in binned:
        _no_data(ax, "no kv_utilization column")
        return
    label = "time-weighted mean per bin" if _is_binned(binned) else "per step"
    util = 100 * binned["kv_utilization_mean"].to_numpy()
    _time_plot(ax, t, util, color="C0", lw=1.4, label=f"KV utilization ({label})")
    ax.set_ylim(0, 105)
    ax.legend(loc="lower right", **_LEGEND)


def _queue_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """Running and waiting sequence counts."""
    ax.set_title("Running and waiting sequences")
    ax.set_ylabel("sequences")
    for col, color, label in (("num_running", "C2", "running"), ("num_waiting", "C1", "waiting")):
        if f"{col}_mean" in binned:
            _time_plot(ax, t, binned[f"{col}_mean"].to_numpy(), color=color, lw=1.4, label=label)
    if not ax.lines:
        _no_data(ax, "no num_running / num_waiting columns")
        return
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", **_LEGEND)


def _preemption_panel(ax: Axes, binned: pd.DataFrame, total: int) -> None:
    """Preemptions per time bin (or per step) as vertical bars at the times they happened."""
    per = "per time bin" if _is_binned(binned) else "per step"
    ax.set_title(f"Preemptions ({total:,} total, {per})")
    ax.set_ylabel("preemptions")
    if "num_preemptions_sum" not in binned:
        _no_data(ax, "no num_preemptions column")
        return
    if total == 0:
        _note(ax, "no preemptions in this run")
        return
    hit = binned[binned["num_preemptions_sum"] > 0]
    ax.vlines(hit["t"], 0, hit["num_preemptions_sum"], color="C3", lw=1.2, label="preemptions")
    ax.plot(hit["t"], hit["num_preemptions_sum"], ls="none", marker="v", ms=3, color="C3")
    ax.set_ylim(0, float(hit["num_preemptions_sum"].max()) * 1.15)


def plot_kv_timeline(steps: pd.DataFrame) -> Figure:
    """KV-block utilization, running/waiting counts and preemptions over time."""
    fig = _new_figure(3, 1, (10, 7.2), sharex=True, height_ratios=(3, 3, 1.6))
    ax_kv, ax_q, ax_pre = fig.axes
    binned = bin_steps(steps)
    if not _timeline_axes(fig, steps, binned, "KV cache and queues"):
        return fig
    t = binned["t"].to_numpy()
    _kv_panel(ax_kv, t, binned)
    _queue_panel(ax_q, t, binned)
    _preemption_panel(ax_pre, binned, int(np.nansum(_values(steps, "num_preemptions"))))
    return fig


def _duration_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """Mean step time per bin with the bin's min-max range shaded."""
    ax.set_title("Step duration")
    ax.set_ylabel("step time (ms)")
    if "duration_s_mean" not in binned:
        _no_data(ax, "no duration_s column")
        return
    if _is_binned(binned):
        lo, hi = 1e3 * binned["duration_s_min"], 1e3 * binned["duration_s_max"]
        ax.fill_between(t, lo, hi, color="C0", alpha=0.18, lw=0, label="min-max in bin")
    label = "mean per bin" if _is_binned(binned) else "per step"
    ms = 1e3 * binned["duration_s_mean"].to_numpy()
    _time_plot(ax, t, ms, color="C0", lw=1.2, label=f"step time ({label})")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", **_LEGEND)


def _tokens_panel(ax: Axes, t: np.ndarray, binned: pd.DataFrame) -> None:
    """Mean tokens per step: decode and prefill stacked, the total as a line."""
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
        _no_data(ax, "no token columns")
        return
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", **_LEGEND)


def plot_step_timeline(steps: pd.DataFrame) -> Figure:
    """Step duration and tokens computed per step (prefill vs decode) over time."""
    fig = _new_figure(2, 1, (10, 6.2), sharex=True)
    ax_dt, ax_tok = fig.axes
    binned = bin_steps(steps)
    if not _timeline_axes(fig, steps, binned, "Scheduler steps"):
        return fig
    t = binned["t"].to_numpy()
    _duration_panel(ax_dt, t, binned)
    _tokens_panel(ax_tok, t, binned)
    return fig


# --------------------------------------------------------------------------- sweeps


@dataclass(frozen=True)
class _Metric:
    """A sweep panel: which summary columns, how to scale them, what to call it."""

    title: str
    ylabel: str
    columns: tuple[tuple[str, str, str], ...]  # (summary column, legend tag, line style)
    scale: float = 1.0


_TTFT = (("ttft_p50_s", "p50", _P50_STYLE), ("ttft_p99_s", "p99", _P99_STYLE))
_TPOT = (("tpot_p50_s", "p50", _P50_STYLE), ("tpot_p99_s", "p99", _P99_STYLE))
_SWEEP_METRICS = (
    _Metric("TTFT", "TTFT (ms)", _TTFT, 1e3),
    _Metric("TPOT", "TPOT (ms)", _TPOT, 1e3),
    _Metric(
        "Output throughput", "output tokens / s", (("output_token_throughput", "output", "-"),)
    ),
    _Metric("Preemptions", "preemptions (count)", (("num_preemptions", "preemptions", "-"),)),
)
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
        return _Axis(num.to_numpy(dtype=float), list(uniq), [_tick(u) for u in uniq], base)
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


def _palette(n: int) -> list[ColorType]:
    """``n`` distinguishable colours: the default cycle, or viridis when there are many."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    return [colormaps["viridis"](v) for v in np.linspace(0, 0.95, n)]


def _lines_for(ok: pd.DataFrame, others: Sequence[str]) -> _Lines:
    """One line per value of the first varying other key; median over the remaining ones."""
    varying = [k for k in others if ok[k].map(_label).nunique() > 1]
    if not varying:
        return _Lines(np.full(len(ok), "all"), ["all"], {"all": "C0"}, None, [])
    split = varying[0]
    groups = ok[split].map(_label)
    order = sorted(groups.unique(), key=_natural_key)
    colors = dict(zip(order, _palette(len(order)), strict=True))
    return _Lines(groups.to_numpy(), order, colors, split, [k for k in varying if k != split])


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
            stats = _per_x(x[in_g], _values(ok, col)[in_g] * m.scale)
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
        _no_data(ax, "no finite values" if present else "metric not in sweep table")
        return False
    _metric_y(ax, np.concatenate(plotted))
    ax.grid(True, alpha=0.3)
    return True


def _metric_y(ax: Axes, values: np.ndarray) -> None:
    """Log y for values spanning decades, else a linear axis from 0."""
    if _wide(values):
        _log_y(ax)
        return
    top = float(np.nanmax(values))
    ax.set_ylim(min(0.0, float(np.nanmin(values))), top * 1.08 if top > 0 else 1.0)


def _legends(fig: Figure, metrics: Sequence[_Metric], lines: _Lines) -> None:
    """One figure legend (colour = group, style = percentile) or per-panel legends."""
    if len(lines.order) <= 1:
        for ax in fig.axes:
            if len(ax.get_lines()) > 1:
                ax.legend(loc="best", **_LEGEND)
        return
    handles = [
        Line2D([], [], color=lines.colors[g], marker="o", ms=4, label=g) for g in lines.order
    ]
    handles += [Line2D([], [], color="0.3", ls=st, label=tag) for _, tag, st in _TTFT]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 9),
               title=lines.split_key, **_LEGEND)  # fmt: skip
    for ax, m in zip(fig.axes, metrics, strict=True):
        # Panels whose line styles mean something else than p50/p99 explain them locally.
        if len(m.columns) > 1 and [tag for _, tag, _ in m.columns] != ["p50", "p99"]:
            styles = [Line2D([], [], color="0.3", ls=st, label=tag) for _, tag, st in m.columns]
            ax.legend(handles=styles, loc="best", **_LEGEND)


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
    fig = _new_figure(rows, cols, size)
    ok = _with_status(sweep, "ok")
    n_failed = len(sweep) - len(ok)
    if ok.empty:
        fig.suptitle(f"{title}\n0 successful runs; {n_failed} failed")
        for ax, m in zip(fig.axes, metrics, strict=True):
            ax.set_title(m.title)
            _no_data(ax, "no successful runs")
        return fig
    lines = _lines_for(ok, others)
    xa = _x_axis(ok[key], force_log2)
    repeats = bool(pd.DataFrame({"x": xa.positions, "g": lines.groups}).duplicated().any())
    fig.suptitle(f"{title}\n{_subtitle(lines, len(ok), n_failed, repeats)}")
    for ax, m in zip(fig.axes, metrics, strict=True):
        if _metric_panel(ax, ok, xa.positions, lines, m):
            _apply_x(ax, xa, key)
    _legends(fig, metrics, lines)
    return fig


def _require_columns(sweep: pd.DataFrame, cols: Sequence[str]) -> None:
    """Fail with one line naming the first requested key the sweep table lacks."""
    for c in cols:
        if c not in sweep.columns:
            known = ", ".join(str(k) for k in sweep.columns if "." in str(k)) or "none"
            raise InputError(f"sweep has no column {c!r} (grid columns: {known})")


def plot_sweep(sweep: pd.DataFrame, keys: list[str]) -> dict[str, Figure]:
    """One 2x2 figure per grid key: p50/p99 TTFT and TPOT, throughput, preemptions vs the key.

    With two keys each panel has one line per value of the other key. With more, lines
    follow the first other key (in ``keys`` order) and points are medians over the rest,
    with the min-max range shaded.
    """
    _require_columns(sweep, keys)
    return {
        key: _sweep_figure(
            sweep,
            key,
            [k for k in keys if k != key],
            _SWEEP_METRICS,
            (2, 2, (11, 8)),
            f"Sweep over {key}",
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


# --------------------------------------------------------------------------- writing files


def _slug(key: str) -> str:
    """A file-name-safe form of a dotted grid key."""
    return re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_") or "key"


def save_run_plots(
    requests: pd.DataFrame, steps: pd.DataFrame, out_dir: Path, fmt: str = "png"
) -> list[Path]:
    """Write the four per-run figures into ``out_dir`` and return their paths."""
    _check_fmt(fmt)
    makers: tuple[Callable[[], Figure], ...] = (
        lambda: plot_latency_cdfs(requests),
        lambda: plot_e2e_vs_prompt(requests),
        lambda: plot_kv_timeline(steps),
        lambda: plot_step_timeline(steps),
    )
    return [
        save_figure(make(), Path(out_dir) / f"{name}.{fmt}", fmt)
        for name, make in zip(RUN_PLOTS, makers, strict=True)
    ]


def save_sweep_plots(
    sweep: pd.DataFrame, keys: list[str], out_dir: Path, fmt: str = "png"
) -> list[Path]:
    """Write one figure per grid key (plus the budget comparison when it is swept)."""
    _check_fmt(fmt)
    out = Path(out_dir)
    paths = [
        save_figure(fig, out / f"sweep_{_slug(k)}.{fmt}", fmt)
        for k, fig in plot_sweep(sweep, keys).items()
    ]
    if BUDGET_KEY in keys:
        fig = plot_budget_comparison(sweep)
        paths.append(save_figure(fig, out / f"budget_comparison.{fmt}", fmt))
    return paths
