"""The files of NVIDIA's kernel database that ``servesim fetch kernels [GPU [VERSION]]``
downloads when ``aiconfigurator-core`` is not installed: the registry
``configs/kernels/database.csv`` (every vLLM and NCCL table of github.com/ai-dynamo/
aiconfigurator at one commit, with its size and sha256; ``tools/kernel_registry.py`` writes it),
saved as ``data/kernels/<gpu>/...`` in the package's ``systems/data`` layout, which
``simulator/cost/kernel_db.py`` reads."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from simulator.errors import InputError
from simulator.workload.datasets import DataFile, load_registry

REGISTRY = Path(__file__).resolve().parents[2] / "configs" / "kernels" / "database.csv"
"""The kernel database's files, one row each (the columns of ``configs/datasets.csv``)."""
PREFIX = "kernels/"
"""Where under the data folder (``data``) the files are saved."""
CORE = ("gemm/gemm_perf", "attention/context_attention_perf")
"""Tables a vLLM version must have on a GPU to count as measured there (as ``kernel_db``)."""


@cache
def kernel_files() -> dict[str, DataFile]:
    """Every registered file of the database, by name."""
    return load_registry(REGISTRY)


def _parts(entry: DataFile) -> tuple[str, str, str, str]:
    """``(gpu, family/table, framework, version)`` of a file from its destination."""
    gpu, family, framework, version, name = entry.dest.removeprefix(PREFIX).split("/")
    return gpu, f"{family}/{name.removesuffix('.parquet')}", framework, version


def _key(version: str) -> tuple[int, ...]:
    """``0.24`` and ``0.24.0`` alike, ordered numerically (as ``kernel_db.version_key``)."""
    parts = [int(p) if p.isdigit() else -1 for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def measured() -> dict[str, list[str]]:
    """GPU -> the vLLM versions measured there (its GEMM and attention tables), oldest first."""
    found: dict[str, dict[str, set[str]]] = {}
    for entry in kernel_files().values():
        gpu, table, framework, version = _parts(entry)
        if framework == "vllm" and table in CORE:
            found.setdefault(gpu, {}).setdefault(version, set()).add(table)
    out = {
        gpu: sorted((v for v, tables in versions.items() if len(tables) == len(CORE)), key=_key)
        for gpu, versions in found.items()
    }
    return {gpu: versions for gpu, versions in sorted(out.items()) if versions}


def select_kernels(args: list[str]) -> list[DataFile]:
    """The files of ``[]`` (every GPU), ``[GPU]`` (every version of it) or ``[GPU, VERSION]``:
    that version's tables, and for a table not measured there the one the reader takes
    instead (the newest older version, else the oldest newer), and the GPU's NCCL tables."""
    if len(args) > 2:
        raise InputError(f"servesim fetch kernels takes a GPU and a vLLM version, got {args}")
    files = list(kernel_files().values())
    if not args:
        return files
    gpus = measured()
    gpu = args[0]
    if gpu not in gpus:
        raise InputError(
            f"servesim fetch kernels: {gpu!r}: no vLLM kernels measured for this GPU "
            f"(measured: {', '.join(gpus)}); cost_model.type: physics prices any GPU"
        )
    mine = [e for e in files if _parts(e)[0] == gpu]
    if len(args) == 1:
        return mine
    wanted = [v for v in gpus[gpu] if _key(v) == _key(args[1])]
    if not wanted:
        raise InputError(
            f"servesim fetch kernels: {gpu} {args[1]}: vLLM version not measured there "
            f"(measured: {', '.join(gpus[gpu])}); cost_model.type: physics prices any version"
        )
    return _at_version(mine, _key(wanted[0]))


def _at_version(entries: list[DataFile], want: tuple[int, ...]) -> list[DataFile]:
    """Per vLLM table, the file at ``want`` or the reader's fallback; the NCCL tables."""
    by_table: dict[str, dict[tuple[int, ...], DataFile]] = {}
    out = []
    for entry in entries:
        _, table, framework, version = _parts(entry)
        if framework != "vllm":
            out.append(entry)  # comm/nccl: the reader takes the newest
            continue
        by_table.setdefault(table, {})[_key(version)] = entry
    for versions in by_table.values():
        older = [k for k in versions if k <= want]
        out.append(versions[max(older)] if older else versions[min(versions)])
    return sorted(out, key=lambda e: e.name)
