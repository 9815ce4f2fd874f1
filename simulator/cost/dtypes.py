"""Element types of weights and KV cache, and their sizes."""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["DTYPE_BYTES", "Dtype", "nbytes"]

Dtype = Literal["bf16", "fp16", "fp8", "fp4"]
"""Element types of weights and KV cache the cost models price."""

DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
"""Bytes per element of each dtype (block scales of fp8/fp4 formats, 1 byte per 16-32
elements, are not counted)."""


def nbytes(count: int, per_element: float | int) -> int:
    """Bytes of ``count`` elements, rounded up (exact integer arithmetic for whole bytes)."""
    if isinstance(per_element, int):
        return count * per_element
    return math.ceil(count * per_element)
