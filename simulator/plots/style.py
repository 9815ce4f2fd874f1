"""What every servesim figure shares: sizes, number and tick formats, log axes chosen from the
data, "no data" notes, and the atomic ``save_figure``.

Everything uses the object-oriented matplotlib API (``Figure`` with the Agg canvas), never
pyplot, so plotting holds no global state and is safe in threads and worker processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from simulator.errors import InputError
from simulator.output_file import write_file

DPI = 120
FORMATS = ("png", "svg")
# A positive range wider than this ratio reads better on a log axis.
_LOG_RATIO = 50.0
P50_STYLE = "-"
P99_STYLE = "--"
SLO_STYLE = "-."
"""Line style of an SLO target drawn on a latency axis."""
LEGEND = {"fontsize": 9, "framealpha": 0.9}


def new_figure(
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


def axes_note(ax: Axes, text: str) -> None:
    """Write a centred grey note in an axes and drop its ticks."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")
    # A shared x axis shares its ticks: clearing them here would blank the sibling panels.
    if len(ax.get_shared_x_axes().get_siblings(ax)) == 1:
        ax.set_xticks([])
    ax.set_yticks([])


def no_data(ax: Axes, reason: str) -> None:
    """Mark an axes that has nothing to show."""
    axes_note(ax, f"no data\n({reason})")


def column_values(df: pd.DataFrame, col: str) -> np.ndarray:
    """A column as a float array (all NaN when the column is missing)."""
    if col not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def with_status(df: pd.DataFrame, status: str) -> pd.DataFrame:
    """Rows whose ``status`` is ``status`` (all rows when there is no status column)."""
    if "status" not in df.columns:
        return df
    return df[df["status"].astype(str) == status]


def count_status(df: pd.DataFrame, status: str) -> int:
    """How many rows have the given status (0 without a status column)."""
    return 0 if "status" not in df.columns else len(with_status(df, status))


def fmt_num(v: float) -> str:
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


def tick_label(v: float) -> str:
    """A tick label without trailing zeros: 0.1, 4, 1,024."""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


TICKS = FuncFormatter(lambda v, _pos: tick_label(v))


def is_wide(values: np.ndarray) -> bool:
    """Whether positive finite values span enough orders of magnitude for a log axis."""
    v = values[np.isfinite(values)]
    if v.size < 2 or v.min() <= 0:
        return False
    return bool(v.max() / v.min() > _LOG_RATIO)


def set_log_x(ax: Axes, base: float = 10) -> None:
    """Log x axis with plain-number major labels and unlabeled minor ticks."""
    ax.set_xscale("log", base=base)
    ax.xaxis.set_major_formatter(TICKS)
    ax.xaxis.set_minor_formatter(NullFormatter())


def set_log_y(ax: Axes) -> None:
    """Log y axis with plain-number major labels and unlabeled minor ticks."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(TICKS)
    ax.yaxis.set_minor_formatter(NullFormatter())


def check_fmt(fmt: str) -> str:
    """Validate an output format name."""
    if fmt not in FORMATS:
        choices = ", ".join(FORMATS)
        raise InputError(f"plot format {fmt!r} is not supported (choose one of {choices})")
    return fmt


def save_figure(fig: Figure, path: Path, fmt: str = "png") -> Path:
    """Write ``fig`` to ``path`` atomically (temp file in the same folder, then rename)."""
    check_fmt(fmt)
    return write_file(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI), str(path))
