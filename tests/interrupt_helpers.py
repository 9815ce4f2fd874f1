"""Stopping a command as a user does (Ctrl-C at a terminal signals the whole foreground process
group; ``kill`` signals one process) and timing how long it takes to exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.paths import ROOT

EXIT_WITHIN_S = 2.0
"""The promise: a stopped command exits within 2 s, whatever the number of jobs."""


def start(argv: list[str], cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    """``servesim ARGV`` in a process group of its own, as a shell starts a job."""
    return subprocess.Popen(
        [sys.executable, "-m", "simulator", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def wait_for(ready: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Poll ``ready`` until true; fail if the process ends first or it takes too long."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"exited {proc.returncode} before it was stopped: {err.decode()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the command never got to the point where it is stopped")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], sig: int, group: bool) -> tuple[float, int, str]:
    """Send ``sig`` (to the process group, as Ctrl-C does, or to the process alone); seconds
    until it exited, its exit code and its stderr."""
    sent = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - sent
    assert _group_gone(proc.pid, within=5.0), "a worker process outlived the command"
    return took, proc.returncode, err.decode()


def _group_gone(pgid: int, within: float) -> bool:
    """Whether process group ``pgid`` is empty within ``within`` seconds (the killed workers
    the command left are reaped by init, not at once)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def leftovers(folder: Path) -> list[str]:
    """Every entry of ``folder`` (a stopped command leaves none)."""
    return sorted(p.name for p in folder.iterdir())
