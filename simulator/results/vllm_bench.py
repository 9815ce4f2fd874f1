"""A simulated run in the JSON ``vllm bench serve --save-result --save-detailed`` writes
(vLLM's ``vllm/benchmarks/serve.py``), so dashboards and scripts built for real runs read
simulated ones, and ``servesim compare --format vllm-bench`` reads it back.

Per request, as vLLM lists them (every request, in order): ``input_lens``, ``output_lens``,
``ttfts`` (seconds from the client's send), ``itls`` (seconds), ``start_times``, ``errors``
(``""`` for a success). Aggregates: ``duration``, ``completed``, ``failed``, the token totals
and throughputs, and ``mean_/median_/std_/p99_`` of ``ttft``, ``tpot``, ``itl`` and ``e2el``
in milliseconds, computed as vLLM does (numpy over the successful requests).

What differs from a real file, by necessity: servesim keeps no per-token times, so a
request's ``itls`` are its decode time spread evenly over its tokens (its TTFT, TPOT and
end-to-end latency stay exact; the ``*_itl_ms`` statistics are the simulation's exact ones
from every token gap, so they differ from statistics of these ``itls``); ``generated_texts``
are empty; a rejected or unfinished request is a failure with its reason in ``errors``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["vllm_bench_result"]


def vllm_bench_result(
    requests: pd.DataFrame, summary: dict[str, Any], meta: dict[str, Any]
) -> dict[str, Any]:
    """The vLLM bench result of a simulated run; ``meta`` gives ``model_id``,
    ``request_rate``, ``label`` and the like (vLLM's run fields), added as they are."""
    done = (requests["status"] == "finished").to_numpy()
    ttft = requests["ttft_s"].to_numpy(dtype=np.float64)
    e2e = requests["e2e_s"].to_numpy(dtype=np.float64)
    out_len = requests["output_len"].to_numpy(dtype=np.int64)
    itls = [
        _even_gaps(e2e[i] - ttft[i], int(out_len[i])) if done[i] else [] for i in range(len(done))
    ]
    duration = float(summary.get("duration_s") or 0.0)
    served_out = int(out_len[done].sum())
    served_in = int(requests["prompt_len"].to_numpy(dtype=np.int64)[done].sum())
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "servesim",
        "endpoint_type": "servesim",
        "num_prompts": len(requests),
        **meta,
        "duration": duration,
        "completed": int(done.sum()),
        "failed": int((~done).sum()),
        "total_input_tokens": served_in,
        "total_output_tokens": served_out,
        "request_throughput": _per_s(int(done.sum()), duration),
        "request_goodput": None,
        "output_throughput": _per_s(served_out, duration),
        "total_token_throughput": _per_s(served_in + served_out, duration),
        "input_lens": requests["prompt_len"].astype(int).tolist(),
        "output_lens": [int(n) if d else 0 for n, d in zip(out_len, done, strict=True)],
        "ttfts": [float(t) if d else 0.0 for t, d in zip(ttft, done, strict=True)],
        "itls": itls,
        "start_times": requests["arrival_s"].astype(float).tolist(),
        "generated_texts": [""] * len(requests),
        "errors": [
            "" if d else f"servesim: request {status}"
            for d, status in zip(done, requests["status"], strict=True)
        ],
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_len > 1, (e2e - ttft) / (out_len - 1), np.nan)
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2e)):
        result.update(_stats_ms(name, values[done]))
    result.update(_itl_stats_ms(summary))
    return result


def _even_gaps(decode_s: float, output_len: int) -> list[float]:
    """``output_len - 1`` equal gaps summing to ``decode_s`` (the request's decode time)."""
    if output_len <= 1:
        return []
    return [float(decode_s) / (output_len - 1)] * (output_len - 1)


def _per_s(count: float, duration: float) -> float:
    return count / duration if duration > 0 else 0.0


def _stats_ms(name: str, seconds: np.ndarray) -> dict[str, float]:
    """vLLM's ``mean_/median_/std_/p99_{name}_ms`` of the defined values (0 if none, as
    vLLM writes for an empty list)."""
    ms = seconds[np.isfinite(seconds)] * 1000.0
    if not len(ms):
        return {f"{k}_{name}_ms": 0.0 for k in ("mean", "median", "std", "p99")}
    return {
        f"mean_{name}_ms": float(np.mean(ms)),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(np.std(ms)),
        f"p99_{name}_ms": float(np.percentile(ms, 99)),
    }


def _itl_stats_ms(summary: dict[str, Any]) -> dict[str, float]:
    """The ITL statistics of every simulated token gap (the summary's), in milliseconds."""
    keys = {"mean": "itl_mean_s", "median": "itl_p50_s", "p99": "itl_p99_s"}
    out = {}
    for name, key in keys.items():
        value = summary.get(key)
        out[f"{name}_itl_ms"] = 0.0 if value is None else float(value) * 1000.0
    return out
