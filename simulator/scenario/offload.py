"""A scenario's KV tiers resolved: the KV bytes per token and the host memory each tier must
fit in filled in (so the saved scenario says what ran), and a tier larger than its machine's
memory refused (docs/kv-offload.md)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from simulator.cluster.config import ClusterConfig, SharedKVConfig, replica_groups
from simulator.cost import CostModelConfig
from simulator.cost.gpus import named_gpus
from simulator.cost.presets import configs_dir, load_model
from simulator.errors import InputError, in_field
from simulator.scenario.config import ScenarioConfig
from simulator.scheduling.config import SchedulerConfig


@cache
def host_memory_table(path: Path) -> dict[str, float]:
    """Hardware preset -> host memory per GPU, GB (``configs/host_memory.yaml``)."""
    with open(path) as f:
        raw = yaml.safe_load(f)
    return {name: float(entry["gb_per_gpu"]) for name, entry in raw.items()}


def default_host_memory_gb(cm: CostModelConfig) -> float | None:
    """Host memory of the machine a replica of ``cm``'s GPUs runs on (its GPUs' share of
    their machine class's), GB; None when that is not known."""
    gpus = named_gpus(cm)
    if gpus is None:
        return None
    per_gpu = host_memory_table(configs_dir() / "host_memory.yaml").get(gpus.hardware)
    return None if per_gpu is None else per_gpu * gpus.tp


def _kv_bytes(cm: CostModelConfig, field: str) -> int:
    gpus = named_gpus(cm)
    if gpus is None:
        raise InputError(
            f"{field}: required with a cost model that names no model, such as a linear one"
        )
    model = in_field(f"{gpus.where}model", load_model, gpus.model)
    if not model.is_mla and gpus.tp > model.num_kv_heads:
        # each of the tp ranks stores its own KV, one replicated head each (vLLM)
        return model.kv_bytes_per_token * gpus.tp // model.num_kv_heads
    return model.kv_bytes_per_token


def resolve_tiers(sched: SchedulerConfig, cm: CostModelConfig, prefix: str = "") -> SchedulerConfig:
    """``sched`` with its ``kv_offload``'s KV bytes and host memory filled in; an
    ``InputError`` naming the field if its CPU tier does not fit in the host's memory."""
    off = sched.kv_offload
    if off is None:
        return sched
    where = f"{prefix}scheduler.kv_offload"
    per_token = off.kv_bytes_per_token or _kv_bytes(cm, f"{where}.kv_bytes_per_token")
    cpu = off.cpu
    if cpu is not None:
        host = cpu.host_memory_gb or default_host_memory_gb(cm)
        if host is None:
            raise InputError(
                f"{where}.cpu.host_memory_gb: required, no machine class is known for the "
                "cost model's GPUs (configs/host_memory.yaml)"
            )
        if cpu.size_gb > host:
            raise InputError(
                f"{where}.cpu.size_gb: {cpu.size_gb:g} GB does not fit in the replica's host "
                f"memory, {host:g} GB (host_memory_gb)"
            )
        cpu = cpu.model_copy(update={"host_memory_gb": host})
    off = off.model_copy(update={"kv_bytes_per_token": per_token, "cpu": cpu})
    return sched.model_copy(update={"kv_offload": off})


def resolve_offload(cfg: ScenarioConfig) -> ScenarioConfig:
    """``cfg`` with every scheduler's KV tiers and the cluster's shared one resolved."""
    parallel = cfg.parallel
    if cfg.scheduler.kv_offload is not None and parallel is not None and parallel.is_data_parallel:
        raise InputError("scheduler.kv_offload: not simulated with data parallelism yet")
    cfg = cfg.model_copy(update={"scheduler": resolve_tiers(cfg.scheduler, cfg.cost_model)})
    cluster = cfg.cluster
    if cluster is None:
        return cfg
    if isinstance(cluster.replicas, list):
        groups = [
            g
            if g.scheduler is None
            else g.model_copy(
                update={
                    "scheduler": resolve_tiers(
                        g.scheduler, g.cost_model or cfg.cost_model, f"cluster.replicas.{i}."
                    )
                }
            )
            for i, g in enumerate(cluster.replicas)
        ]
        cluster = cluster.model_copy(update={"replicas": groups})
    if cluster.shared_kv is not None:
        shared = _resolve_shared(cluster.shared_kv, cfg, cluster)
        cluster = cluster.model_copy(update={"shared_kv": shared})
    return cfg.model_copy(update={"cluster": cluster})


def _resolve_shared(
    shared: SharedKVConfig, cfg: ScenarioConfig, cluster: ClusterConfig
) -> SharedKVConfig:
    """The shared tier with its KV bytes and memory filled in, checked against the memory."""
    where = "cluster.shared_kv"
    specs = replica_groups(cluster, cfg.scheduler, cfg.cost_model)
    for spec in specs:
        if not spec.scheduler.enable_prefix_caching:
            raise InputError(
                f"{where}: needs prefix caching on every replica (tiers find blocks by their "
                f"content), and {spec.field} has it off"
            )
    per_token = shared.kv_bytes_per_token
    if per_token is None and cfg.scheduler.kv_offload is not None:
        per_token = cfg.scheduler.kv_offload.kv_bytes_per_token
    per_token = per_token or _kv_bytes(cfg.cost_model, f"{where}.kv_bytes_per_token")
    host = shared.host_memory_gb
    if host is None:
        host = 0.0
        for spec in specs:
            own = default_host_memory_gb(spec.cost_model)
            off = spec.scheduler.kv_offload
            cpu = off.cpu if off is not None else None
            if cpu is not None:
                own = cpu.host_memory_gb
            if own is None:
                raise InputError(
                    f"{where}.host_memory_gb: required, the host memory of {spec.field}'s "
                    "machines is not known (configs/host_memory.yaml)"
                )
            host += spec.count * (own - (cpu.size_gb if cpu is not None else 0.0))
    if shared.size_gb > host:
        raise InputError(
            f"{where}.size_gb: {shared.size_gb:g} GB does not fit in the store's memory, "
            f"{host:g} GB (host_memory_gb; by default the fleet's host memory less its CPU "
            "tiers)"
        )
    return shared.model_copy(update={"kv_bytes_per_token": per_token, "host_memory_gb": host})
