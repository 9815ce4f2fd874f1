"""Every metric derives from four request timestamps, defined once (see docs/metrics.md):

- ``arrival_s``: the request reaches the server.
- ``first_scheduled_s``: start of the first step that computes any of its tokens.
- ``first_token_s``: end of the step that samples its first output token.
- ``finish_s``: end of the step that samples its last output token.

Definitions follow vLLM's ``benchmark_serving``: TTFT = first token - arrival; TPOT = (finish -
first token) / (output_len - 1), only for output_len > 1; ITL = every gap between consecutive
tokens of a request; E2E = finish - arrival; queue delay = first scheduled - arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from simulator.workload.workload import Workload

REQUEST_COLUMNS = [
    "request_id",
    "arrival_s",
    "prompt_len",
    "output_len",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_delay_s",
    "num_preemptions",
    "status",
]
STEP_COLUMNS = [
    "step",
    "start_s",
    "duration_s",
    "num_seqs",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_seqs",
    "blocks_used",
    "kv_utilization",
    "num_running",
    "num_waiting",
    "num_preemptions",
]
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "queue_delay")
PERCENTILES = (50, 90, 99)


def build_requests(
    workload: Workload,
    *,
    first_scheduled: np.ndarray,
    first_token: np.ndarray,
    finish: np.ndarray,
    num_preemptions: np.ndarray,
    rejected: list[int],
) -> pd.DataFrame:
    """One row per request, every latency derived from the four timestamps."""
    n = len(workload)
    arrival = np.asarray(workload.arrival_s, dtype=np.float64)
    output_len = np.asarray(workload.output_len, dtype=np.int64)
    status = np.full(n, "finished", dtype=object)
    status[rejected] = "rejected"
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output_len > 1, (finish - first_token) / (output_len - 1), np.nan)
    return pd.DataFrame(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": arrival,
            "prompt_len": np.asarray(workload.prompt_len, dtype=np.int64),
            "output_len": output_len,
            "first_scheduled_s": first_scheduled,
            "first_token_s": first_token,
            "finish_s": finish,
            "ttft_s": first_token - arrival,
            "tpot_s": tpot,
            "e2e_s": finish - arrival,
            "queue_delay_s": first_scheduled - arrival,
            "num_preemptions": num_preemptions,
            "status": pd.Categorical(status, categories=["finished", "rejected"]),
        },
        columns=REQUEST_COLUMNS,
    )


def build_steps(
    times: np.ndarray, ints: np.ndarray, int_fields: Sequence[str], num_blocks: int
) -> pd.DataFrame:
    """One row per step from ``(start, duration)`` pairs and integer columns;
    running/waiting are counted at the step's start, before scheduling."""
    cols: dict[str, Any] = {
        "step": np.arange(len(times), dtype=np.int64),
        "start_s": times[:, 0],
        "duration_s": times[:, 1],
    }
    for j, name in enumerate(int_fields):
        cols[name] = ints[:, j]
    cols["kv_utilization"] = cols["blocks_used"] / float(num_blocks)
    return pd.DataFrame(cols, columns=STEP_COLUMNS)


def meets_slo(requests: pd.DataFrame, slo: dict[str, float | None]) -> np.ndarray:
    """Per request: finished and within every SLO given (TPOT is vacuous for 1-token outputs)."""
    ok = np.array(requests["status"] == "finished", dtype=bool)
    for metric in ("ttft", "tpot", "e2e"):
        limit = slo.get(f"{metric}_ms")
        if limit is None:
            continue
        values = requests[f"{metric}_s"].to_numpy() * 1000.0
        within = values <= limit
        if metric == "tpot":
            within |= np.isnan(values)
        ok &= within
    return ok


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    """Mean and percentiles of the non-NaN values; reorders ``values`` in place when it is
    a private array (the ITL gaps are the run's largest: no copy of them is made)."""
    nan = np.isnan(values)
    private = not nan.any() and values.flags.writeable and values.base is None
    if not private:
        values = values[~nan]  # a fresh copy, ours to reorder
    out = {f"{prefix}_mean_s": float(values.mean()) if values.size else float("nan")}
    pct = (
        np.percentile(values, PERCENTILES, overwrite_input=True)
        if values.size
        else [float("nan")] * len(PERCENTILES)
    )
    for p, v in zip(PERCENTILES, pct, strict=True):
        out[f"{prefix}_p{p}_s"] = float(v)
    return out


def summarize(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    itl: np.ndarray,
    slo: dict[str, float | None] | None,
) -> dict[str, Any]:
    """The flat summary: counts, throughputs, KV use and latency percentiles."""
    done = requests[requests["status"] == "finished"]
    # The end of the last step (the clock starts at 0); 0 when no step ran (every request
    # rejected), whenever the requests arrived.
    last = steps.iloc[-1] if len(steps) else None
    duration = float(last["start_s"] + last["duration_s"]) if last is not None else 0.0
    per_s = (lambda x: float(x) / duration) if duration > 0 else (lambda x: float("nan"))
    out_tokens = int(done["output_len"].sum())
    in_tokens = int(done["prompt_len"].sum())
    busy = steps["duration_s"].to_numpy()
    kv = steps["kv_utilization"].to_numpy()
    summary: dict[str, Any] = {
        "num_requests": len(requests),
        "num_finished": len(done),
        "num_rejected": int((requests["status"] == "rejected").sum()),
        "duration_s": duration,
        "request_throughput": per_s(len(done)),
        "output_token_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(out_tokens + in_tokens),
        "num_preemptions": int(steps["num_preemptions"].sum()) if len(steps) else 0,
        "num_steps": len(steps),
        # time-weighted over the whole run: an idle server holds no KV
        "kv_utilization_mean": float((kv * busy).sum() / duration) if duration > 0 else 0.0,
        "kv_utilization_max": float(kv.max()) if kv.size else 0.0,
    }
    for metric in LATENCY_METRICS:
        values = itl if metric == "itl" else done[f"{metric}_s"].to_numpy(dtype=np.float64)
        summary.update(_stats(metric, np.asarray(values, dtype=np.float64)))
    if slo is not None and any(v is not None for v in slo.values()):
        good = int(meets_slo(requests, slo).sum())
        summary["goodput"] = per_s(good)
        summary["slo_attainment"] = good / len(requests) if len(requests) else float("nan")
    return summary
