"""Watching a run as it goes: a stop rule reads the run's state now and then and may end it
early, for a caller that already knows the answer it wanted (a capacity probe whose SLO can no
longer be met). The rule only reads; a run it does not stop is the same as one unwatched."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CHECKS_PER_RUN = 64
"""A run's stop rule is asked about this many times per request count (each arrival and each
finish is an event; it is asked every ``max(64, num_requests // 64)`` events)."""


@dataclass(frozen=True)
class RunState:
    """What a stop rule may read while a run goes (views of the recorder: never write)."""

    now: float
    """The simulated clock (a lower bound of every timestamp still to come)."""
    arrival_s: np.ndarray
    """Every request's arrival time; requests arrive in this order."""
    num_arrived: int
    """Requests ``0 .. num_arrived - 1`` have reached the server."""
    first_scheduled: Sequence[float]
    """Per request: start of its first step (NaN until then)."""
    first_token: Sequence[float]
    """Per request: end of the step that sampled its first token (NaN until then)."""
    finish: Sequence[float]
    """Per request: end of the step that sampled its last token (NaN until then)."""
    rejected: list[int]
    """Requests rejected as they arrived (they never finish)."""

    @property
    def num_requests(self) -> int:
        """Requests in the whole workload."""
        return len(self.arrival_s)


StopRule = Callable[[RunState], "str | None"]
"""Told the run's state; a reason to stop the run now, or None to go on."""


class StoppedEarly(Exception):
    """A run's stop rule ended it before every request finished."""

    def __init__(self, reason: str, at_s: float) -> None:
        # args are the constructor's: simpy re-creates an exception from them
        super().__init__(reason, at_s)
        self.reason = reason
        """Why, as the stop rule said."""
        self.at_s = at_s
        """The simulated time it stopped at."""

    def __str__(self) -> str:
        return f"stopped at {self.at_s:.1f} s simulated: {self.reason}"


class Watch:
    """Counts a run's events and asks ``rule`` every ``every`` of them."""

    def __init__(self, rule: StopRule, num_requests: int) -> None:
        self.rule = rule
        self.every = max(CHECKS_PER_RUN, num_requests // CHECKS_PER_RUN)
        self._events = 0

    def tick(self, state: Callable[[], RunState]) -> None:
        """One more event; ask the rule when it is due (raising ``StoppedEarly``)."""
        self._events += 1
        if self._events % self.every:
            return
        now = state()
        reason = self.rule(now)
        if reason is not None:
            raise StoppedEarly(reason, now.now)
