"""Replaying a trace: its requests in a time window, on a scaled clock."""

from __future__ import annotations

import numpy as np

from simulator.errors import InputError
from simulator.workload.config import TraceConfig
from simulator.workload.inputs import existing_file
from simulator.workload.rate_schedule import PiecewiseRate
from simulator.workload.traces import read_trace
from simulator.workload.workload import Workload


def replay(cfg: TraceConfig) -> Workload:
    """The requests of the trace ``cfg`` names, in its time window, rebased to start at 0 and
    stretched by ``time_scale`` (or ``time_scale_schedule``)."""
    existing_file(cfg.path, "trace.path")
    full = read_trace(cfg.path, cfg.format, cfg.hash_block_tokens)
    t = full.arrival_s
    keep = np.ones(len(t), dtype=bool)
    if cfg.start_s is not None:
        keep &= t >= cfg.start_s
    if cfg.end_s is not None:
        keep &= t < cfg.end_s
    index = np.flatnonzero(keep)[: cfg.max_requests]
    if len(index) == 0:
        span = f"{t[-1]:.3f}"
        raise InputError(
            f"{cfg.path}: no requests in the window start_s={cfg.start_s}, end_s={cfg.end_s} "
            f"(the trace spans 0..{span} s)"
        )
    kept = t[index]
    return Workload(
        arrival_s=scaled_clock(kept - kept[0], cfg),
        prompt_len=full.prompt_len[index],
        output_len=full.output_len[index],
        notes=full.notes,
        priority=None if full.priority is None else full.priority[index],
        prompt_runs=None if full.prompt_runs is None else full.prompt_runs.take(index),
        mm=None if full.mm is None else full.mm.take(index),
    )


def scaled_clock(trace_s: np.ndarray, cfg: TraceConfig) -> np.ndarray:
    """Trace times (from the first kept request) on the simulated clock: times
    ``time_scale``, or the integral of ``time_scale_schedule``'s scale up to each time."""
    if cfg.time_scale_schedule is None:
        return trace_s * cfg.time_scale
    table = np.array(cfg.time_scale_schedule, dtype=np.float64)
    scale = PiecewiseRate.steps(table[:, 0], table[:, 1])
    # units() is the integral divided by the first scale: exactly trace_s for one scale
    return scale.units(trace_s) * scale.ref
