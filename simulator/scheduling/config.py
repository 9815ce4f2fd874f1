"""The scheduler's part of a scenario: which policy, and its budgets."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SchedulerConfig(BaseModel):
    """The step scheduler's policy and budgets (the contract: docs/scheduler.md)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    policy: Literal["spec"] = "spec"
    """Scheduling policy: ``spec`` (docs/scheduler.md, the default)."""
    max_num_batched_tokens: int = Field(ge=1)
    """Token budget of one step, shared by decodes and prefill chunks."""
    max_num_seqs: int = Field(ge=1)
    """Most sequences running at once (an admission limit only)."""
    num_blocks: int | None = Field(default=None, ge=1)
    """KV-cache blocks; omit to derive them from GPU memory (needs a roofline or fitted model)."""
    block_size: int = Field(default=16, ge=1)
    """Tokens per KV block."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of GPU memory for weights + KV when ``num_blocks`` is derived."""
