"""The step table: one row per scheduler step, built a chunk of steps at a time, and the running
aggregates the summary needs, so the table itself may be streamed to disk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

STEP_COLUMNS = [
    "step",
    "start_s",
    "duration_s",
    "num_seqs",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_seqs",
    "blocks_used",
    "kv_utilization",
    "num_running",
    "num_waiting",
    "num_preemptions",
    "num_cached_blocks",
    "cpu_store_bytes",
    "cpu_load_bytes",
    "shared_store_bytes",
    "shared_load_bytes",
    "swap_out_bytes",
    "swap_in_bytes",
    "num_accepted_tokens",
    "encoder_tokens",
]

STEP_INT_FIELDS = tuple(
    c for c in STEP_COLUMNS if c not in ("step", "start_s", "duration_s", "kv_utilization")
)
"""The integer columns a step row is recorded with, in the table's order: all but the step's
number, its start and duration (floats) and ``kv_utilization`` (from ``blocks_used``)."""


def step_columns(
    starts: np.ndarray,
    durations: np.ndarray,
    ints: np.ndarray,
    int_fields: Sequence[str],
    num_blocks: int,
    first_step: int = 0,
) -> dict[str, np.ndarray]:
    """The columns of the step table's rows from their starts, durations and integer columns
    (``ints[j]``: the column ``int_fields[j]``), numbered from ``first_step``, in
    ``STEP_COLUMNS`` order; running/waiting are counted at the step's start, before
    scheduling. Each column is a contiguous array (a view where the input is one)."""
    cols: dict[str, np.ndarray] = {
        "step": np.arange(first_step, first_step + len(starts), dtype=np.int64),
        "start_s": starts,
        "duration_s": durations,
    }
    for j, name in enumerate(int_fields):
        cols[name] = ints[j]
    cols["kv_utilization"] = cols["blocks_used"] / float(num_blocks)
    return {name: cols[name] for name in STEP_COLUMNS}


def frame_of(cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """The step table's rows as a frame, from ``step_columns``."""
    import pandas as pd

    # the columns may be views; the frame copies them once, into its blocks (copying each
    # column first as well took twice as long)
    return pd.DataFrame(cols, columns=STEP_COLUMNS, copy=True)


class StepStats:
    """What the summary needs from the step table, accumulated a chunk of steps at a time."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.end_s = 0.0
        """End of the last step (the clock starts at 0); 0 when no step ran."""
        self.num_preemptions = 0
        self.kv_time = 0.0
        """Sum over steps of KV utilization x duration (for the time-weighted mean)."""
        self.kv_max = 0.0
        self.busy_s = 0.0
        """Sum of step durations."""
        self.num_tokens = 0
        """Tokens computed (prompt chunks and decodes)."""
        self.swap_out_bytes = 0
        """KV bytes swapped out to CPU memory (swap preemption)."""
        self.swap_in_bytes = 0
        """KV bytes swapped back in."""
        self.saturated_s = 0.0
        """Sum of the durations of saturated steps: those that left out a request the server
        held at their start (``num_waiting + num_running > num_seqs``: not admitted, or not
        given a turn). Continuous batching keeps a server stepping whenever it holds a
        request, so busy time says nothing of headroom; this does."""

    def merge(self, other: StepStats) -> None:
        """Account for another server's steps too (a cluster's, run side by side)."""
        self.num_steps += other.num_steps
        self.end_s = max(self.end_s, other.end_s)
        self.num_preemptions += other.num_preemptions
        self.kv_time += other.kv_time
        self.kv_max = max(self.kv_max, other.kv_max)
        self.busy_s += other.busy_s
        self.num_tokens += other.num_tokens
        self.saturated_s += other.saturated_s
        self.swap_out_bytes += other.swap_out_bytes
        self.swap_in_bytes += other.swap_in_bytes

    def add(self, steps: pd.DataFrame | dict[str, np.ndarray]) -> None:
        """Account for a chunk of consecutive rows of the step table (a frame, or its columns
        as contiguous arrays: ``step_columns``)."""
        start = np.asarray(steps["start_s"])
        if not len(start):
            return
        duration = np.asarray(steps["duration_s"])
        kv = np.asarray(steps["kv_utilization"])
        self.num_steps += len(start)
        self.end_s = float(start[-1] + duration[-1])
        self.num_preemptions += int(np.asarray(steps["num_preemptions"]).sum())
        self.kv_time += float((kv * duration).sum())
        self.kv_max = max(self.kv_max, float(kv.max()))
        self.busy_s += float(duration.sum())
        self.num_tokens += int(np.asarray(steps["num_tokens"]).sum())
        self.swap_out_bytes += int(np.asarray(steps["swap_out_bytes"]).sum())
        self.swap_in_bytes += int(np.asarray(steps["swap_in_bytes"]).sum())
        held = np.asarray(steps["num_waiting"]) + np.asarray(steps["num_running"])
        self.saturated_s += float(duration[held > np.asarray(steps["num_seqs"])].sum())
