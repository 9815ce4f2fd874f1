"""A scenario's ``cluster:``: how many replicas, of what kind, behind which router, and
optionally prefill/decode disaggregation with the KV link between the two pools."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.cluster.autoscaler import AutoscalerConfig
from simulator.cost import CostModelConfig
from simulator.engine.serving import HOUR_MS
from simulator.scheduling.config import SchedulerConfig

MAX_REPLICAS = 4096
"""The most replicas a cluster simulates (each holds its own scheduler and KV tables)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaGroup(_Model):
    """Identical replicas: each one has its own scheduler, KV cache and step loop."""

    count: int = Field(default=1, ge=1)
    """How many replicas of this kind."""
    name: str | None = None
    """Label in the tables and plots (default: ``group<i>``, ``prefill`` or ``decode``)."""
    scheduler: SchedulerConfig | None = None
    """This group's scheduler; omit to use the scenario's ``scheduler``."""
    cost_model: CostModelConfig | None = None
    """This group's step times (its GPUs); omit to use the scenario's ``cost_model``."""


class KVTransferConfig(_Model):
    """The link that carries a request's KV cache from its prefill to its decode replica.
    Transfers share it one at a time, first come first served."""

    bandwidth_gbps: float = Field(gt=0, allow_inf_nan=False)
    """Link bandwidth in gigabits per second (400 for one 400 Gb/s NIC)."""
    latency_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Fixed time of each transfer on top of bytes / bandwidth, ms."""
    kv_bytes_per_token: int | None = Field(default=None, ge=1)
    """KV bytes of one token over all layers; omit to take it from the model preset of the
    prefill group's cost model (required with a linear cost model)."""


class DisaggregationConfig(_Model):
    """Prefill/decode disaggregation: a request prefills (and samples its first token) on a
    prefill replica, its KV moves over the link, and it decodes on a decode replica."""

    prefill: ReplicaGroup
    """The replicas that run prefills."""
    decode: ReplicaGroup
    """The replicas that decode."""
    kv_transfer: KVTransferConfig
    """The link between them."""


