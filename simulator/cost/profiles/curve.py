"""A measured time as a piecewise-linear function of one count, with linear extrapolation."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np


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
        """The time at ``x``, by one bisection (a library call's overhead, numpy's ~5 us or
        scipy's ~20 us, is more than a whole simulated step may cost)."""
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
        """The curve at many points at once, extrapolated linearly beyond its ends.

        numpy.interp rather than scipy.interpolate.interp1d (the same piecewise-linear
        interpolation): importing scipy.interpolate takes ~0.8 s, a quarter of the 3 s a whole
        replay of a real run may take (benchmarks/README.md)."""
        xs, ys = np.asarray(self.xs), np.asarray(self.ys)
        points = np.asarray(points, dtype=np.float64)
        if len(xs) == 1:
            return np.full(len(points), ys[0])
        out = np.interp(points, xs, ys)
        low, high = points < xs[0], points > xs[-1]
        out[low] = ys[0] + (ys[1] - ys[0]) / (xs[1] - xs[0]) * (points[low] - xs[0])
        out[high] = ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (points[high] - xs[-1])
        return out
