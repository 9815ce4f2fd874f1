"""Token-id traces: JSONL with each prompt's token ids (LLMServingSim's flat request format:
``input_toks``, ``output_toks``, ``arrival_time_ns``, ``input_tok_ids``; other fields such as
``output_tok_ids`` are ignored), and the prompt runs their token ids give. A bench run's
``requests.jsonl`` (LLMServingSim's measured requests: ``arrival_time`` in seconds, no token
ids) reads the same way.

Runs from token ids: each prompt copies the runs of the earlier prompt it shares the longest
prefix with, cut to that prefix, and adds one new segment for the rest. Then two prompts'
runs agree up to ``k`` tokens exactly when their first ``k`` tokens do (the prompt an earlier
one shares most with is its neighbour in sorted order, found by bisection)."""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import numpy as np

from simulator.errors import InputError
from simulator.workload.prompt_runs import PromptRuns

FIELDS = ("arrival_time_ns", "input_toks", "output_toks")
LIMITS = (2**62, 2**31 - 1, 2**31 - 1)
SECONDS = "arrival_time"
"""The arrival field of a bench run's ``requests.jsonl`` (seconds), read when a line has no
``arrival_time_ns``."""
#: Largest token id accepted.
MAX_TOKEN_ID = 2**31 - 1


def read_token_trace(
    path: str | Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, PromptRuns | None, list[int]]:
    """``(arrival_s, prompt_len, output_len, runs, line numbers)`` of a token-id JSONL file;
    ``runs`` is None when no line has ``input_tok_ids``. Errors name FILE:LINE and field."""
    decoder = json.JSONDecoder()
    values: list[list[int]] = [[], [], []]
    seconds: list[float] = []  # arrival_time of a bench run's lines
    tokens: list[tuple[int, ...] | None] = []
    lines: list[int] = []
    try:
        with Path(path).open(encoding="utf-8-sig") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = decoder.decode(line)
                except (json.JSONDecodeError, ValueError, RecursionError) as err:
                    raise InputError(f"{path}:{line_no}: invalid JSON ({err})") from None
                if not isinstance(record, dict):
                    raise InputError(f"{path}:{line_no}: expected a JSON object")
                if FIELDS[0] not in record and SECONDS in record:
                    seconds.append(_seconds(record, path, line_no))
                    record = {**record, FIELDS[0]: 0}
                for column, key, limit in zip(values, FIELDS, LIMITS, strict=True):
                    column.append(_count(record, key, limit, path, line_no))
                tokens.append(_token_ids(record, values[1][-1], path, line_no))
                lines.append(line_no)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not a UTF-8 text file ({err.reason})") from None
    if not lines:
        raise InputError(f"{path}: no requests in the file")
    if seconds and len(seconds) != len(lines):
        raise InputError(f"{path}: lines with arrival_time_ns and lines with arrival_time mixed")
    if seconds:
        arrival_s = np.asarray(seconds, dtype=np.float64)
    else:
        arrival_s = np.asarray(values[0], dtype=np.float64) / 1e9
    prompt = np.maximum(np.asarray(values[1], dtype=np.int64), 1)
    runs = runs_from_tokens(tokens, prompt) if any(t is not None for t in tokens) else None
    return arrival_s, np.asarray(values[1]), np.asarray(values[2]), runs, lines


def _seconds(record: dict, path: str | Path, line_no: int) -> float:
    value = record[SECONDS]
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 <= value <= 1e12:
        raise InputError(
            f"{path}:{line_no}: field {SECONDS!r}: {value!r:.40} is not a time in 0..1e12 s"
        )
    return float(value)


def _count(record: dict, key: str, limit: int, path: str | Path, line_no: int) -> int:
    if key not in record:
        raise InputError(f"{path}:{line_no}: missing field {key!r}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise InputError(
            f"{path}:{line_no}: field {key!r}: {value!r:.40} is not an integer in 0..{limit}"
        )
    return value


def _token_ids(
    record: dict,
    prompt_len: int,
    path: str | Path,
    line_no: int,
) -> tuple[int, ...] | None:
    ids = record.get("input_tok_ids")
    if ids is None:
        return None
    where = f"{path}:{line_no}: field 'input_tok_ids'"
    if not isinstance(ids, list):
        raise InputError(f"{where}: expected a list of token ids")
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKEN_ID:
            raise InputError(f"{where}: {v!r:.40} is not a token id (an integer in 0..2**31-1)")
    if len(ids) != prompt_len:
        raise InputError(f"{where}: {len(ids)} token ids, but input_toks is {prompt_len}")
    return tuple(ids)


def runs_from_tokens(tokens: list[tuple[int, ...] | None], prompt_len: np.ndarray) -> PromptRuns:
    """Prompt runs from token ids (None: a prompt of its own), in request order."""
    seen: list[tuple[tuple[int, ...], int]] = []  # (tokens, request), sorted
    runs: list[list[tuple[int, int]]] = []
    fresh = 0
    for i, toks in enumerate(tokens):
        n = int(prompt_len[i])
        if not toks:
            runs.append([(fresh, n)])
            fresh += 1
            continue
        at = bisect.bisect_left(seen, (toks, -1))
        best, shared = -1, 0
        for j in (at - 1, at):  # the neighbours in sorted order share the longest prefix
            if 0 <= j < len(seen):
                k = _common(seen[j][0], toks)
                if k > shared:
                    best, shared = seen[j][1], k
        out = _cut(runs[best], shared) if shared else []
        if shared < n:
            out.append((fresh, n - shared))
            fresh += 1
        runs.append(out)
        seen.insert(at, (toks, i))
    return PromptRuns.from_lists(runs)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _cut(runs: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out = []
    for segment, length in runs:
        if n <= 0:
            break
        out.append((segment, min(length, n)))
        n -= length
    return out
