"""Reading a profile's CSV tables: typed columns, and one ``FILE:LINE`` line for any bad row."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np

from simulator.errors import InputError

Kind = Literal["int", "float", "opt", "str"]


def read_columns(path: Path, columns: Mapping[str, Kind]) -> tuple[dict[str, list], list[int]]:
    """The named columns of a headed CSV file, parsed (``int``: a non-negative integer,
    ``float``: a finite number >= 0, ``opt``: the same or empty (NaN), ``str``: stripped
    text), and each row's line number.
    Blank lines are skipped; a missing file or column, a row with a different number of
    fields than the header, or a value that does not parse is an ``InputError``
    ``FILE:LINE: reason``. Other columns are ignored."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not a UTF-8 text file ({err.reason})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    reader = csv.reader(text.splitlines())
    header = [h.strip() for h in next(reader, [])]
    if not header:
        raise InputError(f"{path}: empty file (expected a CSV header)")
    missing = [c for c in columns if c not in header]
    if missing:
        raise InputError(
            f"{path}:1: missing column {missing[0]!r} (header has: {', '.join(header)})"
        )
    index = {name: header.index(name) for name in columns}
    rows: list[list[str]] = []
    lines: list[int] = []
    width = len(header)
    for line_no, row in enumerate(reader, start=2):
        if len(row) != width:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # a blank line
            raise InputError(
                f"{path}:{line_no}: malformed row ({width} fields expected, {len(row)} found)"
            )
        rows.append(row)
        lines.append(line_no)
    if not rows:
        raise InputError(f"{path}: no rows (header only)")
    cells = list(zip(*rows, strict=True))
    out = {
        name: _column(cells[index[name]], kind, name, path, lines) for name, kind in columns.items()
    }
    return out, lines


def _column(cells: tuple[str, ...], kind: Kind, name: str, path: Path, lines: list[int]) -> list:
    """A whole column parsed at once (numpy); the first bad cell, if any, reported by line."""
    if kind == "str":
        values = [c.strip() for c in cells]
        if all(values):
            return values
    elif kind == "opt":
        cells = tuple(c if c.strip() else "nan" for c in cells)
        try:
            numbers = np.asarray(cells, dtype=np.float64)
        except ValueError:
            numbers = None
        if numbers is not None and not np.any(np.isinf(numbers) | (numbers < 0)):
            return numbers.tolist()
        kind = "float"
    else:
        try:
            numbers = np.asarray(cells, dtype=np.float64)
        except ValueError:
            numbers = None
        ok = numbers is not None and bool(np.all(np.isfinite(numbers) & (numbers >= 0)))
        if ok and kind == "int" and numbers is not None:
            ok = bool(np.all(numbers == np.floor(numbers)))
            if ok:
                return numbers.astype(np.int64).tolist()
        elif ok and numbers is not None:
            return numbers.tolist()
    for cell, line_no in zip(cells, lines, strict=True):  # find the first bad cell
        _parse(cell.strip(), kind, name, path, line_no)
    raise AssertionError("unreachable: a bad column has a bad cell")


def _parse(cell: str, kind: Kind, name: str, path: Path, line_no: int) -> int | float | str:
    if kind == "opt" and cell in ("", "nan"):
        return math.nan
    if kind == "str":
        if not cell:
            raise InputError(f"{path}:{line_no}: column {name}: missing value")
        return cell
    try:
        value = float(cell)
    except ValueError:
        what = "missing value" if not cell else repr(cell)
        raise InputError(f"{path}:{line_no}: column {name}: {what} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{path}:{line_no}: column {name}: {cell!r} must be finite and >= 0")
    if kind == "int":
        if value != int(value):
            raise InputError(f"{path}:{line_no}: column {name}: {cell!r} is not an integer")
        return int(value)
    return value
