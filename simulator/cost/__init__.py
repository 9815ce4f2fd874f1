"""Cost models: how long one step takes on the GPU(s); their presets and calibration.

Each model is a ``CostModel`` (``interface.py``) in a file of its own, with its scenario
config; ``build_cost_model`` turns a scenario's ``cost_model:`` into one.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from simulator.cost.fitted import FittedCostConfig, load_fitted
from simulator.cost.interface import CostModel
from simulator.cost.linear import LinearCostConfig, LinearCostModel
from simulator.cost.physics import PhysicsCostConfig, PhysicsCostModel
from simulator.cost.physics_params import load_params
from simulator.cost.presets import load_hardware, load_model
from simulator.cost.profiled import ProfiledCostConfig, ProfiledCostModel
from simulator.cost.profiles import read_profile
from simulator.cost.roofline import RooflineCostConfig, RooflineCostModel
from simulator.errors import InputError, in_field

__all__ = [
    "CostModel",
    "CostModelConfig",
    "LinearCostConfig",
    "LinearCostModel",
    "PhysicsCostConfig",
    "PhysicsCostModel",
    "ProfiledCostConfig",
    "ProfiledCostModel",
    "RooflineCostConfig",
    "RooflineCostModel",
    "build_cost_model",
]

CostModelConfig = Annotated[
    LinearCostConfig
    | RooflineCostConfig
    | FittedCostConfig
    | ProfiledCostConfig
    | PhysicsCostConfig,
    Field(discriminator="type"),
]
"""Any cost-model config, told apart by its ``type`` field."""


def build_cost_model(cfg: CostModelConfig) -> CostModel:
    """The cost model a validated config describes (presets are loaded here)."""
    if isinstance(cfg, LinearCostConfig):
        return LinearCostModel(cfg)
    if isinstance(cfg, RooflineCostConfig):
        model = in_field("cost_model.model", load_model, cfg.model)
        hardware = in_field("cost_model.hardware", load_hardware, cfg.hardware)
        return RooflineCostModel(cfg, model, hardware)
    if isinstance(cfg, FittedCostConfig):
        return in_field("cost_model.path", load_fitted, cfg)
    if isinstance(cfg, ProfiledCostConfig):
        model = in_field("cost_model.model", load_model, cfg.model)
        hardware = in_field("cost_model.hardware", load_hardware, cfg.hardware)
        profile = in_field(
            "cost_model.profile", lambda p: read_profile(p, cfg.format, cfg.tp), cfg.profile
        )
        return ProfiledCostModel(cfg, model, hardware, profile)
    if isinstance(cfg, PhysicsCostConfig):
        return PhysicsCostModel(
            cfg,
            in_field("cost_model.model", load_model, cfg.model),
            in_field("cost_model.hardware", load_hardware, cfg.hardware),
            in_field("cost_model.params", load_params, cfg.params),
        )
    raise InputError(f"cost_model: unsupported type {type(cfg).__name__}")
