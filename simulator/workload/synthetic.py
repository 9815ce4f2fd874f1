"""Workloads: when requests arrive and how many prompt and output tokens each has.

A workload is either synthetic (an arrival process plus two length distributions) or read
from a trace file (see :mod:`simulator.workload.traces`). Options and parametrisations are
documented in ``docs/workloads.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.errors import InputError

__all__ = [
    "ArrivalConfig",
    "EmpiricalLen",
    "FixedLen",
    "LengthConfig",
    "LognormalLen",
    "NormalLen",
    "TraceConfig",
    "UniformLen",
    "Workload",
    "WorkloadConfig",
    "arrival_times",
    "check_inputs",
    "generate",
    "sample_lengths",
]

# Upper bound for unbounded normal/lognormal draws before the int64 cast: far beyond any real
# context length, far below int64 overflow.
_LENGTH_CEILING = 2**40


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ArrivalConfig(_Model):
    """How requests arrive: a renewal process with mean inter-arrival time ``1 / rate``."""

    process: Literal["poisson", "gamma", "constant"] = "poisson"
    """Inter-arrival distribution: exponential, gamma (burstiness set by ``cv``) or fixed."""
    rate: float = Field(gt=0, allow_inf_nan=False)
    """Mean arrival rate in requests per second."""
    cv: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Gamma only: coefficient of variation of inter-arrival times (1 = Poisson, >1 burstier)."""

    @model_validator(mode="after")
    def _cv_only_for_gamma(self) -> ArrivalConfig:
        if self.process != "gamma" and self.cv != 1.0:
            raise ValueError(f"cv applies to process 'gamma' only, not {self.process!r}")
        return self


class _BoundedLen(_Model):
    """Shared ``min``/``max`` clipping bounds of the continuous length distributions."""

    min: int = Field(default=1, ge=1)
    """Smallest length after rounding (draws below are raised to it)."""
    max: int | None = Field(default=None, ge=1)
    """Largest length after rounding (draws above are lowered to it); None = unbounded."""

    @model_validator(mode="after")
    def _min_le_max(self) -> _BoundedLen:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class FixedLen(_Model):
    """Every request has the same length."""

    dist: Literal["fixed"]
    """Discriminator."""
    value: int = Field(ge=1)
    """The length in tokens."""


class UniformLen(_Model):
    """Integers drawn uniformly from ``low..high`` inclusive."""

    dist: Literal["uniform"]
    """Discriminator."""
    low: int = Field(ge=1)
    """Smallest length (inclusive)."""
    high: int = Field(ge=1)
    """Largest length (inclusive)."""

    @model_validator(mode="after")
    def _low_le_high(self) -> UniformLen:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class NormalLen(_BoundedLen):
    """Normal draws, rounded to the nearest integer, then clipped to ``[min, max]``."""

    dist: Literal["normal"]
    """Discriminator."""
    mean: float = Field(allow_inf_nan=False)
    """Mean of the normal before rounding and clipping."""
    std: float = Field(ge=0, allow_inf_nan=False)
    """Standard deviation of the normal before rounding and clipping."""


class LognormalLen(_BoundedLen):
    """``exp(N(mu, sigma))`` draws, rounded, then clipped to ``[min, max]``."""

    dist: Literal["lognormal"]
    """Discriminator."""
    mu: float = Field(allow_inf_nan=False)
    """Mean of the underlying normal (the median length is ``exp(mu)``)."""
    sigma: float = Field(ge=0, allow_inf_nan=False)
    """Standard deviation of the underlying normal."""


class EmpiricalLen(_Model):
    """Lengths resampled uniformly, with replacement, from one column of a CSV file."""

    dist: Literal["empirical"]
    """Discriminator."""
    path: str
    """CSV file with a header row; relative to the working directory, or absolute."""
    column: str
    """Header name of the column holding non-negative integer token counts."""


LengthConfig = Annotated[
    FixedLen | UniformLen | NormalLen | LognormalLen | EmpiricalLen, Field(discriminator="dist")
]


