"""A CSV file read as text cells with the physical line of each row, so every bad value is
reported as ``FILE:LINE: reason`` (header = line 1), also after quoted fields that span lines;
blank lines are dropped, a byte-order mark and CRLF or CR line endings accepted."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import InputError
from simulator.workload.inputs import existing_file

if TYPE_CHECKING:
    import pandas as pd

# Where pandas' C parser says a malformed record is: "line N" (1-based record, header = 1)
# or "row N" (0-based record); records, not physical lines, so only used as a fallback.
_PANDAS_RECORD = re.compile(r"\b(line|row) (\d+)")


class Where:
    """A file name plus the 1-based line number of each row, for error messages."""

    def __init__(self, path: str, lines: np.ndarray) -> None:
        self.path = path
        self.lines = lines

    def fail(self, row: int, reason: str) -> InputError:
        """An InputError pointing at row ``row`` (0-based index into ``lines``)."""
        return InputError(f"{self.path}:{self.lines[row]}: {reason}")


class CsvTable(Where):
    """A CSV file read as strings, blank lines removed, with each row's line number."""

    def __init__(self, path: str, frame: pd.DataFrame, lines: np.ndarray) -> None:
        super().__init__(path, lines)
        self.frame = frame

    @classmethod
    def load(
        cls,
        path: str | Path,
        required: Sequence[str],
        hint: Callable[[list[str]], str],
        optional: Sequence[str] = (),
        what: str = "requests",
    ) -> CsvTable:
        """Read ``path``; InputError if missing, malformed, or lacking a ``required`` column
        or naming one (or an ``optional`` one) twice (``hint(header)`` ends that message), or
        with no row (``what`` the rows are, for that message). The result has the
        ``required`` columns, in order, then the ``optional`` ones present."""
        file = existing_file(path)
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
                f"{name}:1: missing column {missing[0]!r} (header has: {found}){hint(header)}"
            )
        twice = [c for c in (*required, *optional) if header.count(c) > 1]
        if twice:
            raise InputError(f"{name}:1: column {twice[0]!r} appears more than once in the header")
        lines = _record_lines(data, records)[1:]
        body = records.iloc[1:]
        keep = ~_blank_lines(data, body, lines)
        columns = [*required, *(c for c in optional if c in header)]
        frame = body.iloc[keep, [header.index(c) for c in columns]]
        frame.columns = columns
        if frame.empty:
            raise InputError(f"{name}: no {what} in the file (header only)")
        return cls(name, frame.reset_index(drop=True), lines[keep])

    def numbers(self, column: str) -> np.ndarray:
        """A column as finite float64; InputError on the first missing or unparsable cell."""
        import pandas as pd

        raw = self.frame[column]
        parsed = pd.to_numeric(raw.str.strip(), errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(parsed)
        if bad.any():
            row = int(np.argmax(bad))
            cell = raw.iloc[row]
            # A literal inf/nan is "not a number"; digits that overflow a float are too large.
            overflow = np.isinf(parsed[row]) and "inf" not in cell.lower()
            reason = "is out of range" if overflow else "is not a number"
            raise self.fail(row, f"column {column}: {describe_cell(cell)} {reason}")
        return parsed

    def timestamps(self, column: str) -> np.ndarray:
        """Wall-clock timestamps as float64 seconds since the earliest row."""
        import pandas as pd

        raw = self.frame[column]
        # ISO 8601 covers Azure's 7 fractional digits (pandas keeps up to 9) and rows printed
        # without a fraction; utc=True makes mixed offsets comparable (naive times count as UTC).
        parsed = pd.to_datetime(raw.str.strip(), format="ISO8601", utc=True, errors="coerce")
        bad = parsed.isna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            cell = describe_cell(raw.iloc[row])
            reason = f"column {column}: {cell} is not a YYYY-MM-DD HH:MM:SS[.f] time"
            raise self.fail(row, reason)
        # Ticks in the unit pandas chose (ns, or us when a date is outside ns' 1677..2262
        # range), so nothing overflows in a conversion. Subtract in integers before converting,
        # so float rounding never reorders rows; the span of two valid times can exceed int64
        # but never uint64, so the wrapped int64 difference read as uint64 is exact.
        unit = parsed.dt.unit
        ticks = parsed.to_numpy(dtype=f"datetime64[{unit}]").view(np.int64)
        offset = (ticks - ticks.min()).view(np.uint64).astype(np.float64)
        return offset / float(np.timedelta64(1, "s") / np.timedelta64(1, unit))

    def text(self, column: str, row: int) -> str:
        """A cell as written, without surrounding whitespace."""
        return str(self.frame[column].iloc[row]).strip()


def _read_records(data: bytes, name: str) -> pd.DataFrame:
    """Every CSV record as strings (the header is record 0), blank lines kept as all-NaN."""
    import pandas as pd

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


def describe_cell(cell: object) -> str:
    """A cell for an error message: its repr, or "missing value"."""
    # Whitespace around values is allowed, so a whitespace-only cell is a missing value too.
    missing = cell is None or cell != cell or (isinstance(cell, str) and not cell.strip())
    return "missing value" if missing else repr(cell)


def check_range(bad: np.ndarray, reason: Callable[[int], str], where: Where) -> None:
    """Raise ``where.fail`` at the first row where ``bad`` is set, with ``reason(row)``."""
    if bad.any():
        row = int(np.argmax(bad))
        raise where.fail(row, reason(row))
