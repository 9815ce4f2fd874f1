"""Scheduling: which sequences compute how many tokens in each step (no clock, no I/O).

``make_scheduler`` builds the policy a scenario names (``POLICIES``): the one
``StepScheduler`` with the flags of a preset (``spec``, ``vllm-v1``) or of the scenario, or
a policy class by import path. Every policy implements the ``Scheduler`` interface of
``interface.py`` and returns a ``StepPlan`` per step.
"""

from __future__ import annotations

import numpy as np

from simulator.scheduling.acceptance import DrawnAcceptance
from simulator.scheduling.config import POLICIES, SchedulerConfig
from simulator.scheduling.encoder_inputs import EncoderInputs
from simulator.scheduling.interface import ManySampler, Sampler, Scheduler, StepPlan
from simulator.scheduling.kv_tier import KVTier
from simulator.scheduling.sequence import Sequence, SequenceStatus
from simulator.scheduling.spec_config import SpeculativeConfig
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
    "SpeculativeConfig",
    "StepPlan",
    "StepScheduler",
    "make_scheduler",
]


def make_scheduler(
    cfg: SchedulerConfig,
    sample: Sampler | None = None,
    sample_many: ManySampler | None = None,
    *,
    speculative: SpeculativeConfig | None = None,
    rng: np.random.Generator | None = None,
    gpus: int = 1,
) -> Scheduler:
    """The scheduler ``cfg.policy`` names, drawing tokens from ``sample`` (and, for the fast
    path, ``sample_many``); with no ``sample`` it only counts each sequence's tokens. A
    ``StepScheduler`` (sub)class gets the config's budgets and flags; any other policy class
    is called with ``(cfg, sample, sample_many)``. ``speculative``: drafts per decode step,
    accepted as drawn from ``rng`` (the run's acceptance stream). ``gpus``: the replica's GPUs,
    each with its own swap space and host link (``preemption_mode: swap``)."""
    policy = POLICIES.resolve(cfg.policy)
    if not issubclass(policy, StepScheduler):
        if cfg.preemption_mode == "swap":
            raise ValueError(f"policy {cfg.policy!r} takes no swap preemption")
        if speculative is not None or cfg.async_scheduling:
            raise ValueError(f"policy {cfg.policy!r} takes no speculative or async scheduling")
        return policy(cfg, sample, sample_many)  # type: ignore[call-arg]
    assert cfg.num_blocks is not None, "resolve the scenario first (num_blocks)"
    max_num_batched_tokens, max_num_seqs = cfg.budgets()
    scheduler = policy(
        cfg.num_blocks,
        cfg.block_size,
        max_num_seqs,
        max_num_batched_tokens,
        sample,
        sample_many=sample_many,
        keep_finished=False,
        enable_prefix_caching=bool(cfg.enable_prefix_caching),
        admit_after_preemption=bool(cfg.admit_after_preemption),
        reserve_full_isl=bool(cfg.reserve_full_isl),
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        priority=cfg.priority_policy == "priority",
        async_scheduling=cfg.async_scheduling,
        max_model_len=cfg.max_model_len or 0,
        encoder=_encoder(cfg),
        **_speculation(speculative, rng),
        kv_groups=cfg.kv_groups,
    )
    off = cfg.kv_offload
    if off is not None and off.cpu is not None:
        assert off.kv_bytes_per_token is not None, "resolve the scenario first (KV bytes)"
        block_bytes = off.kv_bytes_per_token * cfg.block_size
        tier = KVTier("cpu", int(off.cpu.size_gb * 1e9 // block_bytes))
        scheduler.attach_tier(tier, block_bytes, off.cpu.bandwidth_gb_s * 1e9, off.cpu.latency_s)
    if cfg.preemption_mode == "swap":
        _enable_swap(scheduler, cfg, gpus)
    return scheduler


def _enable_swap(scheduler: StepScheduler, cfg: SchedulerConfig, gpus: int) -> None:
    """Swap preemption: ``swap_space_gb`` GiB of CPU blocks per GPU, copied over each GPU's
    host link at once (each GPU holds and copies its shard of every block)."""
    per_token, link = cfg.swap_kv_bytes_per_token, cfg.host_link_gb_s
    assert per_token is not None and link is not None, "resolve the scenario first (swap)"
    block_bytes = per_token * cfg.block_size
    space = cfg.swap_space_gb * 2**30 * gpus
    scheduler.enable_swap(int(space // block_bytes), block_bytes, link * 1e9 * gpus)


def _encoder(cfg: SchedulerConfig) -> EncoderInputs | None:
    """The encoder budget and cache of a multimodal scenario (resolved), else None."""
    budget, size = cfg.max_num_encoder_input_tokens, cfg.encoder_cache_size
    if budget is None or size is None:
        return None
    return EncoderInputs(budget, size, cfg.disable_chunked_mm_input)


def _speculation(spec: SpeculativeConfig | None, rng: np.random.Generator | None) -> dict:
    """The scheduler's speculative-decoding arguments (none without speculation, or k = 0)."""
    if spec is None or not spec.num_speculative_tokens:
        return {}
    if rng is None:
        raise ValueError("speculative decoding needs an rng for its acceptance draws")
    k = spec.num_speculative_tokens
    return {
        "num_speculative_tokens": k,
        "accept": DrawnAcceptance(spec.acceptance.at_least(k), rng),
    }
