"""Choosing a backend: ``--backend local|ray``, ``--jobs``, ``--address``."""

from __future__ import annotations

import os

from simulator.explore.backend import Backend
from simulator.explore.local_backend import InlineBackend, LocalBackend

BACKENDS = ("local", "ray")
"""The names ``--backend`` takes."""


def check_backend(name: str, jobs: int | None, address: str | None = None) -> None:
    """Refuse, in one line and before anything runs, a backend that cannot be made (``jobs``
    None: one per core; 0 is refused, as no simulation would run)."""
    from simulator.errors import InputError

    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs {jobs}: must be >= 1 (leave it out for one per core)")
    if name not in BACKENDS:
        raise InputError(f"--backend {name}: unknown; known: {', '.join(BACKENDS)}")
    if address is not None and name != "ray":
        raise InputError("--address: only with --backend ray")
    if name == "ray":
        from simulator.explore.ray_backend import import_ray

        import_ray()


def make_backend(name: str, jobs: int | None, address: str | None = None) -> Backend:
    """The backend ``--backend NAME --jobs N [--address A]`` asks for (``jobs`` None: one per
    core; 1 with ``local``: in this process)."""
    check_backend(name, jobs, address)
    if name == "ray":
        from simulator.explore.ray_backend import RayBackend

        return RayBackend(jobs or None, address)
    jobs = jobs or os.cpu_count() or 1
    return InlineBackend() if jobs == 1 else LocalBackend(jobs)
