"""From a scenario's ``cluster:`` to a ``Cluster``: every group's KV budget and the KV bytes
per token filled in (so the saved scenario says what ran), then the replicas built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.cluster.cluster import Cluster
from simulator.cluster.config import ClusterConfig, ReplicaGroup, replica_groups
from simulator.cluster.kv_link import KVLink
from simulator.cost import CostModelConfig, build_cost_model
from simulator.cost.gpus import named_gpus
from simulator.cost.presets import load_hardware, load_model
from simulator.errors import InputError, in_field
from simulator.scenario.config import ScenarioConfig
from simulator.scheduling.config import SchedulerConfig
from simulator.workload.workload import Workload

SchedulerFor = Callable[[SchedulerConfig, CostModelConfig, str], SchedulerConfig]
"""A scheduler config with its budgets and ``num_blocks`` filled in for a cost model's GPUs
(``runner.scheduler_for``)."""


def _resolve_group(
    group: ReplicaGroup, cfg: ScenarioConfig, field: str, fill: SchedulerFor
) -> ReplicaGroup:
    """A group with its own scheduler or GPUs gets its own budgets and KV blocks."""
    if group.scheduler is None and group.cost_model is None:
        return group  # the scenario's scheduler, resolved with the scenario
    cm = group.cost_model or cfg.cost_model
    scheduler = fill(group.scheduler or cfg.scheduler, cm, f"{field}.")
    return group.model_copy(update={"scheduler": scheduler})


def kv_bytes_per_token(cm: CostModelConfig, field: str) -> int:
    """KV bytes of one token of the model a cost model is for."""
    gpus = named_gpus(cm, f"{field}.")
    if gpus is None:
        raise InputError(
            "cluster.disaggregation.kv_transfer.kv_bytes_per_token: required with a cost "
            "model that names no model, such as a linear one (roofline, fitted and profiled "
            "models take it from their model preset)"
        )
    return in_field(f"{gpus.where}model", load_model, gpus.model).kv_bytes_per_token


def resolve_cluster(cfg: ScenarioConfig, fill: SchedulerFor) -> ClusterConfig:
    """``cfg.cluster`` with every group's scheduler (``fill``) and the KV bytes per token
    filled in."""
    cluster = cfg.cluster
    assert cluster is not None
    if isinstance(cluster.replicas, list):
        groups = [
            _resolve_group(g, cfg, f"cluster.replicas.{i}", fill)
            for i, g in enumerate(cluster.replicas)
        ]
        return cluster.model_copy(update={"replicas": groups})
    d = cluster.disaggregation
    if d is None:
        return _resolve_price(cfg, cluster)
    where = "cluster.disaggregation"
    link = d.kv_transfer
    if link.kv_bytes_per_token is None:
        per_token = kv_bytes_per_token(d.prefill.cost_model or cfg.cost_model, f"{where}.prefill")
        link = link.model_copy(update={"kv_bytes_per_token": per_token})
    decode = d.decode.scheduler or cfg.scheduler
    if decode.policy != "spec" or decode.enable_prefix_caching:
        field = f"{where}.decode.scheduler" if d.decode.scheduler else "scheduler"
        raise InputError(
            f"{field}: decode replicas take KV computed elsewhere, which only the spec policy "
            f"without prefix caching simulates yet (policy {decode.policy}, prefix caching "
            f"{'on' if decode.enable_prefix_caching else 'off'})"
        )
    d = d.model_copy(
        update={
            "prefill": _resolve_group(d.prefill, cfg, f"{where}.prefill", fill),
            "decode": _resolve_group(d.decode, cfg, f"{where}.decode", fill),
            "kv_transfer": link,
        }
    )
    return cluster.model_copy(update={"disaggregation": d})


def check_cluster(cfg: ScenarioConfig) -> None:
    """Build every group's cost model (what a run would fail on first), naming the group."""
    assert cfg.cluster is not None
    for spec in replica_groups(cfg.cluster, cfg.scheduler, cfg.cost_model):
        try:
            build_cost_model(spec.cost_model)
        except InputError as err:
            raise InputError(f"{spec.field}.{err}") from None


def build_cluster(
    cfg: ScenarioConfig,
    workload: Workload,
    slo: dict[str, float | None] | None,
    progress: Callable[[int], object] | None,
    fast_decode: bool,
    steps: str = "full",
) -> Cluster:
    """The cluster a resolved scenario describes (its step table kept in memory, or sampled
    or dropped as ``steps`` says)."""
    cluster = cfg.cluster
    assert cluster is not None
    if cfg.workload.concurrency_caps is not None:
        raise InputError(
            "workload.max_concurrency: a closed loop is not simulated in a cluster yet"
        )
    link, per_token = None, 0
    if cluster.disaggregation is not None:
        kv = cluster.disaggregation.kv_transfer
        assert kv.kv_bytes_per_token is not None, "resolve the scenario first"
        link = KVLink(kv.bandwidth_gbps * 1e9 / 8, kv.latency_ms * 1e-3)
        per_token = kv.kv_bytes_per_token
    if cluster.autoscaler is not None:
        return _autoscaled(
            cfg,
            workload,
            slo=slo,
            progress=progress,
            fast_decode=fast_decode,
            percentiles=cfg.metrics.percentiles,
            steps=steps,
        )
    return Cluster(
        workload,
        replica_groups(cluster, cfg.scheduler, cfg.cost_model),
        cluster.router,
        cfg.seed,
        routing_delay_s=cluster.routing_delay_ms * 1e-3,
        affinity_margin=cluster.affinity_margin,
        link=link,
        kv_bytes_per_token=per_token,
        slo=slo,
        progress=progress,
        fast_decode=fast_decode,
        percentiles=cfg.metrics.percentiles,
        steps=steps,
        shared_kv=cluster.shared_kv,
        serving=cfg.serving,
    )


def _autoscaled(cfg: ScenarioConfig, workload: Workload, **options: Any) -> Cluster:
    """An autoscaled fleet of ``cluster.replicas`` to start with."""
    from simulator.cluster.fleet import AutoscaledCluster

    cluster = cfg.cluster
    assert cluster is not None and cluster.autoscaler is not None
    (group,) = replica_groups(cluster, cfg.scheduler, cfg.cost_model)
    gpus = named_gpus(cfg.cost_model)
    weights = None
    if gpus is not None:
        weights = in_field(f"{gpus.where}model", load_model, gpus.model).weight_bytes
    try:
        startup = cluster.autoscaler.startup_seconds(weights)
    except ValueError as err:
        raise InputError(str(err)) from None
    return AutoscaledCluster(
        workload,
        group,
        cluster.router,
        cfg.seed,
        cluster.autoscaler,
        startup,
        gpus_per_replica=1 if gpus is None else gpus.tp,
        cost_per_hour=cluster.autoscaler.cost_per_hour,
        routing_delay_s=cluster.routing_delay_ms * 1e-3,
        affinity_margin=cluster.affinity_margin,
        serving=cfg.serving,
        **options,
    )


def _resolve_price(cfg: ScenarioConfig, cluster: ClusterConfig) -> ClusterConfig:
    """An autoscaler's ``cost_per_hour`` from the hardware preset when not given."""
    scaling = cluster.autoscaler
    if scaling is None or scaling.cost_per_hour is not None:
        return cluster
    gpus = named_gpus(cfg.cost_model)
    if gpus is None:
        return cluster
    price = in_field(f"{gpus.where}hardware", load_hardware, gpus.hardware).cost_per_hour
    if price is None:
        return cluster
    return cluster.model_copy(
        update={"autoscaler": scaling.model_copy(update={"cost_per_hour": price})}
    )
