"""Tables for the console: at most 120 columns (a wide table wraps into blocks of columns,
each repeating the row's identifying columns), headings on two lines (name, unit), and one
number format per column (integers as integers, other figures to three significant digits of
the column's typical value)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

WIDTH = 120
"""Columns a console table may take."""

GAP = 2
"""Spaces between columns."""


def render(table: Any, ident: int, width: int = WIDTH) -> str:
    """``table`` (a DataFrame whose column names may be ``"name (unit)"``) as text at most
    ``width`` wide; its first ``ident`` columns name the row and head every block."""
    columns = [_column(str(name), table[name].tolist()) for name in table.columns]
    keys, rest = columns[:ident], columns[ident:]
    blocks: list[list[list[str]]] = []
    used = _width(keys)
    block: list[list[str]] = []
    for col in rest:
        if block and used + GAP + len(col[0]) > width:
            blocks.append(block)
            block, used = [], _width(keys)
        block.append(col)
        used += GAP + len(col[0])
    blocks.append(block)
    parts = ["\n".join(_lines(keys + b)) for b in blocks]
    return "\n\n".join(parts)


def _width(columns: list[list[str]]) -> int:
    return sum(len(c[0]) for c in columns) + GAP * max(len(columns) - 1, 0)


def _lines(columns: list[list[str]]) -> list[str]:
    """Rows of padded cells (each column a list of equal-width cells, headings first)."""
    return [(" " * GAP).join(cells).rstrip() for cells in zip(*columns, strict=True)]


def _column(name: str, values: list[Any]) -> list[str]:
    """One column's cells, right-aligned to one width: two heading lines, then the values."""
    head, _, unit = name.partition(" (")
    heading = [head, f"({unit}" if unit else ""]
    cells = format_values(values)
    w = max(len(s) for s in heading + cells)
    text = all(not _is_number(v) for v in values if v is not None)
    align = str.ljust if text else str.rjust
    return [align(s, w) for s in heading + cells]


def _is_number(value: Any) -> bool:
    """A real number (numpy's included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def format_values(values: list[Any]) -> list[str]:
    """A column's values in one format: integers with thousands separators when every
    figure is whole, else the decimals that give its median magnitude three significant
    digits (at most 4); text as it is; NaN and None as ``-``."""
    numbers = [float(v) for v in values if _is_number(v) and math.isfinite(float(v))]
    if not numbers:
        decimals = 0
    elif all(n == int(n) for n in numbers):
        decimals = -1  # integers
    else:
        typical = sorted(abs(n) for n in numbers)[len(numbers) // 2] or max(map(abs, numbers))
        digits = math.floor(math.log10(typical)) + 1 if typical > 0 else 1
        decimals = min(4, max(0, 3 - digits))
    out = []
    for v in values:
        if not _is_number(v):
            out.append("-" if v is None else str(v))
        elif not math.isfinite(float(v)):
            out.append("-")
        elif decimals < 0:
            out.append(f"{int(v):,}")
        else:
            out.append(f"{float(v):,.{decimals}f}")
    return out
