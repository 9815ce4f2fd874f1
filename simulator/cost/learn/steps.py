"""Step-time error of fitted physics parameters on one profiled group: a grid of serving
steps (decodes, prefill chunks, mixed), each "measured" as the sum of the group's profiled
operator times (the ``profiled`` model without its skew correction, whose sums reproduce
real vLLM runs within ~1%: docs/fidelity.md) against the physics model's prediction. The
same tensor-parallel all-reduce term is in both, so it is taken out of both."""

from __future__ import annotations

from itertools import product
from pathlib import Path

import numpy as np

from simulator.cost.batch import Batch
from simulator.cost.learn.sources import Source, source_model
from simulator.cost.physics import PhysicsCostConfig, PhysicsCostModel
from simulator.cost.physics_params import PhysicsParams
from simulator.cost.physics_terms import RankShape, gemm_time
from simulator.cost.presets import load_hardware
from simulator.cost.profiled import ProfiledCostConfig, ProfiledCostModel
from simulator.cost.profiles import read_profile


def step_grid() -> list[Batch]:
    """Uniform serving steps within vLLM's usual budgets (2,048 tokens, 256 sequences)."""
    out = [
        Batch.uniform(n, 1, c)
        for n, c in product((1, 2, 4, 8, 16, 32, 64, 128, 256), (128, 512, 1024, 2048, 4096))
    ]
    out += [
        Batch((pc,), (kvp,))
        for pc, kvp in product((16, 64, 128, 256, 512, 1024, 2048), (0, 512, 2048))
    ]
    for pc, nd, kvd, kvp in product(
        (256, 512, 1024, 1792), (16, 64, 128, 255), (256, 1024, 2048), (0, 1024)
    ):
        if pc + nd <= 2048:
            out.append(Batch((pc, *(1,) * nd), (kvp, *(kvd,) * nd)))
    return out


def bundle_errors(src: Source, tp: int, data: Path, params: PhysicsParams) -> np.ndarray:
    """Signed relative errors (predicted / measured - 1) over ``step_grid`` of one TP degree
    of an LLMServingSim bundle."""
    path = str(data / src.path)
    profile = read_profile(path, "llmservingsim", tp)
    model, hw = source_model(src), load_hardware(src.hardware)
    cfg = ProfiledCostConfig(
        profile=path, model=model.name, hardware=src.hardware, tp=tp, skew=False
    )
    measured = ProfiledCostModel(cfg, model, hw, profile)
    physics = PhysicsCostModel(
        PhysicsCostConfig(model=model.name, hardware=src.hardware, tp=tp), model, hw, params
    )
    errs = []
    for batch in step_grid():
        comm = physics.allreduce_time(sum(batch.new_tokens))
        errs.append((physics.step_time(batch) - comm) / (measured.step_time(batch) - comm) - 1)
    return np.asarray(errs)


def vidur_errors(src: Source, tp: int, data: Path, params: PhysicsParams) -> np.ndarray:
    """Signed relative errors of a Vidur profile's four matmuls of one layer, summed, at
    every profiled token count (its only operators fitted), at the GPU's fitted scales (its
    memory and curve scales too: the other stack's level, which pricing does not use)."""
    from simulator.cost.profiles.vidur import read_vidur_mlp

    prof = read_vidur_mlp(data / src.path, tp)
    shape = RankShape.of(source_model(src), tp)
    hw = load_hardware(src.hardware)
    p, c, m = params.as_fitted(hw.name)
    names = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
    xs = np.asarray(prof.per_layer[names[0]][1].xs)
    measured = sum(np.asarray(prof.per_layer[n][1].table(xs)) for n in names)
    predicted = sum(
        gemm_time(xs, k, n, hw.peak_flops * c, hw.hbm_bandwidth * m, p, shape.dtype_bytes)
        for k, n in shape.gemms().values()
    )
    return np.asarray(predicted / measured - 1)


def group_errors(src: Source, data: Path, params: PhysicsParams) -> np.ndarray | None:
    """Signed step-time errors of every TP degree of ``src`` (None: none to compare)."""
    tps = src.tp if isinstance(src.tp, list) else [src.tp]
    if src.format == "vidur-mlp":
        return np.concatenate([vidur_errors(src, tp, data, params) for tp in tps])
    return np.concatenate([bundle_errors(src, tp, data, params) for tp in tps])
