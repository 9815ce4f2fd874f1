"""Workloads: when requests arrive and how many prompt and output tokens each has, drawn from
distributions (``synthetic``) or read from a trace (``traces``, ``replay``); the public data
files behind them (``datasets``). Options: docs/workloads.md."""

from __future__ import annotations

import numpy as np

from simulator.workload.arrivals import arrival_times, rate_schedule
from simulator.workload.config import TraceConfig, WorkloadConfig
from simulator.workload.replay import replay
from simulator.workload.synthetic import check_empirical, draw, sample_lengths
from simulator.workload.workload import Workload

__all__ = [
    "TraceConfig",
    "Workload",
    "WorkloadConfig",
    "arrival_times",
    "check_inputs",
    "generate",
    "sample_lengths",
]


def generate(cfg: WorkloadConfig, seed: np.random.SeedSequence) -> Workload:
    """The workload ``cfg`` describes: replayed from its trace, or drawn from ``seed``."""
    if cfg.trace is not None:
        return replay(cfg.trace)
    return draw(cfg, seed)


def check_inputs(cfg: WorkloadConfig) -> None:
    """Read every file ``cfg`` names (a trace, a rate schedule, empirical length tables), so
    that a missing or malformed one is reported without simulating anything."""
    if cfg.trace is not None:
        replay(cfg.trace)
    if cfg.arrival is not None:
        rate_schedule(cfg.arrival)  # reads a rate_schedule_csv
    check_empirical(cfg)
