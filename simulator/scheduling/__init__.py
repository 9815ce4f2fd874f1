"""Scheduling: which sequences compute how many tokens in each step (no clock, no I/O).

``make_scheduler`` builds the policy a scenario names (``POLICIES``): the one
``StepScheduler`` with the flags of a preset (``spec``, ``vllm-v1``) or of the scenario, or
a policy class by import path. Every policy implements the ``Scheduler`` interface of
``interface.py`` and returns a ``StepPlan`` per step.
"""

from __future__ import annotations

from simulator.scheduling.config import POLICIES, SchedulerConfig
from simulator.scheduling.interface import ManySampler, Sampler, Scheduler, StepPlan
from simulator.scheduling.kv_tier import KVTier
from simulator.scheduling.sequence import Sequence, SequenceStatus
from simulator.scheduling.step_scheduler import PRESETS, StepScheduler

__all__ = [
    "POLICIES",
    "PRESETS",
    "ManySampler",
    "Sampler",
    "Scheduler",
    "SchedulerConfig",
    "Sequence",
    "SequenceStatus",
    "StepPlan",
    "StepScheduler",
    "make_scheduler",
]


def make_scheduler(
    cfg: SchedulerConfig, sample: Sampler | None = None, sample_many: ManySampler | None = None
) -> Scheduler:
    """The scheduler ``cfg.policy`` names, drawing tokens from ``sample`` (and, for the fast
    path, ``sample_many``); with no ``sample`` it only counts each sequence's tokens. A
    ``StepScheduler`` (sub)class gets the config's budgets and flags; any other policy class
    is called with ``(cfg, sample, sample_many)``."""
    policy = POLICIES.resolve(cfg.policy)
    if not issubclass(policy, StepScheduler):
        return policy(cfg, sample, sample_many)  # type: ignore[call-arg]
    assert cfg.num_blocks is not None, "resolve the scenario first (num_blocks)"
    scheduler = policy(
        cfg.num_blocks,
        cfg.block_size,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        sample,
        sample_many=sample_many,
        keep_finished=False,
        enable_prefix_caching=bool(cfg.enable_prefix_caching),
        admit_after_preemption=bool(cfg.admit_after_preemption),
        reserve_full_isl=bool(cfg.reserve_full_isl),
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        priority=cfg.priority_policy == "priority",
    )
    off = cfg.kv_offload
    if off is not None and off.cpu is not None:
        assert off.kv_bytes_per_token is not None, "resolve the scenario first (KV bytes)"
        block_bytes = off.kv_bytes_per_token * cfg.block_size
        tier = KVTier("cpu", int(off.cpu.size_gb * 1e9 // block_bytes))
        scheduler.attach_tier(tier, block_bytes, off.cpu.bandwidth_gb_s * 1e9, off.cpu.latency_s)
    return scheduler
