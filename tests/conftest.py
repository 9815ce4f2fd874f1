"""Fixtures shared by several test files."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


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
