"""The tensor-parallel all-reduce's learned latency and link efficiency: fitted on Vidur's
public NCCL all-reduce profiles of DGX A100 and H100 nodes (``data/profiling/network/``,
registered in ``configs/physics/sources.yaml`` with repo, commit, path and sha256), for the
GPUs on an NVLink link. The files are not in the project; without them the fit is skipped and
the shipped values kept, with a note."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.physics_params import AllReduceFit
from simulator.cost.presets import load_hardware
from simulator.cost.profiles.csvfile import read_columns
from simulator.errors import InputError

__all__ = ["AllReduceSource", "find", "fit_allreduce"]

_MS = 1e-3


class AllReduceSource(BaseModel):
    """One public all-reduce profile (Vidur's ``all_reduce.csv`` of one node type)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Group name, as the errors are reported."""
    hardware: str
    """Hardware preset of the GPUs profiled (its ``interconnect_bandwidth`` is the link)."""
    path: str
    """The file's name under the data folder."""
    repo: str
    """GitHub repository it comes from."""
    commit: str = Field(min_length=40, max_length=40)
    """The commit pinned."""
    source_path: str
    """Its path in the repository."""
    sha256: str = Field(min_length=64, max_length=64)
    """Its digest (a file with another one is refused)."""


def find(src: AllReduceSource, roots: Sequence[Path]) -> Path | None:
    """The first copy of ``src`` under ``roots`` (None: not there); a copy whose sha256
    differs -> ``InputError``."""
    for root in roots:
        path = root / src.path
        if path.is_file():
            if hashlib.sha256(path.read_bytes()).hexdigest() != src.sha256:
                raise InputError(f"{path}: sha256 differs from {src.sha256} (sources.yaml)")
            return path
    return None


def _points(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, bytes, seconds) of the single-node rows: the fastest of each point's timed
    iterations (a CUDA graph replays the kernel without the host's jitter)."""
    cols, _ = read_columns(
        path,
        {
            "time_stats.all_reduce.min": "float",
            "num_workers": "int",
            "devices_per_node": "int",
            "size": "int",
        },
    )
    ranks = np.asarray(cols["num_workers"], dtype=float)
    node = ranks == np.asarray(cols["devices_per_node"], dtype=float)
    size = np.asarray(cols["size"], dtype=float) * 2.0  # fp16 elements (Vidur's profiler)
    t = np.asarray(cols["time_stats.all_reduce.min"]) * _MS
    return ranks[node], size[node], t[node]


def predict(
    ranks: np.ndarray, nbytes: np.ndarray, bw: float, latency_us: float, eff: float
) -> np.ndarray:
    """Seconds of ring all-reduces of ``nbytes`` over ``ranks`` GPUs on a link of ``bw``."""
    return np.asarray(latency_us * 1e-6 + 2.0 * (ranks - 1) / ranks * nbytes / (bw * eff))


def fit_allreduce(found: Sequence[tuple[AllReduceSource, Path]]) -> AllReduceFit:
    """Latency and link efficiency, one pair for every NVLink GPU, by robust least squares on
    the log of predicted over measured times."""
    from scipy.optimize import least_squares

    data = []
    for src, path in found:
        bw = load_hardware(src.hardware).require("interconnect_bandwidth", "the all-reduce fit")
        data.append((bw, *_points(path)))

    def residuals(x: np.ndarray) -> np.ndarray:
        lat, eff = np.exp(x)
        return np.concatenate(
            [np.log(predict(r, b, bw, lat, eff) / t) / np.sqrt(len(t)) for bw, r, b, t in data]
        )

    sol = least_squares(residuals, np.log([10.0, 0.8]), loss="soft_l1", f_scale=0.1)
    lat, eff = (float(f"{v:.6g}") for v in np.exp(sol.x))
    errs = np.abs(np.concatenate([predict(r, b, bw, lat, eff) / t - 1 for bw, r, b, t in data]))
    return AllReduceFit(
        latency_us=lat,
        bandwidth_efficiency=eff,
        points=len(errs),
        median_pct=round(float(np.median(errs)) * 100, 2),
        p90_pct=round(float(np.percentile(errs, 90)) * 100, 2),
        fitted_on=[f"{src.repo}@{src.commit[:7]} {src.source_path}" for src, _ in found],
    )
