"""Readers for request traces (Azure 2023 CSV, Mooncake JSONL, plain CSV) and length columns.

Every reader returns a :class:`~simulator.workload.Workload` on the trace's own time axis,
rebased so the earliest request arrives at 0 s; ``time_scale``, the time window and
``max_requests`` are applied later by :func:`simulator.workload.generate`.

Policy for odd rows (documented in ``docs/workloads.md``):

* unparsable number, missing value or column, non-integer or negative length, a length above
  :data:`MAX_TOKENS` or an arrival time beyond :data:`MAX_ARRIVAL_S`, a CSV row with more
  fields than the header, a required column named twice, bad JSON or a repeated JSON key:
  :class:`~simulator.errors.InputError` ``"FILE:LINE: reason"`` (header = line 1);
* a length of 0: raised to 1, counted in ``Workload.notes``;
* arrivals out of order: rows sorted stably by arrival time, counted in ``Workload.notes``;
* blank (or whitespace-only) lines: ignored (line numbers still count them);
* a UTF-8 byte-order mark and CRLF or CR line endings are accepted.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from simulator.errors import InputError
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

TraceFormat = Literal["azure", "mooncake", "csv"]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
CSV_COLUMNS = ("arrival_s", "prompt_len", "output_len")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
#: Largest token count a trace may hold (2**31 - 1); larger values are errors, not clamped.
MAX_TOKENS = 2**31 - 1
#: Largest magnitude of an arrival time, in seconds (about 31,700 years); keeps every
#: difference between arrival times finite and resolved to better than a millisecond.
MAX_ARRIVAL_S = 1e12
# Where pandas' C parser says a malformed record is: "line N" (1-based record, header = 1)
# or "row N" (0-based record); records, not physical lines, so only used as a fallback.
_PANDAS_RECORD = re.compile(r"\b(line|row) (\d+)")


def read_trace(path: str | Path, fmt: TraceFormat) -> Workload:
    """Read a trace file of format ``fmt`` ("azure", "mooncake" or "csv")."""
    readers = {"azure": read_azure, "mooncake": read_mooncake, "csv": read_csv_trace}
    if fmt not in readers:
        raise InputError(f"{path}: unknown trace format {fmt!r} (expected one of {list(readers)})")
    return readers[fmt](path)


def read_azure(path: str | Path) -> Workload:
    """Azure LLM inference trace 2023: ``TIMESTAMP, ContextTokens, GeneratedTokens``."""
    table = _Table.load(path, AZURE_COLUMNS)
    return _finish(
        table.timestamps("TIMESTAMP"),
        table.lengths("ContextTokens"),
        table.lengths("GeneratedTokens"),
        table,
    )


def read_csv_trace(path: str | Path) -> Workload:
    """Plain CSV with header ``arrival_s, prompt_len, output_len`` (seconds, tokens, tokens)."""
    table = _Table.load(path, CSV_COLUMNS)
    return _finish(
        table.seconds("arrival_s"), table.lengths("prompt_len"), table.lengths("output_len"), table
    )


def read_mooncake(path: str | Path) -> Workload:
    """Mooncake JSONL: one object per line with ``timestamp`` (ms), ``input_length``,
    ``output_length``; other fields (``hash_ids``...) are ignored."""
    file = _existing(path)
    # One decoder for all lines (faster than json.loads); its hook rejects repeated keys,
    # which json would otherwise resolve silently to the last value.
    decoder = json.JSONDecoder(object_pairs_hook=_unique_keys)
    # The values as parsed (int or float), kept for error messages: repr(10**20) is exact.
    values: list[list[int | float]] = [[], [], []]
    line_numbers: list[int] = []
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
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not a UTF-8 text file ({err.reason})") from None
    if not line_numbers:
        raise InputError(f"{path}: no requests in the file")
    where = _Where(str(path), np.asarray(line_numbers, dtype=np.int64))
    stamps, inputs, outputs = values
    timestamp_ms = np.asarray(stamps, dtype=np.float64)
    _check_range(
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
    return _finish(arrival_s, prompt, output, where)


def read_length_column(path: str | Path, column: str) -> tuple[np.ndarray, int]:
    """Token lengths from one CSV column (for ``dist: empirical``): ``(int64 values, zeros)``,
    where zeros were raised to 1 and ``zeros`` counts them."""
    table = _Table.load(path, (column,))
    return _raise_zeros(table.lengths(column))


_ARRIVAL_RANGE = f"arrival times must be within +-{MAX_ARRIVAL_S:.0e} s".replace("e+", "e")


class _Where:
    """A file name plus the 1-based line number of each row, for error messages."""

    def __init__(self, path: str, lines: np.ndarray) -> None:
        self.path = path
        self.lines = lines

    def fail(self, row: int, reason: str) -> InputError:
        """An InputError pointing at row ``row`` (0-based index into ``lines``)."""
        return InputError(f"{self.path}:{self.lines[row]}: {reason}")


class _Table(_Where):
    """A CSV file read as strings, blank lines removed, with each row's line number."""

    def __init__(self, path: str, frame: pd.DataFrame, lines: np.ndarray) -> None:
        super().__init__(path, lines)
        self.frame = frame

    @classmethod
    def load(cls, path: str | Path, required: Sequence[str]) -> _Table:
        """Read ``path``; InputError if missing, malformed, or lacking a ``required`` column
        or naming one twice. The result has exactly the ``required`` columns, in order."""
        file = _existing(path)
        name = str(path)
        data = file.read_bytes()
        # The header is parsed as a record too (header=None): pandas then never guesses an
        # index column from a first row longer than the header, and every longer row is a
        # ParserError rather than a shift of all columns by one.
        records = _read_records(data, name)
        header = [cell.strip() if isinstance(cell, str) else "" for cell in records.iloc[0]]
        missing = [c for c in required if c not in header]
        if missing:
            found = ", ".join(header)
            raise InputError(
                f"{name}:1: missing column {missing[0]!r} (header has: {found}){_hint(header)}"
            )
        twice = [c for c in required if header.count(c) > 1]
        if twice:
            raise InputError(f"{name}:1: column {twice[0]!r} appears more than once in the header")
        lines = _record_lines(data, records)[1:]
        body = records.iloc[1:]
        keep = ~_blank_lines(data, body, lines)
        frame = body.iloc[keep, [header.index(c) for c in required]]
        frame.columns = list(required)
        if frame.empty:
            raise InputError(f"{name}: no requests in the file (header only)")
        return cls(name, frame.reset_index(drop=True), lines[keep])

    def numbers(self, column: str) -> np.ndarray:
        """A column as finite float64; InputError on the first missing or unparsable cell."""
        raw = self.frame[column]
        parsed = pd.to_numeric(raw.str.strip(), errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(parsed)
        if bad.any():
            row = int(np.argmax(bad))
            cell = raw.iloc[row]
            # A literal inf/nan is "not a number"; digits that overflow a float are too large.
            overflow = np.isinf(parsed[row]) and "inf" not in cell.lower()
            reason = "is out of range" if overflow else "is not a number"
            raise self.fail(row, f"column {column}: {_describe(cell)} {reason}")
        return parsed

    def seconds(self, column: str) -> np.ndarray:
        """A column of arrival times in seconds, within +-MAX_ARRIVAL_S."""
        values = self.numbers(column)
        _check_range(
            np.abs(values) > MAX_ARRIVAL_S,
            lambda row: (
                f"column {column}: {self._text(column, row)} is out of range ({_ARRIVAL_RANGE})"
            ),
            self,
        )
        return values

    def lengths(self, column: str) -> np.ndarray:
        """A column of token counts as int64 in 0..MAX_TOKENS."""
        return _as_lengths(
            self.numbers(column), f"column {column}", self, lambda row: self._text(column, row)
        )

    def timestamps(self, column: str) -> np.ndarray:
        """Wall-clock timestamps as float64 seconds since the earliest row."""
        raw = self.frame[column]
        # ISO 8601 covers Azure's 7 fractional digits (pandas keeps up to 9) and rows printed
        # without a fraction; utc=True makes mixed offsets comparable (naive times count as UTC).
        parsed = pd.to_datetime(raw.str.strip(), format="ISO8601", utc=True, errors="coerce")
        bad = parsed.isna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            reason = (
                f"column {column}: {_describe(raw.iloc[row])} is not a YYYY-MM-DD HH:MM:SS[.f] time"
            )
            raise self.fail(row, reason)
        # Ticks in the unit pandas chose (ns, or us when a date is outside ns' 1677..2262
        # range), so nothing overflows in a conversion. Subtract in integers before converting,
        # so float rounding never reorders rows; the span of two valid times can exceed int64
        # but never uint64, so the wrapped int64 difference read as uint64 is exact.
        unit = parsed.dt.unit
        ticks = parsed.to_numpy(dtype=f"datetime64[{unit}]").view(np.int64)
        offset = (ticks - ticks.min()).view(np.uint64).astype(np.float64)
        return offset / float(np.timedelta64(1, "s") / np.timedelta64(1, unit))

    def _text(self, column: str, row: int) -> str:
        return str(self.frame[column].iloc[row]).strip()


def _hint(header: Sequence[str]) -> str:
    # The commonest mistake is a right file with the wrong `format:`; name the one that fits.
    columns = set(header)
    for fmt, expected in (("azure", AZURE_COLUMNS), ("csv", CSV_COLUMNS)):
        if columns.issuperset(expected):
            return f"; this looks like trace format {fmt!r}"
    return ""


def _existing(path: str | Path) -> Path:
    file = Path(path)
    if not file.is_file():
        # the public traces are not shipped: point at the downloader
        raise InputError(
            f"{path}: file not found (relative to {Path.cwd()}; "
            "`servesim fetch --list` shows the public traces it can download)"
        )
    return file


def _read_records(data: bytes, name: str) -> pd.DataFrame:
    """Every CSV record as strings (the header is record 0), blank lines kept as all-NaN."""
    try:
        # pandas drops a UTF-8 byte-order mark and accepts LF, CRLF and CR line endings.
        return pd.read_csv(
            io.BytesIO(data),
            header=None,
            dtype=str,
            skip_blank_lines=False,
            keep_default_na=False,
            na_values=[""],
        )
    except pd.errors.EmptyDataError:
        raise InputError(f"{name}: empty file (expected a CSV header)") from None
    except pd.errors.ParserError as err:
        raise _malformed(data, name, str(err)) from None
    except UnicodeDecodeError as err:
        raise InputError(f"{name}: not a UTF-8 text file ({err.reason})") from None


def _malformed(data: bytes, name: str, pandas_message: str) -> InputError:
    """The InputError for a file pandas could not tokenize, located by physical line.

    pandas counts records, not lines, which differ after a quoted field spanning lines; the
    csv module splits the same records and tells on which line each one starts."""
    reader = csv.reader(io.StringIO(data.decode("utf-8-sig", errors="replace"), newline=""))
    starts: list[int] = []  # the line on which each record starts
    expected = 0  # fields in the header
    line = 1
    try:
        for record in reader:
            if not starts:
                expected = len(record)
            elif len(record) > expected:
                return InputError(
                    f"{name}:{line}: malformed CSV row "
                    f"({expected} fields expected, {len(record)} found)"
                )
            starts.append(line)
            line = reader.line_num + 1
    except csv.Error:  # e.g. a field over the csv module's size limit: use pandas' report
        pass
    detail = " ".join(pandas_message.split("error: ")[-1].split())
    if detail.startswith("EOF inside string"):
        detail = f"a quoted field is never closed; {detail}"
    match = _PANDAS_RECORD.search(detail)
    where = name
    if match:
        # "line N" is 1-based and "row N" 0-based, both counting the header as a record.
        index = int(match.group(2)) - (match.group(1) == "line")
        if 0 <= index < len(starts):
            where = f"{name}:{starts[index]}"
    return InputError(f"{where}: malformed CSV row ({detail})")


def _record_lines(data: bytes, records: pd.DataFrame) -> np.ndarray:
    """The 1-based physical line on which each record starts (the header is line 1)."""
    n = len(records)
    breaks = data.count(b"\n")
    if b"\r" in data:
        breaks += data.count(b"\r") - data.count(b"\r\n")
    lines_in_file = breaks + (0 if data.endswith((b"\n", b"\r")) else 1)
    if lines_in_file == n:  # the usual case: one record per line
        return np.arange(1, n + 1, dtype=np.int64)
    # Quoted fields that span lines: count the line breaks inside each record's cells.
    inner = np.zeros(n, dtype=np.int64)
    for column in records.columns:
        counts = records[column].str.count(r"\r\n|\r|\n")
        inner += counts.fillna(0).to_numpy(dtype=np.int64)
    return np.arange(1, n + 1, dtype=np.int64) + np.concatenate(([0], np.cumsum(inner)[:-1]))


def _blank_lines(data: bytes, body: pd.DataFrame, lines: np.ndarray) -> np.ndarray:
    """Which records are blank or whitespace-only lines (``,,`` is a row of missing values)."""
    if body.shape[1] > 1:
        candidate = body.iloc[:, 1:].isna().all(axis=1).to_numpy(dtype=bool, copy=True)
    else:
        candidate = np.ones(len(body), dtype=bool)
    rows = np.flatnonzero(candidate)
    if len(rows) == 0:
        return candidate
    first = body.iloc[rows, 0]
    candidate[rows] = (first.isna() | first.str.strip().eq("")).to_numpy(dtype=bool)
    rows = np.flatnonzero(candidate)
    if len(rows) == 0:
        return candidate
    # pandas shows both a blank line and one of bare commas as all-missing: look at the line.
    physical = data.splitlines()
    for row in rows:
        candidate[row] = not physical[lines[row] - 1].strip()
    return candidate


def _describe(cell: object) -> str:
    # Whitespace around values is allowed, so a whitespace-only cell is a missing value too.
    missing = cell is None or cell != cell or (isinstance(cell, str) and not cell.strip())
    return "missing value" if missing else repr(cell)


def _check_range(bad: np.ndarray, reason: Callable[[int], str], where: _Where) -> None:
    if bad.any():
        row = int(np.argmax(bad))
        raise where.fail(row, reason(row))


def _as_lengths(
    values: np.ndarray, label: str, where: _Where, text: Callable[[int], str]
) -> np.ndarray:
    """Finite float64 token counts -> int64, checked to be integers in 0..MAX_TOKENS before the
    cast (a cast of a too-large float is undefined); ``text(row)`` is the value as written."""
    _check_range(
        values != np.rint(values),
        lambda row: f"{label}: token count {text(row)} is not an integer",
        where,
    )
    _check_range(values < 0, lambda row: f"{label}: token count {text(row)} is negative", where)
    _check_range(
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
    arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, where: _Where
) -> Workload:
    notes: list[str] = []
    backwards = int(np.count_nonzero(np.diff(arrival_s) < 0))
    if backwards:
        order = np.argsort(arrival_s, kind="stable")
        arrival_s, prompt, output = arrival_s[order], prompt[order], output[order]
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
    )
