"""Cost models: how long one step takes on the GPU(s); their presets and calibration.

Each model is a ``CostModel`` (``interface.py``) in a file of its own, with its scenario
config; ``COST_MODELS`` says how a config's ``type`` is built (``build_cost_model``), and a
scenario may name any other model by import path, ``type: module:Class`` (it is built from an
``ImportedCostConfig``). ``gpus.py`` says which model, GPUs and TP a config names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from simulator.cost.fitted import FittedCostConfig, load_fitted
from simulator.cost.interface import CostModel
from simulator.cost.kernels import KernelsCostConfig, KernelsCostModel
from simulator.cost.linear import LinearCostConfig, LinearCostModel
from simulator.cost.physics import PhysicsCostConfig, PhysicsCostModel
from simulator.cost.physics_params import load_params
from simulator.cost.presets import load_hardware, load_model
from simulator.cost.profiled import ProfiledCostConfig, ProfiledCostModel
from simulator.cost.profiles import read_profile
from simulator.cost.roofline import RooflineCostConfig, RooflineCostModel
from simulator.errors import InputError, in_field
from simulator.registry import Registry, is_import_path

__all__ = [
    "COST_MODELS",
    "CostModel",
    "CostModelConfig",
    "ImportedCostConfig",
    "KernelsCostConfig",
    "KernelsCostModel",
    "LinearCostConfig",
    "LinearCostModel",
    "PhysicsCostConfig",
    "PhysicsCostModel",
    "ProfiledCostConfig",
    "ProfiledCostModel",
    "RooflineCostConfig",
    "RooflineCostModel",
    "build_cost_model",
    "default_type",
]


class ImportedCostConfig(BaseModel):
    """A cost model of your own, named by import path: ``type: mypkg.costs:Flat``; the class
    (a ``CostModel``) is called with this config."""

    model_config = ConfigDict(extra="forbid")

    type: str
    """``module:Class`` of the cost model."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Whatever the class reads (its own names and units)."""


def default_type(hardware: str, model: str | None = None) -> str:
    """The cost model a config naming ``model`` and ``hardware`` but no ``type`` gets:
    ``kernels`` where the kernel database measured the GPU (and is installed) and prices every
    layer of ``model``, else ``physics`` (an unknown preset too: physics then names it; a
    hybrid model's sliding-window, state or sparse layers too: kernels does not read their
    rows yet, ``kernel_hybrid.py``)."""
    from simulator.cost.kernel_db import measured_gpus

    try:
        gpu = load_hardware(hardware).kernels_gpu
        if gpu is None or gpu not in measured_gpus():
            return "physics"
        hybrid = model is not None and load_model(model).layers is not None
    except InputError:
        return "physics"
    return "physics" if hybrid else "kernels"


def _tag(value: Any) -> str | None:
    """The union member a cost-model config is: its ``type``, or ``imported`` for an import
    path, or with no ``type`` but a ``model`` and ``hardware`` the GPU's default
    (``default_type``); anything else is refused as an unknown tag."""
    if isinstance(value, dict):
        kind = value.get("type")
        hardware = value.get("hardware")
        if kind is None and isinstance(hardware, str) and isinstance(value.get("model"), str):
            return default_type(hardware, value["model"])
    else:
        kind = getattr(value, "type", None)
    return "imported" if isinstance(kind, str) and is_import_path(kind) else kind


CostModelConfig = Annotated[
    Annotated[LinearCostConfig, Tag("linear")]
    | Annotated[RooflineCostConfig, Tag("roofline")]
    | Annotated[FittedCostConfig, Tag("fitted")]
    | Annotated[ProfiledCostConfig, Tag("profiled")]
    | Annotated[PhysicsCostConfig, Tag("physics")]
    | Annotated[KernelsCostConfig, Tag("kernels")]
    | Annotated[ImportedCostConfig, Tag("imported")],
    Discriminator(_tag),
]
"""Any cost-model config, told apart by its ``type`` field."""


def _roofline(cfg: RooflineCostConfig) -> CostModel:
    model = in_field("cost_model.model", load_model, cfg.model)
    hardware = in_field("cost_model.hardware", load_hardware, cfg.hardware)
    return RooflineCostModel(cfg, model, hardware)


def _profiled(cfg: ProfiledCostConfig) -> CostModel:
    model = in_field("cost_model.model", load_model, cfg.model)
    hardware = in_field("cost_model.hardware", load_hardware, cfg.hardware)
    profile = in_field(
        "cost_model.profile", lambda p: read_profile(p, cfg.format, cfg.tp), cfg.profile
    )
    return ProfiledCostModel(cfg, model, hardware, profile)


def _physics(cfg: PhysicsCostConfig) -> CostModel:
    return PhysicsCostModel(
        cfg,
        in_field("cost_model.model", load_model, cfg.model),
        in_field("cost_model.hardware", load_hardware, cfg.hardware),
        in_field("cost_model.params", load_params, cfg.params),
    )


def _kernels(cfg: KernelsCostConfig) -> CostModel:
    return KernelsCostModel(
        cfg,
        in_field("cost_model.model", load_model, cfg.model),
        in_field("cost_model.hardware", load_hardware, cfg.hardware),
    )


COST_MODELS: Registry[Callable[[Any], CostModel]] = Registry(
    "cost model",
    {
        "linear": LinearCostModel,
        "roofline": _roofline,
        "fitted": lambda cfg: in_field("cost_model.path", load_fitted, cfg),
        "profiled": _profiled,
        "physics": _physics,
        "kernels": _kernels,
    },
)
"""``cost_model.type`` -> how to build the model from its validated config (a new built-in
model adds its config to ``CostModelConfig`` and its builder here)."""


def build_cost_model(cfg: CostModelConfig) -> CostModel:
    """The cost model a validated config describes (presets are loaded here)."""
    try:
        build = COST_MODELS.resolve(cfg.type)
    except ValueError as err:
        raise InputError(f"cost_model.type: {err}") from None
    if isinstance(cfg, ImportedCostConfig) and not (
        isinstance(build, type) and issubclass(build, CostModel)
    ):
        raise InputError(f"cost_model.type: {cfg.type!r} is not a CostModel subclass")
    return build(cfg)
