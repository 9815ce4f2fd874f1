"""guidellm's ``benchmarks.json`` (``guidellm benchmark ... --output-path benchmarks.json``,
or ``--output kind=json``) as measured runs: one per benchmark of the file (a sweep holds
several, one per rate or concurrency).

The fields read are those guidellm documents for each request of a benchmark
(``GenerativeRequestStats``, serialized with its computed fields) under
``benchmarks[i].requests.successful``: ``time_to_first_token_ms``,
``inter_token_latency_ms`` (the mean gap after the first token: vLLM's and servesim's TPOT),
``request_latency`` (seconds, send to last token), ``prompt_tokens`` and ``output_tokens``.
guidellm keeps no per-gap ITL, so there is none to compare. Incomplete and errored requests
are counted (and named in the label), not compared: they have no complete latencies."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import InputError
from simulator.validation.measured import MeasuredRun, check_times

__all__ = ["read_guidellm"]

_FIELDS = ("time_to_first_token_ms", "inter_token_latency_ms", "request_latency")


def read_guidellm(path: str | Path) -> list[tuple[str, MeasuredRun]]:
    """``(label, run)`` of every benchmark in a guidellm ``benchmarks.json``, in order."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read it ({err})") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise InputError(f"{path}: no 'benchmarks' list (a guidellm benchmarks.json has one)")
    return [_benchmark(b, f"{path}: benchmarks[{i}]", i) for i, b in enumerate(benchmarks)]


def _benchmark(bench: Any, where: str, index: int) -> tuple[str, MeasuredRun]:
    """One benchmark's successful requests as a run, and a label saying which it is."""
    requests = bench.get("requests") if isinstance(bench, dict) else None
    if not isinstance(requests, dict) or not isinstance(requests.get("successful"), list):
        raise InputError(f"{where}: no 'requests.successful' list of per-request stats")
    rows = [
        _request(r, f"{where}.requests.successful[{j}]")
        for j, r in enumerate(requests["successful"])
    ]
    if not rows:
        raise InputError(f"{where}: no successful request to compare")
    ttft_ms, itl_ms, latency_s, prompt, output = (
        np.asarray(c, dtype=np.float64) for c in zip(*rows, strict=True)
    )
    left_out = {k: len(requests.get(k) or []) for k in ("incomplete", "errored")}
    extra = ", ".join(f"{n} {k}" for k, n in left_out.items() if n)
    label = f"benchmark {index} ({_strategy(bench)}{'; ' + extra + ' left out' if extra else ''})"
    run = MeasuredRun(
        source=where,
        ttft=ttft_ms / 1000.0,
        tpot=np.where(output > 1, itl_ms / 1000.0, np.nan),
        e2e=latency_s,
        itl=None,
        prompt_len=prompt.astype(np.int64),
        output_len=output.astype(np.int64),
        reference="arrival",
    )
    check_times(run, lambda j: f"{where}.requests.successful[{j}]")
    return label, run


def _request(record: Any, where: str) -> tuple[float, float, float, float, float]:
    """(TTFT ms, ITL ms or NaN, latency s, prompt tokens, output tokens) of one request."""
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected an object")
    values = []
    for key in (*_FIELDS, "prompt_tokens", "output_tokens"):
        value = record.get(key)
        if key == "inter_token_latency_ms" and value is None:
            values.append(math.nan)  # a one-token output has no gap
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InputError(f"{where}: field {key!r}: {value!r} is not a finite number")
        values.append(float(value))
    return values[0], values[1], values[2], values[3], values[4]


def _strategy(bench: dict[str, Any]) -> str:
    """What load the benchmark applied (``constant 5``), from where guidellm versions put it
    (``config.strategy`` or ``args.strategy``); ``unknown load`` if neither."""
    for parent in ("config", "args"):
        section = bench.get(parent)
        strategy = section.get("strategy") if isinstance(section, dict) else None
        if isinstance(strategy, dict):
            kind = strategy.get("type_") or strategy.get("type") or "strategy"
            rate = next(
                (strategy[k] for k in ("rate", "streams", "max_concurrency") if strategy.get(k)),
                None,
            )
            if isinstance(rate, int | float):
                return f"{kind} {rate:g}"
            return str(kind) if rate is None else f"{kind} {rate}"
    return "unknown load"