class TraceConfig(_Model):
    """Replay a recorded trace instead of drawing a synthetic workload."""

    path: str
    """Trace file; relative to the working directory, or absolute."""
    format: Literal["azure", "mooncake", "csv"]
    """File layout: Azure 2023 CSV, Mooncake JSONL or plain ``arrival_s,prompt_len,output_len``."""
    time_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Multiplies arrival times after windowing: 0.5 replays the trace twice as fast."""
    max_requests: int | None = Field(default=None, ge=1)
    """Keep only the first this many requests (after the window); None = all."""
    start_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Window start in trace seconds since the first request (inclusive); None = from the start."""
    end_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Window end in trace seconds since the first request (exclusive); None = to the end."""

    @model_validator(mode="after")
    def _window_not_empty(self) -> TraceConfig:
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be > start_s ({self.start_s})")
        return self


_SYNTHETIC_KEYS = ("num_requests", "arrival", "prompt_len", "output_len")


class WorkloadConfig(_Model):
    """Either ``trace`` alone, or all of ``num_requests``, ``arrival``, ``prompt_len``,
    ``output_len`` (a synthetic workload)."""

    num_requests: int | None = Field(default=None, ge=1)
    """Synthetic only: how many requests to draw (cap a trace with ``trace.max_requests``)."""
    arrival: ArrivalConfig | None = None
    """Synthetic only: the arrival process."""
    prompt_len: LengthConfig | None = None
    """Synthetic only: distribution of prompt (input) lengths in tokens."""
    output_len: LengthConfig | None = None
    """Synthetic only: distribution of output (generated) lengths in tokens."""
    trace: TraceConfig | None = None
    """Replay this trace; excludes every synthetic key."""

    @model_validator(mode="after")
    def _trace_xor_synthetic(self) -> WorkloadConfig:
        given = [k for k in _SYNTHETIC_KEYS if getattr(self, k) is not None]
        if self.trace is not None and given:
            hint = " (cap a trace with trace.max_requests)" if "num_requests" in given else ""
            raise ValueError(f"with 'trace', remove {', '.join(given)}{hint}")
        missing = [k for k in _SYNTHETIC_KEYS if k not in given]
        if self.trace is None and missing:
            raise ValueError(
                f"give either 'trace' or all of {', '.join(_SYNTHETIC_KEYS)}; "
                f"missing: {', '.join(missing)}"
            )
        return self


@dataclass(frozen=True)
class Workload:
    """The requests to simulate, as parallel read-only arrays sorted by arrival time."""

    arrival_s: np.ndarray
    """Arrival times in seconds, float64, nondecreasing; the first request arrives at 0."""
    prompt_len: np.ndarray
    """Prompt tokens per request, int64 >= 1."""
    output_len: np.ndarray
    """Output tokens per request, int64 >= 1."""
    notes: tuple[str, ...] = ()
    """Adjustments made while reading (zero lengths raised, rows reordered), one line each."""

    def __post_init__(self) -> None:
        arrays = {
            "arrival_s": np.array(self.arrival_s, dtype=np.float64),
            "prompt_len": np.array(self.prompt_len, dtype=np.int64),
            "output_len": np.array(self.output_len, dtype=np.int64),
        }
        _check_workload_arrays(**arrays)
        for name, array in arrays.items():
            array.setflags(write=False)
            # Frozen dataclass: the copies replace the inputs once, here, so callers' arrays
            # are never aliased or made read-only.
            object.__setattr__(self, name, array)

    def __len__(self) -> int:
        """Number of requests."""
        return len(self.arrival_s)


def _check_workload_arrays(
    arrival_s: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray
) -> None:
    if not arrival_s.ndim == prompt_len.ndim == output_len.ndim == 1:
        raise ValueError("Workload arrays must be one-dimensional")
    if not len(arrival_s) == len(prompt_len) == len(output_len):
        raise ValueError(
            f"Workload arrays differ in length: {len(arrival_s)}, "
            f"{len(prompt_len)}, {len(output_len)}"
        )
    if not np.isfinite(arrival_s).all() or (np.diff(arrival_s) < 0).any():
        raise ValueError("Workload.arrival_s must be finite and nondecreasing")
    if (prompt_len < 1).any() or (output_len < 1).any():
        raise ValueError("Workload lengths must be >= 1")


def generate(cfg: WorkloadConfig, seed: np.random.SeedSequence) -> Workload:
    """Draw (or read) the workload described by ``cfg``; deterministic for a given ``seed``.

    Arrivals, prompt lengths and output lengths each use their own stream, the children
    ``seed.spawn(3)`` would give on a fresh ``seed`` (``seed`` itself is not mutated), so
    changing one distribution leaves the other two quantities unchanged.
    """
    if cfg.trace is not None:
        return _from_trace(cfg.trace)
    # The validator guarantees these for a synthetic workload; re-checked for mypy.
    assert cfg.num_requests is not None and cfg.arrival is not None
    assert cfg.prompt_len is not None and cfg.output_len is not None
    rng_arrival, rng_prompt, rng_output = (np.random.default_rng(s) for s in _streams(seed, 3))
    n = cfg.num_requests
    prompt, prompt_notes = _lengths(cfg.prompt_len, n, rng_prompt, "prompt_len")
    output, output_notes = _lengths(cfg.output_len, n, rng_output, "output_len")
    return Workload(
        arrival_s=arrival_times(cfg.arrival, n, rng_arrival),
        prompt_len=prompt,
        output_len=output,
        notes=prompt_notes + output_notes,
    )


def _streams(seed: np.random.SeedSequence, n: int) -> list[np.random.SeedSequence]:
    # Same keys as seed.spawn(n) on a fresh seed, but repeatable: spawn() advances a counter.
    return [
        np.random.SeedSequence(
            seed.entropy, spawn_key=(*seed.spawn_key, i), pool_size=seed.pool_size
        )
        for i in range(n)
    ]


def arrival_times(cfg: ArrivalConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times in seconds: the first at 0, then ``n - 1`` drawn gaps."""
    if cfg.process == "constant":
        return np.arange(n, dtype=np.float64) / cfg.rate
    if cfg.process == "poisson":
        gaps = rng.exponential(1.0 / cfg.rate, size=max(n - 1, 0))
    else:
        # Gamma with shape k has cv = 1/sqrt(k); scale fixes the mean gap at 1/rate.
        shape = 1.0 / cfg.cv**2
        gaps = rng.gamma(shape, 1.0 / (cfg.rate * shape), size=max(n - 1, 0))
    return np.concatenate(([0.0], np.cumsum(gaps)))[:n]


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


