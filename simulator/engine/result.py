"""What a run produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel


@dataclass
class SimulationResult:
    """What a run produces: one row per request, one row per step, and a flat summary."""

    requests: pd.DataFrame
    """One row per request (see docs/metrics.md for every column)."""
    steps: pd.DataFrame | None
    """One row per scheduler step (sampled with ``steps="sampled"``); None when the table was
    streamed to a file as the run went, or not recorded."""
    summary: dict[str, Any]
    """Flat dict of headline figures."""
    rejected: pd.DataFrame
    """``request_id, reason`` for requests that could never fit in the KV cache."""
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
