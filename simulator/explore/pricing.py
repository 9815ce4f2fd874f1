"""What a deployment costs per hour: its GPUs (hardware preset x tensor-parallel size x
replicas) at each preset's ``cost_per_hour``, or at the price ``--gpu-cost`` gives."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from simulator.errors import InputError
from simulator.scenario.config import ScenarioConfig

ANY_GPU = "*"
"""Key of a ``--gpu-cost USD`` given without a hardware name: the price of every GPU."""


def parse_gpu_costs(items: list[str]) -> dict[str, float]:
    """``--gpu-cost`` items (``h100-sxm=2.5`` or a bare ``2.5`` for every GPU) -> prices."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        key = name.strip() if sep else ANY_GPU
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if not (math.isfinite(price) and price > 0) or not key:
            raise InputError(f"--gpu-cost {item!r}: expected HARDWARE=USD_PER_GPU_HOUR or USD")
        out[key] = price
    return out


def _replica_gpus(cost_model: Any) -> tuple[str | None, int]:
    """(hardware preset, GPUs) of one server of ``cost_model`` (None: a linear model names
    no hardware)."""
    from simulator.cost.gpus import named_gpus

    gpus = named_gpus(cost_model)
    return (None, 1) if gpus is None else (gpus.hardware, gpus.tp)


def deployment_gpus(cfg: ScenarioConfig) -> Counter[str | None]:
    """GPUs of the deployment by hardware preset: every replica of every group."""
    gpus: Counter[str | None] = Counter()
    cluster = getattr(cfg, "cluster", None)
    groups = _groups(cfg, cluster) if cluster is not None else [(cfg.cost_model, 1)]
    for cost_model, count in groups:
        hardware, tp = _replica_gpus(cost_model)
        gpus[hardware] += tp * count
    return gpus


def _groups(cfg: ScenarioConfig, cluster: Any) -> list[tuple[Any, int]]:
    """(cost model, replicas) of each replica group of a cluster."""
    from simulator.cluster.config import replica_groups

    return [(g.cost_model, g.count) for g in replica_groups(cluster, cfg.scheduler, cfg.cost_model)]


def cost_per_hour(cfg: ScenarioConfig, prices: dict[str, float]) -> tuple[float, int]:
    """Dollars per hour of the deployment and its number of GPUs; a GPU of unknown price is
    an ``InputError`` saying how to give it."""
    from simulator.cost.presets import load_hardware

    total, count = 0.0, 0
    for hardware, num in deployment_gpus(cfg).items():
        price = prices.get(hardware or "", prices.get(ANY_GPU))
        if price is None and hardware is not None:
            price = load_hardware(hardware).cost_per_hour
        if price is None:
            what = f"hardware {hardware}" if hardware else "a linear cost model (no hardware)"
            name = f"{hardware}=" if hardware else ""
            raise InputError(
                f"{what} has no cost_per_hour; give one with --gpu-cost {name}USD_PER_GPU_HOUR"
            )
        total += price * num
        count += num
    return total, count
