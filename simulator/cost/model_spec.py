"""A model's shape: dense or mixture-of-experts layers, GQA or MLA attention, weight and KV
dtypes; and what follows from it (parameters, bytes, FLOPs per token, experts a batch touches).

Formulas and sources: ``docs/cost_models.md`` ("Model shape").
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.cost.dtypes import DTYPE_BYTES, Dtype, nbytes
from simulator.cost.kv_heads import check_kv_split, replicated_kv_weight_bytes
from simulator.cost.layer_layout import LayerLayout
from simulator.cost.model_checks import check_shape
from simulator.errors import InputError

__all__ = ["DTYPE_BYTES", "Dtype", "ModelSpec"]


class ModelSpec(BaseModel):
    """Shape of a decoder-only transformer (dense or MoE; GQA or MLA attention), enough to count
    parameters, FLOPs and bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Short identifier, e.g. ``llama-2-7b``."""
    source: str
    """Where the shape comes from (e.g. the Hugging Face ``config.json`` of the checkpoint)."""
    num_layers: int = Field(gt=0)
    """Transformer blocks (``num_hidden_layers``)."""
    hidden_size: int = Field(gt=0)
    """Residual-stream width (``hidden_size``)."""
    num_heads: int = Field(gt=0)
    """Query heads (``num_attention_heads``)."""
    num_kv_heads: int = Field(gt=0)
    """Key/value heads (``num_key_value_heads``; equal to ``num_heads`` without GQA)."""
    head_dim: int = Field(gt=0)
    """Width of one attention head (with MLA: ``qk_nope_head_dim + qk_rope_head_dim``)."""
    intermediate_size: int = Field(gt=0)
    """Width of a dense layer's MLP (``intermediate_size``; ``4 * hidden_size`` for BLOOM)."""
    vocab_size: int = Field(gt=0)
    """Vocabulary size (rows of the embedding and of the LM head)."""
    dtype_bytes: int = Field(default=2, gt=0)
    """Bytes per activation element (2 for bf16/fp16); also per weight and per KV element
    unless ``weight_dtype`` / ``kv_dtype`` say otherwise."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with gate, up and down matrices; ``False`` means up and down only."""
    tie_embeddings: bool = False
    """The LM head reuses the input embedding matrix (counted once in ``num_params``)."""
    qk_norm: bool = False
    """An RMSNorm over each query and key head before attention (Qwen3's ``q_norm`` and
    ``k_norm``): a memory-bound operator per layer the physics model prices."""
    weight_dtype: Dtype | None = None
    """Element type of the linear layers' weights (projections, MLPs, experts); embeddings,
    LM head and router stay at ``dtype_bytes``. None: ``dtype_bytes`` for all."""
    kv_dtype: Dtype | None = None
    """Element type of the KV cache; None: ``dtype_bytes``."""
    num_experts: int | None = Field(default=None, gt=0)
    """Routed experts per MoE layer (``num_experts`` / ``num_local_experts`` /
    ``n_routed_experts``); None for a dense model."""
    num_experts_per_tok: int | None = Field(default=None, gt=0)
    """Routed experts each token goes to (top-k)."""
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    """MLP width of one routed expert."""
    num_shared_experts: int = Field(default=0, ge=0)
    """Experts every token goes to besides its routed ones (DeepSeek ``n_shared_experts``;
    Qwen2-MoE's one ``shared_expert``)."""
    shared_expert_intermediate_size: int | None = Field(default=None, gt=0)
    """MLP width of one shared expert; None: ``moe_intermediate_size``."""
    first_k_dense_replace: int = Field(default=0, ge=0)
    """The first this many layers have a dense MLP instead of experts (DeepSeek)."""
    decoder_sparse_step: int = Field(default=1, gt=0)
    """Layer ``i`` is MoE only if ``(i + 1) % decoder_sparse_step == 0`` (Qwen-MoE)."""
    mlp_only_layers: tuple[int, ...] = ()
    """Layer indices with a dense MLP although the rules above make them MoE (Qwen-MoE)."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """MLA: width of the compressed KV latent cached per token and layer; None without MLA."""
    q_lora_rank: int | None = Field(default=None, gt=0)
    """MLA: width of the compressed query (None: queries are projected directly)."""
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    """MLA: rotary part of a query/key head, its key shared by all heads and cached."""
    qk_nope_head_dim: int | None = Field(default=None, gt=0)
    """MLA: non-rotary part of a query/key head."""
    v_head_dim: int | None = Field(default=None, gt=0)
    """MLA: width of one value head."""
    layers: LayerLayout | None = None
    """Layer kinds of a hybrid model (sliding, linear, Mamba2; DeepSeek-V3.2's indexer)."""

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        check_shape(self)  # heads, experts, MLA and layer kinds agree
        return self

    @property
    def is_moe(self) -> bool:
        """Whether any layer routes tokens to experts."""
        return self.num_experts is not None and self.num_moe_layers > 0

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (a compressed KV per token)."""
        return self.kv_lora_rank is not None

    @property
    def weight_dtype_bytes(self) -> float | int:
        """Bytes per element of the linear layers' weights."""
        return self.dtype_bytes if self.weight_dtype is None else DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_dtype_bytes(self) -> float | int:
        """Bytes per element of the KV cache."""
        return self.dtype_bytes if self.kv_dtype is None else DTYPE_BYTES[self.kv_dtype]

    # -- layers ----------------------------------------------------------------------------

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the layers whose MLP is a mixture of experts."""
        if self.num_experts is None:
            return ()
        skip = set(self.mlp_only_layers)
        return tuple(
            i
            for i in range(self.first_k_dense_replace, self.num_layers)
            if (i + 1) % self.decoder_sparse_step == 0 and i not in skip
        )

    @property
    def num_moe_layers(self) -> int:
        """Layers with experts."""
        return len(self.moe_layers)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP."""
        return self.num_layers - self.num_moe_layers

    # -- parameters ------------------------------------------------------------------------

    @property
    def attn_params_per_layer(self) -> int:
        """Weights of the attention projections in one layer (biases ignored): Q, K, V and O,
        or with MLA the query (direct or through ``q_lora_rank``), the KV latent and rotary key,
        the latent's up-projection to keys and values, and O."""
        h = self.hidden_size
        if self.kv_lora_rank is not None:
            assert self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim
            qk = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
            q = h * qk if self.q_lora_rank is None else self.q_lora_rank * (h + qk)
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + self.num_heads * self.v_head_dim * h
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return h * (q_out + 2 * kv_out) + q_out * h

    @property
    def mixer_params(self) -> int:
        """Weights of all layers' token mixers (attention; per kind for a hybrid)."""
        if self.layers is None:
            return self.num_layers * self.attn_params_per_layer
        if self.is_mla:  # MLA everywhere, plus DeepSeek-V3.2's indexer
            index = self.layers.indexer_params(
                self.q_lora_rank or self.hidden_size, self.hidden_size
            )
            return self.num_layers * (self.attn_params_per_layer + index)
        return self.layers.total_mixer_params(self)

    @property
    def _mlp_mats(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def mlp_params_per_layer(self) -> int:
        """Weights of a dense layer's MLP (3 matrices if gated, else 2)."""
        return self._mlp_mats * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert in one layer (0 for a dense model)."""
        return self._mlp_mats * self.hidden_size * (self.moe_intermediate_size or 0)

    @property
    def shared_expert_params_per_layer(self) -> int:
        """Weights of all shared experts of one MoE layer."""
        width = self.shared_expert_intermediate_size or self.moe_intermediate_size or 0
        return self.num_shared_experts * self._mlp_mats * self.hidden_size * width

    @property
    def router_params_per_layer(self) -> int:
        """Weights of one MoE layer's router (gate): ``hidden_size x num_experts``."""
        return self.hidden_size * (self.num_experts or 0)

    @property
    def embedding_params(self) -> int:
        """Weights of the input embedding table."""
        return self.vocab_size * self.hidden_size

    def _layer_params(self, routed_per_layer: int) -> int:
        """All layers' weights with ``routed_per_layer`` routed-expert weights per MoE layer."""
        dense = self.mixer_params + self.num_dense_layers * self.mlp_params_per_layer
        moe = routed_per_layer + self.shared_expert_params_per_layer + self.router_params_per_layer
        return dense + self.num_moe_layers * moe

    @property
    def routed_expert_params(self) -> int:
        """Weights of all routed experts of all layers (what expert parallelism splits)."""
        return self.num_moe_layers * (self.num_experts or 0) * self.expert_params

    @property
    def num_params(self) -> int:
        """Total weights: embeddings, all layers' attention and MLP or experts, and an untied LM
        head. Norm weights and biases are left out: they are < 0.1% of any preset here."""
        if not self.is_moe and not self.is_mla:  # the dense formula, kept term for term
            layers = self.mixer_params + self.num_layers * self.mlp_params_per_layer
        else:
            layers = self._layer_params((self.num_experts or 0) * self.expert_params)
        lm_head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + layers + lm_head

    @property
    def active_params(self) -> int:
        """Weights one token uses: as ``num_params`` but only ``num_experts_per_tok`` routed
        experts per MoE layer (the "A3B" of Qwen3-30B-A3B)."""
        if not self.is_moe:
            return self.num_params
        layers = self._layer_params((self.num_experts_per_tok or 0) * self.expert_params)
        lm_head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + layers + lm_head

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: all layers' active weights plus the LM
        head. The embedding lookup is a gather, not a matmul; a tied LM head still is a matmul."""
        if not self.is_moe and not self.is_mla:
            layers = self.mixer_params + self.num_layers * self.mlp_params_per_layer
        else:
            layers = self._layer_params((self.num_experts_per_tok or 0) * self.expert_params)
        return layers + self.vocab_size * self.hidden_size

    # -- bytes -----------------------------------------------------------------------------

    @property
    def _unquantized_params(self) -> int:
        """Weights kept at ``dtype_bytes`` under a quantized ``weight_dtype``: embedding, LM
        head and routers (as FP8 checkpoints and vLLM leave them)."""
        head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + head + self.num_moe_layers * self.router_params_per_layer

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (linear layers at ``weight_dtype``, the rest at
        ``dtype_bytes``)."""
        if self.weight_dtype is None:
            return self.num_params * self.dtype_bytes
        kept = self._unquantized_params
        return kept * self.dtype_bytes + nbytes(self.num_params - kept, self.weight_dtype_bytes)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert in one layer."""
        return nbytes(self.expert_params, self.weight_dtype_bytes)

    @property
    def routed_expert_bytes(self) -> int:
        """Bytes of all routed experts of all layers."""
        return self.num_moe_layers * (self.num_experts or 0) * self.expert_bytes

    def experts_per_rank(self, ep: int) -> int:
        """Routed experts each of ``ep`` expert-parallel ranks holds; ``ep`` must divide them."""
        e = self.num_experts or 0
        if ep < 1 or e % ep:
            raise InputError(
                f"expert-parallel degree {ep} does not divide num_experts={e} of {self.name}"
            )
        return e // ep

    def weight_bytes_per_gpu(self, tp: int, ep: int | None = None) -> float:
        """Bytes of weights one GPU holds: everything but the routed experts split over the
        ``tp`` GPUs of a tensor-parallel group, the routed experts over ``ep`` GPUs (expert
        parallelism over all ranks; None: ``tp``, experts sharded as the rest); plus the K/V
        projections of a replicated KV head (``kv_heads.replicated_kv_weight_bytes``)."""
        extra = replicated_kv_weight_bytes(self, tp)
        if not self.is_moe:
            return self.weight_bytes / tp + extra
        if ep is not None:
            self.experts_per_rank(ep)
        routed = self.routed_expert_bytes
        return (self.weight_bytes - routed) / tp + extra + routed / (ep or tp)

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """KV-cache elements one token stores in one layer: K and V of each KV head, or with
        MLA the latent and the shared rotary key."""
        if self.kv_lora_rank is not None:
            assert self.qk_rope_head_dim is not None
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers."""
        if self.layers is not None and not self.is_mla:
            return round(self.layers.total_kv_bytes_per_token(self))
        if self.kv_dtype is None and self.kv_lora_rank is None:
            return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes
        elements = self.num_layers * self.kv_elements_per_token_per_layer
        return nbytes(elements, self.kv_dtype_bytes)

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV bytes of one token on one GPU of ``tp``: its share of the KV heads, one whole head
        when ``tp`` exceeds them (replicated, ``kv_heads``); MLA's latent whole on every GPU."""
        if self.is_mla:
            return float(self.kv_bytes_per_token)
        if self.layers is not None:
            return self.layers.total_kv_bytes_per_token(self, tp)
        return self.kv_bytes_per_token / min(tp, self.num_kv_heads)

    # -- FLOPs -----------------------------------------------------------------------------

    @property
    def attention_flops_per_pair(self) -> float:
        """Attention FLOPs of one (query, key) pair over all layers: QK^T and AV, 2 FLOPs per
        multiply-add, per head (MLA: keys of ``qk_nope + qk_rope``, values of ``v_head_dim``,
        as prefill computes it)."""
        if self.kv_lora_rank is not None:
            assert self.qk_nope_head_dim and self.qk_rope_head_dim and self.v_head_dim
            width = self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim
            return 2.0 * self.num_layers * self.num_heads * width
        if self.layers is not None:  # attention layers only, each at its head width
            return self.layers.total_pair_flops(self)
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    @property
    def decode_attention_flops_per_pair(self) -> float:
        """Attention FLOPs of one (query, key) pair of a decode: as ``attention_flops_per_pair``,
        but MLA decodes attend over the latent itself (weights absorbed: keys of
        ``kv_lora_rank + qk_rope``, values of ``kv_lora_rank``)."""
        if self.kv_lora_rank is not None:
            assert self.qk_rope_head_dim is not None
            width = 2 * self.kv_lora_rank + self.qk_rope_head_dim
            return 2.0 * self.num_layers * self.num_heads * width
        return self.attention_flops_per_pair

    @property
    def flops_per_token_matmul(self) -> float:
        """Dense-matmul FLOPs to compute one token (2 per multiply-add per active matmul
        weight)."""
        return 2.0 * self.matmul_params

    def matmul_flops_per_token(self) -> dict[str, float]:
        """``flops_per_token_matmul`` by operator, over all layers: attention projections,
        dense MLPs, routed experts (top-k), shared experts, routers, LM head."""
        n_moe, k = self.num_moe_layers, self.num_experts_per_tok or 0
        return {
            "attention": 2.0 * self.mixer_params,
            "dense_mlp": 2.0 * self.num_dense_layers * self.mlp_params_per_layer,
            "routed_experts": 2.0 * n_moe * k * self.expert_params,
            "shared_experts": 2.0 * n_moe * self.shared_expert_params_per_layer,
            "router": 2.0 * n_moe * self.router_params_per_layer,
            "lm_head": 2.0 * self.vocab_size * self.hidden_size,
        }

    # -- routing ---------------------------------------------------------------------------

    def expected_distinct_experts(self, tokens: float, ep: int = 1) -> float:
        """Expected routed experts of one MoE layer that ``tokens`` routed tokens touch, under
        uniform routing: ``E (1 - (1 - k/E)^T)``; with ``ep`` expert-parallel ranks, those on
        one rank (``1/ep`` of it). 0 for a dense model."""
        if self.num_experts is None or self.num_experts_per_tok is None or tokens <= 0:
            return 0.0
        e, k = self.num_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** tokens) / ep

    def touched_expert_bytes(self, tokens: float, ep: int = 1) -> float:
        """Expected bytes of routed-expert weights one GPU reads in a step of ``tokens`` routed
        tokens, over all MoE layers: the distinct experts touched, split over ``ep`` GPUs (the
        EP ranks holding whole experts, or the TP shards of every expert: the same bytes)."""
        return self.num_moe_layers * self.expected_distinct_experts(tokens) * self.expert_bytes / ep

    def deployed(self, tp: int, weight_dtype: Dtype | None, kv_dtype: Dtype | None) -> ModelSpec:
        """The model as a cost model runs it: ``tp`` checked against the attention and KV
        heads, the weights and KV cache at these dtypes (None: the model's own)."""
        if self.num_heads % tp != 0:
            raise InputError(
                f"cost_model.tp: {tp} does not divide num_heads={self.num_heads} "
                f"of model {self.name}"
            )
        check_kv_split(self, tp)
        return self.with_dtypes(weight_dtype, kv_dtype)

    def with_dtypes(self, weight_dtype: Dtype | None, kv_dtype: Dtype | None) -> ModelSpec:
        """This shape with the given weight and KV dtypes (None keeps the shape's own)."""
        update: dict[str, str] = {}
        if weight_dtype is not None:
            update["weight_dtype"] = weight_dtype
        if kv_dtype is not None:
            update["kv_dtype"] = kv_dtype
        return self.model_copy(update=update) if update else self
