"""Every metric derives from the request timestamps, each defined once (see docs/metrics.md):

- ``arrival_s``: the request reaches the (API) server: the client sent it.
- ``queued_s``: it enters the engine's waiting queue (arrival + the front end's delay, or
  the end of the step then running on a busy engine that plans ahead, as vLLM's QUEUED
  stamp).
- ``first_scheduled_s``: start of the first step that computes any of its tokens.
- ``first_token_s``: end of the step that samples its first output token.
- ``finish_s``: end of the step that samples its last output token.
- ``response_s``: the client has the whole response (finish + the response delay).

Definitions follow vLLM's ``benchmark_serving``, client-side: TTFT = first token + response
delay - arrival (the first token reaches the client by the same way as the last); TPOT =
(finish - first token) / (output_len - 1), only for output_len > 1; ITL = every gap between
consecutive tokens of a request; E2E = response - arrival; queue delay = first scheduled -
arrival.
"""

from __future__ import annotations

import numpy as np

from simulator.metrics.columns import Columns
from simulator.workload.workload import Workload

REQUEST_COLUMNS = [
    "request_id",
    "arrival_s",
    "prompt_len",
    "output_len",
    "queued_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "response_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_delay_s",
    "num_preemptions",
    "num_cached_tokens",
    "status",
]

STATUSES = ("finished", "rejected")
"""The categories of the ``status`` column."""


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
    queued: np.ndarray | None = None,
    response_delay: float = 0.0,
) -> Columns:
    """One row per request, every latency derived from the timestamps (``arrival``: when each
    reached the server, default the workload's arrival times; ``queued``: when each entered
    the engine's queue, default its arrival; ``response_delay``: seconds from a sampled token
    to the client)."""
    n = len(workload)
    arrival = np.asarray(workload.arrival_s if arrival is None else arrival, dtype=np.float64)
    queued = arrival if queued is None else np.asarray(queued, dtype=np.float64)
    response = finish + response_delay
    output_len = np.asarray(workload.output_len, dtype=np.int64)
    status = np.full(n, "finished", dtype=object)
    status[rejected] = "rejected"
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output_len > 1, (finish - first_token) / (output_len - 1), np.nan)
    return Columns(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": arrival,
            "prompt_len": np.asarray(workload.prompt_len, dtype=np.int64),
            "output_len": output_len,
            "queued_s": queued,
            "first_scheduled_s": first_scheduled,
            "first_token_s": first_token,
            "finish_s": finish,
            "response_s": response,
            "ttft_s": first_token + response_delay - arrival,
            "tpot_s": tpot,
            "e2e_s": response - arrival,
            "queue_delay_s": first_scheduled - arrival,
            "num_preemptions": num_preemptions,
            "num_cached_tokens": num_cached_tokens,
            "status": status,
        },
        categories={"status": STATUSES},
    )
