"""Readers of measured runs (what ``servesim compare`` holds a simulation against): per request
TTFT, TPOT and E2E in seconds, ITL gaps where the file has them, and the request lengths.

Formats:

- ``llmservingsim``: a bench run's ``requests.jsonl`` from LLMServingSim (``input_toks``,
  ``output_toks``, ``queued_ts``, ``first_token_ts``, ``last_token_ts``, ...). Its
  ``arrival_time`` is on the wall clock and every other timestamp on the engine's monotonic
  clock, so, as LLMServingSim's own validator does, TTFT and E2E are measured from
  ``queued_ts`` (the request entering the engine's queue): ``reference = "queued"``.
- ``vllm-bench``: the JSON ``vllm bench serve --save-result --save-detailed`` writes
  (``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``; seconds, client side).
  E2E is ``request_complete_times - request_submit_times`` where the file has them, else
  TTFT + the sum of the request's ITLs; TPOT is ``(E2E - TTFT) / (output_len - 1)``, as vLLM.
- ``csv``: ``request_id, ttft_s, tpot_s, e2e_s`` (client side; an empty ``tpot_s`` for a
  one-token output).

Request ids (``csv``'s ``request_id``, LLMServingSim's ``request_id``: ``N`` or ``bench-N``)
name the simulated request ``N`` (the simulation numbers its requests 0, 1, ... in order, as
both benchmarks do): ``compare`` matches the two sides by them. A request whose times cannot
be (a negative time, an E2E shorter than its TTFT) is refused, naming its row.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from simulator.errors import InputError

MeasuredFormat = Literal["llmservingsim", "vllm-bench", "guidellm", "csv"]
FORMATS: tuple[MeasuredFormat, ...] = ("llmservingsim", "vllm-bench", "guidellm", "csv")


@dataclass(frozen=True)
class MeasuredRun:
    """Per-request latencies of a measured run (seconds, NaN where undefined)."""

    source: str
    """The file read."""
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    itl: np.ndarray | None
    """Every inter-token gap, if the file records them."""
    prompt_len: np.ndarray | None
    output_len: np.ndarray | None
    reference: Literal["arrival", "queued"]
    """Where TTFT and E2E start: the client's send (``arrival``) or the engine queue."""
    request_id: np.ndarray | None = None
    """Each request's number (the simulated request it is), if the file names them."""

    def __len__(self) -> int:
        return len(self.ttft)


def guess_format(path: str | Path) -> MeasuredFormat:
    """The format a file's name suggests: ``.jsonl`` llmservingsim, ``.json`` vllm-bench (or
    guidellm, if its top level holds a ``benchmarks`` list), ``.csv`` csv."""
    suffix = Path(path).suffix.lower()
    guesses: dict[str, MeasuredFormat] = {
        ".jsonl": "llmservingsim",
        ".json": "vllm-bench",
        ".csv": "csv",
    }
    if suffix not in guesses:
        raise InputError(f"{path}: cannot tell the format from the name; pass --format")
    if guesses[suffix] == "vllm-bench" and _has_benchmarks_list(Path(path)):
        return "guidellm"
    return guesses[suffix]


def _has_benchmarks_list(file: Path) -> bool:
    """Whether a JSON file is an object with a ``benchmarks`` list (guidellm's layout); a
    file that cannot be read or parsed is left to the reader to report."""
    try:
        data = json.loads(file.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("benchmarks"), list)


def read_measured(path: str | Path, fmt: MeasuredFormat) -> MeasuredRun:
    """The measured run at ``path`` in format ``fmt``."""
    file = Path(path)
    if not file.is_file():
        from simulator.workload.inputs import registered_hint

        hint = registered_hint(path)  # a public real run, not fetched yet
        where = f" (relative to {Path.cwd()}); {hint}" if hint else ""
        raise InputError(f"{path}: file not found{where}")
    if fmt == "guidellm":
        raise InputError(f"{path}: a guidellm file holds several runs: read_measured_runs")
    readers = {"llmservingsim": _llmservingsim, "vllm-bench": _vllm_bench, "csv": _csv}
    return readers[fmt](file)


