"""Synthetic workloads: arrival times and token lengths drawn from distributions, each from its
own random stream of the scenario's seed (options and parametrisations: docs/workloads.md)."""

from __future__ import annotations

import numpy as np

from simulator.workload.arrivals import arrival_times
from simulator.workload.config import (
    EmpiricalLen,
    FixedLen,
    LengthConfig,
    LognormalLen,
    NormalLen,
    UniformLen,
    WorkloadConfig,
)
from simulator.workload.inputs import existing_file
from simulator.workload.multimodal import place_items
from simulator.workload.shared_prefix import draw_priorities, shared_prefix_prompts
from simulator.workload.traces import read_length_column
from simulator.workload.workload import Workload

# Upper bound for unbounded normal/lognormal draws before the int64 cast: far beyond any real
# context length, far below int64 overflow.
_LENGTH_CEILING = 2**40


def draw(cfg: WorkloadConfig, seed: np.random.SeedSequence) -> Workload:
    """Draw the synthetic workload ``cfg`` describes; deterministic for a given ``seed``.

    Arrivals, prompt lengths, output lengths, users (``shared_prefix``) and priorities each
    use their own stream, the children ``seed.spawn(5)`` would give on a fresh ``seed``
    (``seed`` itself is not mutated), so changing one distribution leaves the other
    quantities unchanged.
    """
    # The validator guarantees these for a synthetic workload; re-checked for mypy.
    assert cfg.num_requests is not None and cfg.arrival is not None
    assert cfg.prompt_len is not None and cfg.output_len is not None
    # a sixth stream for multimodal placement: the first five are the same with or without it
    rng_arrival, rng_prompt, rng_output, rng_user, rng_priority, rng_mm = (
        np.random.default_rng(s) for s in _streams(seed, 6)
    )
    n = cfg.num_requests
    prompt, prompt_notes = _lengths(cfg.prompt_len, n, rng_prompt, "prompt_len")
    output, output_notes = _lengths(cfg.output_len, n, rng_output, "output_len")
    runs = None
    if cfg.shared_prefix is not None:  # prompt_len drew the questions
        prompt, runs = shared_prefix_prompts(cfg.shared_prefix, prompt, output, rng_user)
    priority = None if cfg.priority is None else draw_priorities(cfg.priority, n, rng_priority)
    mm, mmc = None, cfg.multimodal
    if mmc is not None and mmc.items_per_request:
        if runs is not None:
            raise ValueError("multimodal with shared_prefix is not simulated (docs/not-modeled.md)")
        assert mmc.tokens_per_item is not None, "resolve the scenario first (tokens_per_item)"
        prompt, mm = place_items(mmc, prompt, mmc.tokens_per_item, rng_mm)
    return Workload(
        arrival_s=arrival_times(cfg.arrival, n, rng_arrival),
        prompt_len=prompt,
        output_len=output,
        notes=prompt_notes + output_notes,
        priority=priority,
        prompt_runs=runs,
        mm=mm,
    )


def _streams(seed: np.random.SeedSequence, n: int) -> list[np.random.SeedSequence]:
    # Same keys as seed.spawn(n) on a fresh seed, but repeatable: spawn() advances a counter.
    return [
        np.random.SeedSequence(
            seed.entropy, spawn_key=(*seed.spawn_key, i), pool_size=seed.pool_size
        )
        for i in range(n)
    ]


def sample_lengths(cfg: LengthConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` token lengths (int64 >= 1) from the distribution ``cfg``."""
    return _lengths(cfg, n, rng, "length")[0]


def _lengths(
    cfg: LengthConfig, n: int, rng: np.random.Generator, field: str
) -> tuple[np.ndarray, tuple[str, ...]]:
    if isinstance(cfg, FixedLen):
        return np.full(n, cfg.value, dtype=np.int64), ()
    if isinstance(cfg, UniformLen):
        return rng.integers(cfg.low, cfg.high, size=n, endpoint=True, dtype=np.int64), ()
    if isinstance(cfg, NormalLen):
        return _round_clip(rng.normal(cfg.mean, cfg.std, size=n), cfg), ()
    if isinstance(cfg, LognormalLen):
        with np.errstate(over="ignore"):  # overflow to inf is clipped just below
            draws = np.exp(rng.normal(cfg.mu, cfg.sigma, size=n))
        return _round_clip(draws, cfg), ()
    return _empirical(cfg, n, rng, field)


def _round_clip(draws: np.ndarray, cfg: NormalLen | LognormalLen) -> np.ndarray:
    upper = cfg.max if cfg.max is not None else _LENGTH_CEILING
    return np.clip(np.rint(draws), cfg.min, upper).astype(np.int64)


def _empirical(
    cfg: EmpiricalLen, n: int, rng: np.random.Generator, field: str
) -> tuple[np.ndarray, tuple[str, ...]]:
    existing_file(cfg.path, f"{field}.path")
    pool, zeros = read_length_column(cfg.path, cfg.column)
    notes = (f"{field}: {zeros} zero lengths in {cfg.path}:{cfg.column} set to 1",) if zeros else ()
    return pool[rng.integers(0, len(pool), size=n)], notes


def check_empirical(cfg: WorkloadConfig) -> None:
    """Read the length tables ``cfg`` names, so a missing or malformed one is reported
    before anything is simulated."""
    for field, length in (("prompt_len", cfg.prompt_len), ("output_len", cfg.output_len)):
        if isinstance(length, EmpiricalLen):
            _empirical(length, 0, np.random.default_rng(0), field)
