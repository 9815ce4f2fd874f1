"""Measurement CSVs for calibrating the ``fitted`` cost model: reading and validating them,
reducing repeats, picking a group, and flagging points that contradict each other.

A measurement CSV has one row per measured step of a *uniform* batch::

    num_seqs, new_tokens, context_len, step_ms

(``num_seqs`` sequences each computing ``new_tokens`` tokens on top of ``context_len`` tokens
already in KV; a prefill of B prompts of P tokens is ``B, P, 0, t``, a decode step of B
sequences at context c is ``B, 1, c, t``). Other columns are kept but ignored, except
``kind`` (prefill/decode/mlp: how errors are grouped), ``group`` (one calibration per group)
and ``model``/``hardware``/``tp`` (defaults for ``calibrate``). Repeats of a point are reduced
to their median before fitting, so k-fold never puts a point's repeats on both sides.
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import InputError

MEAS_COLUMNS: tuple[str, ...] = ("num_seqs", "new_tokens", "context_len", "step_ms")
"""Required columns of a measurement CSV."""


POINT_COLUMNS: tuple[str, ...] = ("num_seqs", "new_tokens", "context_len")
"""Columns that identify one measurement point (repeats share them)."""


def read_csv(path: Path | str, what: str) -> pd.DataFrame:
    """A CSV as a DataFrame; unreadable or empty -> ``InputError`` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {p}: file not found")
    try:
        with warnings.catch_warnings():
            # index_col=False: a row with one field too many must not turn the first column
            # into the index (shifting every value); pandas warns instead, made an error here
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(p, index_col=False)
    except pd.errors.ParserWarning:
        raise InputError(f"{what} {p}: {_long_row(p)}") from None
    except UnicodeDecodeError:
        raise InputError(f"{what} {p}: {_first_non_utf8(p)}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"{what} {p}: not a readable CSV: {' '.join(str(exc).split())}") from None
    if df.empty:
        raise InputError(f"{what} {p}: no data rows")
    return df


def _first_non_utf8(path: Path) -> str:
    """Where a file stops being UTF-8 (pandas reports a position inside its read buffer)."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        return f"line {line}: not UTF-8 text (byte {raw[err.start]:#04x})"
    return "not UTF-8 text"


def _long_row(path: Path) -> str:
    """Where a CSV has a row with more fields than its header (for the error message)."""
    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        rows = csv.reader(handle)
        width = len(next(rows, []))
        for row in rows:
            if len(row) > width:
                return f"line {rows.line_num}: {len(row)} fields, the header has {width}"
    return "a row has more fields than the header"


def check_numeric(df: pd.DataFrame, path: Path | str, col: str, integer: bool, low: float) -> None:
    """Every value of ``col`` is a number >= ``low`` (an integer if asked), or name the line."""
    values = pd.to_numeric(df[col], errors="coerce")
    bad = values.isna() | ~np.isfinite(values) | (values < low)
    if integer:
        bad |= values.notna() & (values != np.floor(values))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        kind = "an integer" if integer else "a number"
        # +2: the header is line 1 and pandas counts data rows from 0.
        raise InputError(
            f"{path}: line {i + 2}, column {col}: expected {kind} >= {low:g}, "
            f"got {df[col].iloc[i]!r}"
        )
    df[col] = values.astype(int) if integer else values.astype(float)


def read_measurements(path: Path | str) -> pd.DataFrame:
    """Read and validate a measurement CSV (rows kept as they are, repeats included)."""
    df = read_csv(path, "measurements")
    missing = [c for c in MEAS_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(
            f"{path}: missing column(s) {', '.join(missing)}; a measurement CSV needs "
            f"{', '.join(MEAS_COLUMNS)}"
        )
    for col in ("num_seqs", "new_tokens"):
        check_numeric(df, path, col, integer=True, low=1)
    check_numeric(df, path, "context_len", integer=True, low=0)
    check_numeric(df, path, "step_ms", integer=False, low=0)
    if (df["step_ms"] <= 0).any():
        i = int(np.flatnonzero((df["step_ms"] <= 0).to_numpy())[0])
        raise InputError(f"{path}: line {i + 2}, column step_ms: a step time must be > 0")
    return df


def step_kinds(meas: pd.DataFrame) -> pd.Series:
    """Kind of each row: the ``kind`` column if present, else prefill (>1 new token) / decode."""
    if "kind" in meas.columns:
        return meas["kind"].astype(str)
    return pd.Series(
        np.where(meas["new_tokens"].to_numpy() > 1, "prefill", "decode"), index=meas.index
    )


def aggregate_repeats(meas: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct point (and group/kind if present): median ``step_ms``,
    ``n_repeats`` added (summed if the rows already carry it)."""
    df = meas.copy()
    df["kind"] = step_kinds(df)
    keys = [c for c in ("group", "kind") if c in df.columns] + list(POINT_COLUMNS)
    if "n_repeats" not in df.columns:
        df["n_repeats"] = 1
    agg: dict[str, Any] = {"step_ms": "median", "n_repeats": "sum"}
    for col in df.columns:
        if col not in agg and col not in keys:
            agg[col] = "first"
    out = df.groupby(keys, sort=True, as_index=False).agg(agg)
    return out.reset_index(drop=True)


def select_group(meas: pd.DataFrame, group: str | None, path: Path | str) -> pd.DataFrame:
    """Rows of one group; a file with several groups needs ``--group``."""
    if "group" not in meas.columns:
        if group is not None:
            raise InputError(f"{path}: --group {group!r} given but the file has no group column")
        return meas
    groups = sorted(meas["group"].astype(str).unique())
    if group is None:
        if len(groups) > 1:
            raise InputError(
                f"{path}: {len(groups)} groups ({', '.join(groups)}); pick one with --group"
            )
        return meas
    if group not in groups:
        raise InputError(f"{path}: no group {group!r}; groups: {', '.join(groups)}")
    return meas[meas["group"].astype(str) == group].reset_index(drop=True)


def measurement_arrays(meas: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``num_seqs``, ``new_tokens``, ``context_len`` and ``step_ms`` as float arrays."""
    return (
        meas["num_seqs"].to_numpy(dtype=float),
        meas["new_tokens"].to_numpy(dtype=float),
        meas["context_len"].to_numpy(dtype=float),
        meas["step_ms"].to_numpy(dtype=float),
    )


def inconsistent_points(meas: pd.DataFrame, tol: float = 0.10) -> np.ndarray:
    """Rows whose time contradicts the others of their group and kind: more work (no fewer
    sequences, new tokens or context, one of them more) yet over ``tol`` faster. Removes the
    worst offender until none is left (ties: the bigger point), returns a boolean mask.

    This checks the data, not a model: no fit can be right about both sides of such a pair.
    """
    flags = np.zeros(len(meas), dtype=bool)
    kinds = step_kinds(meas).to_numpy()
    groups = (
        meas["group"].astype(str).to_numpy() if "group" in meas.columns else np.zeros(len(meas))
    )
    pts = meas[list(POINT_COLUMNS)].to_numpy(dtype=float)
    t = meas["step_ms"].to_numpy(dtype=float)
    work = pts[:, 0] * pts[:, 1] * (1.0 + pts[:, 2])
    for g in np.unique(groups):
        for kind in np.unique(kinds):
            idx = np.flatnonzero((groups == g) & (kinds == kind))
            p, tt = pts[idx], t[idx]
            # bad[i, j]: point i does no less work than j (more in some way) but is too fast.
            ge = np.all(p[:, None, :] >= p[None, :, :], axis=2)
            gt = np.any(p[:, None, :] > p[None, :, :], axis=2)
            bad = ge & gt & (tt[:, None] < (1.0 - tol) * tt[None, :])
            live = np.ones(len(idx), dtype=bool)
            while True:
                sub = bad & live[:, None] & live[None, :]
                counts = sub.sum(axis=0) + sub.sum(axis=1)
                if counts.max(initial=0) == 0:
                    break
                # The worst offender goes first; ties go to the bigger point.
                order = np.lexsort((work[idx], counts))
                worst = order[-1]
                flags[idx[worst]] = True
                live[worst] = False
    return flags
