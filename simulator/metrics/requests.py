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
    "num_cached_tokens",
    "status",
]


def build_requests(
    workload: Workload,
    *,
    arrival: np.ndarray | None = None,
    first_scheduled: np.ndarray,
    first_token: np.ndarray,
    finish: np.ndarray,
    num_preemptions: np.ndarray,
    num_cached_tokens: np.ndarray,
    rejected: list[int],
) -> pd.DataFrame:
    """One row per request, every latency derived from the four timestamps (``arrival``:
    when each reached the server, default the workload's arrival times)."""
    n = len(workload)
    arrival = np.asarray(workload.arrival_s if arrival is None else arrival, dtype=np.float64)
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
            "num_cached_tokens": num_cached_tokens,
            "status": pd.Categorical(status, categories=["finished", "rejected"]),
        },
        columns=REQUEST_COLUMNS,
    )
