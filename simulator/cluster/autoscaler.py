"""A scenario's ``cluster.autoscaler:`` and the controller that turns a policy's wish into the
replica count to run: every ``interval_s`` it reads the metrics of a window that ends
``metrics_delay_s`` ago, asks its policy, then applies Kubernetes HPA's stabilization windows
and the ``min_replicas``/``max_replicas`` bounds (docs/autoscaling.md)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.cluster.autoscale_policies import AutoscalePolicy, MetricsWindow, policy_class


class AutoscalerConfig(BaseModel):
    """Scale the fleet to its load: the initial count is ``cluster.replicas``; a replica added
    serves after its cold start; one removed stops receiving requests and drains."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "target_utilization"
    """``target_utilization``, ``target_queue``, ``slo_ttft``, or the import path
    ``package.module:Class`` of an ``AutoscalePolicy`` subclass."""
    target: float = Field(gt=0, allow_inf_nan=False)
    """The policy's target: a utilization fraction (``target_utilization``), waiting
    requests per replica (``target_queue``) or seconds of TTFT (``slo_ttft``)."""
    metric: Literal["running", "kv", "demand"] = "running"
    """``target_utilization``: running sequences / ``max_num_seqs``, KV blocks in use, or
    (running + waiting) / ``max_num_seqs``."""
    percentile: float = Field(default=99.0, gt=0, le=100)
    """``slo_ttft``: the TTFT percentile held at ``target``."""
    tolerance: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    """No change while the metric is within this fraction of the target (HPA's default)."""
    interval_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """Time between decisions (the first at ``interval_s``)."""
    metrics_delay_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    """How old the newest metrics are at a decision (scrape and aggregation lag)."""
    window_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Length of the window the metrics average over; None: ``interval_s``."""
    min_replicas: int = Field(default=1, ge=1)
    """Fewest replicas (ready or starting)."""
    max_replicas: int = Field(default=16, ge=1, le=4096)
    """Most replicas (ready or starting; at most 4096, as a fixed cluster)."""
    startup_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Cold start of a new replica, seconds; None: derived from ``load_gb_s``."""
    load_gb_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Derived cold start: the model's weight bytes read at this many GB/s (1e9 bytes) per
    replica, plus ``engine_start_s``; excludes ``startup_s``."""
    engine_start_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Derived cold start: the fixed part (process start, CUDA graph capture), seconds."""
    scale_up_stabilization_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """A scale-up goes only as high as the lowest recommendation of this many past seconds
    (HPA's default 0: at once)."""
    scale_down_stabilization_s: float = Field(default=300.0, ge=0, allow_inf_nan=False)
    """A scale-down goes only as low as the highest recommendation of this many past seconds
    (HPA's default 300)."""
    scrape_interval_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """How often each replica's gauges (running, waiting, KV use) are read, from time 0; the
    window's averages are of these readings, each holding until the next (a scraper's
    interval: finer is closer to the true time average, coarser runs faster)."""
    cost_per_hour: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Dollars per GPU-hour for ``cost_usd``; None: the hardware preset's ``cost_per_hour``
    (filled in the saved scenario; no cost without either)."""

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        policy_class(value)  # a ValueError says what is wrong
        return value

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalerConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        if (self.startup_s is None) == (self.load_gb_s is None):
            raise ValueError("give startup_s or load_gb_s (to derive it), exactly one")
        if self.startup_s is not None and self.engine_start_s:
            raise ValueError("engine_start_s is part of a derived startup (with load_gb_s)")
        return self

    def startup_seconds(self, weight_bytes: int | None) -> float:
        """A new replica's cold start: ``startup_s``, or ``weight_bytes`` at ``load_gb_s``
        plus ``engine_start_s`` (``weight_bytes`` from the model preset of its cost model)."""
        if self.startup_s is not None:
            return self.startup_s
        if weight_bytes is None:
            raise ValueError("cluster.autoscaler.load_gb_s: the model's weight bytes are unknown")
        assert self.load_gb_s is not None
        return weight_bytes / (self.load_gb_s * 1e9) + self.engine_start_s

    def check_initial(self, replicas: int) -> None:
        """ValueError unless the initial count ``replicas`` is within the bounds."""
        if not self.min_replicas <= replicas <= self.max_replicas:
            raise ValueError(
                f"cluster.replicas ({replicas}) must be within cluster.autoscaler.min_replicas "
                f"({self.min_replicas}) and max_replicas ({self.max_replicas})"
            )


@dataclass(frozen=True)
class ScalePlan:
    """What the fleet does to reach a new count: start replicas, cancel starting ones (HPA
    removes unready pods first), retire ready ones (they drain)."""

    start: int
    """Replicas to start (each ready after its cold start)."""
    cancel: int
    """Starting replicas to stop before they are ready (youngest first)."""
    retire: int
    """Ready replicas to stop routing to; each drains its requests, then stops."""


def plan(desired: int, ready: int, starting: int) -> ScalePlan:
    """How to go from ``ready + starting`` replicas to ``desired``."""
    change = desired - (ready + starting)
    if change >= 0:
        return ScalePlan(start=change, cancel=0, retire=0)
    cancel = min(-change, starting)
    return ScalePlan(start=0, cancel=cancel, retire=-change - cancel)


class Autoscaler:
    """The control loop's decisions: a policy's recommendation, stabilized as HPA does
    (``max`` over the scale-down window, ``min`` over the scale-up window, the current count
    held between them), then bounded."""

    def __init__(self, cfg: AutoscalerConfig, policy: AutoscalePolicy | None = None) -> None:
        self.cfg = cfg
        self.policy = policy if policy is not None else policy_class(cfg.policy)(cfg)
        self._history: deque[tuple[float, int]] = deque()  # (time, raw recommendation)

    def decision_times(self, end_s: float) -> list[float]:
        """Every decision time in ``(0, end_s]``: ``k * interval_s``."""
        step = self.cfg.interval_s
        return [k * step for k in range(1, int(end_s // step) + 1)]

    def window_bounds(self, now_s: float) -> tuple[float, float]:
        """The ``[start, end)`` the metrics of a decision at ``now_s`` cover (clipped at 0)."""
        end = max(now_s - self.cfg.metrics_delay_s, 0.0)
        span = self.cfg.window_s if self.cfg.window_s is not None else self.cfg.interval_s
        return max(end - span, 0.0), end

    def decide(self, window: MetricsWindow) -> int:
        """The replica count to run from ``window.now_s`` on."""
        cfg, now = self.cfg, window.now_s
        raw = max(self.policy.desired(window), 0)
        self._history.append((now, raw))
        horizon = max(cfg.scale_down_stabilization_s, cfg.scale_up_stabilization_s)
        while self._history and self._history[0][0] <= now - horizon and len(self._history) > 1:
            self._history.popleft()
        # a recommendation counts while it is younger than the window (HPA: after the cutoff)
        up = min(r for t, r in self._history if t > now - cfg.scale_up_stabilization_s or t == now)
        down = max(
            r for t, r in self._history if t > now - cfg.scale_down_stabilization_s or t == now
        )
        count = min(max(window.current, up), down)
        return min(max(count, cfg.min_replicas), cfg.max_replicas)
