"""The run's summary: counts, throughputs, KV use and latency percentiles, all derived from the
request table, the step aggregates and the ITL distribution (definitions: docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.metrics.columns import Columns
from simulator.metrics.distribution import Distribution
from simulator.metrics.steps import StepStats

if TYPE_CHECKING:
    import pandas as pd

    RequestTable = pd.DataFrame | Columns
    """The request table as a frame or as its columns (``build_requests``)."""

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "queue_delay")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
_DONE_COLUMNS = (
    "request_id",
    "prompt_len",
    "output_len",
    "num_cached_tokens",
    *(f"{m}_s" for m in LATENCY_METRICS if m != "itl"),
)
"""What the summary reads of the finished requests."""


def percentile_key(metric: str, p: float) -> str:
    """Summary key of a percentile: ``ttft_p99_s``, ``itl_p99.9_s``."""
    return f"{metric}_p{p:g}_s"


def meets_slo(requests: RequestTable, slo: dict[str, float | None]) -> np.ndarray:
    """Per request: finished and within every SLO given (TPOT is vacuous for 1-token outputs)."""
    ok = np.asarray(requests["status"]) == "finished"
    for metric in ("ttft", "tpot", "e2e"):
        limit = slo.get(f"{metric}_ms")
        if limit is None:
            continue
        values = np.asarray(requests[f"{metric}_s"]) * 1000.0
        within = values <= limit
        if metric == "tpot":
            within |= np.isnan(values)
        ok &= within
    return ok


def _stats(prefix: str, dist: Distribution, percentiles: Sequence[float]) -> dict[str, float]:
    """Mean and percentiles of a distribution, keyed as in the summary."""
    out = {f"{prefix}_mean_s": dist.mean()}
    for p, v in zip(percentiles, dist.percentiles(percentiles), strict=True):
        out[percentile_key(prefix, p)] = v
    return out


def _tier_rates(
    done: dict[str, np.ndarray], in_tokens: int, tier_hits: dict[int, list[int]]
) -> dict[str, float]:
    """The prefix-cache hit rate split by where the hit was: GPU KV, the replica's CPU tier,
    the fleet's shared tier (their sum is ``prefix_cache_hit_rate``)."""
    if not in_tokens:
        nan = float("nan")
        return {"gpu_hit_rate": nan, "cpu_hit_rate": nan, "shared_hit_rate": nan}
    cpu = shared = 0
    if tier_hits:
        finished = set(done["request_id"].tolist())
        for i, (c, s) in tier_hits.items():
            if i in finished:
                cpu, shared = cpu + c, shared + s
    gpu = int(done["num_cached_tokens"].sum()) - cpu - shared
    return {
        "gpu_hit_rate": gpu / in_tokens,
        "cpu_hit_rate": cpu / in_tokens,
        "shared_hit_rate": shared / in_tokens,
    }


def summarize(
    requests: RequestTable,
    steps: StepStats,
    itl: Distribution,
    slo: dict[str, float | None] | None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    tier_hits: dict[int, list[int]] | None = None,
) -> dict[str, Any]:
    """The flat summary: counts, throughputs, KV use and latency percentiles; ``tier_hits``
    gives, per request that loaded KV from the tiers below the GPU's, the prompt tokens each
    tier (cpu, shared) served (``Recorder.tier_hits``)."""
    finished = np.asarray(requests["status"]) == "finished"
    done = {name: np.asarray(requests[name])[finished] for name in _DONE_COLUMNS}
    duration = steps.end_s
    per_s = (lambda x: float(x) / duration) if duration > 0 else (lambda x: float("nan"))
    out_tokens = int(done["output_len"].sum())
    in_tokens = int(done["prompt_len"].sum())
    rejected = int((requests["status"] == "rejected").sum())
    summary: dict[str, Any] = {
        # rejections first: a run that served almost nothing must not read as fine
        "num_requests": len(requests),
        "num_rejected": rejected,
        "rejected_share": rejected / len(requests) if len(requests) else float("nan"),
        "num_finished": int(finished.sum()),
        "duration_s": duration,
        "request_throughput": per_s(finished.sum()),
        "output_token_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens),
        "num_preemptions": steps.num_preemptions,
        "num_steps": steps.num_steps,
        # time-weighted over the whole run: an idle server holds no KV
        "kv_utilization_mean": steps.kv_time / duration if duration > 0 else 0.0,
        "kv_utilization_max": steps.kv_max,
        # the share of the run in saturated steps (some held request left out)
        "saturated_share": steps.saturated_s / duration if duration > 0 else 0.0,
        # swap preemption's copies of KV to CPU memory and back (0 when it recomputes)
        "swap_out_bytes": steps.swap_out_bytes,
        "swap_in_bytes": steps.swap_in_bytes,
        # prompt tokens the prefix cache served when requests were first scheduled
        "prefix_cache_hit_rate": (
            float(done["num_cached_tokens"].sum()) / in_tokens if in_tokens else float("nan")
        ),
    }
    summary.update(_tier_rates(done, in_tokens, tier_hits or {}))
    for metric in LATENCY_METRICS:
        dist = itl
        if metric != "itl":
            values = done[f"{metric}_s"].astype(np.float64, copy=False)
            dist = Distribution(exact_limit=len(values))
            dist.add(values[~np.isnan(values)])
        summary.update(_stats(metric, dist, percentiles))
    if slo is not None and any(v is not None for v in slo.values()):
        good = int(meets_slo(requests, slo).sum())
        summary["goodput"] = per_s(good)
        summary["slo_attainment"] = good / len(requests) if len(requests) else float("nan")
    summary["itl_percentiles_exact"] = itl.exact
    return summary
