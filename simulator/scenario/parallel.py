"""A scenario's ``parallel:`` made concrete: the expert-parallel degree in the cost model, and
the data-parallel ranks (one scheduler and cost model each) of the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from simulator.cost import CostModel, build_cost_model
from simulator.cost.kernels import KernelsCostConfig
from simulator.cost.physics import PhysicsCostConfig
from simulator.cost.profiled import ProfiledCostConfig
from simulator.cost.roofline import RooflineCostConfig
from simulator.engine.dp_padding import DPPadding, capture_sizes
from simulator.engine.lockstep import DataParallelRanks
from simulator.engine.serving import ServingConfig
from simulator.engine.simulation import Simulation
from simulator.errors import InputError, in_field
from simulator.scenario.config import ScenarioConfig
from simulator.scheduling import make_scheduler
from simulator.workload import Workload


def expert_parallel_degree(cfg: ScenarioConfig) -> int:
    """GPUs the routed experts are split over: ``data_parallel_size x tp`` with
    ``enable_expert_parallel``, else 1."""
    par = cfg.parallel
    if par is None or not par.enable_expert_parallel:
        return 1
    return par.data_parallel_size * int(getattr(cfg.cost_model, "tp", 1))


def with_expert_parallel(cfg: ScenarioConfig) -> ScenarioConfig:
    """``cfg`` with its cost model's ``expert_parallel`` set from ``parallel`` (the KV budget
    then counts each rank's share of the experts)."""
    ep = expert_parallel_degree(cfg)
    if ep == 1:
        return cfg
    cm = cfg.cost_model
    if not isinstance(
        cm, ProfiledCostConfig | RooflineCostConfig | PhysicsCostConfig | KernelsCostConfig
    ):
        raise InputError(
            "parallel.enable_expert_parallel: supported with the profiled, roofline, physics "
            f"and kernels cost models (cost_model.type is {cm.type})"
        )
    from simulator.cost.presets import load_hardware, load_model

    model = in_field("cost_model.model", load_model, cm.model)
    if not model.is_moe:
        raise InputError(
            f"parallel.enable_expert_parallel: model {model.name} has no experts to split "
            "(a dense model: use data_parallel_size without it)"
        )
    try:
        model.experts_per_rank(ep)
    except InputError as err:
        raise InputError(f"parallel.enable_expert_parallel: {err}") from None
    if (
        getattr(cm, "interconnect_bandwidth", None) is None
        and load_hardware(cm.hardware).interconnect_bandwidth is None
    ):
        raise InputError(
            "cost_model.interconnect_bandwidth: required with expert parallelism (hardware "
            f"preset {cm.hardware} names no link for the all-to-all)"
        )
    return cfg.model_copy(update={"cost_model": cm.model_copy(update={"expert_parallel": ep})})


def build_dp_simulation(
    cfg: ScenarioConfig,
    workload: Workload,
    progress: Callable[[int], object] | None,
    **kwargs: Any,
) -> Simulation:
    """The run of a resolved scenario with ``parallel.data_parallel_size > 1`` ranks."""
    assert cfg.parallel is not None
    n = cfg.parallel.data_parallel_size
    costs: list[CostModel] = [build_cost_model(cfg.cost_model) for _ in range(n)]
    with_cpu = _with_cpu(cfg.serving) if cfg.serving.changes_steps else None
    spec = cfg.speculative
    ranks = [
        make_scheduler(cfg.scheduler, speculative=spec, rng=rng)
        for rng in rank_acceptance_rngs(cfg, n)
    ]
    sched = cfg.scheduler
    max_num_batched_tokens, max_num_seqs = sched.budgets()
    sizes = capture_sizes(max_num_seqs, max_num_batched_tokens)
    padding = DPPadding(sizes if cfg.parallel.cuda_graphs else None)
    return Simulation(
        workload,
        costs[0],
        ranks[0],
        dp=DataParallelRanks(ranks, costs, padding, with_cpu),
        progress=progress,
        max_concurrency=cfg.workload.concurrency_caps,
        percentiles=cfg.metrics.percentiles,
        serving=cfg.serving,
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        draft_cost=spec.draft_cost if spec else 0.0,
        **kwargs,
    )


def rank_acceptance_rngs(cfg: ScenarioConfig, n: int) -> list[np.random.Generator | None]:
    """Each rank's stream of speculative acceptance draws (None without speculation): rank
    0 draws from the run's acceptance stream (the one a single server draws from), rank
    ``i > 0`` from that stream's ``i``-th spawned child, so the ranks' draws are independent,
    seeded by ``cfg.seed``, and do not depend on which rank a request lands on first."""
    if cfg.speculative is None:
        return [None] * n
    root = np.random.SeedSequence(cfg.seed).spawn(2)[1]  # ``runner.acceptance_rng``'s seed
    return [np.random.default_rng(s) for s in [root, *root.spawn(n - 1)]]


def _with_cpu(serving: ServingConfig) -> Callable[[float, int], float]:
    """A rank's step on the server from its GPU time and sequences, as ``StepWithCpu`` times
    it: the GPU's time scaled, the CPU's per-step work overlapped (``max``) under async
    scheduling, else added."""
    fixed, per_seq = serving.step_cpu_ms * 1e-3, serving.step_cpu_per_seq_us * 1e-6
    overlap, scale = serving.async_scheduling, serving.gpu_time_scale

    def step(gpu: float, num_seqs: int) -> float:
        gpu *= scale
        cpu = fixed + per_seq * num_seqs
        return max(gpu, cpu) if overlap else gpu + cpu

    return step
