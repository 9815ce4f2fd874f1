"""Readers for request traces (Azure 2023 CSV, Mooncake JSONL, plain CSV) and length columns.

Every reader returns a :class:`~simulator.workload.Workload` on the trace's own time axis,
rebased so the earliest request arrives at 0 s; ``time_scale``, the time window and
``max_requests`` are applied later by :func:`simulator.workload.generate`.

Policy for odd rows (documented in ``docs/workloads.md``):

* unparsable number, missing value or column, non-integer or negative length, bad JSON:
  :class:`~simulator.errors.InputError` ``"FILE:LINE: reason"`` (header = line 1);
* a length of 0: raised to 1, counted in ``Workload.notes``;
* arrivals out of order: rows sorted stably by arrival time, counted in ``Workload.notes``;
* blank lines: ignored (line numbers still count them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from simulator.errors import InputError
from simulator.workload import Workload

__all__ = [
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
_PANDAS_LINE = re.compile(r"line (\d+)")


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
        table.numbers("arrival_s"), table.lengths("prompt_len"), table.lengths("output_len"), table
    )


def read_mooncake(path: str | Path) -> Workload:
    """Mooncake JSONL: one object per line with ``timestamp`` (ms), ``input_length``,
    ``output_length``; other fields (``hash_ids``...) are ignored."""
    file = _existing(path)
    values: list[list[float]] = [[], [], []]
    line_numbers: list[int] = []
    with file.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = _json_object(line, path, line_no)
            for column, key in zip(values, MOONCAKE_FIELDS, strict=True):
                column.append(_json_number(record, key, path, line_no))
            line_numbers.append(line_no)
    if not line_numbers:
        raise InputError(f"{path}: no requests in the file")
    lines = np.asarray(line_numbers, dtype=np.int64)
    where = _Where(str(path), lines)
    arrival_s = np.asarray(values[0], dtype=np.float64) / 1000.0
    prompt = _as_lengths(np.asarray(values[1]), "input_length", where)
    output = _as_lengths(np.asarray(values[2]), "output_length", where)
    return _finish(arrival_s, prompt, output, where)


def read_length_column(path: str | Path, column: str) -> tuple[np.ndarray, int]:
    """Token lengths from one CSV column (for ``dist: empirical``): ``(int64 values, zeros)``,
    where zeros were raised to 1 and ``zeros`` counts them."""
    table = _Table.load(path, (column,))
    return _raise_zeros(table.lengths(column))


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
        """Read ``path``; InputError if missing, malformed or lacking a ``required`` column."""
        file = _existing(path)
        frame = _read_strings(file, str(path))
        frame.columns = [str(c).strip() for c in frame.columns]
        missing = [c for c in required if c not in frame.columns]
        if missing:
            found = ", ".join(frame.columns)
            raise InputError(
                f"{path}:1: missing column {missing[0]!r} (header has: {found}){_hint(frame)}"
            )
        # Blank lines are kept by the parser so that row i sits on line i + 2; drop them now.
        blank = frame.isna().all(axis=1).to_numpy()
        lines = np.arange(2, len(frame) + 2, dtype=np.int64)[~blank]
        frame = frame.loc[~blank, list(required)].reset_index(drop=True)
        if frame.empty:
            raise InputError(f"{path}: no requests in the file (header only)")
        return cls(str(path), frame, lines)

    def numbers(self, column: str) -> np.ndarray:
        """A column as finite float64; InputError on the first missing or unparsable cell."""
        raw = self.frame[column]
        parsed = pd.to_numeric(raw.str.strip(), errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(parsed)
        if bad.any():
            row = int(np.argmax(bad))
            raise self.fail(row, f"column {column}: {_describe(raw.iloc[row])} is not a number")
        return parsed

    def lengths(self, column: str) -> np.ndarray:
        """A column of token counts as int64 >= 0."""
        return _as_lengths(self.numbers(column), column, self)

    def timestamps(self, column: str) -> np.ndarray:
        """Wall-clock timestamps as float64 seconds since the first row."""
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
        # Subtract in integer nanoseconds before converting, so float rounding never reorders rows.
        ns = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
        return (ns - ns[0]).astype(np.float64) / 1e9


def _hint(frame: pd.DataFrame) -> str:
    # The commonest mistake is a right file with the wrong `format:`; name the one that fits.
    columns = set(frame.columns)
    for fmt, expected in (("azure", AZURE_COLUMNS), ("csv", CSV_COLUMNS)):
        if columns.issuperset(expected):
            return f"; this looks like trace format {fmt!r}"
    return ""


def _existing(path: str | Path) -> Path:
    file = Path(path)
    if not file.is_file():
        # the public traces are not shipped; the README says where each one comes from
        raise InputError(
            f"{path}: file not found (relative to {Path.cwd()}; "
            "README.md 'Real traces' says where to download the public traces)"
        )
    return file


def _read_strings(file: Path, name: str) -> pd.DataFrame:
    try:
        return pd.read_csv(
            file, dtype=str, skip_blank_lines=False, keep_default_na=False, na_values=[""]
        )
    except pd.errors.EmptyDataError:
        raise InputError(f"{name}: empty file (expected a CSV header)") from None
    except pd.errors.ParserError as err:
        # pandas counts physical lines from 1 (header included) when blank lines are kept.
        match = _PANDAS_LINE.search(str(err))
        where = f"{name}:{match.group(1)}" if match else name
        detail = str(err).split("error: ")[-1].strip()
        raise InputError(f"{where}: malformed CSV row ({detail})") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{name}: not a UTF-8 text file ({err.reason})") from None


def _describe(cell: object) -> str:
    return "missing value" if cell is None or cell != cell else repr(cell)


def _as_lengths(values: np.ndarray, column: str, where: _Where) -> np.ndarray:
    values = values.astype(np.float64)
    bad = values != np.rint(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise where.fail(row, f"column {column}: token count {values[row]:g} is not an integer")
    negative = values < 0
    if negative.any():
        row = int(np.argmax(negative))
        raise where.fail(row, f"column {column}: token count {values[row]:g} is negative")
    return values.astype(np.int64)


def _raise_zeros(lengths: np.ndarray) -> tuple[np.ndarray, int]:
    zeros = int(np.count_nonzero(lengths == 0))
    return np.maximum(lengths, 1), zeros


def _json_object(line: str, path: str | Path, line_no: int) -> dict[str, object]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{line_no}: invalid JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
    return record


def _json_number(record: dict[str, object], key: str, path: str | Path, line_no: int) -> float:
    if key not in record:
        raise InputError(f"{path}:{line_no}: missing field {key!r}")
    value = record[key]
    # bool is an int subclass; a true/false length is a data error, not 1/0.
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise InputError(f"{path}:{line_no}: field {key!r}: {value!r} is not a number")
    return float(value)


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
