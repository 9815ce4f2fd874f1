"""Model shapes and GPU specs, loaded from YAML presets under ``configs/``.

A preset is ``configs/models/<name>.yaml`` or ``configs/hardware/<name>.yaml``; any other YAML
file with the same fields can be passed by path instead. ``SERVESIM_CONFIGS`` overrides the
configs directory (tests and out-of-tree preset collections use it).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simulator.errors import InputError
from simulator.strict_types import find_loose_scalar
from simulator.yaml_file import read_yaml_file

__all__ = [
    "HardwareSpec",
    "ModelSpec",
    "activation_peak_bytes",
    "configs_dir",
    "derive_num_blocks",
    "list_presets",
    "load_hardware",
    "load_model",
]

_YAML_SUFFIXES = (".yaml", ".yml")


class ModelSpec(BaseModel):
    """Shape of a dense decoder-only transformer, enough to count parameters, FLOPs and KV bytes."""

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
    """Width of one attention head."""
    intermediate_size: int = Field(gt=0)
    """MLP hidden width (``intermediate_size``; ``4 * hidden_size`` for BLOOM)."""
    vocab_size: int = Field(gt=0)
    """Vocabulary size (rows of the embedding and of the LM head)."""
    dtype_bytes: int = Field(default=2, gt=0)
    """Bytes per weight and per KV element (2 for bf16/fp16)."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with gate, up and down matrices; ``False`` means up and down only."""
    tie_embeddings: bool = False
    """The LM head reuses the input embedding matrix (counted once in ``num_params``)."""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        # GQA groups query heads evenly over KV heads; anything else is a typo in the preset.
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        return self

    @property
    def attn_params_per_layer(self) -> int:
        """Weights of Q, K, V and O projections in one layer (biases ignored)."""
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size

    @property
    def mlp_params_per_layer(self) -> int:
        """Weights of the MLP in one layer (3 matrices if gated, else 2)."""
        mats = 3 if self.gated_mlp else 2
        return mats * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        """Weights of the input embedding table."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total weights: embeddings, all layers' attention and MLP, and an untied LM head.

        Norm weights and biases are left out: they are < 0.1% of any preset here.
        """
        layers = self.num_layers * (self.attn_params_per_layer + self.mlp_params_per_layer)
        lm_head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + layers + lm_head

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: all layers plus the LM head.

        The embedding lookup is a gather, not a matmul; a tied LM head still is a matmul.
        """
        layers = self.num_layers * (self.attn_params_per_layer + self.mlp_params_per_layer)
        return layers + self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at ``dtype_bytes`` each."""
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_pair(self) -> float:
        """Attention FLOPs of one (query, key) pair over all layers: QK^T and AV, 2 matmuls x
        2 FLOPs per multiply-add, per head."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    @property
    def flops_per_token_matmul(self) -> float:
        """Dense-matmul FLOPs to compute one token (2 per multiply-add per matmul weight)."""
        return 2.0 * self.matmul_params


class HardwareSpec(BaseModel):
    """One GPU's peak numbers, as the roofline cost model and the KV-block budget need them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Short identifier, e.g. ``a100-80gb``."""
    source: str
    """Where the numbers come from (vendor datasheet)."""
    peak_flops: float = Field(gt=0)
    """Dense (no sparsity) bf16 tensor-core FLOP/s of one GPU."""
    hbm_bandwidth: float = Field(gt=0)
    """HBM bandwidth of one GPU, bytes/s."""
    memory_bytes: int = Field(gt=0)
    """HBM capacity of one GPU, bytes (presets use decimal GB: 80 GB = 80e9, unless the source
    gives the bytes the CUDA driver reports)."""
    interconnect_bandwidth: float | None = Field(default=None, gt=0)
    """Per-GPU one-way bandwidth of the link tensor-parallel all-reduces use, bytes/s."""
    allreduce_latency_us: float | None = Field(default=None, ge=0)
    """Fixed latency of one small all-reduce between these GPUs, microseconds."""
    cost_per_hour: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Dollars per GPU-hour (on-demand cloud rental), for ``servesim search``'s cost columns;
    None if unknown (``search --gpu-cost NAME=USD`` sets or overrides it)."""
    cost_source: str | None = None
    """Where ``cost_per_hour`` comes from, and when."""


_M = TypeVar("_M", bound=BaseModel)


def configs_dir() -> Path:
    """Directory holding ``models/`` and ``hardware/`` presets (``SERVESIM_CONFIGS`` overrides)."""
    override = os.environ.get("SERVESIM_CONFIGS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "configs"


def preset_names(kind: str) -> list[str]:
    """Names of the shipped presets of ``kind`` (``models``, ``hardware``, ``fitted``), sorted."""
    folder = configs_dir() / kind
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.iterdir() if p.suffix in _YAML_SUFFIXES and p.is_file())


def list_presets() -> dict[str, list[str]]:
    """Known preset names, sorted: ``{"models": [...], "hardware": [...]}``."""
    return {"models": preset_names("models"), "hardware": preset_names("hardware")}


_NOUNS = {"models": "model", "hardware": "hardware", "fitted": "fitted"}


def _looks_like_path(name_or_path: str) -> bool:
    return (
        "/" in name_or_path
        or os.sep in name_or_path
        or name_or_path.endswith(_YAML_SUFFIXES)
        or Path(name_or_path).is_file()
    )


def resolve_preset(kind: str, name_or_path: str) -> Path:
    """A preset name (``configs/<kind>/<name>.yaml``) or an explicit YAML path -> the file."""
    noun = _NOUNS[kind]
    if _looks_like_path(name_or_path):
        path = Path(name_or_path)
        if not path.is_file():
            raise InputError(f"{noun} file {name_or_path}: not found")
        return path
    for suffix in _YAML_SUFFIXES:
        candidate = configs_dir() / kind / f"{name_or_path}{suffix}"
        if candidate.is_file():
            return candidate
    known = ", ".join(preset_names(kind)) or "none"
    raise InputError(f"unknown {noun} preset {name_or_path!r}; known: {known}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _format_validation(path: Path, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        parts.append(f"field {loc!r}: {_one_line(e['msg'])}")
    return f"{path}: " + "; ".join(parts)


def load_yaml_model(path: Path, cls: type[_M]) -> _M:
    """Read a YAML mapping and validate it as ``cls``; any problem -> ``InputError`` naming the
    file and the field."""
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    try:
        model = cls.model_validate(data)
    except ValidationError as exc:
        raise InputError(_format_validation(path, exc)) from None
    loose = find_loose_scalar(data, model)
    if loose:
        raise InputError(f"{path}: field {loose}")
    return model


def load_model(name_or_path: str) -> ModelSpec:
    """Model shape from a preset name (``configs/models/<name>.yaml``) or a YAML path."""
    return load_yaml_model(resolve_preset("models", name_or_path), ModelSpec)


def load_hardware(name_or_path: str) -> HardwareSpec:
    """GPU spec from a preset name (``configs/hardware/<name>.yaml``) or a YAML path."""
    return load_yaml_model(resolve_preset("hardware", name_or_path), HardwareSpec)


def activation_peak_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Per-GPU peak of the activations vLLM's start-up memory profile measures: a forward
    pass of ``max_num_batched_tokens`` tokens, then the sampler's warm-up on
    ``min(max_num_seqs, max_num_batched_tokens)`` rows of logits (``profile_run``). The larger
    of the two, since the forward pass frees its intermediates before sampling:

    - forward: per token, the residual stream and hidden states (``2 h``), and the largest
      layer's transients alive at once: QKV output, the MLP's gate/up output and its
      activation (``(q + 2 kv) d_h / tp + 3 I / tp``), in the model's dtype;
    - sampler: per row of the full vocabulary (the LM head all-gathers it), the logits in the
      model's dtype and, as vLLM's PyTorch top-k/top-p path keeps them at once, float32
      logits, sorted values, softmax and cumulative sums (4 x 4 bytes) and int64 sort indices
      (8 bytes); plus the kept hidden states of the forward pass.

    Memory vLLM allocates outside PyTorch (cuBLAS and attention workspaces, NCCL buffers) and
    CUDA graphs are not counted: docs/cost_models.md compares the result with a real run."""
    m, d = model, model.dtype_bytes
    qkv = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim // tp
    forward = max_num_batched_tokens * d * (2 * m.hidden_size + qkv + 3 * m.intermediate_size // tp)
    rows = min(max_num_seqs, max_num_batched_tokens)
    sampler = rows * m.vocab_size * (d + 4 * 4 + 8)
    return max(forward, sampler + max_num_batched_tokens * m.hidden_size * d)


def derive_num_blocks(
    model: ModelSpec,
    hw: HardwareSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    *,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> int:
    """KV-cache blocks that fit after the weights and the activation peak, as vLLM sizes its
    cache: per GPU, ``gpu_memory_utilization`` x memory - the weights' shard - the activation
    peak of a ``max_num_batched_tokens`` step (``activation_peak_bytes``, when both budgets
    are given), divided by a block's bytes on one GPU (its share of the KV heads).

    Weights and KV heads are both sharded over the ``tp`` GPUs; KV-head replication when
    ``tp > num_kv_heads`` is ignored."""
    if tp < 1:
        raise InputError(f"tp must be >= 1, got {tp}")
    if block_size < 1:
        raise InputError(f"block_size must be >= 1, got {block_size}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise InputError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    activations = 0
    if max_num_batched_tokens is not None and max_num_seqs is not None:
        activations = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    free = hw.memory_bytes * gpu_memory_utilization - model.weight_bytes / tp - activations
    blocks = math.floor(free / (model.kv_bytes_per_token / tp * block_size))
    if blocks <= 0:
        raise InputError(
            f"model {model.name} ({model.weight_bytes / 1e9:.1f} GB of weights) leaves no room "
            f"for KV cache on {tp} x {hw.name} at gpu_memory_utilization={gpu_memory_utilization}"
        )
    return blocks