class SharedKVConfig(_Model):
    """A KV tier the whole fleet shares (an LMCache server, a Mooncake store): every replica
    writes the blocks it computes to it and loads prefixes from it, and ``prefix_affinity``
    knows what it holds (docs/kv-offload.md)."""

    size_gb: float = Field(ge=0, allow_inf_nan=False)
    """Memory of the store for KV blocks, GB (1e9 bytes). 0: no block fits."""
    bandwidth_gb_s: float = Field(gt=0, allow_inf_nan=False)
    """Bandwidth of each replica's loads from the store, GB/s (its NIC: 400 Gb/s is 50 GB/s);
    each replica has its own link."""
    latency_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Fixed time of each load on top of bytes / bandwidth, s (a network round trip and the
    store's lookup)."""
    host_memory_gb: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Memory of the machines the store runs on, GB, which it must fit in; omit for the
    fleet's own hosts (a Mooncake store pools them): the sum over replicas of their host
    memory less their CPU tiers."""
    kv_bytes_per_token: int | None = Field(default=None, ge=1)
    """KV bytes of one token over all layers; omit to take it from the scenario's
    ``scheduler.kv_offload`` or its cost model's model preset."""
    affinity_margin: int | None = Field(default=None, ge=0)
    """``prefix_affinity``: the load margin for a request whose prefix the shared tier holds
    as deep as the replica that served it (any replica can load it); None: the cluster's
    ``affinity_margin``. 0 balances load first; on ``multi-turn-offload.yaml`` it trades GPU
    hits for slower shared loads and raises mean TTFT (docs/kv-offload.md)."""


class ClusterConfig(_Model):
    """Replicas behind a router on one simulated clock."""

    replicas: int | list[ReplicaGroup] | None = None
    """A count of identical replicas (the scenario's scheduler and cost model), or a list of
    replica groups (a heterogeneous fleet); not with ``disaggregation``."""
    router: str = "round_robin"
    """How a request picks its replica: ``round_robin``, ``random``, ``least_outstanding``,
    ``least_tokens``, ``least_kv``, ``power_of_two``, ``prefix_affinity``, or a ``Router``
    subclass by import path (``module:Class``) or registered in
    ``simulator.cluster.routers.ROUTERS``. Under disaggregation it picks the
    prefill replica at arrival and the decode replica when the prefill ends."""
    routing_delay_ms: float = Field(default=0.0, ge=0, le=HOUR_MS, allow_inf_nan=False)
    """Time between a request's arrival and its routing (and hand-over to the replica), ms."""
    affinity_margin: int = Field(default=4, ge=0)
    """``prefix_affinity``: how many more requests in flight than the least loaded replica the
    replica with the longest cached prefix may have and still be chosen."""
    disaggregation: DisaggregationConfig | None = None
    """Separate prefill and decode replicas (instead of ``replicas``)."""
    autoscaler: AutoscalerConfig | None = None
    """Scale a count of identical replicas to the load (docs/autoscaling.md); ``replicas``
    is the initial count. None: a fixed fleet."""
    shared_kv: SharedKVConfig | None = None
    """A KV tier shared by every replica, below their GPU KV and CPU tiers; None: none."""

    @field_validator("replicas")
    @classmethod
    def _some_replica(
        cls, value: int | list[ReplicaGroup] | None
    ) -> int | list[ReplicaGroup] | None:
        if value is None:
            return value
        total = value if isinstance(value, int) else sum(g.count for g in value)
        if total < 1:
            raise ValueError("a cluster needs at least one replica")
        if total > MAX_REPLICAS:
            raise ValueError(f"{total:,}: at most {MAX_REPLICAS:,} replicas are simulated")
        return value

    @field_validator("router")
    @classmethod
    def _known_router(cls, value: str) -> str:
        from simulator.cluster.routers import ROUTERS

        return ROUTERS.validate(value)

    @model_validator(mode="after")
    def _one_layout(self) -> ClusterConfig:
        if self.replicas is None and self.disaggregation is None:
            raise ValueError("no replica: set replicas (a count or groups) or disaggregation")
        if self.replicas is not None and self.disaggregation is not None:
            raise ValueError("replicas and disaggregation exclude each other")
        if self.autoscaler is not None:
            if not isinstance(self.replicas, int):
                raise ValueError(
                    "autoscaler: scales a count of identical replicas (cluster.replicas: N), "
                    "not replica groups or disaggregation yet"
                )
            self.autoscaler.check_initial(self.replicas)
        if self.shared_kv is not None and self.disaggregation is not None:
            raise ValueError("shared_kv is not simulated with disaggregation yet")
        return self


@dataclass(frozen=True)
class GroupSpec:
    """One replica group with the scenario's defaults filled in."""

    name: str
    role: str
    """``colocated``, ``prefill`` or ``decode``."""
    count: int
    scheduler: SchedulerConfig
    cost_model: CostModelConfig
    field: str
    """Where the group is in the scenario (for error messages)."""


def replica_groups(
    cluster: ClusterConfig, scheduler: SchedulerConfig, cost_model: CostModelConfig
) -> list[GroupSpec]:
    """Every replica group in replica order (prefill before decode), defaults filled in."""
    if cluster.disaggregation is not None:
        d = cluster.disaggregation
        named = [("prefill", d.prefill, "cluster.disaggregation.prefill")]
        named.append(("decode", d.decode, "cluster.disaggregation.decode"))
        return [_spec(g, role, role, scheduler, cost_model, f) for role, g, f in named]
    if isinstance(cluster.replicas, int):
        group = ReplicaGroup(count=cluster.replicas)
        return [_spec(group, "group0", "colocated", scheduler, cost_model, "cluster")]
    assert cluster.replicas is not None
    return [
        _spec(g, f"group{i}", "colocated", scheduler, cost_model, f"cluster.replicas.{i}")
        for i, g in enumerate(cluster.replicas)
    ]


def _spec(
    group: ReplicaGroup,
    default_name: str,
    role: str,
    scheduler: SchedulerConfig,
    cost_model: CostModelConfig,
    field: str,
) -> GroupSpec:
    return GroupSpec(
        name=group.name or default_name,
        role=role,
        count=group.count,
        scheduler=group.scheduler or scheduler,
        cost_model=group.cost_model or cost_model,
        field=field,
    )