def check_inputs(cfg: WorkloadConfig) -> None:
    """Read every file ``cfg`` names (a trace, empirical length tables), so that a missing
    or malformed one is reported without simulating anything."""
    if cfg.trace is not None:
        _from_trace(cfg.trace)
    for field, length in (("prompt_len", cfg.prompt_len), ("output_len", cfg.output_len)):
        if isinstance(length, EmpiricalLen):
            _empirical(length, 0, np.random.default_rng(0), field)


def _need_file(path: str, field: str) -> None:
    """A missing input file named by ``workload.<field>``: one line saying which key and how
    to get the public files (the readers would name the file but not the key)."""
    if not Path(path).is_file():
        hint = (
            "`servesim fetch traces` downloads the public traces"
            if field == "trace.path"
            else "`servesim fetch --list` shows the public tables it can download"
        )
        raise InputError(
            f"workload.{field}: {path}: file not found (relative to {Path.cwd()}); {hint}"
        )


def _empirical(
    cfg: EmpiricalLen, n: int, rng: np.random.Generator, field: str
) -> tuple[np.ndarray, tuple[str, ...]]:
    # Imported here: traces builds Workload objects, so it imports this module.
    from simulator.workload.traces import read_length_column

    _need_file(cfg.path, f"{field}.path")
    pool, zeros = read_length_column(cfg.path, cfg.column)
    notes = (f"{field}: {zeros} zero lengths in {cfg.path}:{cfg.column} set to 1",) if zeros else ()
    return pool[rng.integers(0, len(pool), size=n)], notes


def _from_trace(cfg: TraceConfig) -> Workload:
    from simulator.workload.traces import read_trace

    _need_file(cfg.path, "trace.path")
    full = read_trace(cfg.path, cfg.format)
    t = full.arrival_s
    keep = np.ones(len(t), dtype=bool)
    if cfg.start_s is not None:
        keep &= t >= cfg.start_s
    if cfg.end_s is not None:
        keep &= t < cfg.end_s
    index = np.flatnonzero(keep)[: cfg.max_requests]
    if len(index) == 0:
        span = f"{t[-1]:.3f}"
        raise InputError(
            f"{cfg.path}: no requests in the window start_s={cfg.start_s}, end_s={cfg.end_s} "
            f"(the trace spans 0..{span} s)"
        )
    kept = t[index]
    return Workload(
        arrival_s=(kept - kept[0]) * cfg.time_scale,
        prompt_len=full.prompt_len[index],
        output_len=full.output_len[index],
        notes=full.notes,
    )
