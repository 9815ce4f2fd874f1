"""A replica's gauges for an autoscaler (running and waiting requests, KV blocks in use): a
piecewise-constant signal recorded at each change, kept only as far back as a decision reads,
and averaged over a window by time (what a metrics scraper's rate of a gauge gives)."""

from __future__ import annotations

from collections import deque

import numpy as np


class Gauge:
    """Values that hold from each recorded time until the next; history older than
    ``keep_s`` before the newest record is dropped (one sample before it is kept)."""

    def __init__(self, names: tuple[str, ...], keep_s: float) -> None:
        self.names = names
        self.keep_s = keep_s
        self._times: deque[float] = deque()
        self._values: deque[tuple[float, ...]] = deque()

    def record(self, at_s: float, *values: float) -> None:
        """The gauges read ``values`` (in the order of ``names``) from ``at_s`` on."""
        if len(values) != len(self.names):
            raise ValueError(f"expected {len(self.names)} values ({', '.join(self.names)})")
        if self._times and at_s < self._times[-1]:
            raise ValueError(f"gauge record at {at_s} s before the last one ({self._times[-1]})")
        if self._times and at_s == self._times[-1]:
            self._values[-1] = values  # the last value at an instant is the one that holds
        else:
            self._times.append(at_s)
            self._values.append(values)
        # keep the newest sample at or before the horizon: it holds into the window
        while len(self._times) > 1 and self._times[1] <= at_s - self.keep_s:
            self._times.popleft()
            self._values.popleft()

    def average(self, start_s: float, end_s: float) -> np.ndarray:
        """Time-weighted mean of each gauge over ``[start_s, end_s)``, or over its part after
        the first record (the value at ``start_s`` for an empty window); NaN if the window
        ends before the first record."""
        out = np.full(len(self.names), np.nan)
        if not self._times or end_s < self._times[0]:
            return out
        times = np.fromiter(self._times, dtype=np.float64, count=len(self._times))
        values = np.array(self._values, dtype=np.float64).reshape(len(times), -1)
        if end_s <= start_s:
            return values[max(int(np.searchsorted(times, start_s, side="right")) - 1, 0)]
        lo = max(start_s, times[0])
        edges = np.clip(np.append(times, np.inf), lo, end_s)
        weights = np.diff(edges)
        return (weights @ values) / (end_s - lo)
