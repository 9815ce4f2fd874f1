"""Values stamped with the time they were observed (a request's TTFT at its first token), kept
only as far back as an autoscaler's decision reads, and selected by window."""

from __future__ import annotations

from collections import deque

import numpy as np


class TimedSamples:
    """Samples in time order; those older than ``keep_s`` before the newest are dropped."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._times: deque[float] = deque()
        self._values: deque[float] = deque()

    def add(self, at_s: float, value: float) -> None:
        """``value`` observed at ``at_s`` (not before the last sample's time)."""
        if self._times and at_s < self._times[-1]:
            raise ValueError(f"sample at {at_s} s before the last one ({self._times[-1]})")
        self._times.append(at_s)
        self._values.append(value)
        while self._times[0] < at_s - self.keep_s:
            self._times.popleft()
            self._values.popleft()

    def between(self, start_s: float, end_s: float) -> np.ndarray:
        """The values observed in ``[start_s, end_s)``, in time order."""
        times = np.fromiter(self._times, dtype=np.float64, count=len(self._times))
        lo, hi = np.searchsorted(times, [start_s, end_s], side="left")
        values = np.fromiter(self._values, dtype=np.float64, count=len(self._values))
        return values[lo:hi]
