"""An arrival rate that changes over time, and the time-rescaling that turns a renewal process
of constant rate into arrivals at that rate (docs/workloads.md, "Load that changes").

A schedule works in *reference units*: with ``ref`` its first positive rate, ``units(t)`` is
``Lambda(t) / ref`` (``Lambda`` the rate's integral from 0 to ``t``), so a renewal process
drawn at rate ``ref`` maps onto the schedule by ``times(u)``, the inverse of ``units``. A
constant schedule has ``units(t) == t`` exactly, which keeps its arrivals bit-identical to
those of a constant ``rate``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class RateSchedule(ABC):
    """An arrival rate ``rate(t) >= 0`` (req/s) for ``t >= 0``, with its integral and inverse."""

    ref: float
    """The reference rate (req/s) a renewal process is drawn at before ``times`` maps it."""

    @abstractmethod
    def rate(self, t: np.ndarray) -> np.ndarray:
        """The rate at each time ``t`` (seconds, ``>= 0``), req/s."""

    @abstractmethod
    def units(self, t: np.ndarray) -> np.ndarray:
        """``Lambda(t) / ref``: expected arrivals in ``[0, t)`` in seconds at rate ``ref``."""

    @abstractmethod
    def times(self, u: np.ndarray) -> np.ndarray:
        """The earliest ``t`` with ``units(t) >= u``, for nondecreasing ``u >= 0``."""

    @abstractmethod
    def capacity(self) -> float:
        """``units(inf)``: finite when the rate ends at 0 (then no arrival comes after)."""

    def expected(self, start: float, end: float) -> float:
        """Expected number of arrivals in ``[start, end)``."""
        u = self.units(np.array([start, end], dtype=np.float64))
        return float((u[1] - u[0]) * self.ref)


class PiecewiseRate(RateSchedule):
    """A rate linear on each piece ``[t[k], t[k+1])`` from ``start[k]`` to ``end[k]``, and
    constant at ``start[-1]`` from the last time on (a step schedule has ``start == end``)."""

    def __init__(self, t: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        self.t = np.asarray(t, dtype=np.float64)
        positive = np.flatnonzero(np.asarray(start) > 0)
        self.ref = float(start[positive[0]]) if len(positive) else float(np.max(end))
        if not self.ref > 0:
            raise ValueError("a rate schedule needs a positive rate somewhere")
        # Rates in reference units: a constant schedule is exactly 1.0 everywhere.
        self._a = np.asarray(start, dtype=np.float64) / self.ref
        b = np.asarray(end, dtype=np.float64) / self.ref
        width = np.diff(self.t)
        self._slope = np.zeros_like(self._a)
        self._slope[:-1] = (b[:-1] - self._a[:-1]) / width
        self._u = np.concatenate(([0.0], np.cumsum(0.5 * (self._a[:-1] + b[:-1]) * width)))

    @classmethod
    def steps(cls, t: np.ndarray, rates: np.ndarray) -> PiecewiseRate:
        """Rate ``rates[k]`` from ``t[k]`` until the next time."""
        return cls(t, rates, rates)

    @classmethod
    def linear(cls, t: np.ndarray, rates: np.ndarray) -> PiecewiseRate:
        """Rates interpolated linearly between ``(t[k], rates[k])``; the last rate after."""
        rates = np.asarray(rates, dtype=np.float64)
        return cls(t, rates, np.concatenate((rates[1:], rates[-1:])))

    def _piece(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self.t, t, side="right") - 1, 0, len(self.t) - 1)

    def rate(self, t: np.ndarray) -> np.ndarray:
        """The rate at each time ``t``, req/s."""
        t = np.asarray(t, dtype=np.float64)
        k = self._piece(t)
        return (self._a[k] + self._slope[k] * (t - self.t[k])) * self.ref

    def units(self, t: np.ndarray) -> np.ndarray:
        """``Lambda(t) / ref``, exact for the linear pieces."""
        t = np.asarray(t, dtype=np.float64)
        k = self._piece(t)
        dt = t - self.t[k]
        return self._u[k] + dt * self._a[k] + 0.5 * self._slope[k] * dt * dt

    def times(self, u: np.ndarray) -> np.ndarray:
        """Inverse of ``units``: the root of each piece's quadratic, in the form that stays
        accurate for a slope of either sign (and is exactly ``u`` for a constant rate 1)."""
        u = np.asarray(u, dtype=np.float64)
        # side="left": a value on a knot belongs to the piece before it, so a zero-rate piece
        # (whose knots repeat the same value) is never chosen for a positive step.
        k = np.clip(np.searchsorted(self._u, u, side="left") - 1, 0, len(self.t) - 1)
        du = u - self._u[k]
        a, slope = self._a[k], self._slope[k]
        root = np.sqrt(np.maximum(a * a + 2.0 * slope * du, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            dt = np.where(du > 0, 2.0 * du / (a + root), 0.0)
        return self.t[k] + dt

    def capacity(self) -> float:
        """``units(inf)``: ``inf`` unless the last rate is 0."""
        return float("inf") if self._a[-1] > 0 else float(self._u[-1])


def schedule_problem(t: np.ndarray, rates: np.ndarray) -> tuple[int | None, str] | None:
    """The first reason ``(t, rates)`` is not a schedule, with the 0-based entry it is about
    (None for the whole), or None: times finite, the first 0, strictly increasing; rates
    finite, ``>= 0``, not all 0."""
    if len(t) == 0:
        return None, "the schedule is empty"
    bad_time = ~np.isfinite(t) | (t < 0)
    unsorted = np.concatenate(([t[0] != 0], ~(t[1:] > t[:-1])))
    bad_rate = ~np.isfinite(rates) | (rates < 0)
    first = np.flatnonzero(bad_time | unsorted | bad_rate)
    if len(first):
        i = int(first[0])
        time, rate = float(t[i]), float(rates[i])
        if bad_time[i]:
            return i, f"time {time} is not a finite number >= 0"
        if i == 0 and unsorted[0]:
            return 0, f"the first time must be 0 (the rate from the start), not {time}"
        if unsorted[i]:
            return i, f"time {time} is not after the previous time {float(t[i - 1])}"
        return i, f"rate {rate} is not a finite number >= 0"
    if not (rates > 0).any():
        return None, "every rate is 0 (no request would ever arrive)"
    return None


def schedule_check(t: np.ndarray, rates: np.ndarray) -> str | None:
    """Why ``(t, rates)`` is not a schedule, naming the 0-based entry, or None."""
    problem = schedule_problem(t, rates)
    if problem is None:
        return None
    entry, why = problem
    return why if entry is None else f"entry {entry}: {why}"
