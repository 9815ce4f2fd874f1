"""How sure a capacity is: one capacity search per seed, each its own bracketing and bisection,
and the capacity reported as the mean of the per-seed capacities with two 95% intervals from
Student's t over the seeds (n seeds, mean m, sample standard deviation s, t the 97.5%
quantile with n - 1 degrees of freedom):

- the confidence interval of the mean, ``m +- t s / sqrt(n)``: where the capacity of this
  workload's distribution lies (what more seeds would converge to);
- the prediction interval of one seed, ``m +- t s sqrt(1 + 1/n)``: where a single run of this
  length (another seed, or one real benchmark of as many requests) would put it.

Both are clipped at 0 (few seeds and a wide spread can put ``m - ...`` below it).

A seed's capacity is the highest load its own search met, so within ``tolerance`` below the
load where that seed's run stops meeting the SLO; the intervals hold the seeds' spread, which
is usually far wider (the quickstart's seeds span ~20%).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from simulator.explore.capacity import Capacity, ProbeReport, capacity_search
from simulator.explore.driver import Search, in_lockstep
from simulator.explore.probe import Load
from simulator.explore.slo import Target

DEFAULT_SEEDS = 5
"""Seeds a capacity or design search runs by default (one search each)."""
LEVEL = 0.95
"""Coverage of the reported intervals."""
METHOD = "Student's t over the per-seed capacities"
"""How the intervals are computed (written into capacity.json)."""
_ANSWERED = ("found", "max_probes")
"""Outcomes of a seed's search that give a capacity."""


@dataclass
class SeededCapacity:
    """A capacity from one search per seed."""

    load: Load
    tolerance: float
    seeds: tuple[int, ...]
    searches: list[Capacity]

    @property
    def outcome(self) -> str:
        """The seeds' common outcome; ``mixed`` when they differ (see ``reason``)."""
        outcomes = {s.outcome for s in self.searches}
        if outcomes <= set(_ANSWERED):
            return "max_probes" if "max_probes" in outcomes else "found"
        return outcomes.pop() if len(outcomes) == 1 else "mixed"

    def per_seed(self) -> list[float]:
        """The capacities of the seeds whose search found one (reported unit)."""
        return [s.capacity for s in self.searches if s.outcome in _ANSWERED and s.capacity]

    @property
    def capacity(self) -> float | None:
        """The mean of the per-seed capacities (None unless every seed found one)."""
        values = self.per_seed()
        if self.outcome not in _ANSWERED or not values:
            return None
        return float(np.mean(values))

    def interval(self, one_seed: bool = False) -> tuple[float, float] | None:
        """The 95% confidence interval of the mean, or with ``one_seed`` the prediction
        interval of one seed's capacity; None with fewer than two seeds."""
        values = self.per_seed()
        mean = self.capacity
        if mean is None or len(values) < 2:
            return None
        from scipy.stats import t

        n = len(values)
        s = float(np.std(values, ddof=1))
        scale = math.sqrt(1 + 1 / n) if one_seed else 1 / math.sqrt(n)
        half = float(t.ppf(0.5 + LEVEL / 2, n - 1)) * s * scale
        return max(0.0, mean - half), mean + half  # no load below 0

    @property
    def num_probes(self) -> int:
        """Probes (loads tried) over all seeds."""
        return sum(s.num_probes for s in self.searches)

    @property
    def probes(self) -> list[dict[str, Any]]:
        """Every simulation of every seed's search."""
        return [p for s in self.searches for p in s.probes]

    @property
    def num_simulations(self) -> int:
        """Simulations run over every seed (requests alone included)."""
        return sum(s.num_simulations for s in self.searches)

    def decisive_runs(self) -> list[dict[str, Any]]:
        """Each seed's simulation at its own capacity."""
        return [p for s in self.searches for p in s.decisive_runs()]

    def reason(self) -> str | None:
        """Why there is no capacity (None when there is one)."""
        if self.outcome in _ANSWERED:
            return None
        if all(s.outcome == "none" and s.missed_alone for s in self.searches):
            runs = [run for s in self.searches for run in s.alone]
            return "even requests sent one at a time miss it: " + alone_missed(runs)
        parts = [f"seed {seed}: {describe_outcome(s)}" for seed, s in self._by_seed()]
        return "; ".join(parts)

    def _by_seed(self) -> list[tuple[int, Capacity]]:
        return list(zip(self.seeds, self.searches, strict=True))

    def row(self) -> dict[str, Any]:
        """The columns of a design search's table."""
        ci, pi = self.interval(), self.interval(one_seed=True)
        return {
            "capacity": self.capacity,
            "capacity_ci_low": None if ci is None else ci[0],
            "capacity_ci_high": None if ci is None else ci[1],
            "capacity_one_seed_low": None if pi is None else pi[0],
            "capacity_one_seed_high": None if pi is None else pi[1],
            "unit": self.load.unit,
            "num_seeds": len(self.seeds),
            "num_probes": self.num_probes,
            "num_simulations": self.num_simulations,
        }

    def to_json(self) -> dict[str, Any]:
        """``capacity.json``'s answer: the capacity, its intervals, each seed's search."""
        ci, pi = self.interval(), self.interval(one_seed=True)
        return {
            "capacity": self.capacity,
            "unit": self.load.unit,
            "load_key": self.load.key,
            "status": self.outcome,
            "reason": self.reason(),
            "interval": None if ci is None else _bounds(ci, "confidence interval of the mean"),
            "one_seed_interval": None if pi is None else _bounds(pi, "prediction interval"),
            "per_seed": [_seed_json(seed, s) for seed, s in self._by_seed()],
            "tolerance": self.tolerance,
            "num_probes": self.num_probes,
            "num_simulations": self.num_simulations,
            "probes": self.probes,
            "alone": [run for s in self.searches for run in s.alone],
        }


