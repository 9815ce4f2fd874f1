"""One KV-cache group of a hybrid model: the layers of one kind that share block tables and
allocate from the one block pool (vLLM's ``KVCacheGroupSpec``, each run by its single-type
manager under the hybrid coordinator)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GroupKind = Literal["full", "sliding_window", "mamba"]
"""``full``: every block kept (full attention, MLA); ``sliding_window``: blocks wholly before
the window given back as the request advances; ``mamba``: a fixed state per request (Mamba2
and linear attention such as Gated DeltaNet)."""


class KVGroup(BaseModel):
    """A KV-cache group: its kind, its tokens per block and, by kind, its window or Mamba
    caching mode (the shape the models' layers are grouped into and the KV manager runs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: GroupKind
    """Which rules the group's blocks follow (``GroupKind``)."""
    block_size: int = Field(ge=1)
    """Tokens per block of this group: vLLM may scale it per group so that every group's page
    has the same bytes; a Mamba group's is ``max_model_len`` in mode ``none``."""
    num_layers: int = Field(default=1, ge=1)
    """Layers in the group (each block is one page of each of them)."""
    sliding_window: int | None = Field(default=None, ge=1)
    """``sliding_window`` only: tokens each new token attends to (the model's
    ``sliding_window``)."""
    mamba_cache_mode: Literal["none", "align"] | None = None
    """``mamba`` only: ``none`` (prefix caching off: one state block for the request's life)
    or ``align`` (prefix caching on: states kept at block boundaries, prefill chunks cut on
    them)."""

    @model_validator(mode="after")
    def _kind_keys(self) -> KVGroup:
        if (self.kind == "sliding_window") != (self.sliding_window is not None):
            raise ValueError("sliding_window: required for kind 'sliding_window' and only there")
        if (self.kind == "mamba") != (self.mamba_cache_mode is not None):
            raise ValueError("mamba_cache_mode: required for kind 'mamba' and only there")
        return self


def caching_refusal(groups: list[KVGroup], caching: bool) -> str | None:
    """Why prefix caching cannot run over ``groups`` here, or None: a Mamba group in mode
    ``none`` keeps no states to hit, and groups of different block sizes vLLM hashes at their
    gcd, which the KV manager does not (yet)."""
    if not caching:
        return None
    if any(g.mamba_cache_mode == "none" for g in groups):
        return "a Mamba group in mode 'none' takes no prefix caching (vLLM runs 'align' with it)"
    sizes = sorted({g.block_size for g in groups})
    if len(sizes) > 1:
        return f"prefix caching over groups of different block sizes {sizes} is not simulated yet"
    return None
