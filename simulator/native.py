"""The modules that run compiled, and the guard that runs their source when it changed since.

``make`` compiles the modules below with mypyc (``tools/build_native.py``: C extensions beside
them, the same code with its type annotations enforced) and writes ``_native.json``, the hash
of each source compiled. The compiled modules call one another directly in C, so they are used
all or none: if any source differs from what was compiled, or ``SERVESIM_PURE=1`` is set, or
nothing was compiled, every one of them is imported from its source. The results are identical
either way (``tests/test_native.py``); only the speed differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
"""The ``simulator`` package's folder."""

MANIFEST = ROOT / "_native.json"
"""What ``tools/build_native.py`` compiled: each module's source hash."""

COMPILED = (
    "simulator.scheduling.async_run",
    "simulator.scheduling.block_pool",
    "simulator.scheduling.decode_run",
    "simulator.scheduling.deferred",
    "simulator.scheduling.fast_async",
    "simulator.scheduling.fast_step",
    "simulator.scheduling.group_tables",
    "simulator.scheduling.hybrid_kv",
    "simulator.scheduling.intake",
    "simulator.scheduling.interface",
    "simulator.scheduling.kv_manager",
    "simulator.scheduling.mamba_group",
    "simulator.scheduling.preemption",
    "simulator.scheduling.sequence",
    "simulator.scheduling.speculation",
    "simulator.scheduling.step_scheduler",
    "simulator.scheduling.swap_space",
    "simulator.scheduling.tier_loads",
    "simulator.scheduling.window_group",
    "simulator.engine.ahead",
    "simulator.engine.fast_window",
    "simulator.engine.recorder",
    "simulator.engine.server",
    "simulator.engine.server_shape",
    "simulator.engine.step_buffer",
    "simulator.engine.held",
    "simulator.engine.clock",
    "simulator.engine.simulation",
    "simulator.cost.decode_times",
    "simulator.cluster.handover",
    "simulator.cluster.replica",
    "simulator.cluster.router",
    "simulator.cluster.routers",
)
"""The hot path: the scheduler, its KV manager, the server's step loop, the arrivals, and
what a router reads of a replica."""


def source_of(module: str) -> Path:
    """The source file of ``module`` (one of ``COMPILED``)."""
    return ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")


def source_hashes() -> dict[str, str]:
    """Each compiled module's source hash now."""
    return {m: hashlib.sha256(source_of(m).read_bytes()).hexdigest() for m in COMPILED}


def compiled_in_use() -> bool:
    """Whether the compiled modules are imported (built, current, and not turned off)."""
    if os.environ.get("SERVESIM_PURE") == "1":
        return False
    try:
        built = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return False
    return bool(built.get("python") == sys.implementation.cache_tag) and bool(
        built.get("modules") == source_hashes()
    )


class _SourceFirst(MetaPathFinder):
    """Imports from source every module of the package that is not compiled and current
    (an extension beside its source would otherwise be found first, also one left by a build
    of another checkout whose list differed)."""

    def __init__(self, compiled: frozenset[str]) -> None:
        self.compiled = compiled

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("simulator.") or fullname in self.compiled:
            return None
        source = source_of(fullname)
        return spec_from_file_location(fullname, source) if source.is_file() else None


def guard() -> None:
    """Import the compiled modules only where they are current, everything else from source."""
    if any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        return
    in_use = frozenset(COMPILED) if compiled_in_use() else frozenset()
    sys.meta_path.insert(0, _SourceFirst(in_use | {"simulator.native__mypyc"}))
