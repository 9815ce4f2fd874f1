"""Attention time of a step from a 4-D profile: (prefill chunk tokens, prefill context, decode
sequences, decode context), as LLMServingSim's profiler measures it.

The profiled points need not form a full grid (bundles mix a doubling grid with a finer one,
and a step cannot hold ``2048`` prefill tokens and ``256`` decodes at once), so the lookup is
nested 1-D linear interpolation, each level over the points that exist below it: prefill
chunk, then decode sequences, then prefill context, then decode context. Outside the profiled
points every level extrapolates linearly from its two end points.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from simulator.cost.profiles.curve import Curve


def _bracket(xs: list[float], x: float) -> tuple[int, int, float]:
    """``(lo, hi, w)`` with ``x = xs[lo] + w (xs[hi] - xs[lo])``: the two points around ``x``,
    the end two outside them (linear extrapolation); ``lo == hi`` on an exact hit."""
    n = len(xs)
    i = bisect_right(xs, x)
    if i and xs[i - 1] == x or n == 1:
        k = i - 1 if i else 0
        return k, k, 0.0
    i = 1 if i < 1 else (n - 1 if i >= n else i)
    x0 = xs[i - 1]
    return i - 1, i, (x - x0) / (xs[i] - x0)


class _Slice:
    """The points of one (prefill chunk, decode sequences) pair: per prefill context, a curve
    over decode context."""

    __slots__ = ("kvp", "rows")

    def __init__(self, points: dict[float, dict[float, float]]) -> None:
        self.kvp = sorted(points)
        self.rows = [
            Curve(sorted(points[p]), [points[p][d] for d in sorted(points[p])]) for p in self.kvp
        ]

    def at(self, kvp: float, kvd: float) -> float:
        lo, hi, w = _bracket(self.kvp, kvp)
        rows = self.rows
        y = rows[lo].at(kvd)
        return y if lo == hi else y + (rows[hi].at(kvd) - y) * w


class AttentionTable:
    """Per-layer attention time (seconds) of a step, looked up from profiled points."""

    def __init__(self, points: Sequence[tuple[int, int, int, int, float]]) -> None:
        """``points``: ``(prefill_chunk, kv_prefill, n_decode, kv_decode, seconds)``; a
        repeated key is the caller's to reject."""
        grid: dict[int, dict[int, dict[float, dict[float, float]]]] = {}
        for pc, kvp, nd, kvd, t in points:
            grid.setdefault(pc, {}).setdefault(nd, {}).setdefault(kvp, {})[kvd] = t
        self.pcs = [float(p) for p in sorted(grid)]
        self._nds = [[float(n) for n in sorted(grid[p])] for p in sorted(grid)]
        self._slices = [[_Slice(grid[p][n]) for n in sorted(grid[p])] for p in sorted(grid)]
        self.bounds = self._bounds(points)
        """``(min, max)`` profiled value of each axis, in argument order."""

    @staticmethod
    def _bounds(points: Sequence[tuple[int, int, int, int, float]]) -> list[tuple[float, float]]:
        axes = list(zip(*(p[:4] for p in points), strict=True))
        return [(float(min(a)), float(max(a))) for a in axes]

    def at(self, pc: float, kvp: float, nd: float, kvd: float) -> float:
        """Attention time of one layer for a step with ``pc`` prefill tokens attending to
        ``kvp`` cached tokens and ``nd`` decodes with mean context ``kvd`` (never negative).
        Called once or twice per simulated step: plain loops, no closures."""
        if pc == 0 and nd == 0:
            return 0.0
        lo, hi, w = _bracket(self.pcs, pc)
        y = self._column(lo, kvp, nd, kvd)
        if lo != hi:
            y += (self._column(hi, kvp, nd, kvd) - y) * w
        return y if y > 0.0 else 0.0

    def _column(self, j: int, kvp: float, nd: float, kvd: float) -> float:
        """The time at one profiled prefill chunk, interpolated over its decode counts."""
        ns = self._nds[j]
        if nd == 0 and ns[0] > 0:  # no decode-free points (the pure-decode column): none
            return 0.0
        lo, hi, w = _bracket(ns, nd)
        slices = self._slices[j]
        y = slices[lo].at(kvp, kvd)
        return y if lo == hi else y + (slices[hi].at(kvp, kvd) - y) * w

    def decode_contexts(self) -> list[float]:
        """Every decode context profiled without a prefill chunk (the pure-decode points)."""
        if not self.pcs or self.pcs[0] != 0:
            return []
        return sorted({x for s in self._slices[0] for row in s.rows for x in row.xs})

    def decode_table(self, contexts: list[float], top: int) -> np.ndarray:
        """``at(0, 0, n, k)`` for every ``n`` in 0..top (row 0: zeros) and ``k`` in
        ``contexts``, at once: the pure-decode slices at those contexts, then linear in ``n``
        between (and beyond) the profiled decode counts, as ``at`` does."""
        points = np.asarray(contexts, dtype=np.float64)
        nds = np.asarray(self._nds[0])
        rows = np.array([np.array([s.at(0, k) for k in contexts]) for s in self._slices[0]])
        n = np.arange(top + 1, dtype=np.float64)
        hi = np.clip(np.searchsorted(nds, n, side="left"), 1, len(nds) - 1)
        lo = hi - 1
        exact = nds[np.minimum(np.searchsorted(nds, n), len(nds) - 1)] == n
        weight = ((n - nds[lo]) / (nds[hi] - nds[lo]))[:, None]
        table = rows[lo] + (rows[hi] - rows[lo]) * weight
        table[exact] = rows[np.searchsorted(nds, n[exact])]
        table[0] = 0.0
        return np.maximum(table, 0.0) if len(points) else table

    def outside(self, pc: float, kvp: float, nd: float, kvd: float) -> str | None:
        """Which axis a query leaves the profiled range on (None: inside)."""
        names = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
        for name, value, (lo, hi) in zip(names, (pc, kvp, nd, kvd), self.bounds, strict=True):
            if value and not lo <= value <= hi:
                return f"{name} {value:g} outside the profiled {lo:g}..{hi:g}"
        return None
