"""A scenario's swap preemption resolved (``scheduler.preemption_mode: swap``, docs/swap.md):
the KV bytes per token and the host link's bandwidth filled in from the model and hardware
presets (so the saved scenario says what ran), and a swap space larger than the host's memory
refused."""

from __future__ import annotations

from simulator.cost.gpus import named_gpus
from simulator.cost.host_link import host_link_bandwidth
from simulator.cost.presets import load_hardware, load_model
from simulator.errors import InputError, in_field
from simulator.scenario.config import ScenarioConfig
from simulator.scenario.offload import default_host_memory_gb

GIB = 2**30
"""vLLM's ``--swap-space`` is in GiB."""


def resolve_swap(cfg: ScenarioConfig) -> ScenarioConfig:
    """``cfg`` with its swap preemption's KV bytes per token and host link filled in; an
    ``InputError`` naming the field for a swap space that does not fit in the host's memory,
    or a setting swap is not simulated with."""
    sched = cfg.scheduler
    if sched.preemption_mode != "swap":
        return cfg
    where = "scheduler.preemption_mode: 'swap' is not simulated with"
    if cfg.cluster is not None:
        raise InputError(f"{where} cluster yet")
    if cfg.parallel is not None and cfg.parallel.is_data_parallel:
        raise InputError(f"{where} data parallelism yet")
    if cfg.speculative is not None:
        raise InputError(f"{where} speculative decoding (vLLM v0 swapped without drafts)")
    gpus = named_gpus(cfg.cost_model)
    per_token = sched.swap_kv_bytes_per_token
    link = sched.host_link_gb_s
    if gpus is None and (per_token is None or link is None):
        field = "swap_kv_bytes_per_token" if per_token is None else "host_link_gb_s"
        raise InputError(
            f"scheduler.{field}: required with a cost model that names no model and GPU, "
            "such as a linear one"
        )
    if gpus is not None:
        if per_token is None:
            model = in_field(f"{gpus.where}model", load_model, gpus.model)
            per_token = model.kv_bytes_per_token
        if link is None:
            hw = in_field(f"{gpus.where}hardware", load_hardware, gpus.hardware)
            bandwidth = host_link_bandwidth(hw)
            if bandwidth is None:
                raise InputError(
                    f"scheduler.host_link_gb_s: required, hardware {hw.name} gives no "
                    "pcie_generation and pcie_lanes"
                )
            link = bandwidth / 1e9
        _check_host_memory(cfg, gpus.tp)
    return cfg.model_copy(
        update={
            "scheduler": sched.model_copy(
                update={"swap_kv_bytes_per_token": per_token, "host_link_gb_s": link}
            )
        }
    )


def _check_host_memory(cfg: ScenarioConfig, tp: int) -> None:
    """Refuse a swap space larger than the replica's host memory, where that is known."""
    host = default_host_memory_gb(cfg.cost_model)
    space = cfg.scheduler.swap_space_gb
    if host is not None and space * GIB * tp > host * 1e9:
        raise InputError(
            f"scheduler.swap_space_gb: {space:g} GiB per GPU x {tp} GPU(s) = "
            f"{space * GIB * tp / 1e9:,.1f} GB does not fit in the replica's host memory, "
            f"{host:g} GB (configs/host_memory.yaml)"
        )
