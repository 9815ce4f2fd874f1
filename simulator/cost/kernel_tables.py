"""Lookups in the measured kernel tables (``kernel_db.py``): one GEMM shape by token count,
context and generation attention of one head layout by batch and length, an all-reduce by
message size, the fused MoE by token count. Each is a ``Curve`` (linear between measured
points, exact at them; linear beyond the last) built once at construction, so a simulated
step costs a bisection per lookup. Between measured GEMM widths and batch sizes the
curves are interpolated linearly too (bilinear / trilinear over the grid, as AIConfigurator
does); times in seconds.

The piecewise-linear interpolation is numpy's (``Curve.table``), the same as
``scipy.interpolate.interp1d``: importing scipy.interpolate costs ~0.8 s per run, more than
a whole replay's step timing (see ``profiles/curve.py``)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from simulator.cost.profiles import Curve
from simulator.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

_MS = 1e-3


def bracket(grid: Sequence[float], x: float) -> tuple[int, int, float]:
    """Indices of the two grid points around ``x`` and ``x``'s weight on the upper one (the
    two end points when ``x`` is outside: linear extrapolation); one point: weight 0."""
    n = len(grid)
    if n == 1:
        return 0, 0, 0.0
    i = min(max(bisect_left(grid, x), 1), n - 1)
    lo, hi = grid[i - 1], grid[i]
    return i - 1, i, (x - lo) / (hi - lo)


def _mix(curves: list[tuple[float, Curve]]) -> Curve:
    """``sum(w * curve)`` over the union of the curves' points (exact: each is linear between
    its own points, and beyond its last)."""
    xs = sorted({x for _, c in curves for x in c.xs})
    points = np.asarray(xs, dtype=float)
    total = sum(w * c.table(points) for w, c in curves)
    return Curve(xs, np.asarray(total, dtype=float).tolist())


def _curves(
    df: pd.DataFrame, by: str, x: str, xmap: Callable[[np.ndarray], np.ndarray]
) -> dict[int, Curve]:
    """Per value of ``by``: a Curve of ``latency`` (seconds) over ``xmap(df[x])``."""
    out = {}
    for key in sorted(df[by].unique().tolist()):
        part = df[df[by] == key].sort_values(x).drop_duplicates(x)
        out[int(key)] = Curve(xmap(part[x].to_numpy(float)).tolist(), (part.latency * _MS).tolist())
    return out


def interpolated(curves: dict[int, Curve], at: float) -> Curve:
    """The curve at ``at`` between the measured keys of ``curves`` (linear in the key)."""
    keys = sorted(curves)
    i, j, w = bracket(keys, at)
    if i == j or w == 0.0:
        return curves[keys[i]]
    if w == 1.0:
        return curves[keys[j]]
    return _mix([(1.0 - w, curves[keys[i]]), (w, curves[keys[j]])])


def gemm_curve(df: pd.DataFrame, n: int, k: int, where: str) -> Curve:
    """Seconds of an ``(m x k) @ (k x n)`` GEMM over ``m`` (the step's tokens), from the
    table's rows of one dtype; ``n`` or ``k`` between measured widths: bilinear."""
    if df.empty:
        raise InputError(f"{where}: no GEMMs measured at this dtype")
    ns, ks = sorted(df.n.unique().tolist()), sorted(df.k.unique().tolist())
    if n > ns[-1] or k > ks[-1]:  # wider than measured: as that many of the widest, side by side
        top_n, top_k = min(n, ns[-1]), min(k, ks[-1])
        widest = gemm_curve(df, top_n, top_k, where)
        scale = (n / top_n) * (k / top_k)
        return Curve(widest.xs, [scale * y for y in widest.ys])
    i0, i1, wn = bracket(ns, n)
    j0, j1, wk = bracket(ks, k)
    parts = []
    for ni, a in ((i0, 1.0 - wn), (i1, wn)):
        for kj, b in ((j0, 1.0 - wk), (j1, wk)):
            if a * b == 0.0:
                continue
            cell = df[(df.n == ns[ni]) & (df.k == ks[kj])].sort_values("m").drop_duplicates("m")
            curve = Curve(cell.m.tolist(), (cell.latency * _MS).tolist())
            parts.append((a * b, curve))
    return parts[0][1] if len(parts) == 1 else _mix(parts)


def pairs_of(isl: np.ndarray) -> np.ndarray:
    """Causal query-key pairs of one sequence prefilling ``isl`` tokens from empty."""
    return isl * (isl + 1) / 2


def batch_curves(
    df: pd.DataFrame, x: str, xmap: Callable[[np.ndarray], np.ndarray]
) -> dict[int, Curve]:
    """Per measured batch size: seconds over ``xmap(df[x])``."""
    return _curves(df, "batch_size", x, xmap)


def message_curve(df: pd.DataFrame) -> Curve:
    """Seconds of one collective over its message size in bytes."""
    part = df.sort_values("message_size").drop_duplicates("message_size")
    return Curve(part.message_size.tolist(), (part.latency * _MS).tolist())


def token_curve(df: pd.DataFrame) -> Curve:
    """Seconds of one fused-MoE layer over the tokens entering it."""
    part = df.sort_values("num_tokens").drop_duplicates("num_tokens")
    return Curve(part.num_tokens.tolist(), (part.latency * _MS).tolist())
