"""A design search: for every point of a grid of deployments (hardware, tp, replicas, budgets,
policy, router ...), its capacity under an SLO, what that capacity costs (capacity per dollar,
dollars per million tokens), or with ``replicas_for`` the fewest replicas that serve a given
load. The capacity searches of all points run together on one backend."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import InputError, MissingFile
from simulator.explore.driver import Search
from simulator.explore.estimate import SeededCapacity, seeded_capacity
from simulator.explore.grid import cell_keys
from simulator.explore.pricing import cost_per_hour
from simulator.explore.probe import Load, load_for
from simulator.explore.replicas import REPLICAS_KEY, Replicas, replicas_search
from simulator.explore.slo import Target
from simulator.explore.sweep import GridPoint, grid_points
from simulator.explore.uncertainty import scenario_band
from simulator.scenario.config import ScenarioConfig, apply_overrides, validate
from simulator.scenario.feasibility import DoesNotFit
from simulator.scenario.runner import resolve
from simulator.workload import check_input_files


@dataclass(frozen=True)
class SearchSpec:
    """Everything a design search needs besides the backend."""

    base: dict[str, Any]
    source: str
    grid: dict[str, list[Any]]
    target: Target
    seeds: tuple[int, ...]
    tolerance: float
    prices: dict[str, float]
    start: float | None = None
    """First load probed (reported unit), default each point's own."""
    replicas_for: float | None = None
    """Find the fewest replicas for this load (reported unit) instead of the capacity."""
    replicas_for_scenario: bool = False
    """Find the fewest replicas for each point's own load."""
    uncertainty: bool = False
    """Give each capacity its model interval (``capacity_model_low``/``_high``): the
    capacity searched again with every step at each end of the cost model's error band."""


def point_config(spec: SearchSpec, point: GridPoint) -> ScenarioConfig:
    """A grid point's validated scenario."""
    data = apply_overrides(spec.base, point.values, spec.source)
    return validate(data, f"{spec.source} [{point.name}]")


def check_points(spec: SearchSpec) -> None:
    """Before anything runs: every point is a valid scenario with a known price (one line
    naming the first that is not), and replicas can be set if asked for."""
    asks = spec.replicas_for is not None or spec.replicas_for_scenario
    if asks and REPLICAS_KEY in cell_keys(spec.grid):
        raise InputError(f"--replicas-for: {REPLICAS_KEY} is what it finds; drop its --grid")
    for point in grid_points(spec.grid):
        cfg = point_config(spec, point)
        try:
            check_input_files(cfg.workload)
        except MissingFile as err:
            raise InputError(f"{spec.source} [{point.name}]: {err}") from None
        cost_per_hour(cfg, spec.prices)


def _found_row(found: SeededCapacity | Replicas) -> dict[str, Any]:
    """The figures of the probe that decided a point: the highest load met (capacity), or
    the fewest replicas that met the load; mean over its seeds."""
    runs = found.decisive_runs()
    keys = ("request_throughput", "total_token_throughput", "output_token_throughput",
            "goodput", "slo_attainment", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s")  # fmt: skip
    row = {k: _mean([r.get(k) for r in runs]) for k in keys}
    for served, measured in SERVED.items():
        row[served] = _mean([_served(r, measured) for r in runs])
    return row


SERVED = {
    "served_request_rate": "request_throughput",
    "served_token_rate": "total_token_throughput",
    "served_output_token_rate": "output_token_throughput",
}
"""What a deployment serves per second at a load it keeps up with, from the throughput
measured over the run: what the costs are priced on."""


def _served(run: dict[str, Any], measured: str) -> float | None:
    """``run``'s throughput ``measured`` over the span in which its requests arrived rather
    than its whole duration: a finite run ends with a drain (the last requests finishing
    with nothing arriving) that a deployment serving the load all day does not have, and
    which would price a slow deployment's tail as lost capacity. Requests that all arrive
    at once (no span) keep the run's throughput, as vLLM's benchmark counts it."""
    value, duration, span = run.get(measured), run.get("duration_s"), run.get("arrival_span_s")
    if value is None or not duration or not span or span <= 0:
        return value
    return float(value) * duration / span


def _mean(values: list[Any]) -> float:
    got = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(got)) if got else float("nan")


def _cost_columns(row: dict[str, Any], usd_per_hour: float) -> None:
    """Capacity per dollar and dollars per million tokens at the capacity."""
    hour = 3600.0
    row["usd_per_hour"] = usd_per_hour
    row["requests_per_usd"] = row["served_request_rate"] * hour / usd_per_hour
    for col, rate in (("usd_per_million_tokens", "served_token_rate"),
                      ("usd_per_million_output_tokens", "served_output_token_rate")):  # fmt: skip
        row[col] = usd_per_hour / (row[rate] * hour) * 1e6 if row[rate] > 0 else float("nan")


