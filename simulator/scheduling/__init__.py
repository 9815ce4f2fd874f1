"""Scheduling: which sequences compute how many tokens in each step (no clock, no I/O).

``make_scheduler`` builds the policy a scenario names; each policy implements the
``Scheduler`` interface of ``interface.py`` and returns a ``StepPlan`` per step.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.scheduling.config import SchedulerConfig
from simulator.scheduling.interface import ManySampler, Sampler, Scheduler, StepPlan
from simulator.scheduling.sequence import Sequence, SequenceStatus
from simulator.scheduling.spec import SpecScheduler
from simulator.scheduling.vllm_v1 import VllmV1Scheduler

__all__ = [
    "POLICIES",
    "ManySampler",
    "Sampler",
    "Scheduler",
    "SchedulerConfig",
    "Sequence",
    "SequenceStatus",
    "SpecScheduler",
    "StepPlan",
    "VllmV1Scheduler",
    "make_scheduler",
]


def _spec(
    cfg: SchedulerConfig, sample: Sampler | None, sample_many: ManySampler | None
) -> Scheduler:
    assert cfg.num_blocks is not None, "resolve the scenario first (num_blocks)"
    return SpecScheduler(
        cfg.num_blocks,
        cfg.block_size,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        sample,
        sample_many=sample_many,
        keep_finished=False,
        enable_prefix_caching=bool(cfg.enable_prefix_caching),
    )


def _vllm_v1(
    cfg: SchedulerConfig, sample: Sampler | None, sample_many: ManySampler | None
) -> Scheduler:
    assert cfg.num_blocks is not None, "resolve the scenario first (num_blocks)"
    return VllmV1Scheduler(
        cfg.num_blocks,
        cfg.block_size,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        sample,
        priority=cfg.priority_policy == "priority",
        reserve_full_isl=bool(cfg.reserve_full_isl),
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        enable_prefix_caching=bool(cfg.enable_prefix_caching),
        sample_many=sample_many,
        keep_finished=False,
    )


POLICIES: dict[str, Callable[[SchedulerConfig, Sampler | None, ManySampler | None], Scheduler]] = {
    "spec": _spec,
    "vllm-v1": _vllm_v1,
}
"""Policy name (``scheduler.policy``) -> how to build it from the config and a sampler."""


def make_scheduler(
    cfg: SchedulerConfig, sample: Sampler | None = None, sample_many: ManySampler | None = None
) -> Scheduler:
    """The scheduler ``cfg.policy`` names, drawing tokens from ``sample`` (and, for the fast
    path, ``sample_many``); with no ``sample`` it only counts each sequence's tokens."""
    return POLICIES[cfg.policy](cfg, sample, sample_many)
