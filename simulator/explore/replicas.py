"""The fewest replicas (``cluster.replicas``) that serve a given load within an SLO: doubling
from one replica until a count meets it, then bisection between the last count that missed and
the first that met (capacity grows with replicas; the search assumes it never shrinks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.cluster.config import MAX_REPLICAS  # the search gives up above it (``none``)
from simulator.explore.capacity import can_run_alone, probe_error, runs_alone
from simulator.explore.driver import Search, Unit
from simulator.explore.estimate import alone_missed
from simulator.explore.probe import Load, ProbeSpec, run_probe
from simulator.explore.slo import Target

REPLICAS_KEY = "cluster.replicas"


@dataclass
class Replicas:
    """A finished replica search: the fewest replicas that met the target at ``level``."""

    load: Load
    level: float
    outcome: str = "found"
    """``found``, or ``none`` (even ``MAX_REPLICAS`` missed)."""
    fewest: int | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    alone: list[dict[str, Any]] = field(default_factory=list)
    """The runs of requests alone on one server, made when one replica missed."""

    @property
    def missed_alone(self) -> bool:
        """Whether requests sent one at a time missed the target (so no count can meet it)."""
        return any(not run["meets"] for run in self.alone)

    def overrides(self) -> dict[str, Any]:
        """The scenario keys of the answer (to price it)."""
        return {REPLICAS_KEY: self.fewest or MAX_REPLICAS}

    def decisive_runs(self) -> list[dict[str, Any]]:
        """The simulations with the fewest replicas that met the target."""
        return [p for p in self.probes if p["probe_meets"] and p["replicas"] == self.fewest]

    def reason(self) -> str | None:
        """Why no count of replicas was found (None when one was)."""
        if self.outcome == "found":
            return None
        if self.missed_alone:
            return "even requests sent one at a time miss it: " + alone_missed(self.alone)
        return f"even {MAX_REPLICAS} replicas miss the SLO at {self.load.describe(self.level)}"

    def row(self) -> dict[str, Any]:
        """The search's columns in a design search's table."""
        return {
            "replicas": self.fewest,
            "load": self.load.value(self.level),
            "unit": self.load.unit,
            "num_probes": len({p["probe"] for p in self.probes}),
            "num_simulations": len(self.probes) + len(self.alone),
        }


def replicas_search(
    base: dict[str, Any],
    source: str,
    target: Target,
    load: Load,
    level: float,
    seeds: Sequence[int],
    overrides: tuple[tuple[str, Any], ...] = (),
) -> Search[Replicas]:
    """The search as a generator of probe batches for ``drive``."""
    found = Replicas(load, level)
    missed, met = 0, None  # most replicas that missed, fewest that met
    count = 1
    while count <= MAX_REPLICAS:
        extra = (*overrides, (REPLICAS_KEY, count))
        specs = [ProbeSpec(base, source, load, level, s, target, extra) for s in seeds]
        outcomes = yield [Unit(run_probe, (spec,)) for spec in specs]
        if any(o.error is not None for o in outcomes):
            err = next(o.error for o in outcomes if o.error is not None)
            raise probe_error(err) from err
        runs = [o.value for o in outcomes]
        meets = all(run["meets"] for run in runs)
        index = len({p["probe"] for p in found.probes})
        found.probes += [
            {"probe": index, "probe_meets": meets, "replicas": count, **run} for run in runs
        ]
        if meets:
            met = count
        else:
            missed = count
        if count == 1 and not meets and can_run_alone(base, source, overrides):
            # no count can do better than one server given each request alone
            alone = [ProbeSpec(base, source, load, level, s, target, overrides) for s in seeds]
            found.alone = yield from runs_alone(alone)
            if found.missed_alone:
                break
        if met is None:
            count *= 2
        elif met - missed <= 1:
            found.fewest = met
            return found
        else:
            count = (missed + met) // 2
    found.outcome = "none"
    return found
