"""The ``speculative:`` part of a scenario: vLLM's speculative decoding (``method``,
``num_speculative_tokens``) and how often the target model accepts the drafts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AcceptanceConfig(BaseModel):
    """How many drafts a verify step accepts: a constant per-token rate, or the per-position
    rates vLLM's metrics report (one of the two)."""

    model_config = ConfigDict(extra="forbid")

    rate: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    """Probability that each draft token is accepted, given that those before it were: the
    accepted prefix of ``k`` drafts is the leading run of ``k`` Bernoulli(``rate``) trials."""
    per_position: list[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]] | None = Field(
        default=None, min_length=1
    )
    """Probability that draft position ``i`` (1-based) is accepted, i.e. that at least ``i``
    drafts are (vLLM's per-position acceptance rate: accepted at ``i`` / drafts): one per
    speculative token, each in [0, 1], non-increasing."""

    @model_validator(mode="after")
    def _one_model(self) -> AcceptanceConfig:
        if (self.rate is None) == (self.per_position is None):
            raise ValueError("give exactly one of rate, per_position")
        for i, p in enumerate(self.per_position or ()):
            if i and p > self.per_position[i - 1]:  # type: ignore[index]
                raise ValueError(
                    f"per_position[{i}]: {p} is above position {i}'s rate (at least i + 1 "
                    "drafts accepted cannot be likelier than at least i)"
                )
        return self

    def at_least(self, k: int) -> list[float]:
        """``P(at least i drafts accepted)`` for ``i = 1 .. k``."""
        if self.rate is not None:
            return [self.rate**i for i in range(1, k + 1)]
        assert self.per_position is not None
        return list(self.per_position[:k])


class SpeculativeConfig(BaseModel):
    """Speculative decoding (vLLM's ``speculative_config``): every decode verifies
    ``num_speculative_tokens`` drafts in one step of ``1 + k`` tokens (docs/scheduler.md,
    "Speculative decoding")."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["ngram", "mtp", "eagle", "draft_model"] = "ngram"
    """Who proposes the drafts: prompt lookup (``ngram``, no GPU work), the model's MTP
    layers, an EAGLE head or a separate draft model (their forward passes cost
    ``draft_cost``)."""
    num_speculative_tokens: int = Field(ge=0, le=64)
    """Draft tokens per decode step, ``k`` (0: no speculation, the same run as without; at
    most 64, far past what vLLM's drafters propose: its examples use 1 to 10)."""
    acceptance: AcceptanceConfig
    """How many of them the target model accepts."""
    draft_cost: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """One forward pass of the drafter as a share of the target model's decode step over the
    same sequences (MTP: its layers / the model's layers; a draft model: its size / the
    target's); a step with drafts adds ``k`` such passes. 0 (the default): free, as ngram."""

    @model_validator(mode="after")
    def _enough_positions(self) -> SpeculativeConfig:
        per = self.acceptance.per_position
        if per is not None and len(per) != self.num_speculative_tokens:
            raise ValueError(
                f"acceptance.per_position has {len(per)} rates, expected one per speculative "
                f"token ({self.num_speculative_tokens})"
            )
        if self.method == "ngram" and self.draft_cost:
            raise ValueError("draft_cost: ngram drafts need no forward pass (leave it 0)")
        return self


__all__ = ["AcceptanceConfig", "SpeculativeConfig"]
