"""What a capacity search asks of a run: bounds on latency statistics (``ttft_p99_ms=500``:
the run's p99 TTFT at most 500 ms), or goodput attainment (``--attain 0.99``: at least 99% of
the requests meet every per-request limit: ``ttft_ms=500``, or the scenario's ``slo:``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import InputError
from simulator.metrics import LATENCY_METRICS
from simulator.metrics.summary import percentile_key

PER_REQUEST = ("ttft", "tpot", "e2e")
"""Metrics a per-request limit (``ttft_ms=...``, the scenario's ``slo:``) may name."""

DEFAULT_ATTAIN = 0.99
"""Attainment asked for when only per-request limits are given (the scenario's ``slo:``)."""

_TERM = re.compile(r"^(?P<metric>[a-z0-9_]+?)(?:_(?P<stat>mean|p\d+(?:\.\d+)?))?_ms$")


@dataclass(frozen=True)
class Bound:
    """A bound on one latency statistic of a run: ``ttft_p99_ms=500``."""

    metric: str
    """One of ``ttft``, ``tpot``, ``itl``, ``e2e``, ``queue_delay``."""
    stat: str
    """``mean`` or ``pNN`` (``p99``, ``p99.9``)."""
    bound_ms: float
    """The most the statistic may be, ms."""

    @property
    def percentile(self) -> float | None:
        """The percentile a ``pNN`` stat asks for (None for the mean)."""
        return None if self.stat == "mean" else float(self.stat[1:])

    @property
    def key(self) -> str:
        """The summary key of the statistic (``ttft_p99_s``)."""
        p = self.percentile
        return f"{self.metric}_mean_s" if p is None else percentile_key(self.metric, p)

    @property
    def bound_s(self) -> float:
        """The bound in seconds (what the summary holds)."""
        return self.bound_ms / 1e3

    @property
    def name(self) -> str:
        """As the user wrote it: ``ttft_p99_ms``."""
        return f"{self.metric}_{self.stat}_ms"

    def holds(self, summary: dict[str, Any], requests: pd.DataFrame | None = None) -> bool:
        """The run's statistic, every request counted, is defined and within the bound."""
        value = self.value(summary, requests)
        return math.isfinite(value) and value <= self.bound_s

    def value(self, summary: dict[str, Any], requests: pd.DataFrame | None = None) -> float:
        """The statistic over every request of the run, one that did not finish (rejected, or
        cut short) counting as an infinite latency, i.e. a miss; with every request finished,
        the summary's figure. ITL has no per-request value: its figure is over the gaps that
        happened, infinite once the requests that did not finish exceed the share the
        statistic leaves out (a mean: any)."""
        got = summary.get(self.key)
        value = float("nan") if got is None else float(got)
        total = summary.get("num_requests", 0)
        missing = total - summary.get("num_finished", total)
        if missing <= 0:
            return value
        if requests is None or self.metric == "itl":
            allowed = 0.0 if self.percentile is None else 1.0 - self.percentile / 100.0
            return float("inf") if missing / total > allowed else value
        return statistic_with_misses(requests, self.metric, self.percentile)


@dataclass(frozen=True)
class Target:
    """Every bound must hold, and with ``attain`` the share of requests meeting every
    per-request ``limits`` must be at least ``attain``."""

    bounds: tuple[Bound, ...] = ()
    attain: float | None = None
    """Goodput attainment asked for (0..1], or None."""
    limits: tuple[tuple[str, float], ...] = ()
    """Per-request limits for attainment: ``(("ttft_ms", 500.0), ...)``, the scenario's ``slo:``."""

    def percentiles(self) -> list[float]:
        """The percentiles the summary must hold for the bounds."""
        return sorted({b.percentile for b in self.bounds if b.percentile is not None})

    def allowed_misses(self) -> float:
        """The share of requests the target lets miss: the complement of ``attain``, and of
        each percentile bound (a mean bound lets none miss)."""
        shares = [1.0 - self.attain] if self.attain is not None else []
        shares += [0.0 if b.percentile is None else 1.0 - b.percentile / 100 for b in self.bounds]
        return min(shares, default=0.0)

    def failures(self, summary: dict[str, Any], requests: pd.DataFrame | None = None) -> list[str]:
        """The terms a run misses (empty: the run meets the target), every request counted:
        ``unfinished`` leads them when more requests were rejected or cut short than the
        target lets miss."""
        missed = [b.name for b in self.bounds if not b.holds(summary, requests)]
        if self.attain is not None:
            got = summary.get("slo_attainment")
            if got is None or not math.isfinite(got) or got < self.attain:
                missed.append("attain")
        total = summary.get("num_requests", 0)
        unfinished = total - summary.get("num_finished", total)
        if total and unfinished / total > self.allowed_misses():
            missed.insert(0, "unfinished")
        return missed

    def to_json(self) -> dict[str, Any]:
        """The target as plain data (``capacity.json``'s ``slo``)."""
        return {
            "text": self.describe(),
            "bounds": [
                {"metric": b.metric, "stat": b.stat, "bound_ms": b.bound_ms} for b in self.bounds
            ],
            "attain": self.attain,
            "limits": dict(self.limits),
        }

    def describe(self) -> str:
        """One line, as the user would write it."""
        terms = [f"{b.name}={b.bound_ms:g}" for b in self.bounds]
        if self.attain is not None:
            limits = ", ".join(f"{k}={v:g}" for k, v in self.limits)
            terms.append(f"at least {self.attain:.1%} of requests within {limits}")
        return "; ".join(terms)


def parse_terms(items: list[str]) -> tuple[list[Bound], dict[str, float]]:
    """``--slo`` items (each ``a=1,b=2``) -> the statistic bounds and per-request limits."""
    bounds: list[Bound] = []
    limits: dict[str, float] = {}
    for item in items:
        for term in filter(None, (t.strip() for t in item.split(","))):
            name, sep, value = term.partition("=")
            match = _TERM.match(name.strip())
            if not sep or match is None:
                raise InputError(
                    f"--slo {term!r}: expected <metric>_<stat>_ms=<bound> (metric one of "
                    f"{', '.join(LATENCY_METRICS)}; stat mean or pNN), or "
                    f"<metric>_ms=<limit> per request (with --attain)"
                )
            metric, stat = match["metric"], match["stat"]
            bound = _positive(term, value)
            if stat is None:
                if metric not in PER_REQUEST:
                    known = ", ".join(f"{m}_ms" for m in PER_REQUEST)
                    raise InputError(f"--slo {term!r}: a per-request limit is one of {known}")
                limits[f"{metric}_ms"] = bound
                continue
            if metric not in LATENCY_METRICS:
                raise InputError(
                    f"--slo {term!r}: unknown metric {metric!r}; one of "
                    f"{', '.join(LATENCY_METRICS)}"
                )
            if stat != "mean" and not 0 < float(stat[1:]) <= 100:
                raise InputError(f"--slo {term!r}: a percentile is in (0, 100]")
            bounds.append(Bound(metric, stat, bound))
    names = [b.name for b in bounds]
    for name in names:
        if names.count(name) > 1:
            raise InputError(f"--slo {name}: given twice")
    return bounds, limits


def _positive(term: str, value: str) -> float:
    try:
        bound = float(value)
    except ValueError:
        bound = float("nan")
    if not (math.isfinite(bound) and bound > 0):
        raise InputError(f"--slo {term!r}: the bound must be a number of ms > 0")
    return bound


def make_target(
    items: list[str], attain: float | None, scenario_slo: dict[str, float | None] | None
) -> Target:
    """The target of ``--slo ITEMS [--attain A]`` for a scenario whose ``slo:`` is
    ``scenario_slo``: statistic bounds, attainment of per-request limits (given, or the
    scenario's), or, with neither, the scenario's ``slo:`` at ``DEFAULT_ATTAIN``."""
    bounds, limits = parse_terms(items)
    if attain is not None and not 0 < attain <= 1:
        raise InputError(f"--attain {attain}: a share of requests in (0, 1]")
    if limits and attain is None and bounds:
        raise InputError(
            "--slo: per-request limits (like ttft_ms=500) go with --attain; bounds on a "
            "statistic are written like ttft_p99_ms=500"
        )
    if not limits and (attain is not None or not bounds):
        limits = {k: v for k, v in (scenario_slo or {}).items() if v is not None}
        if not limits:
            raise InputError(
                "--slo: no SLO; give bounds (--slo ttft_p99_ms=500,tpot_p99_ms=50) or "
                "per-request limits with --attain, or set the scenario's slo:"
            )
    if limits and attain is None:
        attain = DEFAULT_ATTAIN
    return Target(tuple(bounds), attain, tuple(sorted(limits.items())))


_MISS = 1e300
"""Stands for a request that did not finish in a percentile: larger than any latency, so
numpy's interpolation stays exact elsewhere, and any figure it touches is a miss."""


def statistic_with_misses(requests: pd.DataFrame, metric: str, percentile: float | None) -> float:
    """``metric``'s mean or percentile over every request, one that did not finish counting
    as infinite (TPOT leaves out finished 1-token requests, as the summary does)."""
    values = requests[f"{metric}_s"].to_numpy(dtype=np.float64)
    finished = np.asarray(requests["status"] == "finished", dtype=bool)
    keep = ~finished | ~np.isnan(values)
    values = np.where(finished, values, _MISS)[keep]
    if not len(values):
        return float("nan")
    if percentile is None:
        return float("inf") if (~finished).any() else float(np.mean(values))
    got = float(np.percentile(values, percentile))
    return float("inf") if got > _MISS * 1e-200 else got
