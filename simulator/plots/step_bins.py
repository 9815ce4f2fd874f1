"""The step table in equal time bins, for the timelines: from a DataFrame, or from a parquet
file read a row group at a time (a long run's table never has to fit in memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.parquet_file import iter_parquet, open_parquet

MAX_TIME_BINS = 800
"""Most bins a timeline is drawn from: the screen cannot show more, and 10^6-point lines make
savefig slow."""

_STATE = ("kv_utilization", "num_running", "num_waiting")  # averaged over time, not steps
_BATCH_ROWS = 1 << 18


def _numeric_columns(schema_cols: list[str], dtypes: list[Any]) -> list[str]:
    """The columns that get a per-bin mean: numeric, not bool, not the step number or start."""
    out = []
    for c, d in zip(schema_cols, dtypes, strict=True):
        numeric = pd.api.types.is_numeric_dtype(d) and not pd.api.types.is_bool_dtype(d)
        if numeric and c not in ("step", "start_s"):
            out.append(c)
    return out


class _Bins:
    """Per-bin sums, filled a chunk of steps at a time."""

    def __init__(self, lo: float, hi: float, max_bins: int, cols: list[str]) -> None:
        self.lo, self.max_bins, self.cols = lo, max_bins, cols
        self.width = (hi - lo) / max_bins if hi > lo else 1.0
        self.state = [c for c in _STATE if c in cols]
        zeros = lambda: np.zeros(max_bins)  # noqa: E731
        self.n, self.t = zeros(), zeros()
        self.sums = {c: zeros() for c in cols}
        self.counts = {c: zeros() for c in cols}  # non-NaN values (a mean skips NaN)
        self.weighted = {c: zeros() for c in self.state}
        self.weights = {c: zeros() for c in self.state}
        self.d_min = np.full(max_bins, np.inf)
        self.d_max = np.full(max_bins, -np.inf)
        self.num_steps = 0
        self.num_preemptions = 0

    def add(self, chunk: pd.DataFrame) -> None:
        """Account for some rows of the step table."""
        t = chunk["start_s"].to_numpy(dtype=float)
        self.num_steps += len(t)
        if "num_preemptions" in chunk:
            self.num_preemptions += int(np.nansum(chunk["num_preemptions"].to_numpy()))
        keep = np.isfinite(t)
        t = t[keep]
        b = np.minimum(((t - self.lo) / self.width).astype(np.int64), self.max_bins - 1)
        count = lambda w=None: np.bincount(b, weights=w, minlength=self.max_bins)  # noqa: E731
        d = np.nan_to_num(chunk["duration_s"].to_numpy(dtype=float)[keep])
        self.n += count()
        self.t += count(t)
        for c in self.cols:
            values = chunk[c].to_numpy(dtype=float)[keep]
            ok = ~np.isnan(values)
            bc, vc = b[ok], values[ok]
            self.sums[c] += np.bincount(bc, weights=vc, minlength=self.max_bins)
            self.counts[c] += np.bincount(bc, minlength=self.max_bins)
            if c in self.weighted:
                self.weighted[c] += np.bincount(bc, weights=vc * d[ok], minlength=self.max_bins)
                self.weights[c] += np.bincount(bc, weights=d[ok], minlength=self.max_bins)
        if "duration_s" in self.cols:  # fmin/fmax: NaN durations do not count
            np.fmin.at(self.d_min, b, chunk["duration_s"].to_numpy(dtype=float)[keep])
            np.fmax.at(self.d_max, b, chunk["duration_s"].to_numpy(dtype=float)[keep])

    def frame(self) -> pd.DataFrame:
        """One row per non-empty bin (see ``bin_steps``)."""
        full = self.n > 0
        n = self.n[full]
        out = pd.DataFrame({"t": self.t[full] / n, "n": n.astype(np.int64)})
        with np.errstate(invalid="ignore", divide="ignore"):
            for c in self.cols:
                out[f"{c}_mean"] = self.sums[c][full] / self.counts[c][full]
            for c in self.state:
                d = self.weights[c][full]
                weighted = self.weighted[c][full] / d
                # Bins whose steps all last 0 s (degenerate input) fall back to the plain mean.
                out[f"{c}_mean"] = np.where(d > 0, weighted, out[f"{c}_mean"])
        if "duration_s" in self.cols:
            out["duration_s_max"] = np.where(np.isinf(self.d_max[full]), np.nan, self.d_max[full])
            out["duration_s_min"] = np.where(np.isinf(self.d_min[full]), np.nan, self.d_min[full])
        if "num_preemptions" in self.cols:
            out["num_preemptions_sum"] = self.sums["num_preemptions"][full]
        return _label(out, self.width, self.num_steps, self.num_preemptions)


def _label(out: pd.DataFrame, width: float, num_steps: int, preemptions: int) -> pd.DataFrame:
    out.attrs.update(bin_width_s=width, num_steps=num_steps, num_preemptions=preemptions)
    return out


def _empty(num_steps: int = 0) -> pd.DataFrame:
    return _label(pd.DataFrame({"t": [], "n": np.zeros(0, dtype=np.int64)}), 0.0, num_steps, 0)


def bin_steps(steps: pd.DataFrame, max_bins: int = MAX_TIME_BINS) -> pd.DataFrame:
    """Aggregate steps into at most ``max_bins`` equal time bins (empty bins dropped).

    Columns: ``t`` (mean start time of the bin's steps, s), ``n`` (steps), ``<col>_mean``
    for every numeric column, ``duration_s_min``/``_max`` and ``num_preemptions_sum``.
    KV utilization, running and waiting are averaged weighted by step duration, so a long
    step counts for the time it lasts. ``attrs``: ``bin_width_s``, ``num_steps`` and
    ``num_preemptions`` (over every step, also those without a start time)."""
    if "start_s" not in steps or "duration_s" not in steps:
        return _empty(len(steps))
    t = steps["start_s"].to_numpy(dtype=float)
    finite = t[np.isfinite(t)]
    if not finite.size:
        return _empty(len(steps))
    cols = _numeric_columns(list(steps.columns), list(steps.dtypes))
    bins = _Bins(float(finite.min()), float(finite.max()), max_bins, cols)
    bins.add(steps)
    return bins.frame()


def bin_steps_file(path: Path, max_bins: int = MAX_TIME_BINS) -> pd.DataFrame:
    """``bin_steps`` of a parquet step table, read a batch of rows at a time (twice: first
    for the time span, then for the sums)."""
    table = open_parquet(path)
    schema = table.schema_arrow
    names = schema.names
    if "start_s" not in names or "duration_s" not in names:
        return _empty(table.metadata.num_rows)
    dtypes = [field.type.to_pandas_dtype() for field in schema]
    cols = _numeric_columns(names, dtypes)
    lo, hi = np.inf, -np.inf
    for batch in iter_parquet(path, table, ["start_s"], _BATCH_ROWS):
        t = batch["start_s"].to_numpy(dtype=float)
        t = t[np.isfinite(t)]
        if t.size:
            lo, hi = min(lo, float(t.min())), max(hi, float(t.max()))
    if not np.isfinite(lo):
        return _empty(table.metadata.num_rows)
    bins = _Bins(lo, hi, max_bins, cols)
    for batch in iter_parquet(path, table, ["start_s", *cols], _BATCH_ROWS):
        bins.add(batch)
    return bins.frame()
