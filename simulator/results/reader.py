"""Reading a results folder back (``servesim plot``, ``compare``): its parquet tables and
``sweep.json``, a truncated, corrupt or foreign file named in one line instead of a traceback
from pyarrow or json."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulator.errors import InputError, reason_of
from simulator.parquet_file import iter_parquet, open_parquet, read_parquet

__all__ = [
    "SWEEP_META",
    "iter_parquet",
    "open_parquet",
    "read_json",
    "read_parquet",
    "read_search_keys",
    "read_summary",
    "read_sweep_keys",
]

SWEEP_META = "sweep.json"
"""A sweep folder's grid: scenario, grid values, ``--set`` items and the grid keys."""


def read_json(path: Path, required: Sequence[str] = ()) -> dict[str, Any]:
    """A JSON object servesim wrote (``summary.json``, ``sweep.json``, ``capacity.json``...),
    with at least the ``required`` keys; anything else is an InputError naming the file."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as err:
        raise InputError(f"{path}: cannot read ({reason_of(err)})") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise InputError(f"{path}: not a {path.name} written by servesim ({err})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a {path.name} written by servesim (not an object)")
    missing = [k for k in required if k not in data]
    if missing:
        raise InputError(f"{path}: not a {path.name} written by servesim (no {missing[0]!r})")
    return data


def _keys(path: Path) -> list[str]:
    keys = read_json(path, ["keys"])["keys"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InputError(f"{path}: 'keys' is not a list of scenario keys")
    return keys


def read_sweep_keys(folder: Path) -> list[str]:
    """The grid keys of a sweep folder (none if its ``sweep.json`` is missing)."""
    meta_file = folder / SWEEP_META
    return _keys(meta_file) if meta_file.exists() else []


def read_search_keys(folder: Path) -> list[str]:
    """The keys a design-search folder searched (its ``search.json``)."""
    return _keys(folder / "search.json")


def read_summary(folder: Path) -> dict[str, Any]:
    """A run folder's ``summary.json`` (empty if it has none)."""
    path = folder / "summary.json"
    return read_json(path) if path.is_file() else {}
