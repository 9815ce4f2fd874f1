"""Fixtures shared by several test files."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulator import native


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pure: replaces or counts the hot path's own functions (monkeypatch), which compiled "
        "modules call directly: runs with those modules from source",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A ``pure`` test, where the compiled modules are in use, runs in a process of its own
    with them from source (``SERVESIM_PURE=1``, simulator/native.py) and fails as it fails
    there."""
    if pyfuncitem.get_closest_marker("pure") is None or not native.compiled_in_use():
        return None
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid]
    env = {**os.environ, "SERVESIM_PURE": "1"}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or " passed" not in done.stdout:
        pytest.fail(f"from source: {done.stdout[-4000:]}{done.stderr[-2000:]}", pytrace=False)
    return True


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray instance of 2 CPUs per test process (starting one costs 15-25 s here),
    initialised in this process: ``--backend ray`` in-process uses it; a subprocess joins it
    with ``--address``. (pytest-xdist's ``--dist loadgroup`` would keep the Ray tests on one
    worker, but pytest 9 ignores the node ids it rewrites, so each worker may start one.)"""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
