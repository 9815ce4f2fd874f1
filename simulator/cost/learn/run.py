"""``servesim learn`` without the command line: read the training set, fit, measure the
fit's step-time error per group, and return the parameters file's content."""

from __future__ import annotations

import datetime
from collections.abc import Collection
from pathlib import Path

import numpy as np

from simulator.cost.learn.fit import fit
from simulator.cost.learn.sources import ObservationSet, Sources, read_source, sha256
from simulator.cost.learn.steps import group_errors
from simulator.cost.physics_params import GpuFit, GroupError, PhysicsParams

__all__ = ["error_summary", "learn", "observations"]


def observations(
    sources: Sources, data: Path, exclude: Collection[str] = ()
) -> tuple[list[ObservationSet], list[str]]:
    """Every observation set of the sources whose hardware and model are not in
    ``exclude``, and ``fitted_on`` lines (path under ``data`` and sha256) of the files read."""
    sets: list[ObservationSet] = []
    files: set[Path] = set()
    for src in sources.sources:
        if src.hardware in exclude or src.model in exclude:
            continue
        found, read = read_source(src, data)
        sets += found
        files.update(read)
    fitted_on = [f"{f.relative_to(data)} sha256:{sha256(f)}" for f in sorted(files)]
    return sets, fitted_on


def error_summary(errors: np.ndarray) -> GroupError:
    """Median and p90 of the absolute errors, in percent."""
    a = np.abs(errors) * 100
    return GroupError(
        points=len(a),
        median_pct=round(float(np.median(a)), 2),
        p90_pct=round(float(np.percentile(a, 90)), 2),
    )


def learn(
    sources: Sources, data: Path, command: str, exclude: Collection[str] = ()
) -> PhysicsParams:
    """Fit the sources (less the excluded hardware or model presets) and report the fit's
    in-sample step-time error on each group it fitted."""
    sets, fitted_on = observations(sources, data, exclude)
    result = fit(sets)
    params = PhysicsParams(
        stack=sources.stack,
        fitted_on=fitted_on,
        excluded=[*sources.excluded, *(f"{name}: left out by --exclude" for name in exclude)],
        fitted_at=datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        command=command,
        shared={k: float(f"{v:.6g}") for k, v in result.shared.items()},
        gpus={
            g: GpuFit(**{k: float(f"{v:.6g}") for k, v in s.items()})
            for g, s in result.gpus.items()
        },
    )
    errors = {}
    for src in sources.sources:
        if src.hardware in exclude or src.model in exclude:
            continue
        errs = group_errors(src, data, params)
        if errs is not None:
            errors[src.name] = error_summary(errs)
    return params.model_copy(update={"errors": errors})
