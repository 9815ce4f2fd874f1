"""Which model, GPUs and tensor-parallel size a cost-model config names: read here once for
whoever needs them (the KV cache derived from memory, the KV bytes a disaggregated request
moves, what a deployment costs)."""

from __future__ import annotations

from typing import Any, NamedTuple

from simulator.cost.fitted import FittedCostConfig, load_preset
from simulator.errors import in_field


class NamedGpus(NamedTuple):
    """The presets a cost-model config names, and where a scenario names them."""

    model: str
    """Model preset name (or file)."""
    hardware: str
    """Hardware preset name (or file)."""
    tp: int
    """GPUs of one server (tensor parallelism)."""
    where: str
    """What goes before ``model`` or ``hardware`` in an error about them."""


def named_gpus(cm: Any, prefix: str = "") -> NamedGpus | None:
    """The presets ``cm`` names: its own ``model``, ``hardware`` and ``tp`` fields (roofline,
    profiled), or its fitted preset's; None when it names none (a linear model). ``prefix``
    goes before the keys named in errors (a cluster's replica group)."""
    if isinstance(cm, FittedCostConfig):
        # a fitted preset names the model and GPUs it was fitted on
        preset = in_field(f"{prefix}cost_model.path", load_preset, cm.path)
        return NamedGpus(
            preset.model, preset.hardware, preset.tp, f"{prefix}cost_model.path: {cm.path}: "
        )
    model, hardware = getattr(cm, "model", None), getattr(cm, "hardware", None)
    if isinstance(model, str) and isinstance(hardware, str):
        return NamedGpus(model, hardware, int(getattr(cm, "tp", 1) or 1), f"{prefix}cost_model.")
    return None
