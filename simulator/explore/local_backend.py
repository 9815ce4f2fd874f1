"""Backends on this machine: in this process (``--jobs 1``), or a pool of worker processes."""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from simulator.explore.backend import Backend, Done


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
