"""Cutting short a probe that can no longer meet its target: while a run goes, a request that
has waited longer than a bound already misses it, whatever happens next. Once enough requests
certainly miss (more than the percentile or attainment allows, or a mean whose lower bound is
past the bound), the run would fail the target if run to its end, so it is stopped there.

The rule only ever stops a run whose full answer is "fails": every figure it uses is a lower
bound of the final one (a waiting request's TTFT is at least ``now - arrival``; a rejected
request misses every bound, as ``explore/slo.py`` counts it), and it is compared exactly as
the target is (numpy's linear-interpolation percentile is above a bound once the order
statistic below its position is). TPOT and ITL give no such bound before a request ends; they
never stop a run.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.engine.watch import RunState
from simulator.explore.slo import Target

_TIMESTAMP = {"ttft": "first_token", "e2e": "finish", "queue_delay": "first_scheduled"}
"""The timestamp (minus arrival) each watchable metric is."""

MEAN_MARGIN = 1e-9
"""Relative margin on a mean's bound: the summary sums in another order (rounding may differ)."""


def _lower_bounds(state: RunState, metric: str) -> np.ndarray:
    """Per request that arrived and was not rejected: a lower bound of its ``metric``."""
    n = state.num_arrived
    arrival = state.arrival_s[:n]
    stamps = np.asarray(getattr(state, _TIMESTAMP[metric])[:n], dtype=np.float64)
    # same float operation as the request table's (timestamp - arrival), where known
    low = np.where(np.isnan(stamps), state.now - arrival, stamps - arrival)
    rejected = [i for i in state.rejected if i < n]
    return np.delete(low, rejected)


def certain_misses(low: np.ndarray, bound_s: float) -> int:
    """Requests certainly past ``bound_s``."""
    return int(np.count_nonzero(low > bound_s))


def percentile_past(num_past: int, num_values: int, p: float) -> bool:
    """Whether numpy's ``p``-th percentile of ``num_values`` values, ``num_past`` of them past
    a bound, is past it: the order statistic at ``floor((n - 1) p / 100)`` is."""
    if num_values <= 0:
        return False
    return num_past >= num_values - math.floor((num_values - 1) * p / 100.0)


class Cutoff:
    """The stop rule of a probe for ``target`` (see the module's docstring)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.watched = [b for b in target.bounds if b.metric in _TIMESTAMP]
        named = [(m[: -len("_ms")], limit_ms) for m, limit_ms in target.limits]
        self.limits = [(m, limit_ms) for m, limit_ms in named if m in _TIMESTAMP]

    @property
    def active(self) -> bool:
        """Whether any term of the target can stop a run."""
        return bool(self.watched) or (self.target.attain is not None and bool(self.limits))

    def __call__(self, state: RunState) -> str | None:
        """Why the run can no longer meet the target, or None."""
        # every request counts (explore/slo.py): a rejected one is a miss of every bound
        n, rejected = state.num_requests, len(state.rejected)
        for b in self.watched:
            low = _lower_bounds(state, b.metric)
            p = b.percentile
            if p is None:
                if rejected:
                    return f"{b.name}: {rejected} request(s) rejected, the mean is unbounded"
                if low.sum() / max(n, 1) > b.bound_s * (1 + MEAN_MARGIN):
                    return f"{b.name}: mean already above {b.bound_ms:g} ms"
            elif percentile_past(certain_misses(low, b.bound_s) + rejected, n, p):
                k = certain_misses(low, b.bound_s)
                return (
                    f"{b.name}: {k + rejected} of {n} requests already miss it ({k} above "
                    f"{b.bound_ms:g} ms, {rejected} rejected)"
                )
        if self.target.attain is not None and self.limits:
            return self._attainment(state)
        return None

    def _attainment(self, state: RunState) -> str | None:
        """Attainment is (requests meeting every limit) / (all requests); a rejected request
        and one certainly past a limit miss."""
        assert self.target.attain is not None
        missed = np.zeros(state.num_arrived - sum(i < state.num_arrived for i in state.rejected))
        for metric, limit_ms in self.limits:
            # as metrics.meets_slo compares: value_s * 1000 <= limit_ms
            missed = np.logical_or(missed, _lower_bounds(state, metric) * 1000.0 > limit_ms)
        num_missed = int(np.count_nonzero(missed)) + len(state.rejected)
        n = state.num_requests
        if (n - num_missed) / n < self.target.attain:
            return f"attain: {num_missed} of {n} requests already miss the SLO"
        return None
