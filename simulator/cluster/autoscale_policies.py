"""Autoscaling policies: what a fleet's metrics say the replica count should be, by the
Kubernetes HPA's formula ``ceil(current * metric / target)`` with its tolerance and its
handling of replicas that are still starting (docs/autoscaling.md)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from simulator.registry import Registry


class PolicySettings(Protocol):
    """The keys of ``cluster.autoscaler`` a policy reads (``AutoscalerConfig`` has them)."""

    @property
    def target(self) -> float:
        """The policy's target value."""

    @property
    def metric(self) -> str:
        """``target_utilization``'s metric: ``running``, ``kv`` or ``demand``."""

    @property
    def percentile(self) -> float:
        """``slo_ttft``'s TTFT percentile."""

    @property
    def tolerance(self) -> float:
        """HPA's tolerance around a ratio of 1."""

    @property
    def interval_s(self) -> float:
        """Time between decisions."""


@dataclass(frozen=True)
class MetricsWindow:
    """What the autoscaler reads at one decision: the fleet over ``[start_s, end_s)``, which
    ends ``metrics_delay_s`` before ``now_s``; one entry per replica that reported (was ready
    and receiving requests over the window)."""

    now_s: float
    """When the decision is taken."""
    start_s: float
    """Start of the window the metrics cover."""
    end_s: float
    """End of that window (``now_s - metrics_delay_s``)."""
    current: int
    """Replicas the fleet has now, ready or starting (HPA's ``currentReplicas``)."""
    starting: int
    """Of ``current``, those still starting (no metrics yet: HPA's unready pods)."""
    running: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per reporting replica: running sequences, time-averaged over the window."""
    max_num_seqs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per reporting replica: its ``scheduler.max_num_seqs``."""
    kv_use: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per reporting replica: fraction of KV blocks in use, time-averaged."""
    waiting: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per reporting replica: requests waiting in its queue, time-averaged."""
    ttft_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """TTFT of every request whose first token came in the window, seconds."""

    @property
    def ready(self) -> int:
        """Replicas that reported metrics."""
        return len(self.running)


def hpa_desired(
    usage: np.ndarray, target: float, current: int, unready: int, tolerance: float
) -> int:
    """HPA's replica count for per-replica ``usage`` against ``target`` (its replica
    calculator): ``ceil(ready * mean(usage) / target)``, or ``current`` within ``tolerance``
    of the target; on a scale-up, replicas still starting count as using nothing (so the count
    is ``ceil(sum(usage) / target)`` over all), and a scale-down ignores them."""
    if len(usage) == 0:
        return current  # no metrics: hold, as HPA does
    ratio = float(np.mean(usage)) / target
    if not (unready > 0 and ratio > 1.0):
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * len(usage))
    # a scale-up with unready replicas: they count as using 0
    counted = len(usage) + unready
    new_ratio = float(np.sum(usage)) / (counted * target)
    if abs(1.0 - new_ratio) <= tolerance or new_ratio < 1.0:
        return current  # the starting replicas may be enough
    return max(math.ceil(new_ratio * counted), current)


class AutoscalePolicy(ABC):
    """The interface: given a metrics window, the replica count the policy wants (before
    stabilization and the min/max bounds, which the autoscaler applies)."""

    def __init__(self, cfg: PolicySettings) -> None:
        self.cfg = cfg

    @abstractmethod
    def desired(self, window: MetricsWindow) -> int:
        """The replica count this window calls for."""


class TargetUtilization(AutoscalePolicy):
    """Keep each replica's running sequences at ``target`` of ``max_num_seqs`` (``metric:
    running``), its KV cache at ``target`` full (``metric: kv``), or its running and waiting
    requests at ``target`` of ``max_num_seqs`` (``metric: demand``). Running and KV use cannot
    exceed 1, so a saturated fleet under ``running`` or ``kv`` grows by at most
    ``1 / target`` per decision; ``demand`` sees the queue and jumps to the count at once."""

    def desired(self, window: MetricsWindow) -> int:
        """HPA's count for the mean utilization over the reporting replicas."""
        if self.cfg.metric == "kv":
            usage = window.kv_use
        elif self.cfg.metric == "demand":
            usage = (window.running + window.waiting) / np.maximum(window.max_num_seqs, 1)
        else:
            usage = window.running / np.maximum(window.max_num_seqs, 1)
        return hpa_desired(
            usage, self.cfg.target, window.current, window.starting, self.cfg.tolerance
        )


class TargetQueue(AutoscalePolicy):
    """Keep the requests waiting per replica at ``target`` (HPA's ``AverageValue`` target on a
    per-pod metric)."""

    def desired(self, window: MetricsWindow) -> int:
        """HPA's count for the mean queue length over the reporting replicas."""
        return hpa_desired(
            window.waiting, self.cfg.target, window.current, window.starting, self.cfg.tolerance
        )


class SloTtft(AutoscalePolicy):
    """Keep the ``percentile`` TTFT of the window's requests at ``target`` seconds (HPA's
    ``Value`` target on one fleet-wide metric: ``ceil(ready * p99 / target)``). A window with
    no first token holds the count."""

    def desired(self, window: MetricsWindow) -> int:
        """HPA's count for the window's TTFT percentile against the target."""
        if len(window.ttft_s) == 0 or window.ready == 0:
            return window.current
        ratio = float(np.percentile(window.ttft_s, self.cfg.percentile)) / self.cfg.target
        if abs(1.0 - ratio) <= self.cfg.tolerance:
            return window.current
        return math.ceil(ratio * window.ready)


POLICIES: Registry[type[AutoscalePolicy]] = Registry(
    "policy",
    {"target_utilization": TargetUtilization, "target_queue": TargetQueue, "slo_ttft": SloTtft},
    check=AutoscalePolicy,
)
"""The built-in policies by name; any other name is an import path ``package.module:Class``
(or ``package.module.Class``) of an :class:`AutoscalePolicy` subclass."""


def policy_class(name: str) -> type[AutoscalePolicy]:
    """The policy ``name`` names: built in, or imported; ValueError saying why not."""
    if name not in POLICIES and ":" not in name and "." in name:  # package.module.Class
        module, _, attr = name.rpartition(".")
        name = f"{module}:{attr}"
    return POLICIES.resolve(name)
