"""Where the simulations of a sweep, capacity search or design search run: in this process, in
a pool of local worker processes, or on a Ray cluster. A work unit is one whole simulation (a
module-level function and its arguments); its result is the same on every backend.

A backend is used as a context manager: leaving it normally waits for nothing (every result
was taken); leaving it on an exception (Ctrl-C, SIGTERM, an error) stops every worker at
once, so that nothing writes into an output folder after it is removed, and returns within
about a second whatever the number of jobs."""

from __future__ import annotations

import multiprocessing
import os
import signal
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from types import TracebackType
from typing import Any

BACKENDS = ("local", "ray")
"""The names ``--backend`` takes."""


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


class InlineBackend(Backend):
    """Runs each unit in this process when ``wait`` is called (``--jobs 1``): no pool to
    start, and an interruption stops the simulation where it is."""

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[tuple[int, Callable[..., Any], tuple[Any, ...]]] = deque()

    def submit(self, fn: Callable[..., Any], *args: Any) -> int:
        """Queue ``fn(*args)``."""
        ticket = self._ticket()
        self._queue.append((ticket, fn, args))
        return ticket

    def wait(self) -> list[Done]:
        """Run the oldest queued unit."""
        if not self._queue:
            return []
        ticket, fn, args = self._queue.popleft()
        try:
            return [Done(ticket, fn(*args))]
        except Exception as err:  # reported with the unit; Ctrl-C and SIGTERM propagate
            return [Done(ticket, error=err)]


def _worker_init() -> None:
    """A pool worker leaves Ctrl-C to its parent (which stops it) and dies of SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class LocalBackend(Backend):
    """A pool of ``workers`` local processes (``concurrent.futures``: a worker that dies is
    reported, never waited for)."""

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers
        # fork (Linux's default) starts a worker in milliseconds, and no thread of ours runs
        # while the pool forks its workers
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        self._pool = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context(method), initializer=_worker_init
        )
        self._futures: dict[Future[Any], int] = {}

    def submit(self, fn: Callable[..., Any], *args: Any) -> int:
        """Queue ``fn(*args)`` on the pool."""
        ticket = self._ticket()
        self._futures[self._pool.submit(fn, *args)] = ticket
        return ticket

    def wait(self) -> list[Done]:
        """Wait for the first unit to finish; every finished one."""
        if not self._futures:
            return []
        finished, _ = wait(self._futures, return_when=FIRST_COMPLETED)
        out = []
        for fut in finished:
            ticket = self._futures.pop(fut)
            err = fut.exception()
            out.append(Done(ticket, None if err else fut.result(), err))
        return out

    def close(self) -> None:
        """Shut the idle pool down."""
        self._pool.shutdown(wait=True)

    def abort(self) -> None:
        """Kill every worker (running or idle) and wait until they are gone, so none writes
        after this returns; drop what was queued."""
        # ProcessPoolExecutor.shutdown waits for running work (it cannot interrupt it), and
        # Python < 3.14 has no terminate_workers(): the processes are signalled directly.
        processes = list(getattr(self._pool, "_processes", {}).values())
        for proc in processes:
            if proc.is_alive():
                proc.kill()
        for proc in processes:
            proc.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._futures.clear()


def check_backend(name: str, jobs: int, address: str | None = None) -> None:
    """Refuse, in one line and before anything runs, a backend that cannot be made."""
    from simulator.errors import InputError

    if jobs < 0:
        raise InputError(f"--jobs {jobs}: must be >= 0 (0 = all cores)")
    if name not in BACKENDS:
        raise InputError(f"--backend {name}: unknown; known: {', '.join(BACKENDS)}")
    if address is not None and name != "ray":
        raise InputError("--address: only with --backend ray")
    if name == "ray":
        from simulator.explore.ray_backend import import_ray

        import_ray()


def make_backend(name: str, jobs: int, address: str | None = None) -> Backend:
    """The backend ``--backend NAME --jobs N [--address A]`` asks for (``jobs`` 0: one per
    core; 1 with ``local``: in this process)."""
    check_backend(name, jobs, address)
    if name == "ray":
        from simulator.explore.ray_backend import RayBackend

        return RayBackend(jobs or None, address)
    jobs = jobs or os.cpu_count() or 1
    return InlineBackend() if jobs == 1 else LocalBackend(jobs)
