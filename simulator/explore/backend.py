"""Where the simulations of a sweep, capacity search or design search run: the interface every
backend (local_backend.py, ray_backend.py) has. A work unit is one whole simulation (a
module-level function and its arguments); its result is the same on every backend.

A backend is used as a context manager: leaving it normally waits for nothing (every result
was taken); leaving it on an exception (Ctrl-C, SIGTERM, an error) stops every worker at
once, so that nothing writes into an output folder after it is removed, and returns within
about a second whatever the number of jobs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Done:
    """A finished work unit: its ticket, and its value or the exception it raised."""

    ticket: int
    value: Any = None
    error: BaseException | None = None


class Backend(ABC):
    """Runs work units (module-level functions with picklable arguments) somewhere."""

    workers: int = 1
    """How many work units run at once."""

    def __init__(self) -> None:
        self._next = 0

    def _ticket(self) -> int:
        self._next += 1
        return self._next

    @abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> int:
        """Queue ``fn(*args)``; a ticket that ``wait`` reports it under."""

    @abstractmethod
    def wait(self) -> list[Done]:
        """Block until at least one queued unit is done; every unit done so far (empty when
        nothing is queued)."""

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release the workers after every result was taken."""

    def abort(self) -> None:  # noqa: B027
        """Stop every worker now, finished or not."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
