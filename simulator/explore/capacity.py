"""The capacity of a deployment: the highest load (arrival rate, or trace speed) at which a
run still meets an SLO target, found by bracketing then bisection.

Bracketing starts at the scenario's own load and doubles it (or halves it) until one probe
meets the target and another fails; bisection (at the geometric midpoint) then narrows the
bracket until ``fails / meets - 1 <= tolerance``. The capacity is the highest load that met
the target. Every probe runs the same seeds: the workload at load ``x`` is the one at load
``y`` with its arrival times scaled by ``y / x`` (common random numbers), so the answer moves
smoothly with the load. With several seeds a probe meets the target when every seed does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from simulator.errors import InputError
from simulator.explore.driver import Search, Unit
from simulator.explore.probe import Load, ProbeSpec, alone_possible, run_probe
from simulator.explore.slo import Target
from simulator.scenario.config import apply_overrides, validate

TOLERANCE = 0.02
"""Default relative width of the final bracket."""
GROWTH = 2.0
"""Factor between bracketing probes."""
MAX_DOUBLINGS = 30
"""Bracketing upwards gives up after this many doublings from the start (``unbounded``)."""
MAX_HALVINGS = 10
"""Bracketing downwards gives up after this many halvings (``none``: even 1/1024 of the
starting load misses the SLO, which then asks for less than the server's idle latency)."""
MAX_PROBES = 60
"""Probes of one search at most (bracketing plus bisection need ~10 at 2%)."""


class ProbeFailed(RuntimeError):
    """A probe's simulation raised an error (the search cannot go on)."""


def probe_error(err: BaseException) -> Exception:
    """What a search raises for a probe that raised ``err``: bad input (a trace file that is
    not there, say) as the user's one line, anything else as ``ProbeFailed``."""
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return InputError(line) if isinstance(err, InputError) else ProbeFailed(line)


@dataclass(frozen=True)
class ProbeReport:
    """What a search tells its progress callback after each probe."""

    index: int
    level: float
    meets: bool
    cut_short: int
    """How many of the probe's seeds were cut short."""
    meets_at: float | None
    fails_at: float | None


@dataclass
class Capacity:
    """A finished search: the capacity, its bracket and every probe's simulations."""

    load: Load
    tolerance: float
    outcome: str = "found"
    """``found``; ``unbounded`` (met the target at every load tried); ``none`` (failed at
    every load tried); ``max_probes`` (stopped before the bracket was narrow enough)."""
    meets_at: float | None = None
    """Highest load level that met the target."""
    fails_at: float | None = None
    """Lowest load level above it that failed."""
    probes: list[dict[str, Any]] = field(default_factory=list)
    """One record per simulation (``probe`` numbers the probes)."""
    alone: list[dict[str, Any]] = field(default_factory=list)
    """The runs of requests alone (one at a time), made when the first load missed: each
    request's best case, which no lower load can better."""

    @property
    def capacity(self) -> float | None:
        """The capacity as reported: req/s, or the trace's time_scale (None if none met)."""
        return None if self.meets_at is None else self.load.value(self.meets_at)

    @property
    def num_probes(self) -> int:
        """Probes (loads tried)."""
        return len({p["probe"] for p in self.probes})

    def decisive_runs(self) -> list[dict[str, Any]]:
        """The simulations at the capacity (the highest load that met the target)."""
        return [p for p in self.probes if p["probe_meets"] and p["level"] == self.meets_at]

    def row(self) -> dict[str, Any]:
        """The search's columns in a design search's table."""
        value = self.load.value
        return {
            "capacity": self.capacity,
            "unit": self.load.unit,
            "fails_at": None if self.fails_at is None else value(self.fails_at),
            "num_probes": self.num_probes,
            "num_simulations": self.num_simulations,
        }

    @property
    def missed_alone(self) -> bool:
        """Whether requests sent one at a time missed the target (so no load can meet it)."""
        return any(not run["meets"] for run in self.alone)

    @property
    def num_simulations(self) -> int:
        """Simulations run: the probes', and those of requests alone."""
        return len(self.probes) + len(self.alone)

    def to_json(self) -> dict[str, Any]:
        """``capacity``, ``unit``, the bracket, ``status`` and ``probes``."""
        value = self.load.value
        return {
            "capacity": self.capacity,
            "unit": self.load.unit,
            "load_key": self.load.key,
            "status": self.outcome,
            "bracket": {
                "meets": None if self.meets_at is None else value(self.meets_at),
                "fails": None if self.fails_at is None else value(self.fails_at),
            },
            "tolerance": self.tolerance,
            "num_probes": self.num_probes,
            "num_simulations": self.num_simulations,
            "probes": self.probes,
            "alone": self.alone,
        }


def _next_level(found: Capacity, start: float) -> float | None:
    """The next load to probe, or None when the search is over (setting its status)."""
    lo, hi = found.meets_at, found.fails_at
    if lo is None and hi is not None:
        if hi < start / GROWTH**MAX_HALVINGS:
            found.outcome = "none"
            return None
        return hi / GROWTH
    if hi is None and lo is not None:
        if lo > start * GROWTH**MAX_DOUBLINGS:
            found.outcome = "unbounded"
            return None
        return lo * GROWTH
    assert lo is not None and hi is not None
    if hi / lo - 1 <= found.tolerance:
        return None
    return math.sqrt(lo * hi)


def capacity_search(
    base: dict[str, Any],
    source: str,
    target: Target,
    load: Load,
    seeds: Sequence[int],
    tolerance: float = TOLERANCE,
    overrides: tuple[tuple[str, Any], ...] = (),
    on_probe: Callable[[ProbeReport], object] | None = None,
) -> Search[Capacity]:
    """The search as a generator of probe batches (one unit per seed), for ``drive``."""
    found = Capacity(load, tolerance)
    level: float | None = load.start
    for index in range(MAX_PROBES):
        assert level is not None
        specs = [ProbeSpec(base, source, load, level, s, target, overrides) for s in seeds]
        outcomes = yield [Unit(run_probe, (spec,)) for spec in specs]
        runs = []
        for done in outcomes:
            if done.error is not None:
                raise probe_error(done.error) from done.error
            runs.append(done.value)
        meets = all(run["meets"] for run in runs)
        found.probes += [{"probe": index, "probe_meets": meets, **run} for run in runs]
        if meets:
            found.meets_at = level
        else:
            found.fails_at = level
        if on_probe is not None:
            cut = sum(run["cut_short"] is not None for run in runs)
            on_probe(ProbeReport(index, level, meets, cut, found.meets_at, found.fails_at))
        if index == 0 and not meets and can_run_alone(base, source, overrides):
            # below the first load: first ask whether any load can meet the target at all
            found.alone = yield from runs_alone(specs)
            if found.missed_alone:
                found.outcome = "none"
                return found
        level = _next_level(found, load.start)
        if level is None:
            return found
    found.outcome = "max_probes"
    return found


def runs_alone(specs: list[ProbeSpec]) -> Search[list[dict[str, Any]]]:
    """The probes ``specs`` with their requests sent one at a time."""
    outcomes = yield [Unit(run_probe, (replace(spec, alone=True),)) for spec in specs]
    for done in outcomes:
        if done.error is not None:
            raise probe_error(done.error) from done.error
    return [done.value for done in outcomes]


def can_run_alone(
    base: dict[str, Any], source: str, overrides: tuple[tuple[str, Any], ...]
) -> bool:
    """Whether the scenario (with ``overrides``) can run its requests one at a time."""
    try:
        cfg = validate(apply_overrides(base, dict(overrides), source), source)
    except InputError:
        return False  # the probes themselves say what is wrong
    return alone_possible(cfg)
