"""A distribution fed in chunks: exact mean, and percentiles exact while it is small, then from a
log-bucket sketch with a stated relative error (for the run's largest series, the ITL gaps)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RELATIVE_ERROR = 0.001
"""Bound on a sketched percentile's relative error (0.1%)."""

EXACT_LIMIT = 1 << 22
"""Values kept exactly (32 MiB) before the distribution switches to the sketch."""


class LogBuckets:
    """DDSketch's bucketing (Masson et al., VLDB 2019): value ``v > 0`` counts in bucket
    ``ceil(log(v) / log(gamma))``, whose every value lies within ``RELATIVE_ERROR`` of its
    representative ``2 gamma^k / (gamma + 1)``.

    Written here rather than taken from the ``ddsketch`` package: it adds one value per Python
    call (1.9 us each, measured), where ``np.bincount`` adds a chunk at ~45 ns a value, and a
    run has ~10^8 gaps."""

    def __init__(self, relative_error: float = RELATIVE_ERROR) -> None:
        self.gamma = (1 + relative_error) / (1 - relative_error)
        self._log_gamma = math.log(self.gamma)
        self.counts = np.zeros(0, dtype=np.int64)
        """Count per bucket, for keys ``offset`` .. ``offset + len(counts) - 1``."""
        self.offset = 0
        self.num_zero = 0
        """Values <= 0 (counted apart: a log has no bucket for them)."""

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Count ``values`` (each ``weights[i]`` times, default once)."""
        positive = values > 0
        if weights is None:
            weights = np.ones(len(values), dtype=np.int64)
        self.num_zero += int(weights[~positive].sum())
        values, weights = values[positive], weights[positive]
        if not len(values):
            return
        keys = np.ceil(np.log(values) / self._log_gamma).astype(np.int64)
        lo, hi = int(keys.min()), int(keys.max())
        self._cover(lo, hi)
        self.counts += np.bincount(
            keys - self.offset, weights=weights, minlength=len(self.counts)
        ).astype(np.int64)

    def _cover(self, lo: int, hi: int) -> None:
        """Grow ``counts`` to hold keys ``lo`` .. ``hi``."""
        if not len(self.counts):
            self.offset, self.counts = lo, np.zeros(hi - lo + 1, dtype=np.int64)
            return
        new_lo, new_hi = min(lo, self.offset), max(hi, self.offset + len(self.counts) - 1)
        if (new_lo, new_hi) != (self.offset, self.offset + len(self.counts) - 1):
            grown = np.zeros(new_hi - new_lo + 1, dtype=np.int64)
            start = self.offset - new_lo
            grown[start : start + len(self.counts)] = self.counts
            self.offset, self.counts = new_lo, grown

    def value_at_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """Estimates of the order statistics at 0-based ``ranks`` (sorted ascending)."""
        cum = np.cumsum(self.counts)
        out = np.zeros(len(ranks))
        positive = ranks >= self.num_zero
        index = np.searchsorted(cum, ranks[positive] - self.num_zero, side="right")
        out[positive] = 2 * self.gamma ** (index + self.offset) / (self.gamma + 1)
        return out


class Distribution:
    """Values added in chunks (optionally weighted: ``count`` copies of one value).

    Mean and count are exact. Percentiles are numpy's (linear interpolation between order
    statistics) computed exactly while at most ``exact_limit`` values were added, and
    from ``LogBuckets`` after that: then each is within ``RELATIVE_ERROR`` of the exact one
    (both interpolate between order statistics that the buckets pin to that precision)."""

    def __init__(self, exact_limit: int = EXACT_LIMIT) -> None:
        self.exact_limit = exact_limit
        self.count = 0
        self.total = 0.0
        self._values: list[np.ndarray] = []
        self._weights: list[np.ndarray] = []
        self._sketch: LogBuckets | None = None

    @property
    def exact(self) -> bool:
        """Whether percentiles are still computed exactly."""
        return self._sketch is None

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add ``values`` (float64), each ``weights[i]`` times (int64 >= 0) if given."""
        values = np.asarray(values, dtype=np.float64)
        w = np.ones(len(values), dtype=np.int64) if weights is None else np.asarray(weights)
        if not len(values):
            return
        self.count += int(w.sum())
        # numpy's pairwise sum, not np.dot: BLAS splits a long dot product over its threads,
        # so the last bit of the mean depended on OMP_NUM_THREADS (a Ray worker sets it to 1)
        self.total += float(np.sum(values * w))
        if self._sketch is not None:
            self._sketch.add(values, w)
            return
        self._values.append(values.copy())
        self._weights.append(w.astype(np.int64, copy=True))
        if self.count > self.exact_limit:
            self._sketch = LogBuckets()
            for v, vw in zip(self._values, self._weights, strict=True):
                self._sketch.add(v, vw)
            self._values, self._weights = [], []

    def mean(self) -> float:
        """Mean of every value added (NaN if none)."""
        return self.total / self.count if self.count else float("nan")

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """Percentiles ``qs`` (0..100) as numpy's default method gives them (NaN if empty)."""
        if not self.count:
            return [float("nan")] * len(qs)
        if self._sketch is None:
            values, weights = np.concatenate(self._values), np.concatenate(self._weights)
            return [float(v) for v in weighted_percentiles(values, weights, qs)]
        h = (self.count - 1) * np.asarray(qs, dtype=float) / 100.0
        lo = np.floor(h)
        hi = np.minimum(lo + 1, self.count - 1)
        x_lo = self._sketch.value_at_ranks(lo.astype(np.int64))
        x_hi = self._sketch.value_at_ranks(hi.astype(np.int64))
        return [float(v) for v in x_lo + (h - lo) * (x_hi - x_lo)]


def weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, qs: Sequence[float]
) -> np.ndarray:
    """``np.percentile(np.repeat(values, weights), qs)``, bit for bit, without repeating: the
    ITL gaps of 10,000 requests are 22,000 values standing for 2.5 million (repeating and
    partitioning them took 27 ms, and ``np.percentile`` imports ``numpy.ma``, 14 ms more).

    The same arithmetic as numpy's default method: rank ``(n - 1) q``, its floor and the next
    order statistic, and numpy's two-sided interpolation between them."""
    live = weights > 0
    if np.isnan(values[live]).any():  # numpy's answer when any value is NaN
        return np.full(len(qs), np.nan)
    order = np.argsort(values, kind="stable")
    sorted_values, cum = values[order], np.cumsum(weights[order])
    n = int(cum[-1])
    virtual = (n - 1) * np.true_divide(np.asarray(qs, dtype=np.float64), 100)
    below = np.floor(virtual)
    below[virtual >= n - 1] = -1  # numpy: the last value for both neighbours
    lo = below.astype(np.intp)
    hi = np.where(lo < 0, -1, lo + 1)
    gamma = virtual - lo
    a = sorted_values[np.searchsorted(cum, np.where(lo < 0, n - 1, lo), side="right")]
    b = sorted_values[np.searchsorted(cum, np.where(hi < 0, n - 1, hi), side="right")]
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out
