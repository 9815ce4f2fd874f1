"""A measured time as a piecewise-linear function of one count, with linear extrapolation."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
from scipy.interpolate import interp1d


class Curve:
    """Time (seconds) at profiled points ``xs`` (strictly increasing), linear between them and
    extrapolated linearly from the two end points outside ``[xs[0], xs[-1]]``."""

    __slots__ = ("xs", "ys", "lo", "hi")

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        if len(xs) != len(ys) or not xs:
            raise ValueError("a curve needs as many times as points, and at least one")
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            raise ValueError("curve points must be strictly increasing")
        self.xs = [float(x) for x in xs]
        self.ys = [float(y) for y in ys]
        self.lo = self.xs[0]
        """Smallest profiled point."""
        self.hi = self.xs[-1]
        """Largest profiled point."""

    def at(self, x: float) -> float:
        """The time at ``x`` (one bisection: scipy's per-call overhead, ~20 us, is more than a
        whole simulated step may cost; ``table`` is where scipy evaluates many points)."""
        xs, ys = self.xs, self.ys
        n = len(xs)
        if n == 1:
            return ys[0]
        i = bisect_right(xs, x)
        i = 1 if i < 1 else (n - 1 if i >= n else i)
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)

    def inside(self, x: float) -> bool:
        """Whether ``x`` is within the profiled points (no extrapolation)."""
        return self.lo <= x <= self.hi

    def table(self, points: np.ndarray) -> np.ndarray:
        """The curve at many points at once (scipy.interpolate, linear, extrapolated)."""
        if len(self.xs) == 1:
            return np.full(len(points), self.ys[0])
        line = interp1d(
            self.xs, self.ys, kind="linear", fill_value="extrapolate", assume_sorted=True
        )
        return np.asarray(line(points), dtype=np.float64)
