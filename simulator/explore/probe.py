"""One probe simulation of a capacity search (a work unit): the scenario at one load and seed,
run to its end or cut short once it can no longer meet the target, as a flat record."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.errors import InputError
from simulator.explore.slo import Target
from simulator.metrics.summary import meets_slo
from simulator.scenario.config import ScenarioConfig, apply_overrides, validate

RATE_KEY = "workload.arrival.rate"
TIME_SCALE_KEY = "workload.trace.time_scale"
ALONE_KEY = "workload.max_concurrency"
"""Set to 1 for a probe of requests alone."""


@dataclass(frozen=True)
class Load:
    """What a capacity search varies: a synthetic workload's arrival rate (req/s), or a
    trace's speed, ``1 / time_scale`` (reported as the ``time_scale``)."""

    key: str
    """``workload.arrival.rate`` or ``workload.trace.time_scale``."""
    start: float
    """The first load probed (rate, or speed ``1 / time_scale``)."""

    @property
    def is_trace(self) -> bool:
        """The load is a trace's speed."""
        return self.key == TIME_SCALE_KEY

    @property
    def unit(self) -> str:
        """The unit of a reported value."""
        return "time_scale" if self.is_trace else "req/s"

    def value(self, load: float) -> float:
        """The scenario value setting ``load``: the rate, or the time_scale ``1 / load``."""
        return 1.0 / load if self.is_trace else load

    def describe(self, load: float) -> str:
        """``8.25 req/s`` or ``time_scale 0.5``."""
        v = self.value(load)
        return f"time_scale {v:.4g}" if self.is_trace else f"{v:.4g} req/s"


@dataclass(frozen=True)
class ProbeSpec:
    """One simulation to run: the base scenario at ``load`` with ``seed``."""

    base: dict[str, Any]
    source: str
    load: Load
    level: float
    """The load probed (rate, or speed)."""
    seed: int
    target: Target
    overrides: tuple[tuple[str, Any], ...] = ()
    """Other keys the caller sets (a design search's grid point)."""
    alone: bool = False
    """Send one request at a time (a closed loop of one): the latency each request gets from
    an otherwise idle server, which no load can better."""


def probe_scenario(spec: ProbeSpec) -> dict[str, Any]:
    """The raw scenario of a probe: the load, the seed, the percentiles and per-request
    limits the target needs."""
    values: dict[str, Any] = dict(spec.overrides)
    values[spec.load.key] = spec.load.value(spec.level)
    values["seed"] = spec.seed
    if spec.alone:  # on one server: a replica of a cluster of identical ones, unrouted
        values[ALONE_KEY] = 1
        values["cluster"] = None
    data = apply_overrides(spec.base, values, spec.source)
    wanted = spec.target.percentiles()
    if wanted:
        have = (data.get("metrics") or {}).get("percentiles") or [50, 90, 99]
        data = apply_overrides(
            data, {"metrics.percentiles": sorted({*map(float, have), *wanted})}, spec.source
        )
    if spec.target.attain is not None:
        data = apply_overrides(data, {"slo": dict(spec.target.limits)}, spec.source)
    return data


def run_probe(spec: ProbeSpec) -> dict[str, Any]:
    """Simulate one probe (in a worker): a flat record with ``meets`` (the run met the
    target), ``cut_short`` (why it was stopped early, or None), the failing terms and the
    run's summary figures."""
    from simulator.engine.watch import StoppedEarly
    from simulator.explore.cutoff import Cutoff
    from simulator.scenario.runner import resolve, run

    started = time.perf_counter()
    cfg = resolve(validate(probe_scenario(spec), spec.source))
    # a probe of requests alone runs whole: its figures say by how much the SLO is missed
    cutoff = Cutoff(spec.target if not spec.alone else Target())
    record: dict[str, Any] = {"level": spec.level, "seed": spec.seed}
    record["value"] = spec.load.value(spec.level)
    try:
        result = run(cfg, steps="none", stop=cutoff if cutoff.active else None)
    except StoppedEarly as stopped:
        record.update(meets=False, cut_short=stopped.reason, stopped_at_s=stopped.at_s)
        record["failed_terms"] = [stopped.reason.split(":")[0]]
    else:
        failed = spec.target.failures(result.summary, result.requests)
        record.update(meets=not failed, cut_short=None, stopped_at_s=None)
        record["failed_terms"] = failed
        record.update({k: _plain(v) for k, v in result.summary.items()})
        arrivals = result.requests["arrival_s"].to_numpy()
        # the steady state's time base: the throughputs count the drain after the last
        # arrival too, which a deployment serving this load all day does not have
        record["arrival_span_s"] = float(np.ptp(arrivals)) if len(arrivals) > 1 else None
        if spec.alone:
            record["alone"] = alone_figures(spec.target, result.summary, result.requests)
    record["wall_time_s"] = time.perf_counter() - started
    return record


def alone_figures(target: Target, summary: dict[str, Any], requests: Any) -> dict[str, float]:
    """The terms of ``target`` a run of requests alone missed, keyed as the user wrote them,
    with what it got: a bound's statistic in ms (``tpot_p99_ms=50``), a per-request limit's
    share of requests within it (``tpot_ms=50``), the number of requests ``rejected`` (alone,
    every request that is not rejected finishes)."""
    total = summary.get("num_requests", 0)
    out: dict[str, float] = {}
    rejected = total - summary.get("num_finished", total)
    if rejected > target.allowed_misses() * total:
        out["rejected"] = rejected
    for bound in target.bounds:
        value = bound.value(summary, requests) * 1e3
        # infinite only through the rejected requests, which are already named
        if not bound.holds(summary, requests) and (math.isfinite(value) or not rejected):
            out[f"{bound.name}={bound.bound_ms:g}"] = value
    for name, limit in target.limits:
        within = float(meets_slo(requests, {name: limit}).mean()) if total else math.nan
        if not within >= (target.attain or 1.0):
            out[f"{name}={limit:g}"] = within
    return out


def alone_possible(cfg: ScenarioConfig) -> bool:
    """Whether a probe of requests alone can be simulated: on a single server (data parallel
    or not), or on one replica of a cluster of identical ones (unrouted: a lower bound still),
    with no schedule of clients and no serving delays (a closed loop has none yet)."""
    serving, cluster = cfg.serving, cfg.cluster
    identical = cluster is None or (
        isinstance(cluster.replicas, int)
        and cluster.disaggregation is None
        and cluster.autoscaler is None
        and cluster.shared_kv is None
    )
    return (
        identical
        and cfg.workload.max_concurrency_schedule is None
        and not (serving.frontend_delay_ms or serving.response_delay_ms)
    )


def _plain(value: Any) -> Any:
    """A summary value as plain JSON-able Python (NaN as None)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def load_for(cfg: ScenarioConfig, start: float | None = None) -> Load:
    """What a capacity search of ``cfg`` varies, starting at ``start`` (in the reported unit:
    req/s, or a trace's time_scale) or at the scenario's own rate / time_scale (1 req/s for
    ``rate: inf``)."""
    w = cfg.workload
    if w.trace is not None:
        level = 1.0 / (start if start is not None else w.trace.time_scale)
        return Load(TIME_SCALE_KEY, level)
    assert w.arrival is not None
    if w.arrival.rate is None:  # a changing rate has no one level to vary
        raise InputError(f"workload.arrival: a search varies {RATE_KEY}; give it, not a schedule")
    if start is None:
        start = w.arrival.rate if math.isfinite(w.arrival.rate) else 1.0
    return Load(RATE_KEY, start)
