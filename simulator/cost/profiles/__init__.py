"""Operator profiles: per-operator GPU times measured on a serving stack, read from a profile
format (one reader module each) into one ``OperatorProfile`` that the ``profiled`` cost model
interpolates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from simulator.cost.profiles.attention import AttentionTable
from simulator.cost.profiles.curve import Curve
from simulator.cost.profiles.llmservingsim import read_llmservingsim
from simulator.cost.profiles.profile import OperatorProfile
from simulator.cost.profiles.vidur import read_vidur_mlp

__all__ = ["READERS", "AttentionTable", "Curve", "OperatorProfile", "ProfileFormat", "read_profile"]

ProfileFormat = Literal["llmservingsim", "vidur-mlp"]

READERS: dict[str, Callable[[str | Path, int], OperatorProfile]] = {
    "llmservingsim": read_llmservingsim,
    "vidur-mlp": read_vidur_mlp,
}
"""Profile format -> its reader ``(path, tp) -> OperatorProfile``."""


def read_profile(path: str | Path, fmt: ProfileFormat, tp: int) -> OperatorProfile:
    """The profile at ``path`` in format ``fmt``, for tensor-parallel degree ``tp``."""
    return READERS[fmt](path, tp)
