"""Readers for request traces (Azure 2023 CSV, Mooncake JSONL, plain CSV, token-id JSONL) and
length columns. Token identity (for the prefix cache): Mooncake's ``hash_ids``, a CSV's
optional ``hash_ids`` column (``hash_ids.py``), token ids (``token_traces.py``); images: a
CSV's ``mm_*`` columns (``trace_images.py``). Every reader returns a ``Workload`` on the
trace's own time axis, rebased so the earliest request arrives at 0 s; ``time_scale``, the
time window and ``max_requests`` are applied later by :func:`simulator.workload.generate`.
Policy for odd rows (documented in ``docs/workloads.md``):
* unparsable number, missing value or column, non-integer or negative length, a length above
  ``MAX_TOKENS`` or an arrival time beyond ``MAX_ARRIVAL_S``, a CSV row with more fields than
  the header, a required column named twice, bad JSON or a repeated JSON key: ``InputError``
  ``"FILE:LINE: reason"`` (header = line 1); a length of 0: raised to 1, in ``Workload.notes``;
* arrivals out of order: rows sorted stably by arrival time, counted in ``Workload.notes``;
* blank (or whitespace-only) lines: ignored (line numbers still count them); a UTF-8
  byte-order mark and CRLF or CR line endings are accepted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np

from simulator.errors import InputError
from simulator.registry import Registry
from simulator.workload.csv_table import CsvTable, Where, check_range, existing_file
from simulator.workload.hash_ids import check_json_ids, parse_cell, runs_from_hash_ids
from simulator.workload.multimodal import MMItems
from simulator.workload.prompt_runs import PromptRuns
from simulator.workload.token_traces import read_token_trace
from simulator.workload.trace_images import IMAGE_COLUMNS, trace_images
from simulator.workload.workload import Workload

__all__ = [
    "MAX_ARRIVAL_S",
    "MAX_TOKENS",
    "TraceFormat",
    "read_azure",
    "read_csv_trace",
    "read_length_column",
    "read_mooncake",
    "read_trace",
]

TraceFormat = str
"""A name in ``TRACE_READERS``, or a reader's import path (``module:function``)."""

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
CSV_COLUMNS = ("arrival_s", "prompt_len", "output_len")
CSV_OPTIONAL = ("priority", "hash_ids", *IMAGE_COLUMNS)
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
#: Largest token count a trace may hold (2**31 - 1); larger values are errors, not clamped.
MAX_TOKENS = 2**31 - 1
#: Largest magnitude of an arrival time, in seconds (about 31,700 years); keeps every
#: difference between arrival times finite and resolved to better than a millisecond.
MAX_ARRIVAL_S = 1e12


TraceReader = Callable[[str | Path, int], Workload]
"""Reads a trace file into a workload; each hash id covers the given prompt tokens."""


def read_trace(path: str | Path, fmt: TraceFormat, hash_block_tokens: int = 512) -> Workload:
    """Read a trace file of format ``fmt`` (``TRACE_READERS``: "azure", "mooncake", "csv",
    "llmservingsim", or by import path); each hash id covers ``hash_block_tokens`` tokens."""
    try:
        reader = TRACE_READERS.resolve(fmt)
    except ValueError as err:
        raise InputError(f"{path}: {err}") from None
    if fmt in ("mooncake", "llmservingsim"):
        with _json_lines_expected(path, fmt):
            return reader(path, hash_block_tokens)
    return reader(path, hash_block_tokens)


@contextmanager
def _json_lines_expected(path: str | Path, fmt: str) -> Iterator[None]:
    """A JSON-lines reader's error on a file that is CSV gets the format meant (a CSV read as
    ``mooncake`` otherwise says only ``:1: invalid JSON``)."""
    try:
        yield
    except InputError as err:
        header = _first_line(path)
        if not f"{err}".startswith(f"{path}:") or header is None or header.startswith("{"):
            raise
        columns = {c.strip() for c in header.split(",")}
        meant = [
            f
            for f, cols in (("azure", AZURE_COLUMNS), ("csv", CSV_COLUMNS))
            if set(cols) <= columns
        ]
        fix = (
            f"set workload.trace.format to {meant[0]}"
            if meant
            else "formats azure and csv read CSV"
        )
        raise InputError(
            f"{err}; the file looks like CSV (first line {header[:60]!r}), but format {fmt} "
            f"reads one JSON object per line: {fix}"
        ) from None


def _first_line(path: str | Path) -> str | None:
    """The first non-blank line of a text file (at most 4 KiB of it), None if unreadable."""
    try:
        with Path(path).open(encoding="utf-8-sig", errors="replace") as handle:
            start = handle.read(4096)
    except OSError:
        return None
    return next((line.strip() for line in start.splitlines() if line.strip()), None)


def read_azure(path: str | Path) -> Workload:
    """Azure LLM inference trace 2023: ``TIMESTAMP, ContextTokens, GeneratedTokens``."""
    table = CsvTable.load(path, AZURE_COLUMNS, _hint)
    return _finish(
        table.timestamps("TIMESTAMP"),
        _lengths(table, "ContextTokens"),
        _lengths(table, "GeneratedTokens"),
        table,
    )


