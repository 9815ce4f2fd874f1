"""Whether an operator profile fits the model preset it prices: the shape it names, and
experts on both sides or on neither."""

from __future__ import annotations

from simulator.cost.presets import ModelSpec
from simulator.cost.profiles import OperatorProfile
from simulator.cost.profiles.moe import MoeTable
from simulator.errors import InputError


def moe_table(profile: OperatorProfile, model: ModelSpec) -> MoeTable | None:
    """The profile's MoE table when the model has experts; a mismatch either way -> error."""
    if profile.moe is not None and not model.is_moe:
        raise InputError(
            f"cost_model.profile: {profile.source}: has moe.csv, but model {model.name} has no "
            "experts (an MoE model's shape: num_experts, num_experts_per_tok, ...)"
        )
    if profile.moe is None and model.is_moe:
        raise InputError(
            f"cost_model.profile: {profile.source}: no moe.csv to price the experts of MoE "
            f"model {model.name}"
        )
    return profile.moe


def check_shape(profile: OperatorProfile, model: ModelSpec) -> None:
    """A profile that names its model's shape must match the model preset."""
    want = {
        "n_embd": model.hidden_size,
        "n_head": model.num_heads,
        "n_kv_head": model.num_kv_heads,
        "n_expanded_embd": model.intermediate_size,
        "vocab_size": model.vocab_size,
    }
    for key, value in profile.shape.items():
        if key in want and want[key] != value:
            raise InputError(
                f"cost_model.profile: {profile.source}: {key} {value} does not match model "
                f"{model.name} ({want[key]})"
            )
