"""Which kind each layer of a hybrid model is, and the shapes that kind needs: sliding-window
attention (gpt-oss, Gemma), Gated DeltaNet linear attention (Qwen3.5), Mamba2 (Nemotron-H),
DeepSeek-V3.2's lightning indexer; and what follows per layer (mixer weights, attention FLOPs,
KV bytes per token, recurrent state bytes) on one GPU of a tensor-parallel group.

Formulas and sources: ``docs/hybrid-kv.md`` and ``docs/cost_models.md`` ("Hybrid layers").
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerKind = Literal["full", "sliding", "linear", "mamba"]
"""``full``: attention over every earlier token; ``sliding``: over the last
``sliding_window`` tokens; ``linear``: Gated DeltaNet (a fixed recurrent state);
``mamba``: Mamba2 (a fixed state)."""

STATE_KINDS = ("linear", "mamba")


class AttentionShape(Protocol):
    """What of ``ModelSpec`` the per-layer figures need."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def dtype_bytes(self) -> int: ...
    @property
    def kv_dtype_bytes(self) -> float | int: ...


class LayerLayout(BaseModel):
    """The layer kinds of a model that is not full attention everywhere, and their shapes
    (all from its ``config.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kinds: tuple[LayerKind, ...]
    """One kind per layer (``layer_types``, ``hybrid_override_pattern``, ...)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Tokens a ``sliding`` layer attends to (``sliding_window``)."""
    global_num_kv_heads: int | None = Field(default=None, gt=0)
    """KV heads of the ``full`` layers when they differ from the sliding ones (Gemma 4's
    ``num_global_key_value_heads``)."""
    global_head_dim: int | None = Field(default=None, gt=0)
    """Head width of the ``full`` layers when it differs (Gemma 4's ``global_head_dim``)."""
    global_k_eq_v: bool = False
    """The ``full`` layers' values are their keys (Gemma 4's ``attention_k_eq_v``): no V
    projection (the cache still holds both, as vLLM's does)."""
    attn_output_gate: bool = False
    """A sigmoid gate on the attention output, projected with the queries (Qwen3.5)."""
    attention_sinks: bool = False
    """A learned sink logit per head (gpt-oss): one more score per query, priced as nothing."""
    linear_num_key_heads: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: query/key heads (``linear_num_key_heads``)."""
    linear_num_value_heads: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: value heads, one recurrent state each (``linear_num_value_heads``)."""
    linear_key_head_dim: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: key head width (``linear_key_head_dim``)."""
    linear_value_head_dim: int | None = Field(default=None, gt=0)
    """Gated DeltaNet: value head width (``linear_value_head_dim``)."""
    mamba_num_heads: int | None = Field(default=None, gt=0)
    """Mamba2: SSM heads (``mamba_num_heads``)."""
    mamba_head_dim: int | None = Field(default=None, gt=0)
    """Mamba2: head width (``mamba_head_dim``)."""
    ssm_state_size: int | None = Field(default=None, gt=0)
    """Mamba2: state width per head (``ssm_state_size``)."""
    mamba_n_groups: int | None = Field(default=None, gt=0)
    """Mamba2: B/C groups (``n_groups``)."""
    conv_kernel: int | None = Field(default=None, gt=0)
    """Causal-convolution width of a state layer (``conv_kernel``, ``linear_conv_kernel_dim``):
    its state keeps the last ``conv_kernel - 1`` inputs."""
    chunk_size: int = Field(default=64, gt=0)
    """Chunk of the chunked scan in prefill (Mamba2 ``chunk_size``; 64 for Gated DeltaNet, FLA's
    chunk): vLLM aligns prefix-cached states to it."""
    state_dtype_bytes: int = Field(default=4, gt=0)
    """Bytes per element of the recurrent (SSM / delta-rule) state: float32 (``mamba_ssm_dtype``;
    vLLM keeps Nemotron-H's in float32 too); the convolution state is at the model dtype."""
    index_topk: int | None = Field(default=None, gt=0)
    """DeepSeek-V3.2: tokens each query attends to, picked by the lightning indexer."""
    index_n_heads: int | None = Field(default=None, gt=0)
    """DeepSeek-V3.2: indexer heads (``index_n_heads``)."""
    index_head_dim: int | None = Field(default=None, gt=0)
    """DeepSeek-V3.2: indexer head width (``index_head_dim``); its key cache is fp8 plus one
    float32 scale per 128 elements (``index_head_dim + index_head_dim / 128 * 4`` bytes)."""
    max_position_embeddings: int | None = Field(default=None, gt=0)
    """The model's context length: vLLM's ``max_model_len`` when none is given."""

    @model_validator(mode="after")
    def _shapes_present(self) -> LayerLayout:
        if "sliding" in self.kinds and self.sliding_window is None:
            raise ValueError("sliding layers need sliding_window")
        need = {
            "linear": ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim"),
            "mamba": ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "mamba_n_groups"),
        }
        for kind, keys in need.items():
            missing = [k for k in keys if kind in self.kinds and getattr(self, k) is None]
            if missing:
                raise ValueError(f"{kind} layers need {', '.join(missing)}")
        return self

    # -- counts ------------------------------------------------------------------------------

    def count(self, kind: LayerKind) -> int:
        """Layers of this kind."""
        return sum(k == kind for k in self.kinds)

    @property
    def has_state(self) -> bool:
        """Whether any layer keeps a recurrent state instead of a KV cache."""
        return any(k in STATE_KINDS for k in self.kinds)

    # -- per-kind attention shape ---------------------------------------------------------------

    def kv_shape(self, m: AttentionShape, kind: LayerKind) -> tuple[int, int]:
        """(KV heads, head width) of an attention layer of ``kind``."""
        if kind == "full":
            return (self.global_num_kv_heads or m.num_kv_heads, self.global_head_dim or m.head_dim)
        return m.num_kv_heads, m.head_dim

    def kv_bytes_per_token(self, m: AttentionShape, kind: LayerKind, tp: int = 1) -> float:
        """KV bytes one token keeps in one attention layer of ``kind`` on one GPU of ``tp``
        (its share of the KV heads; a whole head when ``tp`` exceeds them)."""
        heads, dim = self.kv_shape(m, kind)
        per_gpu = heads / tp if tp <= heads else 1
        return 2 * per_gpu * dim * float(m.kv_dtype_bytes)

    def pair_flops(self, m: AttentionShape, kind: LayerKind) -> float:
        """FLOPs of one (query, key) pair in one attention layer (QK^T and AV, all heads)."""
        return 4.0 * m.num_heads * self.kv_shape(m, kind)[1]

    def total_kv_bytes_per_token(self, m: AttentionShape, tp: int = 1) -> float:
        """KV bytes one token keeps over all attention layers on one GPU of ``tp``."""
        return sum(self.kv_bytes_per_token(m, k, tp) for k in self.kinds if k not in STATE_KINDS)

    def total_pair_flops(self, m: AttentionShape) -> float:
        """FLOPs of one (query, key) pair over all attention layers."""
        return sum(self.pair_flops(m, k) for k in self.kinds if k not in STATE_KINDS)

    def total_mixer_params(self, m: AttentionShape) -> int:
        """Weights of all layers' token mixers."""
        return sum(self.mixer_params(m, k) for k in self.kinds)

    # -- recurrent state ------------------------------------------------------------------------

    def state_bytes(self, m: AttentionShape, kind: LayerKind, tp: int = 1) -> int:
        """Bytes of one request's state in one ``linear`` or ``mamba`` layer on one GPU of
        ``tp``: the convolution state ``(conv_kernel - 1) x channels`` at the model dtype and
        the recurrent state at ``state_dtype_bytes`` (vLLM's ``MambaStateShapeCalculator``)."""
        conv_rows = (self.conv_kernel or 4) - 1
        if kind == "linear":
            assert self.linear_num_key_heads and self.linear_num_value_heads
            dk = self.linear_key_head_dim or 0
            dv = self.linear_value_head_dim or dk
            channels = (2 * self.linear_num_key_heads * dk + self.linear_num_value_heads * dv) // tp
            state = self.linear_num_value_heads // tp * dk * dv
        else:
            assert self.mamba_num_heads and self.mamba_head_dim and self.mamba_n_groups
            inner = self.mamba_num_heads * self.mamba_head_dim
            channels = (inner + 2 * self.mamba_n_groups * (self.ssm_state_size or 0)) // tp
            state = self.mamba_num_heads // tp * self.mamba_head_dim * (self.ssm_state_size or 0)
        return conv_rows * channels * m.dtype_bytes + state * self.state_dtype_bytes

    def state_flops_per_token(self, kind: LayerKind) -> float:
        """FLOPs of one token's recurrent update in one state layer (all heads): the delta
        rule reads and writes its ``d_k x d_v`` state a few times (~6 multiply-adds per
        element); Mamba2 decays, adds ``B x`` and reads ``C h`` (~3)."""
        if kind == "linear":
            dk = self.linear_key_head_dim or 0
            dv = self.linear_value_head_dim or dk
            return 2.0 * 6 * (self.linear_num_value_heads or 0) * dk * dv
        n = self.ssm_state_size or 0
        return 2.0 * 3 * (self.mamba_num_heads or 0) * (self.mamba_head_dim or 0) * n

    # -- weights ----------------------------------------------------------------------------

    def mixer_params(self, m: AttentionShape, kind: LayerKind) -> int:
        """Weights of one layer's token mixer (attention, Gated DeltaNet or Mamba2)."""
        h = m.hidden_size
        if kind == "linear":
            nk, nv = self.linear_num_key_heads or 0, self.linear_num_value_heads or 0
            dk = self.linear_key_head_dim or 0
            dv = self.linear_value_head_dim or dk
            # q, k, v, z (output gate) and the per-head beta/alpha; out projection
            return h * (2 * nk * dk + 2 * nv * dv + 2 * nv) + nv * dv * h
        if kind == "mamba":
            inner = (self.mamba_num_heads or 0) * (self.mamba_head_dim or 0)
            bc = 2 * (self.mamba_n_groups or 0) * (self.ssm_state_size or 0)
            return h * (2 * inner + bc + (self.mamba_num_heads or 0)) + inner * h
        heads, dim = self.kv_shape(m, kind)
        q = m.num_heads * dim * (2 if self.attn_output_gate else 1)
        kv = heads * dim * (1 if kind == "full" and self.global_k_eq_v else 2)
        return h * (q + kv) + m.num_heads * dim * h

    def indexer_params(self, q_lora_rank: int, hidden: int) -> int:
        """Weights of one layer's lightning indexer (DeepSeek-V3.2): its queries from the
        query latent, one key head and the per-head weights from the hidden state."""
        heads, dim = self.index_n_heads or 0, self.index_head_dim or 0
        return q_lora_rank * heads * dim + hidden * (dim + heads)

    @property
    def indexer_bytes_per_token(self) -> int:
        """Bytes of the indexer's key cache per token and layer (fp8 keys + a float32 scale
        per 128 elements: 132 for DeepSeek-V3.2's width 128); 0 without an indexer."""
        dim = self.index_head_dim or 0
        return dim + dim // 128 * 4 if self.index_topk else 0