def read_csv_trace(path: str | Path, hash_block_tokens: int = 512) -> Workload:
    """Plain CSV with header ``arrival_s, prompt_len, output_len`` (seconds, tokens, tokens)
    and optional ``priority`` (integer, lower first) and ``hash_ids`` (ids separated by
    spaces, each ``hash_block_tokens`` prompt tokens) columns, and images (``trace_images``)."""
    table = CsvTable.load(path, CSV_COLUMNS, _hint, CSV_OPTIONAL)
    arrival_s = _seconds(table, "arrival_s")
    prompt = _lengths(table, "prompt_len")
    output = _lengths(table, "output_len")
    priority = _integers(table, "priority") if "priority" in table.frame else None
    runs = None
    if "hash_ids" in table.frame:

        def fail(row: int, why: str) -> InputError:
            return table.fail(row, f"column hash_ids: {why}")

        cells = table.frame["hash_ids"].tolist()
        ids = [parse_cell(c, partial(fail, row)) for row, c in enumerate(cells)]
        runs = runs_from_hash_ids(ids, prompt, hash_block_tokens, fail)
    return _finish(arrival_s, prompt, output, table, priority, runs, trace_images(table, prompt))


def read_token_ids(path: str | Path) -> Workload:
    """Token-id JSONL (``token_traces.py``): arrivals in ns, lengths, prompt token ids."""
    existing_file(path)
    arrival_s, prompt, output, runs, lines = read_token_trace(path)
    where = Where(str(path), np.asarray(lines, dtype=np.int64))
    check_range(
        np.abs(arrival_s) > MAX_ARRIVAL_S,
        lambda row: f"field 'arrival_time_ns' is out of range ({_ARRIVAL_RANGE})",
        where,
    )
    return _finish(arrival_s, prompt, output, where, runs=runs)


def read_mooncake(path: str | Path, hash_block_tokens: int = 512) -> Workload:
    """Mooncake JSONL: one object per line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` and optional ``hash_ids`` (each ``hash_block_tokens`` prompt tokens)."""
    file = existing_file(path)
    # One decoder for all lines (faster than json.loads); its hook rejects repeated keys,
    # which json would otherwise resolve silently to the last value.
    decoder = json.JSONDecoder(object_pairs_hook=_unique_keys)
    # The values as parsed (int or float), kept for error messages: repr(10**20) is exact.
    values: list[list[int | float]] = [[], [], []]
    line_numbers: list[int] = []
    hash_ids: list[list[int]] = []
    try:
        # utf-8-sig: a byte-order mark at the start is dropped; universal newlines take CRLF.
        with file.open(encoding="utf-8-sig") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                record = _json_object(decoder, line, path, line_no)
                for column, key in zip(values, MOONCAKE_FIELDS, strict=True):
                    column.append(_json_number(record, key, path, line_no))
                line_numbers.append(line_no)
                hash_ids.append(
                    check_json_ids(
                        record.get("hash_ids", []), partial(_hash_ids_error, path, line_no)
                    )
                )
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not a UTF-8 text file ({err.reason})") from None
    if not line_numbers:
        raise InputError(f"{path}: no requests in the file")
    where = Where(str(path), np.asarray(line_numbers, dtype=np.int64))
    stamps, inputs, outputs = values
    timestamp_ms = np.asarray(stamps, dtype=np.float64)
    check_range(
        np.abs(timestamp_ms) > MAX_ARRIVAL_S * 1000.0,
        lambda row: f"field 'timestamp': {stamps[row]!r} ms is out of range ({_ARRIVAL_RANGE})",
        where,
    )
    arrival_s = timestamp_ms / 1000.0
    prompt = _as_lengths(
        np.asarray(inputs, dtype=np.float64),
        "field 'input_length'",
        where,
        lambda row: repr(inputs[row]),
    )
    output = _as_lengths(
        np.asarray(outputs, dtype=np.float64),
        "field 'output_length'",
        where,
        lambda row: repr(outputs[row]),
    )
    runs = None
    if any(hash_ids):
        runs = runs_from_hash_ids(
            hash_ids,
            prompt,
            hash_block_tokens,
            lambda row, why: where.fail(row, f"field 'hash_ids': {why}"),
        )
    return _finish(arrival_s, prompt, output, where, runs=runs)


def _hash_ids_error(path: str | Path, line_no: int, why: str) -> InputError:
    return InputError(f"{path}:{line_no}: field 'hash_ids': {why}")


def read_length_column(path: str | Path, column: str) -> tuple[np.ndarray, int]:
    """Token lengths from one CSV column (for ``dist: empirical``): ``(int64 values, zeros)``,
    where zeros were raised to 1 and ``zeros`` counts them."""
    table = CsvTable.load(path, (column,), _hint)
    return _raise_zeros(_lengths(table, column))


_ARRIVAL_RANGE = f"arrival times must be within +-{MAX_ARRIVAL_S:.0e} s".replace("e+", "e")


