"""The step table as a run records it: rows buffered (a stretch of decode steps as one segment
of alike rows) and passed on in chunks of exactly the same size, so memory stays bounded and
the summary's sums do not depend on how the rows came."""

from __future__ import annotations

import numpy as np

from simulator.engine.step_sink import StepSink
from simulator.metrics import STEP_INT_FIELDS, StepStats, step_columns

__all__ = ["STEP_INT_FIELDS", "StepBuffer"]

# STEP_INT_FIELDS (metrics.steps): the integer columns in the order ``record_step`` takes them
# (then the KV bytes moved to and from the tiers below the GPU: ``Scheduler.take_kv_moved``;
# last the draft tokens the step's verifications accepted, known once it is applied)

_USED = STEP_INT_FIELDS.index("blocks_used")
_KEPT = STEP_INT_FIELDS.index("num_cached_blocks")


class StepBuffer:
    """Step rows until they go, ``chunk`` at a time, to ``sink`` and ``stats``.

    Rows are kept as Python lists and turned into arrays once per chunk: appending to a list
    is several times cheaper than to an ``array`` or numpy (measured: 81 ints into an
    ``array('q')`` take 5 us, into a list 0.3 us), and most steps come in stretches of rows
    that differ only in start, duration and blocks used, kept once per stretch."""

    def __init__(self, num_blocks: int, sink: StepSink, stats: StepStats, chunk: int) -> None:
        self._num_blocks = num_blocks
        self._sink = sink
        self._stats = stats
        self._chunk = chunk
        self._starts: list[float] = []
        self._durations: list[float] = []
        self._used: list[int] = []  # blocks used, per row
        self._segments: list[int] = []  # STEP_INT_FIELDS of each segment of alike rows ...
        self._lengths: list[int] = []  # ... and its number of rows
        # per segment: 0, or the blocks in all when its rows' cached blocks are at most their
        # free ones (``DecodeStretch.num_blocks``); with any, the segments' indices
        self._caps: list[int] = []
        self._capped: list[int] = []
        # rows expanded, not passed on: starts, durations, integer columns
        self._carry: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._num_carried = 0
        self._num_flushed = 0

    def add(self, start: float, duration: float, ints: tuple[int, ...]) -> None:
        """One row: its start, duration and ``STEP_INT_FIELDS``."""
        self._starts.append(start)
        self._durations.append(duration)
        self._used.append(ints[_USED])
        self._segments.extend(ints)
        self._lengths.append(1)
        if len(self._used) + self._num_carried >= self._chunk:
            self.flush()

    def add_segments(
        self,
        starts: list[float],
        durations: list[float],
        blocks_used: list[int],
        segments: list[int],
        lengths: list[int],
        num_blocks: int = 0,
    ) -> None:
        """Rows in segments of alike rows: the next ``lengths[i]`` rows share the ``i``-th
        run of ``len(STEP_INT_FIELDS)`` ints of ``segments`` (``STEP_INT_FIELDS``) but for
        their blocks used, and with ``num_blocks`` their cached blocks, which are at most
        ``num_blocks - blocks used``."""
        if num_blocks:
            first = len(self._lengths)
            self._capped.extend(range(first, first + len(lengths)))
            self._caps.extend([num_blocks] * len(lengths))
        self._starts += starts
        self._durations += durations
        self._used += blocks_used
        self._segments += segments
        self._lengths += lengths
        if len(self._used) + self._num_carried >= self._chunk:
            self.flush()

    def _rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every buffered row: starts, durations and ``STEP_INT_FIELDS`` (one row of the
        last per field, so that each column is contiguous), as arrays."""
        num_ints = len(STEP_INT_FIELDS)
        starts = np.array(self._starts, dtype=np.float64)
        durations = np.array(self._durations, dtype=np.float64)
        # a segment per column of ``segments``, its rows repeated along the columns: each
        # field comes out contiguous, with no transposed copy of the whole chunk
        segments = np.array(self._segments, dtype=np.int64).reshape(-1, num_ints).T
        lengths = np.array(self._lengths, dtype=np.int64)
        columns = np.repeat(segments, lengths, axis=1)
        columns[_USED] = np.array(self._used, dtype=np.int64)
        if self._caps:
            caps = np.zeros(len(lengths), dtype=np.int64)
            caps[self._capped] = self._caps
            caps = np.repeat(caps, lengths)
            rows = caps > 0
            free = caps[rows] - columns[_USED, rows]
            columns[_KEPT, rows] = np.minimum(columns[_KEPT, rows], free)
            self._caps, self._capped = [], []
        self._starts, self._durations, self._used = [], [], []
        self._segments, self._lengths = [], []
        if self._carry is not None:
            carried_starts, carried_durations, carried = self._carry
            starts = np.concatenate([carried_starts, starts])
            durations = np.concatenate([carried_durations, durations])
            columns = np.concatenate([carried, columns], axis=1)
            self._carry, self._num_carried = None, 0
        return starts, durations, columns

    def flush(self, whole: bool = False) -> None:
        """Pass on the buffered rows in chunks of exactly ``chunk`` rows, and the rest too if
        ``whole`` (as one chunk, maybe empty: a sink learns the columns from it)."""
        starts, durations, columns = self._rows()
        total = len(starts)
        n = total if whole else total // self._chunk * self._chunk
        for lo in range(0, n, self._chunk) if n or not whole else (0,):
            hi = min(lo + self._chunk, n)
            cols = step_columns(
                starts[lo:hi],
                durations[lo:hi],
                columns[:, lo:hi],
                STEP_INT_FIELDS,
                self._num_blocks,
                self._num_flushed,
            )
            self._num_flushed += hi - lo
            self._stats.add(cols)
            self._sink.write_columns(cols)
        if n < total:
            self._carry = (starts[n:].copy(), durations[n:].copy(), columns[:, n:].copy())
            self._num_carried = total - n
