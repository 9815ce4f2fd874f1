"""The Ray backend: each work unit is one Ray task (one simulation) on a local Ray instance
this process starts, or on an existing cluster (``--address``). Ray is an optional extra:
``pip install 'servesim[ray]'``.

On a cluster of several machines, every node needs servesim installed and the scenario's
files (traces, presets given by path) at the same paths; a task runs in the driver's working
folder when the node has it, so relative paths mean the same as on the driver."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from simulator.errors import InputError
from simulator.explore.backend import Backend, Done

WAIT_S = 0.1
"""Longest block inside Ray per ``wait`` round: Ctrl-C and SIGTERM are handled between."""


def _call(cwd: str, fn: Callable[..., Any], *args: Any) -> Any:
    """A work unit on a Ray worker, in the driver's folder when this node has it."""
    if os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    return fn(*args)


def import_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "--backend ray: Ray is not installed; pip install 'servesim[ray]'"
        ) from None
    return ray


class RayBackend(Backend):
    """Ray tasks of one CPU each, on a local instance of ``workers`` CPUs (default: every
    core) or on the cluster at ``address``. If Ray is already initialised in this process,
    that session is used and left running."""

    def __init__(self, workers: int | None, address: str | None) -> None:
        super().__init__()
        ray = self._ray = import_ray()
        self._owned = not ray.is_initialized()
        # Ray's core worker installs its own SIGTERM handler (which exits 1): keep ours, so
        # SIGTERM still stops the command as it does without Ray
        sigterm = signal.getsignal(signal.SIGTERM)
        if self._owned:
            if address is None:
                print("servesim: starting a local Ray instance ...", file=sys.stderr)
            try:
                ray.init(
                    address=address,
                    num_cpus=workers if address is None else None,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    configure_logging=True,
                )
            except (ConnectionError, RuntimeError, ValueError) as err:
                where = f"--address {address}" if address else "--backend ray"
                reason = _first_line(err)
                raise InputError(f"{where}: cannot start or join Ray ({reason})") from None
        if threading.current_thread() is threading.main_thread() and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        where = f"the Ray cluster at {address}" if address else "Ray"
        print(f"servesim: running on {where} ({self.workers} CPUs)", file=sys.stderr)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_call)
        self._refs: dict[Any, int] = {}
        self._cwd = os.getcwd()

    def submit(self, fn: Callable[..., Any], *args: Any) -> int:
        """Start ``fn(*args)`` as a Ray task."""
        ticket = self._ticket()
        self._refs[self._remote.remote(self._cwd, fn, *args)] = ticket
        return ticket

    def wait(self) -> list[Done]:
        """Wait for the first task to finish (in short rounds, so signals get through)."""
        ray = self._ray
        while self._refs:
            try:
                ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=WAIT_S)
            except SystemError as err:
                # a signal handler's exception raised inside Ray's C++ wait comes out wrapped
                cause = err.__cause__ or err.__context__
                if isinstance(cause, BaseException) and not isinstance(cause, Exception):
                    raise cause from None
                raise
            if ready:
                return [self._done(ref) for ref in ready]
        return []

    def _done(self, ref: Any) -> Done:
        ticket = self._refs.pop(ref)
        try:
            return Done(ticket, self._ray.get(ref))
        except self._ray.exceptions.RayTaskError as err:
            cause = err.cause if isinstance(err.cause, BaseException) else err
            return Done(ticket, error=cause)
        except self._ray.exceptions.RayError as err:  # a worker or node died
            return Done(ticket, error=RuntimeError(_first_line(err)))

    def close(self) -> None:
        """Leave Ray (stopping the local instance this backend started)."""
        if self._owned:
            self._ray.shutdown()

    def abort(self) -> None:
        """Cancel every task (killing its worker) and leave Ray."""
        for ref in self._refs:
            with contextlib.suppress(Exception):  # already finished or gone
                self._ray.cancel(ref, force=True)
        self._refs.clear()
        if self._owned:
            _no_graceful_stop(self._ray)
        self.close()


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _no_graceful_stop(ray: Any) -> None:
    """Make the coming ``ray.shutdown`` kill the local instance's processes at once instead of
    asking each to stop and waiting (~1.4 s here, too long for a Ctrl-C). Ray has no public
    switch for it: this wraps a private method, and does nothing if that method is gone."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    node: Any = getattr(worker, "_global_node", None)
    kill = getattr(node, "kill_all_processes", None)
    if kill is None:
        return

    def kill_at_once(
        check_alive: bool = False, allow_graceful: bool = False, wait: bool = False
    ) -> None:
        kill(check_alive=check_alive, allow_graceful=False, wait=wait)

    node.kill_all_processes = kill_at_once
