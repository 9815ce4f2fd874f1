"""servesim: a discrete-event simulator of an LLM inference server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator import native
from simulator.version import __version__

native.guard()  # the compiled hot path only where it is current (``native.py``)

__all__ = ["__version__", "run"]

if TYPE_CHECKING:
    from simulator.engine.simulation import SimulationResult


def run(scenario: Any, *, progress: bool | None = False) -> SimulationResult:
    """Simulate a scenario (ScenarioConfig, dict or YAML path) and return its result."""
    from simulator.scenario.runner import run as _run

    return _run(scenario, progress=progress)
