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

from pydantic import BaseModel, ValidationError

from simulator.cost.hardware_spec import HardwareSpec
from simulator.cost.hf_config import read_hf_config
from simulator.cost.kv_heads import kv_heads_per_gpu
from simulator.cost.model_spec import DTYPE_BYTES, Dtype, ModelSpec
from simulator.errors import DoesNotFit, InputError
from simulator.strict_types import find_loose_scalar
from simulator.yaml_file import read_yaml_file

__all__ = [
    "DTYPE_BYTES",
    "Dtype",
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


def load_model(
    name_or_path: str, weight_dtype: Dtype | None = None, kv_dtype: Dtype | None = None
) -> ModelSpec:
    """Model shape from a preset name (``configs/models/<name>.yaml``), a YAML path, or the
    path of a Hugging Face ``config.json``; ``weight_dtype`` / ``kv_dtype`` override its own."""
    if name_or_path.endswith(".json"):
        spec = read_hf_config(name_or_path)
    else:
        spec = load_yaml_model(resolve_preset("models", name_or_path), ModelSpec)
    return spec.with_dtypes(weight_dtype, kv_dtype)


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
    qkv = (m.num_heads // tp + 2 * kv_heads_per_gpu(m, tp)) * m.head_dim  # KV replicated
    forward = max_num_batched_tokens * d * (2 * m.hidden_size + qkv + _mlp_transient(m, tp))
    rows = min(max_num_seqs, max_num_batched_tokens)
    sampler = rows * m.vocab_size * (d + 4 * 4 + 8)
    return max(forward, sampler + max_num_batched_tokens * m.hidden_size * d)


def _mlp_transient(m: ModelSpec, tp: int) -> int:
    """Per token, the largest MLP's elements alive at once on one GPU: a dense MLP's gate/up
    output and activation (``3 I / tp``); an MoE layer's fused-experts buffers, per routed
    copy of the token, its gate/up output, activation and output (``k (3 I_e / tp + h)``)."""
    dense = 3 * m.intermediate_size // tp if m.num_dense_layers else 0
    if not m.is_moe:
        return dense
    k, width = m.num_experts_per_tok or 0, m.moe_intermediate_size or 0
    return max(dense, k * (3 * width // tp + m.hidden_size))


GIB = 1 << 30
"""Bytes in a GiB."""


def serve_budgets(
    hw: HardwareSpec | None, max_num_batched_tokens: int | None, max_num_seqs: int | None
) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` with those not given set as ``vllm serve``
    sets them on GPU ``hw`` (vLLM's ``EngineArgs.get_batch_defaults`` and
    ``_set_default_args``, OpenAI API server context): 8192 tokens and 1024 sequences on a
    GPU of 70 GiB or more that is not an A100 (large budgets cost an A100 throughput, vLLM
    PR #17885), else 2048 and 256, which is also vLLM's choice when it cannot read the GPU
    (``hw`` None); the sequences are never more than the tokens."""
    large = hw is not None and hw.memory_bytes >= 70 * GIB and "a100" not in hw.name.lower()
    tokens = max_num_batched_tokens or (8192 if large else 2048)
    seqs = max_num_seqs or min(1024 if large else 256, tokens)
    return tokens, seqs


def derive_num_blocks(
    model: ModelSpec,
    hw: HardwareSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    *,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    ep: int | None = None,
    block_bytes: float | None = None,
) -> int:
    """KV-cache blocks that fit after the weights and the activation peak, as vLLM sizes its
    cache: per GPU, ``gpu_memory_utilization`` x memory - the weights' shard - the activation
    peak of a ``max_num_batched_tokens`` step (``activation_peak_bytes``, when both budgets
    are given), divided by a block's bytes on one GPU (its share of the KV heads; a hybrid
    model's ``block_bytes``: one page of every layer of its largest group, ``kv_layout``).

    Weights and KV heads are both sharded over the ``tp`` GPUs (routed experts over ``ep``,
    default ``tp``: ``ModelSpec.weight_bytes_per_gpu``); when ``tp`` exceeds the KV heads
    each GPU keeps one whole head, replicated as vLLM does (``kv_heads``); MLA's latent KV is
    kept whole on every GPU."""
    if tp < 1:
        raise InputError(f"tp must be >= 1, got {tp}")
    if block_size < 1:
        raise InputError(f"block_size must be >= 1, got {block_size}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise InputError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    activations = 0
    if max_num_batched_tokens is not None and max_num_seqs is not None:
        activations = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    weights = model.weight_bytes_per_gpu(tp, ep)
    usable = hw.memory_bytes * gpu_memory_utilization
    if block_bytes is None:
        block_bytes = model.kv_bytes_per_token_per_gpu(tp) * block_size
    blocks = math.floor((usable - weights - activations) / block_bytes)
    if blocks <= 0:
        step = f"a step of {max_num_batched_tokens} tokens" if activations else "a step"
        raise DoesNotFit(
            f"{model.name} does not fit on {tp} x {hw.name} with any KV cache: per GPU "
            f"{weights / 1e9:,.1f} GB of weights + {activations / 1e9:,.1f} GB activation peak "
            f"({step}) leave nothing of the {usable / 1e9:.1f} GB that "
            f"gpu_memory_utilization={gpu_memory_utilization:g} leaves of "
            f"{hw.memory_bytes / 1e9:.0f} GB"
        )
    return blocks
