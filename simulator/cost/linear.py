"""The ``linear`` cost model: a step's time as a linear function of its counts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.cost.batch import Batch, StepSums
from simulator.cost.decode_times import linear_decodes
from simulator.cost.interface import CostModel

_MS = 1e-3


class LinearCostConfig(BaseModel):
    """Step time as a linear function of the batch's token, sequence and context counts."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["linear"] = "linear"
    """Discriminator of the cost-model union."""
    base_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Fixed cost of every step (launch, scheduling, sampling), ms."""
    per_token_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Cost per computed token (sum of ``new_tokens``), ms."""
    per_seq_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Cost per scheduled sequence, ms."""
    per_context_token_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Cost per token already in KV cache (attention reads), ms."""

    @model_validator(mode="after")
    def _some_positive(self) -> LinearCostConfig:
        # Every scheduled sequence computes >= 1 token, so one of these > 0 guarantees a
        # positive step time; per_context_token_ms alone would time a fresh prefill at 0.
        if self.base_ms <= 0 and self.per_token_ms <= 0 and self.per_seq_ms <= 0:
            raise ValueError(
                "at least one of base_ms, per_token_ms, per_seq_ms must be > 0 "
                "(a step would otherwise take no time)"
            )
        return self


class LinearCostModel(CostModel):
    """``base + per_token * tokens + per_seq * seqs + per_context_token * context`` (ms)."""

    times_from_sums = True

    def __init__(self, cfg: LinearCostConfig) -> None:
        """Store the coefficients in seconds."""
        self.cfg = cfg
        self._base = cfg.base_ms * _MS
        self._per_token = cfg.per_token_ms * _MS
        self._per_seq = cfg.per_seq_ms * _MS
        self._per_ctx = cfg.per_context_token_ms * _MS

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes."""
        new = batch.new_tokens
        sums = (len(new), 0, sum(new), sum(batch.context_lens), 0, 0)
        return self.time_sums(sums)  # type: ignore[arg-type]

    def time_sums(self, sums: StepSums) -> float:
        """Seconds of a step with these sums (``step_time`` goes through here too)."""
        # one call: the engine times most steps of a run here
        return (
            self._base
            + self._per_token * sums[2]
            + self._per_seq * sums[0]
            + self._per_ctx * sums[3]
        )

    def time_decodes(self, num_seqs: int, contexts: range) -> list[float]:
        """``time_sums`` of decode steps of ``num_seqs`` sequences over ``contexts``: the same
        sums in the same order, the part that does not change added once (it is the sum's
        left end, so every step's float result is the same)."""
        head = self._base + self._per_token * num_seqs + self._per_seq * num_seqs
        return linear_decodes(head, self._per_ctx, contexts)
