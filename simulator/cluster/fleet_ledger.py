"""The fleet's books under autoscaling: how many replicas were live, starting and draining
after every change (``fleet.parquet``), each replica's lifetime, and what the GPUs cost."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class Lifetime:
    """One replica's life: requested, ready (serving), retired (no new request), gone."""

    replica: int
    """Replica id, in order of request (the initial ones first)."""
    requested_s: float
    """When it was asked for (billing starts: the GPUs are held while it loads)."""
    ready_s: float | None = None
    """When it began to receive requests; None if cancelled before."""
    retired_s: float | None = None
    """When the router stopped sending it requests (or it was cancelled while starting)."""
    gone_s: float | None = None
    """When it had drained and stopped (billing ends)."""


class FleetLedger:
    """Counts and lifetimes as the fleet changes; a replica is billed from its request until
    it is gone, starting and draining included."""

    def __init__(self, initial: int, at_s: float = 0.0) -> None:
        self._lives: list[Lifetime] = []
        self._rows: list[tuple[float, int, int, int]] = []
        self._live = self._starting = self._draining = 0
        for _ in range(initial):  # the initial replicas serve from the start
            self._lives.append(Lifetime(len(self._lives), at_s, ready_s=at_s))
        self._live = initial
        self._record(at_s)

    def _record(self, at_s: float) -> None:
        row = (at_s, self._live, self._starting, self._draining)
        if self._rows and self._rows[-1][0] == at_s:
            self._rows[-1] = row  # several changes at one instant: one row, the last state
        else:
            self._rows.append(row)

    def _check_time(self, at_s: float) -> None:
        if self._rows and at_s < self._rows[-1][0]:
            raise ValueError(f"fleet change at {at_s} s before the last one ({self._rows[-1][0]})")

    def request(self, at_s: float) -> int:
        """A replica asked for at ``at_s`` (starting); its id."""
        self._check_time(at_s)
        self._lives.append(Lifetime(len(self._lives), at_s))
        self._starting += 1
        self._record(at_s)
        return self._lives[-1].replica

    def ready(self, replica: int, at_s: float) -> None:
        """``replica`` finished starting and receives requests from ``at_s``."""
        life = self._at(replica, at_s, "starting")
        life.ready_s = at_s
        self._starting -= 1
        self._live += 1
        self._record(at_s)

    def cancel(self, replica: int, at_s: float) -> None:
        """``replica`` is stopped while still starting."""
        life = self._at(replica, at_s, "starting")
        life.retired_s = life.gone_s = at_s
        self._starting -= 1
        self._record(at_s)

    def retire(self, replica: int, at_s: float) -> None:
        """``replica`` receives no new request from ``at_s``; it drains what it has."""
        life = self._at(replica, at_s, "live")
        life.retired_s = at_s
        self._live -= 1
        self._draining += 1
        self._record(at_s)

    def gone(self, replica: int, at_s: float) -> None:
        """``replica`` finished its last request and stopped at ``at_s``."""
        life = self._at(replica, at_s, "draining")
        life.gone_s = at_s
        self._draining -= 1
        self._record(at_s)

    def _at(self, replica: int, at_s: float, state: str) -> Lifetime:
        self._check_time(at_s)
        life = self._lives[replica]
        if _state(life) != state:
            raise ValueError(f"replica {replica} is {_state(life)}, not {state}")
        return life

    def frame(self) -> pd.DataFrame:
        """``fleet.parquet``: ``time_s, live, starting, draining`` after each change."""
        rows = np.array(self._rows, dtype=np.float64).reshape(-1, 4)
        return pd.DataFrame(
            {
                "time_s": rows[:, 0],
                "live": rows[:, 1].astype(np.int64),
                "starting": rows[:, 2].astype(np.int64),
                "draining": rows[:, 3].astype(np.int64),
            }
        )

    def lifetimes(self) -> pd.DataFrame:
        """One row per replica: ``replica, requested_s, ready_s, retired_s, gone_s`` (NaN:
        not yet, or never)."""

        def col(values: list[float | None]) -> np.ndarray:
            return np.array([math.nan if v is None else v for v in values], dtype=np.float64)

        lives = self._lives
        return pd.DataFrame(
            {
                "replica": np.array([x.replica for x in lives], dtype=np.int64),
                "requested_s": col([x.requested_s for x in lives]),
                "ready_s": col([x.ready_s for x in lives]),
                "retired_s": col([x.retired_s for x in lives]),
                "gone_s": col([x.gone_s for x in lives]),
            }
        )

    def replica_seconds(self, end_s: float) -> float:
        """Billed replica-seconds up to ``end_s``: each replica from its request until gone
        (or ``end_s``)."""
        return float(
            sum(
                max(min(end_s, x.gone_s if x.gone_s is not None else end_s) - x.requested_s, 0.0)
                for x in self._lives
            )
        )

    def cost_usd(self, end_s: float, gpus_per_replica: int, cost_per_hour: float) -> float:
        """Dollars up to ``end_s``: billed replica-seconds x GPUs per replica x the price of a
        GPU-hour / 3600."""
        return self.replica_seconds(end_s) * gpus_per_replica * cost_per_hour / 3600.0


def _state(life: Lifetime) -> str:
    if life.gone_s is not None:
        return "gone"
    if life.retired_s is not None:
        return "draining"
    return "live" if life.ready_s is not None else "starting"
