"""``servesim learn`` without the command line: read the training set, fit, measure the
fit's step-time error per group, and return the parameters file's content."""

from __future__ import annotations

import datetime
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np

from simulator.cost.learn.allreduce import find, fit_allreduce
from simulator.cost.learn.fit import fit
from simulator.cost.learn.sources import (
    ObservationSet,
    Sources,
    read_kernels,
    read_source,
    sha256,
)
from simulator.cost.learn.steps import group_errors
from simulator.cost.physics_params import AllReduceFit, GpuFit, GroupError, PhysicsParams

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
    if sources.kernels is not None:
        gpus = [g for g in sources.kernels.gpus if g not in exclude]
        for gpu in gpus:
            sets += read_kernels(sources.kernels, gpu)
        if gpus:
            fitted_on.append(f"{sources.kernels.package}: {', '.join(gpus)}")
    return sets, fitted_on


def error_summary(errors: np.ndarray) -> GroupError:
    """Median and p90 of the absolute errors, in percent."""
    a = np.abs(errors) * 100
    return GroupError(
        points=len(a),
        median_pct=round(float(np.median(a)), 2),
        p90_pct=round(float(np.percentile(a, 90)), 2),
    )


def allreduce_fit(
    sources: Sources, roots: Sequence[Path], kept: AllReduceFit | None, exclude: Collection[str]
) -> tuple[AllReduceFit | None, list[str]]:
    """The all-reduce fitted on the profiles found under ``roots`` (the first holding each),
    and notes; none found: ``kept`` (the shipped fit) and a note saying so."""
    wanted = [s for s in sources.allreduce if s.hardware not in exclude]
    found = [(s, path) for s in wanted if (path := find(s, roots)) is not None]
    if not wanted:
        return None, []
    if not found:
        where = " or ".join(str(r) for r in roots)
        names = ", ".join(s.path for s in wanted)
        return kept, [f"{names}: not found under {where}; the all-reduce fit kept as shipped"]
    missing = [f"{s.path}: not found, not fitted" for s in wanted if s not in dict(found)]
    return fit_allreduce(found), missing


def learn(
    sources: Sources,
    data: Path,
    command: str,
    exclude: Collection[str] = (),
    roots: Sequence[Path] | None = None,
    kept: AllReduceFit | None = None,
) -> PhysicsParams:
    """Fit the sources (less the excluded hardware or model presets) and report the fit's
    in-sample step-time error on each group it fitted; the all-reduce profiles are read under
    ``roots`` (default: ``data``), ``kept`` when none is there."""
    sets, fitted_on = observations(sources, data, exclude)
    result = fit(sets)
    ar, notes = allreduce_fit(sources, roots or [data], kept, exclude)
    params = PhysicsParams(
        stack=sources.stack or "",
        fitted_on=fitted_on,
        allreduce=ar,
        excluded=[
            *sources.excluded,
            *(f"{name}: left out by --exclude" for name in exclude),
            *notes,
        ],
        fitted_at=datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        command=command,
        shared={k: float(f"{v:.6g}") for k, v in result.shared.items()},
        gpus={
            g: GpuFit(
                **{k: float(f"{v:.6g}") for k, v in s.items()},
                own_stack=any(o.own_stack for o in sets if o.hardware.name == g),
            )
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
