"""Arrival times of a synthetic workload: a renewal process (exponential, gamma or fixed gaps)
at a constant rate, or mapped onto a rate that changes over time by time-rescaling."""

from __future__ import annotations

import math

import numpy as np

from simulator.errors import InputError
from simulator.workload.config import ArrivalConfig
from simulator.workload.csv_table import CsvTable
from simulator.workload.diurnal import DiurnalRate
from simulator.workload.inputs import existing_file
from simulator.workload.rate_schedule import PiecewiseRate, RateSchedule, schedule_problem

SCHEDULE_COLUMNS = ("time_s", "rate")


def arrival_times(cfg: ArrivalConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times in seconds: the first at 0, then ``n - 1`` drawn gaps (all at 0 for
    an infinite rate). With a schedule the gaps are drawn at its reference rate and the times
    mapped through the inverse of its cumulative rate (time-rescaling)."""
    schedule = rate_schedule(cfg)
    rate = cfg.rate if schedule is None else schedule.ref
    assert rate is not None  # the validator gives exactly one of rate and a schedule
    if math.isinf(rate):
        return np.zeros(n, dtype=np.float64)
    if cfg.process == "constant":
        steps = np.arange(n, dtype=np.float64) / rate
    else:
        if cfg.process == "poisson":
            gaps = rng.exponential(1.0 / rate, size=max(n - 1, 0))
        else:
            # Gamma with shape k has cv = 1/sqrt(k); scale fixes the mean gap at 1/rate.
            shape = 1.0 / cfg.cv**2
            gaps = rng.gamma(shape, 1.0 / (rate * shape), size=max(n - 1, 0))
        steps = np.concatenate(([0.0], np.cumsum(gaps)))[:n]
    if schedule is None:
        return steps
    return _rescaled(schedule, steps, n)


def _rescaled(schedule: RateSchedule, steps: np.ndarray, n: int) -> np.ndarray:
    """``steps`` (a renewal process at ``schedule.ref``) on the schedule's clock."""
    room = schedule.capacity()
    if len(steps) and steps[-1] > room:
        fit = int(np.searchsorted(steps, room, side="right"))
        raise InputError(
            f"workload.arrival: the rate ends at 0 and only {fit} of the {n} requests "
            f"(num_requests) arrive before it does; lower num_requests or end at a rate > 0"
        )
    return schedule.times(steps)


def rate_schedule(cfg: ArrivalConfig) -> RateSchedule | None:
    """The changing rate ``cfg`` gives (None for a constant ``rate``); reads a CSV schedule."""
    if cfg.rate_schedule is not None:
        table = np.array(cfg.rate_schedule, dtype=np.float64)
        return PiecewiseRate.steps(table[:, 0], table[:, 1])
    if cfg.rate_schedule_csv is not None:
        t, rates = read_rate_csv(cfg.rate_schedule_csv)
        return PiecewiseRate.linear(t, rates)
    if cfg.diurnal is not None:
        d = cfg.diurnal
        peak_at = d.peak_at_s if d.peak_at_s is not None else 0.5 * d.period_s
        return DiurnalRate(d.peak, d.trough, d.period_s, peak_at)
    return None


def read_rate_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Times and rates of a ``time_s, rate`` CSV; InputError ``FILE:LINE: reason`` on the
    first bad row (header = line 1)."""
    existing_file(path, "arrival.rate_schedule_csv")
    table = CsvTable.load(path, SCHEDULE_COLUMNS, lambda header: "", what="rows")
    t, rates = table.numbers("time_s"), table.numbers("rate")
    problem = schedule_problem(t, rates)
    if problem is not None:
        row, why = problem
        raise InputError(f"{path}: {why}") if row is None else table.fail(row, why)
    return t, rates