def _seconds(table: CsvTable, column: str) -> np.ndarray:
    """A column of arrival times in seconds, within +-MAX_ARRIVAL_S."""
    values = table.numbers(column)
    check_range(
        np.abs(values) > MAX_ARRIVAL_S,
        lambda row: (
            f"column {column}: {table.text(column, row)} is out of range ({_ARRIVAL_RANGE})"
        ),
        table,
    )
    return values


def _integers(table: CsvTable, column: str) -> np.ndarray:
    """A column of integers (sign allowed) within +-2**31, as int64."""
    values = table.numbers(column)
    check_range(
        (values != np.rint(values)) | (np.abs(values) > 2**31),
        lambda row: f"column {column}: {table.text(column, row)} is not an integer in +-2**31",
        table,
    )
    return values.astype(np.int64)


def _lengths(table: CsvTable, column: str) -> np.ndarray:
    """A column of token counts as int64 in 0..MAX_TOKENS."""
    return _as_lengths(
        table.numbers(column), f"column {column}", table, lambda row: table.text(column, row)
    )


def _hint(header: Sequence[str]) -> str:
    # The commonest mistake is a right file with the wrong `format:`; name the one that fits.
    columns = set(header)
    for fmt, expected in (("azure", AZURE_COLUMNS), ("csv", CSV_COLUMNS)):
        if columns.issuperset(expected):
            return f"; this looks like trace format {fmt!r}"
    return ""


def _as_lengths(
    values: np.ndarray, label: str, where: Where, text: Callable[[int], str]
) -> np.ndarray:
    """Finite float64 token counts -> int64, checked to be integers in 0..MAX_TOKENS before the
    cast (a cast of a too-large float is undefined); ``text(row)`` is the value as written."""
    check_range(
        values != np.rint(values),
        lambda row: f"{label}: token count {text(row)} is not an integer",
        where,
    )
    check_range(values < 0, lambda row: f"{label}: token count {text(row)} is negative", where)
    check_range(
        values > MAX_TOKENS,
        lambda row: f"{label}: {text(row)} is out of range (token counts are at most {MAX_TOKENS})",
        where,
    )
    return values.astype(np.int64)


def _raise_zeros(lengths: np.ndarray) -> tuple[np.ndarray, int]:
    zeros = int(np.count_nonzero(lengths == 0))
    return np.maximum(lengths, 1), zeros


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return record


def _json_object(
    decoder: json.JSONDecoder, line: str, path: str | Path, line_no: int
) -> dict[str, object]:
    try:
        record = decoder.decode(line)
    except _RepeatedKey as err:
        raise InputError(f"{path}:{line_no}: key {err.key!r} appears more than once") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{line_no}: invalid JSON ({err.msg})") from None
    except (ValueError, RecursionError) as err:  # an int over 4300 digits, deep nesting
        raise InputError(f"{path}:{line_no}: invalid JSON ({err})") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
    return record


def _json_number(
    record: dict[str, object], key: str, path: str | Path, line_no: int
) -> int | float:
    """The field as parsed (int or float, for exact error messages); finite as a float."""
    if key not in record:
        raise InputError(f"{path}:{line_no}: missing field {key!r}")
    value = record[key]
    # bool is an int subclass; a true/false length is a data error, not 1/0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{path}:{line_no}: field {key!r}: {value!r} is not a number")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        raise InputError(f"{path}:{line_no}: field {key!r}: {value!r} is out of range") from None
    if not math.isfinite(number):
        raise InputError(f"{path}:{line_no}: field {key!r}: {value!r} is not a number")
    return value


def _finish(
    arrival_s: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    where: Where,
    priority: np.ndarray | None = None,
    runs: PromptRuns | None = None,
    mm: MMItems | None = None,
) -> Workload:
    notes: list[str] = []
    backwards = int(np.count_nonzero(np.diff(arrival_s) < 0))
    if backwards:
        order = np.argsort(arrival_s, kind="stable")
        arrival_s, prompt, output = arrival_s[order], prompt[order], output[order]
        priority = priority[order] if priority is not None else None
        runs = runs.take(order) if runs is not None else None
        mm = mm.take(order) if mm is not None else None
        notes.append(
            f"{where.path}: {backwards} rows arrive before the row above them; "
            "rows sorted by arrival time (stable)"
        )
    for name, column in (("prompt", prompt), ("output", output)):
        zeros = int(np.count_nonzero(column == 0))
        if zeros:
            notes.append(f"{where.path}: {zeros} rows with {name} length 0 set to 1")
    return Workload(
        arrival_s=arrival_s - arrival_s[0],
        prompt_len=np.maximum(prompt, 1),
        output_len=np.maximum(output, 1),
        notes=tuple(notes),
        priority=priority,
        prompt_runs=runs,
        mm=mm,
    )


TRACE_READERS: Registry[TraceReader] = Registry(
    "trace format",
    {
        "azure": lambda path, _: read_azure(path),
        "mooncake": read_mooncake,
        "csv": read_csv_trace,
        "llmservingsim": lambda path, _: read_token_ids(path),
    },
)
"""``workload.trace.format`` -> its reader; a scenario may also name a ``TraceReader`` by
import path (``module:function``)."""
