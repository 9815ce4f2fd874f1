"""Fixtures shared by several test files."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray instance of 2 CPUs for the whole session (starting one costs seconds),
    initialised in this process: ``--backend ray`` in-process uses it; a subprocess joins it
    with ``--address``. Tests using it are in xdist group ``ray`` (one worker runs them)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
