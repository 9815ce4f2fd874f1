"""Reading a results folder back (``servesim plot``, ``compare``): its parquet tables and
``sweep.json``, a truncated, corrupt or foreign file named in one line instead of a traceback
from pyarrow or json."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.errors import InputError, reason_of

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

# What a damaged parquet file raises while being opened or decoded: pyarrow's errors (ArrowIOError
# is an OSError), and from pandas' metadata in the schema a UnicodeDecodeError, a JSONDecodeError
# (both ValueError) or a KeyError. InputError is a ValueError too: it is re-raised untouched.
_DAMAGED = (OSError, pa.ArrowException, ValueError, KeyError)


def _unreadable(path: Path | str, err: BaseException) -> InputError:
    # pyarrow repeats the path the message already starts with
    reason = re.sub(r"^Could not open Parquet input source '.*?': ", "", reason_of(err))
    return InputError(f"{path}: not a readable parquet file ({reason})")


def read_parquet(path: Path | str) -> pd.DataFrame:
    """A whole parquet table, or an InputError naming the file."""
    try:
        return pd.read_parquet(path)
    except InputError:
        raise
    except _DAMAGED as err:
        raise _unreadable(path, err) from None


def open_parquet(path: Path | str) -> pq.ParquetFile:
    """A parquet file opened for reading a batch at a time (its footer read and checked)."""
    try:
        return pq.ParquetFile(path)
    except _DAMAGED as err:
        raise _unreadable(path, err) from None


def iter_parquet(
    path: Path | str, table: pq.ParquetFile, columns: Sequence[str], batch_rows: int
) -> Iterator[pd.DataFrame]:
    """The columns of ``table`` (``open_parquet(path)``), ``batch_rows`` rows at a time; a row
    group that cannot be decoded is an InputError naming the file."""
    batches = table.iter_batches(batch_size=batch_rows, columns=list(columns))
    while True:
        try:
            batch = next(batches, None)
            frame = None if batch is None else batch.to_pandas()
        except InputError:
            raise
        except _DAMAGED as err:
            raise _unreadable(path, err) from None
        if frame is None:
            return
        yield frame


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