def does_not_fit(spec: SearchSpec, point: GridPoint) -> str | None:
    """Why a point's deployment cannot exist (its memory arithmetic), or None; any other
    problem its search reports."""
    try:
        resolve(point_config(spec, point))
    except DoesNotFit as err:
        return str(err)
    except InputError:
        return None
    return None


def point_search(spec: SearchSpec, point: GridPoint) -> Search[dict[str, Any]]:
    """One point's search as a generator for ``drive``: its row in the table."""
    row: dict[str, Any] = {k: json_cell(v) for k, v in point.cells.items()}  # names too
    row["point"] = point.name
    overrides = tuple(point.values.items())
    problem = does_not_fit(spec, point)
    if problem is not None:  # a deployment that cannot exist is not searched
        return {**row, "status": "infeasible", "error": None, "reason": problem}
    try:
        cfg = point_config(spec, point)
        load = load_for(cfg, spec.start)
        found: SeededCapacity | Replicas
        if spec.replicas_for is not None or spec.replicas_for_scenario:
            want = load_for(cfg, spec.replicas_for).start
            replicas = yield from replicas_search(
                spec.base, spec.source, spec.target, load, want, spec.seeds, overrides
            )
            values = {**point.values, **replicas.overrides()}
            cfg = validate(apply_overrides(spec.base, values, spec.source), spec.source)
            found = replicas
        else:
            found = yield from seeded_capacity(
                spec.base, spec.source, spec.target, load, spec.seeds, spec.tolerance, overrides
            )
            if spec.uncertainty:
                row.update((yield from _model_interval(spec, cfg, load, overrides, found)))
    except Exception as err:  # one bad point must not lose the others
        text = str(err).strip().splitlines()
        error = text[0] if text else type(err).__name__
        return {**row, "status": "failed", "error": error, "reason": error}
    row.update(found.row())
    row.update(_found_row(found))
    if isinstance(found, Replicas) and found.fewest is None:  # no deployment to price
        return {
            **row,
            "gpus": None,
            "status": found.outcome,
            "error": None,
            "reason": found.reason(),
        }
    usd, gpus = cost_per_hour(cfg, spec.prices)
    row["gpus"] = gpus
    _cost_columns(row, usd)
    return {**row, "status": found.outcome, "error": None, "reason": found.reason()}


def _model_interval(
    spec: SearchSpec,
    cfg: ScenarioConfig,
    load: Load,
    overrides: tuple[tuple[str, Any], ...],
    found: SeededCapacity,
) -> Search[dict[str, Any]]:
    """A point's capacity at both ends of its cost model's error band
    (``explore.uncertainty``), with its own: ``capacity_model_low``/``_high`` (None without
    a measured band, or where an end found no capacity)."""
    band = scenario_band(cfg)
    caps = [found.capacity]
    for scale in band[1].scales() if band is not None else ():
        at = (*overrides, ("serving.gpu_time_scale", cfg.serving.gpu_time_scale * scale))
        end = yield from seeded_capacity(
            spec.base, spec.source, spec.target, load, spec.seeds, spec.tolerance, at
        )
        caps.append(end.capacity)
    known = [c for c in caps if c is not None]
    if band is None or len(known) < len(caps):
        return {"capacity_model_low": None, "capacity_model_high": None}
    return {"capacity_model_low": min(known), "capacity_model_high": max(known)}


def json_cell(value: Any) -> Any:
    """Lists and mappings as JSON text, so every grid column has one plain type."""
    import json

    return json.dumps(value) if isinstance(value, list | dict) else value


def searches(spec: SearchSpec) -> list[Search[dict[str, Any]]]:
    """The search of every grid point, in grid order."""
    return [point_search(spec, p) for p in grid_points(spec.grid)]


def search_table(rows: list[dict[str, Any]], grid: dict[str, list[Any]]) -> pd.DataFrame:
    """The rows as a table, grid columns of one type each, and ``cheapest``: the point that
    meets the SLO at the lowest cost per million tokens."""
    table = pd.DataFrame(rows)
    for key in cell_keys(grid):
        if table[key].map(type).nunique() > 1:  # mixed int/float grid values: one dtype
            table[key] = table[key].astype(str)
    cost = pd.to_numeric(table.get("usd_per_million_tokens", pd.Series(np.nan, table.index)))
    served = table["status"].isin(["found", "max_probes"]) & cost.notna()
    table["cheapest"] = False
    if served.any():
        table.loc[cost[served].idxmin(), "cheapest"] = True
    return table
