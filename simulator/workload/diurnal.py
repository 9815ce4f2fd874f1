"""The built-in diurnal shape: a raised cosine between a trough and a peak rate, once per
period, its integral in closed form and its inverse solved to float precision."""

from __future__ import annotations

import math

import numpy as np

from simulator.workload.rate_schedule import RateSchedule

# Safeguarded Newton: quadratic convergence where the rate is positive, and bisection inside a
# shrinking bracket where it is near 0 (a trough of 0); 200 rounds is far beyond either need.
_MAX_ROUNDS = 200
# Points per period of the table that gives Newton its first guess and bracket.
_TABLE = 4096


class DiurnalRate(RateSchedule):
    """``rate(t) = trough + (peak - trough) * (1 + cos(2 pi (t - peak_at_s) / period_s)) / 2``."""

    def __init__(self, peak: float, trough: float, period_s: float, peak_at_s: float) -> None:
        self.ref = 0.5 * (peak + trough)
        self.period_s = period_s
        self.peak_at_s = peak_at_s
        self._omega = 2.0 * math.pi / period_s
        self._half = 0.5 * (peak - trough) / self.ref  # the cosine's amplitude, in ref units
        self._phase0 = math.sin(self._omega * peak_at_s)

    def rate(self, t: np.ndarray) -> np.ndarray:
        """The rate at each time ``t``, req/s."""
        t = np.asarray(t, dtype=np.float64)
        return self.ref * (1.0 + self._half * np.cos(self._omega * (t - self.peak_at_s)))

    def units(self, t: np.ndarray) -> np.ndarray:
        """``Lambda(t) / ref = t + (half / w) (sin(w (t - peak_at)) + sin(w peak_at))``, with
        ``w = 2 pi / period_s``."""
        t = np.asarray(t, dtype=np.float64)
        wave = np.sin(self._omega * (t - self.peak_at_s)) + self._phase0
        return t + (self._half / self._omega) * wave

    def times(self, u: np.ndarray) -> np.ndarray:
        """Inverse of ``units``; exactly ``u`` when peak equals trough."""
        u = np.asarray(u, dtype=np.float64)
        if self._half == 0:
            return u.copy()
        # units(t + period) = units(t) + period: solve within one period, from a table of
        # units over it (the first guess and a bracket), then add the whole periods back.
        period = self.period_s
        whole = np.floor(u / period)
        rest = u - whole * period
        grid = np.linspace(0.0, period, _TABLE + 1)
        table = self.units(grid)
        j = np.clip(np.searchsorted(table, rest, side="right") - 1, 0, _TABLE - 1)
        start = np.interp(rest, table, grid)
        return whole * period + self._solve(rest, start, grid[j], grid[j + 1])

    def _solve(self, u: np.ndarray, t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """``units(t) = u`` by Newton's method kept inside the bracket ``[lo, hi]``."""
        active = np.arange(len(u))
        for _ in range(_MAX_ROUNDS):
            if len(active) == 0:
                break
            x = t[active]
            f = self.units(x) - u[active]
            below = f < 0
            lo[active] = np.where(below, x, lo[active])
            hi[active] = np.where(below, hi[active], x)
            with np.errstate(divide="ignore", invalid="ignore"):
                step = x - f / (self.rate(x) / self.ref)
            a, b = lo[active], hi[active]
            inside = (step > a) & (step < b)
            new = np.where(f == 0, x, np.where(inside, step, 0.5 * (a + b)))
            t[active] = new
            # Done when the step no longer moves it or the bracket is a few ulps wide.
            tiny = 4 * np.spacing(np.maximum(np.abs(new), 1.0))
            active = active[(np.abs(new - x) > tiny) & (b - a > tiny)]
        return t

    def capacity(self) -> float:
        """A diurnal rate never ends."""
        return float("inf")
