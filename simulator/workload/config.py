"""A scenario's ``workload:``: a synthetic arrival process and length distributions, or a
trace to replay (every option: docs/workloads.md)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.workload.multimodal import MultimodalConfig
from simulator.workload.rate_schedule import schedule_check


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DiurnalConfig(_Model):
    """A day's shape: the rate follows a raised cosine from ``trough`` up to ``peak`` and back
    once per ``period_s``, highest at ``peak_at_s`` (and every period after)."""

    peak: float = Field(gt=0, allow_inf_nan=False)
    """Highest rate, req/s."""
    trough: float = Field(ge=0, allow_inf_nan=False)
    """Lowest rate, req/s (0: no request at the bottom of the night)."""
    period_s: float = Field(default=86400.0, gt=0, allow_inf_nan=False)
    """Length of one cycle, seconds (a day; less compresses it)."""
    peak_at_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """When the rate peaks, seconds from the start; None: half a period (the run starts at
    the trough)."""

    @model_validator(mode="after")
    def _trough_le_peak(self) -> DiurnalConfig:
        if self.trough > self.peak:
            raise ValueError(f"trough ({self.trough}) must be <= peak ({self.peak})")
        return self


_RATE_KEYS = ("rate", "rate_schedule", "rate_schedule_csv", "diurnal")


class ArrivalConfig(_Model):
    """How requests arrive: a renewal process at a constant ``rate``, or at a rate that changes
    over time (``rate_schedule``, ``rate_schedule_csv`` or ``diurnal``; exactly one of the four)
    by time-rescaling."""

    process: Literal["poisson", "gamma", "constant"] = "poisson"
    """Inter-arrival distribution: exponential, gamma (burstiness set by ``cv``) or fixed; with
    a changing rate, of the process in rescaled time (docs/workloads.md)."""
    rate: float | None = Field(default=None, gt=0)
    """Mean arrival rate in requests per second; ``inf``: every request arrives at 0 (as
    ``benchmark_serving --request-rate inf``)."""
    rate_schedule: list[tuple[float, float]] | None = None
    """``[[t_s, rate], ...]``: the rate (req/s) is ``rate`` from each time ``t_s`` until the next
    one, the last one from then on; times start at 0 and increase; rates ``>= 0``."""
    rate_schedule_csv: str | None = None
    """CSV file with columns ``time_s, rate``: the rate interpolated linearly between rows and
    held at the last row's after it (same rules as ``rate_schedule``)."""
    diurnal: DiurnalConfig | None = None
    """The built-in daily shape."""
    cv: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Gamma only: coefficient of variation of inter-arrival times (1 = Poisson, >1 burstier)."""

    @field_validator("rate")
    @classmethod
    def _not_nan(cls, value: float | None) -> float | None:
        if value is not None and math.isnan(value):
            raise ValueError("rate must be a number > 0 or inf")
        return value

    @field_validator("rate_schedule")
    @classmethod
    def _valid_schedule(
        cls, value: list[tuple[float, float]] | None
    ) -> list[tuple[float, float]] | None:
        if value is not None:
            t = np.array([p[0] for p in value], dtype=np.float64)
            why = schedule_check(t, np.array([p[1] for p in value], dtype=np.float64))
            if why is not None:
                raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _one_rate(self) -> ArrivalConfig:
        given = [k for k in _RATE_KEYS if getattr(self, k) is not None]
        if len(given) != 1:
            got = f" (got {', '.join(given)})" if given else ""
            raise ValueError(f"give exactly one of {', '.join(_RATE_KEYS)}{got}")
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
    format: str
    """File layout: ``azure`` (Azure 2023 CSV), ``mooncake`` (JSONL), ``csv`` (plain
    ``arrival_s,prompt_len,output_len``, optional ``priority`` and ``hash_ids`` columns),
    ``llmservingsim`` (token-id JSONL: ``input_toks, output_toks, arrival_time_ns,
    input_tok_ids``), or a reader function by import path (``module:function``, called with
    the path and ``hash_block_tokens``)."""
    hash_block_tokens: int = Field(default=512, ge=1)
    """Prompt tokens each hash id stands for (Mooncake ``hash_ids``, a CSV ``hash_ids``
    column); Mooncake's are 512."""
    time_scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Multiplies arrival times after windowing: 0.5 replays the trace twice as fast."""
    time_scale_schedule: list[tuple[float, float]] | None = None
    """``[[trace_s, scale], ...]``: a ``time_scale`` that changes, ``scale`` from each trace
    time (seconds after the first kept request) until the next; times start at 0 and
    increase, scales ``> 0``; excludes ``time_scale``."""
    max_requests: int | None = Field(default=None, ge=1)
    """Keep only the first this many requests (after the window); None = all."""
    start_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Window start in trace seconds since the first request (inclusive); None = from the start."""
    end_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Window end in trace seconds since the first request (exclusive); None = to the end."""

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        from simulator.workload.traces import TRACE_READERS

        return TRACE_READERS.validate(value)

    @field_validator("time_scale_schedule")
    @classmethod
    def _valid_scales(
        cls, value: list[tuple[float, float]] | None
    ) -> list[tuple[float, float]] | None:
        if value is not None:
            t = np.array([p[0] for p in value], dtype=np.float64)
            scales = np.array([p[1] for p in value], dtype=np.float64)
            why = schedule_check(t, scales)
            zero = np.flatnonzero(scales == 0)
            if why is None and len(zero):
                why = f"entry {zero[0]}: scale 0 is not > 0"
            if why is not None:
                raise ValueError(why.replace("rate", "scale"))
        return value

    @model_validator(mode="after")
    def _window_not_empty(self) -> TraceConfig:
        if self.time_scale_schedule is not None and self.time_scale != 1.0:
            raise ValueError("give time_scale or time_scale_schedule, not both")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be > start_s ({self.start_s})")
        return self


class SharedPrefixConfig(_Model):
    """Prompts that share system prompts: ``num_prefixes`` system prompts of ``prefix_len``
    tokens, each used by ``users_per_prefix`` users; every request belongs to a user drawn
    uniformly and its prompt is the user's system prompt followed by a question of
    ``prompt_len`` tokens (or, with ``multi_turn``, the user's previous prompt, its answer,
    then the question)."""

    num_prefixes: int = Field(ge=1)
    """System prompts (N)."""
    prefix_len: int = Field(ge=1)
    """Tokens of each system prompt (L)."""
    users_per_prefix: int = Field(default=1, ge=1)
    """Users sharing each system prompt (M)."""
    multi_turn: bool = False
    """A user's next prompt repeats its previous prompt and that request's whole output, then
    adds the new question (a conversation); prompts grow with every turn."""


class PriorityDraw(_Model):
    """Request priorities drawn at random (lower is served first by a priority policy)."""

    values: list[int] = Field(min_length=1)
    """The priorities to draw from."""
    weights: list[float] | None = None
    """Relative weight of each value (same length; default: equal)."""

    @model_validator(mode="after")
    def _weights_match(self) -> PriorityDraw:
        if self.weights is not None and (
            len(self.weights) != len(self.values)
            or any(w < 0 for w in self.weights)
            or not sum(self.weights) > 0
        ):
            raise ValueError("weights: one non-negative weight per value, not all 0")
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
    max_concurrency: int | None = Field(default=None, ge=1)
    """Closed loop: at most this many requests in flight; a request whose time has come waits
    for one to finish and is sent then (``benchmark_serving --max-concurrency``). With
    ``arrival.rate: inf``, a fixed population of this many clients. None: open loop."""
    max_concurrency_schedule: list[tuple[float, int]] | None = None
    """``[[t_s, clients], ...]``: a closed loop whose cap changes over the run, ``clients``
    from each time ``t_s`` until the next (times start at 0 and increase; counts ``>= 0``,
    the last ``>= 1`` so every request is sent); excludes ``max_concurrency``."""
    shared_prefix: SharedPrefixConfig | None = None
    """Synthetic only: prompts share system prompts (``prompt_len`` is then the question
    after it); None = every prompt its own."""
    priority: PriorityDraw | None = None
    """Synthetic only: draw each request's priority; None = all 0 (a CSV trace may carry a
    ``priority`` column)."""
    multimodal: MultimodalConfig | None = None
    """Synthetic only: images in each prompt, priced by the model's vision encoder and
    scheduled against ``scheduler.max_num_encoder_input_tokens`` (docs/multimodal.md); None:
    text only."""

    @field_validator("max_concurrency_schedule")
    @classmethod
    def _valid_caps(cls, value: list[tuple[float, int]] | None) -> list[tuple[float, int]] | None:
        if value is not None:
            t = np.array([p[0] for p in value], dtype=np.float64)
            why = schedule_check(t, np.array([p[1] for p in value], dtype=np.float64))
            if why is None and value[-1][1] < 1:
                why = f"entry {len(value) - 1}: the last count must be >= 1 (else nobody sends)"
            if why is not None:
                raise ValueError(why.replace("rate", "count"))
        return value

    @property
    def concurrency_caps(self) -> list[tuple[float, int]] | None:
        """The closed loop's cap from each time on (``max_concurrency`` is one entry at 0);
        None: open loop."""
        if self.max_concurrency is not None:
            return [(0.0, self.max_concurrency)]
        return self.max_concurrency_schedule

    @model_validator(mode="after")
    def _trace_xor_synthetic(self) -> WorkloadConfig:
        if self.max_concurrency is not None and self.max_concurrency_schedule is not None:
            raise ValueError("give max_concurrency or max_concurrency_schedule, not both")
        given = [
            k
            for k in (*_SYNTHETIC_KEYS, "shared_prefix", "priority", "multimodal")
            if getattr(self, k) is not None
        ]
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