def _number(value: Any, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{where}: field {key!r}: {value!r} is not a finite number")
    return float(value)


def _llmservingsim(file: Path) -> MeasuredRun:
    keys = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
    rows: list[list[float]] = []
    ids: list[str | None] = []
    wheres: list[str] = []
    for line_no, line in enumerate(_lines(file), start=1):
        if not line.strip():
            continue
        where = f"{file}:{line_no}"
        wheres.append(where)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{where}: invalid JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{where}: expected a JSON object")
        for key in keys:
            if key not in record:
                raise InputError(f"{where}: missing field {key!r}")
        rows.append([_number(record[k], where, k) for k in keys])
        ids.append(None if record.get("request_id") is None else str(record["request_id"]))
        if not rows[-1][2] <= rows[-1][3] <= rows[-1][4]:
            raise InputError(f"{where}: timestamps out of order (queued, first, last token)")
    if not rows:
        raise InputError(f"{file}: no requests in the file")
    inp, out, queued, first, last = np.asarray(rows, dtype=np.float64).T
    given = [i for i in ids if i is not None]
    named = request_numbers(given, wheres.__getitem__) if len(given) == len(ids) else None
    run = MeasuredRun(
        source=str(file),
        ttft=first - queued,
        tpot=_tpot(last - first, out),
        e2e=last - queued,
        itl=None,
        prompt_len=inp.astype(np.int64),
        output_len=out.astype(np.int64),
        reference="queued",
        request_id=named,
    )
    return check_times(run, wheres.__getitem__)


def _tpot(decode_time: np.ndarray, output_len: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(output_len > 1, decode_time / (output_len - 1), np.nan)


def _lines(file: Path) -> list[str]:
    try:
        return file.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as err:
        raise InputError(f"{file}: not a UTF-8 text file ({err.reason})") from None


def _vllm_bench(file: Path) -> MeasuredRun:
    try:
        data = json.loads("\n".join(_lines(file)))
    except json.JSONDecodeError as err:
        raise InputError(f"{file}:{err.lineno}: invalid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected a JSON object (vllm bench serve --save-result)")
    need = ("input_lens", "output_lens", "ttfts", "itls")
    missing = [k for k in need if not isinstance(data.get(k), list)]
    if missing:
        raise InputError(
            f"{file}: missing list {missing[0]!r} (save it with --save-result --save-detailed)"
        )
    n = len(data["ttfts"])
    for key in need:
        if len(data[key]) != n:
            raise InputError(f"{file}: {key!r} has {len(data[key])} entries, 'ttfts' {n}")
    errors = data.get("errors") or [""] * n
    failed = [i for i, e in enumerate(errors) if e]
    if failed:
        raise InputError(
            f"{file}: {len(failed)} request(s) failed in the measurement "
            f"(e.g. #{failed[0]}: {str(errors[failed[0]]).splitlines()[0][:80]})"
        )
    ttft = np.array([_number(v, str(file), f"ttfts[{i}]") for i, v in enumerate(data["ttfts"])])
    gaps = [
        np.asarray([_number(g, str(file), f"itls[{i}]") for g in row])
        for i, row in enumerate(data["itls"])
    ]
    out = np.asarray([int(_number(v, str(file), "output_lens")) for v in data["output_lens"]])
    inp = np.asarray([int(_number(v, str(file), "input_lens")) for v in data["input_lens"]])
    submit, complete = data.get("request_submit_times"), data.get("request_complete_times")
    if (
        isinstance(submit, list)
        and isinstance(complete, list)
        and len(submit) == len(complete) == n
    ):
        e2e = np.asarray(complete, dtype=np.float64) - np.asarray(submit, dtype=np.float64)
    else:
        e2e = ttft + np.asarray([g.sum() for g in gaps])
    itl: np.ndarray | None = np.concatenate(gaps) if gaps else np.empty(0)
    if data.get("backend") == "servesim":
        # servesim's own file: its itls spread each request's decode time evenly (it keeps
        # no per-token times), so they are no measurement of the gaps
        itl = None
    run = MeasuredRun(
        source=str(file),
        ttft=ttft,
        tpot=_tpot(e2e - ttft, out),
        e2e=e2e,
        itl=itl,
        prompt_len=inp,
        output_len=out,
        reference="arrival",
    )
    return check_times(run, lambda i: f"{file}: request #{i} (ttfts[{i}])")


def _csv(file: Path) -> MeasuredRun:
    from simulator.cost.profiles.csvfile import read_columns

    kinds = {"request_id": "str", "ttft_s": "float", "tpot_s": "opt", "e2e_s": "float"}
    cols, lines = read_columns(file, kinds)  # type: ignore[arg-type]

    def row(i: int) -> str:
        return f"{file}:{lines[i]}"

    run = MeasuredRun(
        source=str(file),
        ttft=np.asarray(cols["ttft_s"]),
        tpot=np.asarray(cols["tpot_s"], dtype=np.float64),
        e2e=np.asarray(cols["e2e_s"]),
        itl=None,
        prompt_len=None,
        output_len=None,
        reference="arrival",
        request_id=request_numbers(cols["request_id"], row),
    )
    return check_times(run, row)


_NUMBERED = re.compile(r"(?:.*\D)?(\d+)")
"""An id ending in the request's number: ``7``, ``bench-7``."""


def request_numbers(ids: list[str], row: Callable[[int], str]) -> np.ndarray:
    """The request number each id ends in (``bench-7``: 7); an id without one, or one given
    twice, -> ``InputError`` naming its row."""
    numbers: dict[int, int] = {}
    for i, text in enumerate(ids):
        match = _NUMBERED.fullmatch(text.strip())
        if match is None:
            raise InputError(
                f"{row(i)}: request_id {text!r} names no request number (N or bench-N: the "
                "simulation numbers its requests 0, 1, ... in order)"
            )
        n = int(match.group(1))
        if n in numbers:
            raise InputError(f"{row(i)}: request_id {text!r} given twice (first {row(numbers[n])})")
        numbers[n] = i
    return np.asarray(list(numbers), dtype=np.int64)


def check_times(run: MeasuredRun, row: Callable[[int], str]) -> MeasuredRun:
    """``run``, unless a request's times cannot be: a negative TTFT, TPOT or E2E, or an E2E
    shorter than its TTFT (``InputError`` naming the row, ``row(i)`` for request ``i``)."""
    for name, values in (("TTFT", run.ttft), ("TPOT", run.tpot), ("E2E", run.e2e)):
        negative = np.flatnonzero(values < 0)  # NaN (undefined) is not negative
        if negative.size:
            i = int(negative[0])
            raise InputError(f"{row(i)}: {name} {values[i]:g} s is negative: not a latency")
    early = np.flatnonzero(run.e2e < run.ttft)
    if early.size:
        i = int(early[0])
        raise InputError(
            f"{row(i)}: E2E {run.e2e[i]:g} s is shorter than its TTFT {run.ttft[i]:g} s: "
            "a request cannot end before its first token"
        )
    return run


_SUMMARY_ROWS = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2e"}
_SUMMARY_STATS = {"Mean": "mean", "Median": "p50", "P90": "p90", "P99": "p99"}


def read_llmservingsim_summary(path: str | Path) -> dict[str, dict[str, float]]:
    """LLMServingSim's own sim-vs-real errors (``validation/summary.txt`` of a bench run):
    ``{metric: {stat: signed error %}}`` for TTFT, TPOT and E2E (its "Latency")."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"{path}: file not found")
    out: dict[str, dict[str, float]] = {}
    for line_no, line in enumerate(_lines(file), start=1):
        parts = line.split()
        if len(parts) == 5 and parts[0] in _SUMMARY_ROWS and parts[1] in _SUMMARY_STATS:
            try:
                error = float(parts[4].rstrip("%"))
            except ValueError:
                raise InputError(f"{file}:{line_no}: {parts[4]!r} is not a percentage") from None
            out.setdefault(_SUMMARY_ROWS[parts[0]], {})[_SUMMARY_STATS[parts[1]]] = error
    if len(out) != 3 or any(len(v) != 4 for v in out.values()):
        raise InputError(f"{file}: not an LLMServingSim validation summary")
    return out
