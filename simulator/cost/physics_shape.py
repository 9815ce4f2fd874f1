"""What one rank of a tensor- (and expert-) parallel deployment computes, as the `physics`
cost model's terms see it: its matmuls (attention projections, dense MLPs, routers, shared
experts), its memory-bound operators, its routed experts, its attention (GQA or MLA) and the
bytes per element of weights and KV. Built from a ``ModelSpec`` (a preset or a Hugging Face
``config.json``); the formulas per operator are in ``docs/cost_models.md``."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.model_spec import ModelSpec

__all__ = ["Mla", "RankShape"]


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention's widths (DeepSeek-V2/V3)."""

    kv_lora: int
    """Width of the compressed KV latent cached per token and layer."""
    rope: int
    """Rotary part of a query/key head (its key shared by all heads and cached)."""
    nope: int
    """Non-rotary part of a query/key head."""
    v_head: int
    """Width of one value head."""
    q_lora: int | None
    """Width of the compressed query (None: projected directly)."""


@dataclass(frozen=True)
class RankShape:
    """One rank's share of a transformer (dense or MoE, GQA or MLA)."""

    layers: int
    """Transformer blocks."""
    hidden: int
    """Residual width (not sharded)."""
    q_heads: int
    """Query heads on this rank."""
    kv_heads: int
    """KV heads on this rank (at least 1: replicated when ``tp`` exceeds them; 1 for MLA)."""
    head_dim: int
    """Width of one query/key head."""
    intermediate: int
    """Dense MLP width on this rank."""
    vocab: int
    """LM-head rows on this rank."""
    full_vocab: int
    """Vocabulary size: the sampler sees every logit (the LM head all-gathers them)."""
    dtype_bytes: int
    """Bytes per activation element (and per weight of the embedding, LM head and routers)."""
    gated: bool
    """Gate, up and down matrices (else up and down)."""
    weight_bytes: float = 0.0
    """Bytes per element of the linear layers' weights (fp8: 1); 0: ``dtype_bytes``."""
    kv_bytes: float = 0.0
    """Bytes per KV-cache element; 0: ``dtype_bytes``."""
    dense_layers: int = -1
    """Layers with a dense MLP (-1: all)."""
    moe_layers: int = 0
    """Layers with routed experts."""
    experts: int = 0
    """Routed experts per MoE layer (all ranks)."""
    top_k: int = 0
    """Routed experts per token."""
    expert_intermediate: int = 0
    """Width of one routed expert on this rank (split by ``tp`` without EP)."""
    shared_intermediate: int = 0
    """Width of all shared experts of one MoE layer on this rank."""
    ep: int = 1
    """Expert-parallel ranks holding the routed experts (each holds ``experts / ep``)."""
    pair_share: float = 1.0
    """Fraction of its tokens' routed (token, expert) pairs this rank computes (balanced
    routing: 1, or ``1 / tp`` when EP spans the TP ranks too)."""
    mla: Mla | None = None
    """MLA's widths; None for GQA attention."""
    qk_norm: bool = False
    """An RMSNorm over each query and key head (Qwen3)."""

    @classmethod
    def of(cls, model: ModelSpec, tp: int, ep: int = 1) -> RankShape:
        """The shard of ``model`` one of ``tp`` ranks holds, its experts split over ``ep``."""
        mla = None
        if model.kv_lora_rank is not None:
            assert model.qk_rope_head_dim and model.qk_nope_head_dim and model.v_head_dim
            mla = Mla(
                model.kv_lora_rank,
                model.qk_rope_head_dim,
                model.qk_nope_head_dim,
                model.v_head_dim,
                model.q_lora_rank,
            )
        width = model.shared_expert_intermediate_size or model.moe_intermediate_size or 0
        return cls(
            layers=model.num_layers,
            hidden=model.hidden_size,
            q_heads=model.num_heads // tp,
            kv_heads=1 if mla else max(1, model.num_kv_heads // tp),
            head_dim=model.head_dim,
            intermediate=model.intermediate_size // tp,
            vocab=model.vocab_size // tp,
            full_vocab=model.vocab_size,
            dtype_bytes=model.dtype_bytes,
            gated=model.gated_mlp,
            weight_bytes=float(model.weight_dtype_bytes),
            kv_bytes=float(model.kv_dtype_bytes),
            dense_layers=model.num_dense_layers,
            moe_layers=model.num_moe_layers if model.is_moe else 0,
            experts=model.num_experts or 0,
            top_k=model.num_experts_per_tok or 0,
            expert_intermediate=(model.moe_intermediate_size or 0) // (1 if ep > 1 else tp),
            shared_intermediate=model.num_shared_experts * width // tp,
            ep=ep,
            pair_share=1.0 / tp if ep > 1 else 1.0,
            mla=mla,
            qk_norm=model.qk_norm,
        )

    # -- element sizes ---------------------------------------------------------------------

    @property
    def wdt(self) -> float:
        """Bytes per linear-layer weight element."""
        return self.weight_bytes or float(self.dtype_bytes)

    @property
    def kvdt(self) -> float:
        """Bytes per KV element."""
        return self.kv_bytes or float(self.dtype_bytes)

    @property
    def n_dense(self) -> int:
        """Layers with a dense MLP."""
        return self.layers if self.dense_layers < 0 else self.dense_layers

    # -- matmuls ---------------------------------------------------------------------------

    def gemms(self) -> dict[str, tuple[int, int]]:
        """(k, n) of each matmul of a layer (attention, dense MLP, router, shared experts):
        the token count is its M; ``gemm_calls`` says in how many layers each runs."""
        h, d = self.hidden, self.head_dim
        out = (
            self._mla_gemms()
            if self.mla
            else {
                "qkv_proj": (h, (self.q_heads + 2 * self.kv_heads) * d),
                "o_proj": (self.q_heads * d, h),
            }
        )
        up = 2 if self.gated else 1
        if self.n_dense:
            out["gate_up_proj"] = (h, up * self.intermediate)
            out["down_proj"] = (self.intermediate, h)
        if self.moe_layers:
            out["router"] = (h, self.experts)
            if self.shared_intermediate:
                out["shared_gate_up"] = (h, up * self.shared_intermediate)
                out["shared_down"] = (self.shared_intermediate, h)
        return out

    def _mla_gemms(self) -> dict[str, tuple[int, int]]:
        """MLA's projections: the query (direct or through its latent), the KV latent and
        rotary key (replicated on every TP rank, as vLLM does), the latent's up-projection to
        keys and values (absorbed into the query and output in decodes: the same FLOPs per
        token), and O."""
        m, h, heads = self.mla, self.hidden, self.q_heads
        assert m is not None
        qk = m.nope + m.rope
        out: dict[str, tuple[int, int]] = {}
        if m.q_lora is None:
            out["q_proj"] = (h, heads * qk)
        else:
            out["q_a_proj"] = (h, m.q_lora)
            out["q_b_proj"] = (m.q_lora, heads * qk)
        out["kv_a_proj"] = (h, m.kv_lora + m.rope)
        out["kv_b_proj"] = (m.kv_lora, heads * (m.nope + m.v_head))
        out["o_proj"] = (heads * m.v_head, h)
        return out

    def gemm_calls(self, name: str) -> int:
        """Layers the matmul ``name`` runs in."""
        if name in ("gate_up_proj", "down_proj"):
            return self.n_dense
        if name in ("router", "shared_gate_up", "shared_down"):
            return self.moe_layers
        return self.layers

    def gemm_weight_bytes(self, name: str) -> float:
        """Bytes per weight element of matmul ``name`` (routers stay at ``dtype_bytes``)."""
        return float(self.dtype_bytes) if name == "router" else self.wdt

    # -- memory-bound operators ------------------------------------------------------------

    def elementwise(self) -> dict[str, tuple[str, int, int]]:
        """Per-token memory-bound operators: name -> (efficiency parameter's kind, elements
        moved per token, calls per step)."""
        h, n = self.hidden, self.layers
        qk = (self.q_heads + self.kv_heads) * self.head_dim
        if self.mla:
            qk = (self.q_heads + 1) * self.mla.rope  # rotary on the rope parts only
        mats = 3 if self.gated else 2
        out = {
            # fused residual add + RMSNorm: reads x and the residual, writes both
            "layernorm": ("norm", 4 * h, 2 * n),
            "rotary_emb": ("rotary", 2 * qk, n),
            "embedding": ("embedding", 2 * h, 1),
            "final_layernorm": ("norm", 4 * h, 1),
        }
        if self.qk_norm:  # reads and writes each query and key head
            out["qk_norm"] = ("norm", 2 * (self.q_heads + self.kv_heads) * self.head_dim, n)
        if self.n_dense:
            out["act_fn"] = ("act", mats * self.intermediate, self.n_dense)
        if self.moe_layers and self.shared_intermediate:
            out["shared_act_fn"] = ("act", mats * self.shared_intermediate, self.moe_layers)
        out.update(self._activation_quant())
        return out

    def _activation_quant(self) -> dict[str, tuple[str, int, int]]:
        """With quantized weights, vLLM quantizes each matmul's input first (a kernel reading
        it at ``dtype_bytes`` and writing it at the weights' size; the experts' two grouped
        GEMMs too): an activation-like memory-bound operator per matmul."""
        if self.wdt >= self.dtype_bytes:
            return {}
        grow = 1.0 + self.wdt / self.dtype_bytes  # elements moved per input element
        out = {
            f"quant:{name}": ("act", round(k * grow), self.gemm_calls(name))
            for name, (k, _) in self.gemms().items()
            if name != "router"
        }
        if self.moe_layers:
            pairs = self.top_k * self.pair_share  # per token on the rank
            out["quant:experts"] = ("act", round(self.hidden * grow), self.moe_layers)
            width = pairs * self.expert_intermediate * grow
            out["quant:experts_down"] = ("act", round(width), self.moe_layers)
        return out

    # -- routed experts ----------------------------------------------------------------------

    @property
    def local_experts(self) -> int:
        """Routed experts this rank holds."""
        return self.experts // self.ep

    @property
    def expert_weight_elements(self) -> int:
        """Weights of one routed expert on this rank."""
        return (3 if self.gated else 2) * self.hidden * self.expert_intermediate

    # -- attention ---------------------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes of one token in one layer on this rank (MLA: the latent and rotary key,
        whole on every rank)."""
        if self.mla:
            return (self.mla.kv_lora + self.mla.rope) * self.kvdt
        return 2 * self.kv_heads * self.head_dim * self.kvdt

    @property
    def prefill_flops_per_pair(self) -> float:
        """FLOPs of one (query, key) pair of one layer in a prefill (QK^T and AV; MLA: keys of
        ``nope + rope``, values of ``v_head``, on the decompressed latent)."""
        if self.mla:
            return 2.0 * self.q_heads * (self.mla.nope + self.mla.rope + self.mla.v_head)
        return 4.0 * self.q_heads * self.head_dim

    @property
    def decode_flops_per_pair(self) -> float:
        """FLOPs of one pair of one layer in an MLA decode (attending over the latent itself,
        keys of ``kv_lora + rope``, values of ``kv_lora``); 0 for GQA (its decodes are priced
        by their KV read alone, as fitted)."""
        if self.mla:
            return 2.0 * self.q_heads * (2 * self.mla.kv_lora + self.mla.rope)
        return 0.0

    @property
    def context_flops_per_token(self) -> float:
        """FLOPs per cached context token of a prefill chunk to decompress its latent into keys
        and values (MLA's ``kv_b_proj`` on the context); 0 for GQA."""
        if self.mla:
            return 2.0 * self.mla.kv_lora * self.q_heads * (self.mla.nope + self.mla.v_head)
        return 0.0
