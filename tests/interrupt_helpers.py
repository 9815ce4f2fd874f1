"""Stopping a command as a user does (Ctrl-C at a terminal signals the whole foreground process
group; ``kill`` signals one process) and timing how long it takes to exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.paths import ROOT

EXIT_WITHIN_S = 2.0
"""The promise: a stopped command exits within 2 s, whatever the number of jobs."""


class Job:
    """``servesim ARGV`` in a process group of its own, as a shell starts a job; its stderr
    read as it comes."""

    def __init__(self, argv: list[str], cwd: Path = ROOT) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simulator", *argv],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        while chunk := self.proc.stderr.read1(4096):
            self._chunks.append(chunk)

    @property
    def stderr(self) -> str:
        """What it said on stderr so far."""
        return b"".join(self._chunks).decode(errors="replace")


def start(argv: list[str], cwd: Path = ROOT) -> Job:
    """Start ``servesim ARGV`` as a job."""
    return Job(argv, cwd)


def wait_for(ready: Callable[[], bool], job: Job, timeout: float) -> None:
    """Poll ``ready`` until true; fail if the job ends first or it takes too long."""
    deadline = time.monotonic() + timeout
    while not ready():
        if job.proc.poll() is not None:
            time.sleep(0.2)
            raise AssertionError(
                f"exited {job.proc.returncode} before it was stopped: {job.stderr}"
            )
        if time.monotonic() > deadline:
            os.killpg(job.proc.pid, signal.SIGKILL)
            raise AssertionError(f"never got to where it is stopped: {job.stderr}")
        time.sleep(0.05)


def stop(job: Job, sig: int, group: bool) -> tuple[float, int, str]:
    """Send ``sig`` (to the process group, as Ctrl-C does, or to the process alone); seconds
    until it exited, its exit code and its stderr."""
    proc = job.proc
    sent = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - sent
    job._reader.join(timeout=5)
    assert proc.stderr is not None
    proc.stderr.close()
    assert _group_gone(proc.pid, within=5.0), "a worker process outlived the command"
    return took, proc.returncode, job.stderr


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
