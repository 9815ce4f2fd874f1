"""NVIDIA's database of measured vLLM kernels, as the installed ``aiconfigurator-core`` package
ships it (``servesim[kernels]``; Apache-2.0): ``aiconfigurator_core/systems/data/<gpu>/<family>/
vllm/<version>/<table>.parquet``, latencies in milliseconds. Read in place, never copied. Without
the package, the same layout under ``data/kernels`` (``$SERVESIM_KERNELS_DIR``), where ``servesim
fetch kernels`` saves the repository's files pinned to a commit and sha256-checked.

A vLLM version is *measured* on a GPU when both its GEMM and attention tables exist at that
version; the other tables (communication, MoE) are taken at that version, else at the newest
older one (AIConfigurator's backward fill), else the oldest newer one.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

PACKAGE = "aiconfigurator_core"
"""The import name of the package holding the tables."""
CORE_TABLES = ("gemm/gemm_perf", "attention/context_attention_perf")
"""Tables a version must have on a GPU to count as measured there."""


FETCHED_ENV = "SERVESIM_KERNELS_DIR"
"""Environment variable naming the fetched database's folder (default ``data/kernels``)."""


def fetched_root() -> Path:
    """Where ``servesim fetch kernels`` saved the database: ``$SERVESIM_KERNELS_DIR``, else
    ``data/kernels`` (from the folder servesim runs in, as every ``data/`` path)."""
    return Path(os.environ.get(FETCHED_ENV) or Path("data") / "kernels")


def data_root() -> Path:
    """``systems/data`` of the installed package (found without importing it: its compiled
    core is not needed to read the tables), else the fetched files (``fetched_root``);
    neither -> ``InputError``."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        root = Path(loc) / "systems" / "data"
        if root.is_dir():
            return root
    fetched = fetched_root()
    if fetched.is_dir():
        return fetched
    raise InputError(
        "cost_model.type: kernels needs NVIDIA's kernel database: pip install "
        "'servesim[kernels]' (aiconfigurator-core) or servesim fetch kernels [GPU], "
        "or use cost_model.type: physics"
    )


def version_key(version: str) -> tuple[int, ...]:
    """``0.24`` and ``0.24.0`` alike, ordered numerically; a non-numeric part sorts as -1."""
    parts = [int(p) if p.isdigit() else -1 for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _versions(gpu_dir: Path, table: str) -> dict[tuple[int, ...], Path]:
    """Versions of ``table`` (``family/name``) measured with vLLM on this GPU -> its file."""
    family, name = table.split("/")
    out: dict[tuple[int, ...], Path] = {}
    folder = gpu_dir / family / "vllm"
    if folder.is_dir():
        for vdir in folder.iterdir():
            path = vdir / f"{name}.parquet"
            if path.is_file():
                out[version_key(vdir.name)] = path
    return out


def measured_gpus() -> list[str]:
    """GPU folders with at least one vLLM version measured, sorted."""
    root = data_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and measured_versions(p.name))


@cache
def measured_versions(gpu: str) -> list[str]:
    """vLLM versions measured on ``gpu`` (oldest first, as ``0.24.0``); none -> empty."""
    gpu_dir = data_root() / gpu
    found = [_versions(gpu_dir, t) for t in CORE_TABLES]
    common = set(found[0]).intersection(*found[1:])
    return [found[0][k].parent.name for k in sorted(common)]


@dataclass(frozen=True)
class KernelDatabase:
    """The tables of one GPU at one vLLM version."""

    gpu: str
    """The database's GPU folder (``h100_sxm``, ``rtx_pro_6000_server``, ...)."""
    version: str
    """The vLLM version of the GEMM and attention tables."""

    @classmethod
    def open(cls, gpu: str | None, version: str | None, hardware: str) -> KernelDatabase:
        """The tables of ``gpu`` (a hardware preset's ``kernels_gpu``) at ``version`` (None:
        the newest measured); a GPU or version the database lacks -> ``InputError``."""
        measured = measured_gpus()
        if gpu is None or gpu not in measured:
            raise InputError(
                f"cost_model.hardware: {hardware}: no vLLM kernels measured for this GPU "
                f"(measured: {', '.join(measured)}); use cost_model.type: physics"
            )
        versions = measured_versions(gpu)
        if version is None:
            return cls(gpu, versions[-1])
        for v in versions:
            if version_key(v) == version_key(version):
                return cls(gpu, v)
        raise InputError(
            f"cost_model.vllm_version: {version}: not measured on {gpu} (measured: "
            f"{', '.join(versions)}); omit it for the newest, or use cost_model.type: physics"
        )

    def path(self, table: str) -> Path | None:
        """File of ``table`` (``family/name``) at this version, else the newest older one,
        else the oldest newer one; None if never measured on this GPU."""
        found = _versions(data_root() / self.gpu, table)
        if not found:
            return None
        want = version_key(self.version)
        older = [k for k in found if k <= want]
        return found[max(older)] if older else found[min(found)]

    def read(self, table: str, **equal: str | int) -> pd.DataFrame | None:
        """The table's rows whose columns equal ``equal`` (a column the table lacks does not
        vary there: not filtered on), or None (see ``path``)."""
        path = self.path(table)
        return None if path is None else _read(path, tuple(sorted(equal.items())))

    def nccl(self) -> pd.DataFrame | None:
        """The GPU's NCCL collectives table (newest NCCL version), or None."""
        folder = data_root() / self.gpu / "comm" / "nccl"
        if not folder.is_dir():
            return None
        files = sorted(
            (version_key(v.name), v / "nccl_perf.parquet")
            for v in folder.iterdir()
            if (v / "nccl_perf.parquet").is_file()
        )
        return _read(files[-1][1], ()) if files else None


@cache
def _read(path: Path, equal: tuple[tuple[str, str | int], ...]) -> pd.DataFrame:
    """A table's rows with these column values, read once per process (filtered as parquet
    is read: the GEMM table alone has 100k rows); ``latency`` in milliseconds."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from simulator.parquet_file import unreadable

    try:
        # the file whole, then the rows (read_table's filters import pyarrow.dataset: 0.5 s)
        table = pq.ParquetFile(path).read()
        for column, value in equal:
            if column in table.column_names:  # older tables lack some (no window_size at 0.14)
                table = table.filter(pc.equal(table[column], value))
        return table.to_pandas()
    except Exception as err:  # any damage: one line naming the file
        raise unreadable(path, err) from None
