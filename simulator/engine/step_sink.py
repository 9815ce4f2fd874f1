"""Where the step table goes as a run records it, a chunk of rows at a time: kept in memory,
streamed to a parquet file, thinned to a sample, or dropped."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.metrics import STEP_COLUMNS, frame_of
from simulator.metrics.columns import arrow_array

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.parquet as pq

STEP_MODES = ("full", "sampled", "none")
"""What ``--steps`` may ask for."""

SAMPLE_EVERY = 100
"""``sampled`` keeps one step in this many, plus every step that preempted."""


class StepSink(ABC):
    """Receives consecutive chunks of the step table."""

    @abstractmethod
    def write(self, chunk: pd.DataFrame) -> None:
        """Take the next rows."""

    def write_columns(self, cols: dict[str, np.ndarray]) -> None:
        """Take the next rows as their columns (``metrics.step_columns``, which may be views
        of buffers reused later: a sink that keeps them copies them)."""
        self.write(frame_of(cols))

    @abstractmethod
    def close(self) -> pd.DataFrame | None:
        """No more rows: the table, if this sink keeps it in memory."""

    def close_columns(self) -> dict[str, np.ndarray] | None:
        """``close()``, the table as its columns (a cluster merges its replicas' so)."""
        frame = self.close()
        return None if frame is None else {c: frame[c].to_numpy() for c in frame.columns}


class MemorySink(StepSink):
    """Keeps every chunk; ``close()`` returns the whole table."""

    def __init__(self) -> None:
        # columns, not frames: a frame per chunk and their concatenation cost more than
        # the rows' own arrays (a 64-replica cluster merged its steps in 0.3 s through pandas)
        self._chunks: list[dict[str, np.ndarray]] = []

    def write(self, chunk: pd.DataFrame) -> None:
        """Keep the rows."""
        if len(chunk):
            self._chunks.append({c: chunk[c].to_numpy(copy=True) for c in chunk.columns})

    def write_columns(self, cols: dict[str, np.ndarray]) -> None:
        """Keep the rows (copies: the columns may be views of reused buffers)."""
        if len(cols["step"]):
            self._chunks.append({name: values.copy() for name, values in cols.items()})

    def close_columns(self) -> dict[str, np.ndarray]:
        """The step table as its columns (float64 and empty when no step ran)."""
        chunks = self._chunks
        if not chunks:
            return {c: np.zeros(0) for c in STEP_COLUMNS}
        if len(chunks) == 1:
            return chunks[0]
        return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}

    def close(self) -> pd.DataFrame:
        """The step table (with its columns even when no step ran)."""
        import pandas as pd

        return pd.DataFrame(self.close_columns(), copy=False)


class ParquetSink(StepSink):
    """Streams the table into a parquet file, one row group per chunk (the file is complete
    only after ``close()``; write it inside a temporary folder)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: pq.ParquetWriter | None = None

    def write(self, chunk: pd.DataFrame) -> None:
        """Append the rows as a row group."""
        self.write_columns({name: chunk[name].to_numpy() for name in chunk.columns})

    def write_columns(self, cols: dict[str, np.ndarray]) -> None:
        """Append the rows as a row group, straight from their columns (no frame: a frame and
        its conversion took 10-15 ms per 65,536 rows, the arrays 0.1 ms)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrays = [arrow_array(v) for v in cols.values()]
        if self._writer is None:
            schema = pa.Table.from_arrays(arrays, names=list(cols)).schema
            # no dictionary pages: step columns barely repeat, and trying them doubled the
            # write time (0.62 s against 0.29 s for 1.5 M rows, the file 10% larger)
            self._writer = pq.ParquetWriter(self.path, schema, use_dictionary=False)
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self._writer.schema))

    def close(self) -> None:
        """Finish the file (an empty table, every column float64, when no step ran)."""
        if self._writer is None:
            import pyarrow as pa
            import pyarrow.parquet as pq

            empty = [arrow_array(np.zeros(0)) for _ in STEP_COLUMNS]
            pq.write_table(pa.Table.from_arrays(empty, names=STEP_COLUMNS), self.path)
            return
        self._writer.close()


class SampledSink(StepSink):
    """Passes on one step in ``every`` (by step number) and every step that preempted."""

    def __init__(self, inner: StepSink, every: int = SAMPLE_EVERY) -> None:
        self.inner = inner
        self.every = every

    def write(self, chunk: pd.DataFrame) -> None:
        """Pass on the sampled rows."""
        keep = (chunk["step"].to_numpy() % self.every == 0) | (
            chunk["num_preemptions"].to_numpy() > 0
        )
        self.inner.write(chunk[keep].reset_index(drop=True))

    def write_columns(self, cols: dict[str, np.ndarray]) -> None:
        """Pass on the sampled rows, as columns."""
        keep = (cols["step"] % self.every == 0) | (cols["num_preemptions"] > 0)
        self.inner.write_columns({name: values[keep] for name, values in cols.items()})

    def close(self) -> pd.DataFrame | None:
        """Close the inner sink."""
        return self.inner.close()

    def close_columns(self) -> dict[str, np.ndarray] | None:
        """Close the inner sink, its table as columns."""
        return self.inner.close_columns()


class NullSink(StepSink):
    """Drops the rows (the summary still counts every step)."""

    def write(self, chunk: pd.DataFrame) -> None:
        """Nothing."""

    def write_columns(self, cols: dict[str, np.ndarray]) -> None:
        """Nothing (no frame is built)."""

    def close(self) -> None:
        """Nothing."""


def make_sink(mode: str, path: Path | None) -> StepSink:
    """The sink for ``--steps MODE``: to ``path`` (parquet) if given, else in memory."""
    if mode not in STEP_MODES:
        raise ValueError(f"steps mode must be one of {STEP_MODES}, got {mode!r}")
    if mode == "none":
        return NullSink()
    base: StepSink = ParquetSink(path) if path is not None else MemorySink()
    return SampledSink(base) if mode == "sampled" else base
