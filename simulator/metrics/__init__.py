"""Metrics: the request table, the step table, the streaming distributions and the summary
derived from them (every timestamp and metric is defined once: docs/metrics.md)."""

from simulator.metrics.columns import Columns
from simulator.metrics.distribution import Distribution
from simulator.metrics.requests import REQUEST_COLUMNS, build_requests
from simulator.metrics.steps import STEP_COLUMNS, STEP_INT_FIELDS, StepStats, frame_of, step_columns
from simulator.metrics.summary import DEFAULT_PERCENTILES, LATENCY_METRICS, meets_slo, summarize

__all__ = [
    "Columns",
    "DEFAULT_PERCENTILES",
    "LATENCY_METRICS",
    "REQUEST_COLUMNS",
    "STEP_COLUMNS",
    "STEP_INT_FIELDS",
    "Distribution",
    "StepStats",
    "build_requests",
    "frame_of",
    "meets_slo",
    "step_columns",
    "summarize",
]