def _bounds(pair: tuple[float, float], kind: str) -> dict[str, Any]:
    return {"low": pair[0], "high": pair[1], "level": LEVEL, "kind": kind, "method": METHOD}


def _seed_json(seed: int, found: Capacity) -> dict[str, Any]:
    value = found.load.value
    return {
        "seed": seed,
        "capacity": found.capacity,
        "status": found.outcome,
        "bracket": {
            "meets": None if found.meets_at is None else value(found.meets_at),
            "fails": None if found.fails_at is None else value(found.fails_at),
        },
    }


def describe_outcome(found: Capacity) -> str:
    """A seed's search in words, with what its decisive probe missed."""
    load = found.load
    if found.outcome == "unbounded":
        assert found.meets_at is not None
        return f"the SLO holds at every load tried, up to {load.describe(found.meets_at)}"
    if found.outcome == "none" and found.missed_alone:
        return "even requests sent one at a time miss it: " + alone_missed(found.alone)
    if found.outcome == "none":
        assert found.fails_at is not None
        runs = [p for p in found.probes if p["level"] == found.fails_at]
        return f"the SLO is missed even at {load.describe(found.fails_at)} ({_missed(runs)})"
    assert found.meets_at is not None
    return f"capacity {load.describe(found.meets_at)}"


def alone_missed(runs: list[dict[str, Any]]) -> str:
    """What runs of requests alone missed, with their figures (a range over several runs):
    a bound's statistic, or the share of requests within a per-request limit."""
    words = []
    for term in dict.fromkeys(t for run in runs for t in run.get("alone", {})):
        got = [run["alone"][term] for run in runs if term in run["alone"]]
        if term == "rejected":
            words.append(f"{_spread(got, ',.0f')} requests rejected")
        elif term.split("=")[0].count("_") == 1:  # a per-request limit: ttft_ms=500
            words.append(f"{_spread(got, '.1%')} of requests within {term}")
        else:  # a bound: tpot_p99_ms=50
            name, bound = term.split("=")
            words.append(f"{name} {_spread(got, '.4g')} ms (at most {bound})")
    return "; ".join(words) or "missed"


def _spread(values: list[float], fmt: str) -> str:
    """``12.5%``, or ``12.5-13.0%`` over several runs."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo.rstrip('%')}-{hi}"


def _missed(runs: list[dict[str, Any]]) -> str:
    """What the runs of a probe missed, and how many requests they rejected."""
    cut = [r["cut_short"] for r in runs if r.get("cut_short")]
    if cut:  # the stop rule's words: what already missed, and how many were rejected
        return f"cut short: {cut[0]}"
    terms = sorted({t for r in runs for t in r.get("failed_terms") or []})
    text = "missed " + ", ".join(terms) if terms else "missed"
    rejected = [int(r["num_rejected"]) for r in runs if r.get("num_rejected") is not None]
    total = [int(r["num_requests"]) for r in runs if r.get("num_requests")]
    if rejected and total and sum(rejected):
        text += f"; {sum(rejected):,} of {sum(total):,} requests rejected"
    return text


def seeded_capacity(
    base: dict[str, Any],
    source: str,
    target: Target,
    load: Load,
    seeds: Sequence[int],
    tolerance: float,
    overrides: tuple[tuple[str, Any], ...] = (),
    on_probe: Callable[[int, ProbeReport], object] | None = None,
) -> Search[SeededCapacity]:
    """One capacity search per seed, run side by side, as one search for ``drive``;
    ``on_probe(seed, report)`` hears of each seed's probes."""
    each = [
        capacity_search(
            base, source, target, load, [seed], tolerance, overrides,
            None if on_probe is None else partial(on_probe, seed),
        )
        for seed in seeds
    ]  # fmt: skip
    found = yield from in_lockstep(each)
    return SeededCapacity(load, tolerance, tuple(seeds), found)


def significant(value: float, half_width: float | None, tolerance: float) -> str:
    """``value`` to the decimal place of the interval's half width (its first significant
    digit), or with no interval to the place the bracket's ``tolerance`` supports."""
    spread = half_width if half_width else value * tolerance
    if not (spread > 0 and math.isfinite(spread)):
        return f"{value:.4g}"
    place = math.floor(math.log10(spread))
    if value > 0:  # at least the value's first significant digit
        place = min(place, math.floor(math.log10(value)))
    return f"{round(value, -place):.{max(0, -place)}f}"
