"""Workloads: when requests arrive and how many prompt and output tokens each has, drawn from
distributions (``synthetic``) or read from a trace (``traces``, ``replay``); the public data
files behind them (``datasets``). Options: docs/workloads.md."""

from __future__ import annotations

import numpy as np

from simulator.workload.arrivals import arrival_times, rate_schedule
from simulator.workload.config import TraceConfig, WorkloadConfig
from simulator.workload.inputs import existing_file
from simulator.workload.replay import replay
from simulator.workload.synthetic import check_empirical, draw, sample_lengths
from simulator.workload.workload import Workload

__all__ = [
    "TraceConfig",
    "Workload",
    "WorkloadConfig",
    "arrival_times",
    "check_input_files",
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


def check_input_files(cfg: WorkloadConfig) -> None:
    """Every file ``cfg`` names is there (else ``existing_file``'s one line): checked when a
    scenario is resolved, so a search or sweep refuses a missing trace before it runs."""
    if cfg.trace is not None:
        existing_file(cfg.trace.path, "trace.path")
    if cfg.arrival is not None and cfg.arrival.rate_schedule_csv is not None:
        existing_file(cfg.arrival.rate_schedule_csv, "arrival.rate_schedule_csv")
    for field in ("prompt_len", "output_len"):
        path = getattr(getattr(cfg, field), "path", None)  # an empirical distribution's file
        if isinstance(path, str):
            existing_file(path, f"{field}.path")
