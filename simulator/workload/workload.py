"""The requests to simulate, as parallel arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.workload.multimodal import MMItems
from simulator.workload.prompt_runs import PromptRuns


@dataclass(frozen=True)
class Workload:
    """The requests to simulate, as parallel read-only arrays sorted by arrival time."""

    arrival_s: np.ndarray
    """Arrival times in seconds, float64, nondecreasing; the first request arrives at 0."""
    prompt_len: np.ndarray
    """Prompt tokens per request, int64 >= 1."""
    output_len: np.ndarray
    """Output tokens per request, int64 >= 1."""
    notes: tuple[str, ...] = ()
    """Adjustments made while reading (zero lengths raised, rows reordered), one line each."""
    priority: np.ndarray | None = None
    """Per request, int64: lower is served first by a priority policy; None = all 0."""
    prompt_runs: PromptRuns | None = None
    """Token identity of the prompts (what a prefix cache can hit); None = every prompt
    unique."""
    mm: MMItems | None = None
    """Multimodal items in the prompts (their placeholders counted in ``prompt_len``); None =
    text only."""

    def __post_init__(self) -> None:
        arrays = {
            "arrival_s": np.array(self.arrival_s, dtype=np.float64),
            "prompt_len": np.array(self.prompt_len, dtype=np.int64),
            "output_len": np.array(self.output_len, dtype=np.int64),
        }
        if self.priority is not None:
            arrays["priority"] = np.array(self.priority, dtype=np.int64)
        _check_workload_arrays(**arrays)
        if self.prompt_runs is not None:
            self.prompt_runs.check(arrays["prompt_len"], arrays["output_len"])
        for name, array in arrays.items():
            array.setflags(write=False)
            # Frozen dataclass: the copies replace the inputs once, here, so callers' arrays
            # are never aliased or made read-only.
            object.__setattr__(self, name, array)

    def __len__(self) -> int:
        """Number of requests."""
        return len(self.arrival_s)


def _check_workload_arrays(
    arrival_s: np.ndarray,
    prompt_len: np.ndarray,
    output_len: np.ndarray,
    priority: np.ndarray | None = None,
) -> None:
    if not arrival_s.ndim == prompt_len.ndim == output_len.ndim == 1:
        raise ValueError("Workload arrays must be one-dimensional")
    if not len(arrival_s) == len(prompt_len) == len(output_len):
        raise ValueError(
            f"Workload arrays differ in length: {len(arrival_s)}, "
            f"{len(prompt_len)}, {len(output_len)}"
        )
    if priority is not None and priority.shape != arrival_s.shape:
        raise ValueError("Workload.priority must have one value per request")
    if not np.isfinite(arrival_s).all() or (np.diff(arrival_s) < 0).any():
        raise ValueError("Workload.arrival_s must be finite and nondecreasing")
    if (prompt_len < 1).any() or (output_len < 1).any():
        raise ValueError("Workload lengths must be >= 1")
