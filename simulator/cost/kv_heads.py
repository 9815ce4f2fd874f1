"""How a tensor-parallel group holds a GQA model's KV heads, as vLLM does: split evenly when
``tp`` divides them, else (``tp`` a multiple of them) one whole head on each GPU, each head
replicated on ``tp // num_kv_heads`` GPUs (vLLM's ``ModelConfig.get_num_kv_heads`` and
``QKVParallelLinear``). MLA's latent is not split by heads: every GPU keeps all of it."""

from __future__ import annotations

from typing import Protocol

from simulator.errors import InputError


class HeadShape(Protocol):
    """What of ``model_spec.ModelSpec`` these need (a protocol: that module uses this one)."""

    @property
    def name(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def is_mla(self) -> bool: ...
    @property
    def weight_dtype_bytes(self) -> float | int: ...


def kv_heads_per_gpu(model: HeadShape, tp: int) -> int:
    """KV heads one GPU of ``tp`` holds: its share, or 1 (replicated) when ``tp`` exceeds
    them (vLLM: ``max(1, num_kv_heads // tp)``)."""
    return max(1, model.num_kv_heads // tp)


def replicated_kv_weight_bytes(model: HeadShape, tp: int) -> float:
    """Bytes of K and V projection weights one GPU holds beyond its ``1 / tp`` share, because
    it keeps a whole replicated head (0 when ``tp`` divides the KV heads, and for MLA)."""
    if model.is_mla or tp <= model.num_kv_heads:
        return 0.0
    extra_heads = kv_heads_per_gpu(model, tp) - model.num_kv_heads / tp
    params = model.num_layers * 2 * model.head_dim * model.hidden_size * extra_heads
    return params * float(model.weight_dtype_bytes)


def check_kv_split(model: HeadShape, tp: int) -> None:
    """Refuse a ``tp`` that neither divides nor is a multiple of the KV heads: vLLM's
    ``QKVParallelLinear`` splits or replicates them evenly, or does not start."""
    kv = model.num_kv_heads
    if model.is_mla or (kv % tp == 0 if tp <= kv else tp % kv == 0):
        return
    raise InputError(
        f"cost_model.tp: {tp} neither divides nor is a multiple of num_kv_heads={kv} of model "
        f"{model.name} (vLLM splits or replicates KV heads evenly)"
    )
