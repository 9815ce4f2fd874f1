"""The fit behind ``servesim learn``: every shared parameter and each measured GPU's two scales
at once, by robust least squares on the log of predicted over measured operator times
(scipy.optimize.least_squares, deterministic: a fixed start, no random restarts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.cost.learn.sources import ObservationSet
from simulator.cost.physics_terms import PER_GPU, SHARED, Array, gpu_params

START = {
    "gemm_launch_us": 4.0,
    "gemm_compute": 0.8,
    "gemm_ramp_tokens": 20.0,
    "gemm_memory": 0.85,
    "gemm_tiled_memory": 0.95,
    "gemm_sharpness": 3.0,
    "elem_launch_us": 2.0,
    "norm_memory": 0.6,
    "rotary_memory": 0.5,
    "act_memory": 0.8,
    "embedding_memory": 0.5,
    "attn_launch_us": 6.0,
    "prefill_compute": 0.4,
    "prefill_causal": 0.7,
    "prefill_memory": 0.5,
    "attn_sharpness": 3.0,
    "decode_memory": 0.9,
    "decode_occupancy": 1.0,
    "decode_seq_us": 0.5,
    "decode_step_us": 3.0,
    "decode_units": 300.0,
    "mixed_decode": 1.5,
    "sampler_us": 20.0,
    "sampler_memory": 0.3,
    # relative to the dense matmuls' (gemm_compute, gemm_memory): 1 prices a grouped GEMM as
    # dense ones of the same shape, which is what a fit without moe.csv keeps
    "moe_launch_us": 15.0,
    "moe_compute": 1.0,
    "moe_ramp_tokens": 16.0,
    "moe_memory": 1.0,
    "moe_sharpness": 3.0,
}
"""Where the fit starts (physically plausible values; the fit moves every one)."""
BOUNDS = {
    "gemm_sharpness": (1.0, 12.0),
    "attn_sharpness": (1.0, 12.0),
    "moe_sharpness": (1.0, 12.0),
}
"""Parameters with bounds other than ``(1e-4, 1e4)`` times their start."""
SCALE_PRIOR = 0.15
"""Weight of the pull of each log GPU scale towards 0 for a GPU measured on the stack priced:
without it a shared efficiency and the scales could trade off freely; with it the shared
ones fit the typical such GPU. (0.15 rather than 0.3 since the GPUs have curves of their
own: the leave-one-GPU-out step errors of the vLLM-stack groups are no worse at 0.15 on any
group and better on two; 0.08 trades some of them for others.) A GPU measured only on
another stack (Vidur's) gets a pull of ``OTHER_STACK_PRIOR`` on all but its compute scale:
its scales take up the other stack's level and shape, and its points shape the stack's
compute curve mostly."""
OTHER_STACK_PRIOR = 0.003
START_PRIOR = 0.01
"""Weight of the pull of each shared parameter's log towards its start: too weak to move a
parameter the data determine, it keeps one no training set measures (the activation's
efficiency when every bundle left is MoE) at its plausible start instead of at a bound."""


@dataclass(frozen=True)
class FitResult:
    """Fitted parameters and the fit's cost."""

    shared: dict[str, float]
    """Shared parameters."""
    gpus: dict[str, dict[str, float]]
    """Per measured GPU: its scales (``PER_GPU``)."""
    cost: float
    """Final weighted sum of squared log errors (halved, as scipy reports it)."""
    evaluations: int
    """Residual evaluations the optimiser made."""


def _unpack(x: Array, gpus: Sequence[str]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    values = np.exp(x)
    shared = {k: float(v) for k, v in zip(SHARED, values, strict=False)}
    rest, n = values[len(SHARED) :], len(PER_GPU)
    scales = {
        g: {k: float(v) for k, v in zip(PER_GPU, rest[n * i : n * (i + 1)], strict=True)}
        for i, g in enumerate(gpus)
    }
    return shared, scales


def residuals(x: Array, sets: Sequence[ObservationSet], gpus: Sequence[str], prior: Array) -> Array:
    """Weighted log errors of every observation, then the scales' prior (``prior``: its
    weight for each scale)."""
    shared, scales = _unpack(x, gpus)
    curves = {g: gpu_params(shared, s) for g, s in scales.items()}
    parts = []
    for s in sets:
        g = scales[s.hardware.name]
        c, m = g["compute_scale"], g["memory_scale"] if s.scaled else 1.0
        pred = s.predict(
            curves[s.hardware.name], s.hardware.peak_flops * c, s.hardware.hbm_bandwidth * m
        )
        w = np.sqrt(s.weight / len(s.measured))
        parts.append(w * np.log(np.maximum(pred, 1e-12) / s.measured))
    parts.append(prior * x[len(SHARED) :])
    parts.append(START_PRIOR * (x[: len(SHARED)] - np.log([START[k] for k in SHARED])))
    return np.concatenate(parts)


def fit(sets: Sequence[ObservationSet]) -> FitResult:
    """Least squares (soft-L1 loss: a few odd profiled points do not steer it) from ``START``."""
    from scipy.optimize import least_squares

    gpus = sorted({s.hardware.name for s in sets})
    own = {s.hardware.name for s in sets if s.own_stack}
    # per GPU in PER_GPU order: another stack's compute-bound matmuls are the same cuBLAS
    # kernels, so its GPUs' compute scales are pulled like any; only their memory-bound end
    # (and its timing overheads) is that stack's own: its other scales are all but free
    rest = len(PER_GPU) - 1
    prior = np.ravel(
        [[SCALE_PRIOR] + [SCALE_PRIOR if g in own else OTHER_STACK_PRIOR] * rest for g in gpus]
    )
    n = len(PER_GPU) * len(gpus)
    x0 = np.log([START[k] for k in SHARED] + [1.0] * n)
    lo = np.array([np.log(BOUNDS.get(k, (START[k] * 1e-4, 0))[0]) for k in SHARED])
    hi = np.array([np.log(BOUNDS.get(k, (0, START[k] * 1e4))[1]) for k in SHARED])
    lo = np.concatenate([lo, np.full(n, np.log(0.2))])
    hi = np.concatenate([hi, np.full(n, np.log(5.0))])
    sol = least_squares(
        residuals,
        x0,
        bounds=(lo, hi),
        args=(sets, gpus, prior),
        loss="soft_l1",
        f_scale=0.1,
        x_scale=1.0,
        max_nfev=200,
        ftol=1e-10,
        xtol=1e-10,
        gtol=1e-10,
    )
    shared, scales = _unpack(sol.x, gpus)
    return FitResult(
        shared,
        scales,
        float(sol.cost),
        int(sol.nfev),
    )
