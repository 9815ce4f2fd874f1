"""What a run produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from simulator.metrics.columns import Columns

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class SimulationResult:
    """What a run produces: one row per request, one row per step, and a flat summary.

    The request and rejection tables may be held as their columns and become frames when first
    read (``Columns``): a run that only writes its files never imports pandas."""

    request_table: pd.DataFrame | Columns
    """One row per request (see docs/metrics.md for every column); read it as ``requests``."""
    steps: pd.DataFrame | None
    """One row per scheduler step (sampled with ``steps="sampled"``); None when the table was
    streamed to a file as the run went, or not recorded."""
    summary: dict[str, Any]
    """Flat dict of headline figures."""
    rejected_table: pd.DataFrame | Columns
    """``request_id, reason`` for requests that could never be served (too long for the KV
    cache or for ``max_model_len``); read it as ``rejected``."""
    checksums: np.ndarray
    """Per request, a hash of its output tokens (0 for rejected; `engine/tokens.py`)."""
    replicas: pd.DataFrame | None = None
    """A cluster's per-replica figures, one row per replica (None for a single server)."""
    scenario: BaseModel | None = None
    """The resolved scenario that produced this result (a ``ScenarioConfig``: the engine
    does not import the scenario, which names the engine's parts)."""
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    """More tables by name, each written as ``<name>.parquet`` (an autoscaled fleet's
    ``fleet`` and ``replica_lifetimes``)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Room for run metadata (wall time, version)."""

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request, as a frame."""
        if isinstance(self.request_table, Columns):
            self.request_table = self.request_table.frame()
        return self.request_table

    @property
    def rejected(self) -> pd.DataFrame:
        """The requests that could never be served, with the reason, as a frame."""
        if isinstance(self.rejected_table, Columns):
            self.rejected_table = self.rejected_table.frame()
        return self.rejected_table


def rejection_table(rejected: list[tuple[int, str]]) -> Columns:
    """``request_id, reason`` of each rejected request (in the order given)."""
    return Columns(
        {
            "request_id": np.array([i for i, _ in rejected], dtype=np.int64),
            "reason": np.array([r for _, r in rejected], dtype=object),
        }
    )
