"""Metrics: per-request and per-step tables, and the summary derived from them."""

from simulator.metrics.summary import build_requests, build_steps, summarize

__all__ = ["build_requests", "build_steps", "summarize"]
