"""A GPU's link to its host's memory in bytes per second, one way, from its hardware preset's
PCI Express generation and lanes and the per-lane rates of ``configs/pcie.yaml`` (each with
the PCI-SIG specification it comes from)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from simulator.cost.hardware_spec import HardwareSpec
from simulator.cost.presets import configs_dir
from simulator.errors import InputError


@cache
def pcie_lane_rates(path: Path) -> dict[int, float]:
    """PCIe generation -> bytes per second one lane carries one way, after line encoding."""
    with open(path) as f:
        raw = yaml.safe_load(f)
    return {int(g): float(e["gt_per_s"]) * 1e9 * float(e["encoding"]) / 8 for g, e in raw.items()}


def pcie_bandwidth(generation: int, lanes: int) -> float:
    """Bytes per second a PCIe link of ``generation`` and ``lanes`` carries one way."""
    rates = pcie_lane_rates(configs_dir() / "pcie.yaml")
    if generation not in rates:
        known = ", ".join(str(g) for g in sorted(rates))
        raise InputError(f"pcie_generation: {generation} is not one of {known} (configs/pcie.yaml)")
    return rates[generation] * lanes


def host_link_bandwidth(hw: HardwareSpec) -> float | None:
    """Bytes per second ``hw``'s link to its host carries one way; None when its preset gives
    no PCIe generation or lanes."""
    if hw.pcie_generation is None or hw.pcie_lanes is None:
        return None
    return pcie_bandwidth(hw.pcie_generation, hw.pcie_lanes)
