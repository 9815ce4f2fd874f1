"""Parquet files read back with their damage named: a truncated, corrupt or foreign file is
one line naming it instead of a traceback from pyarrow (results folders, step tables)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from simulator.errors import InputError, reason_of

if TYPE_CHECKING:
    import pandas as pd

# What a damaged parquet file raises while being opened or decoded: pyarrow's errors (ArrowIOError
# is an OSError), and from pandas' metadata in the schema a UnicodeDecodeError, a JSONDecodeError
# (both ValueError) or a KeyError. InputError is a ValueError too: it is re-raised untouched.
_DAMAGED = (OSError, pa.ArrowException, ValueError, KeyError)


def unreadable(path: Path | str, err: BaseException) -> InputError:
    """The one-line error of a parquet file that cannot be read."""
    # pyarrow repeats the path the message already starts with
    reason = re.sub(r"^Could not open Parquet input source '.*?': ", "", reason_of(err))
    return InputError(f"{path}: not a readable parquet file ({reason})")


def read_parquet(path: Path | str) -> pd.DataFrame:
    """A whole parquet table, or an InputError naming the file."""
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except InputError:
        raise
    except _DAMAGED as err:
        raise unreadable(path, err) from None


def open_parquet(path: Path | str) -> pq.ParquetFile:
    """A parquet file opened for reading a batch at a time (its footer read and checked)."""
    try:
        return pq.ParquetFile(path)
    except _DAMAGED as err:
        raise unreadable(path, err) from None


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
            raise unreadable(path, err) from None
        if frame is None:
            return
        yield frame
