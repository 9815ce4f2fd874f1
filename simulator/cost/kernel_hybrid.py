"""What the kernels cost model does with a hybrid model's layers: it refuses them, in one line.

NVIDIA's database (``aiconfigurator-core``) does measure some of them on datacenter GPUs:
windowed attention (``window_size`` 128 / 1024 / 8192 in the context and generation attention
tables), Gated DeltaNet (``gdn_perf``: conv1d and the chunked / recurrent delta rule, Qwen3.5
shapes) and DeepSeek's sparse attention (``dsa_*_module_perf``); Mamba2 it does not. servesim's
kernels model does not read those rows yet, and pricing such a model's layers as full
attention would be a wrong answer with exit 0, so it says so (docs/not-modeled.md)."""

from __future__ import annotations

from simulator.cost.model_spec import ModelSpec
from simulator.errors import InputError

__all__ = ["refuse_hybrid"]


def refuse_hybrid(model: ModelSpec) -> None:
    """``InputError`` for a model with sliding-window, linear-attention, Mamba or sparse
    (indexer) layers; nothing for one whose every layer is full attention."""
    lay = model.layers
    if lay is None:
        return
    kinds = sorted(
        {k for k in lay.kinds if k != "full"} | ({"sparse"} if lay.index_topk else set())
    )
    raise InputError(
        f"cost_model.type: kernels does not price {model.name}'s {', '.join(kinds)} layers yet "
        "(the database's windowed-attention, gdn_perf and DSA rows are not read): use "
        "cost_model.type roofline or physics"
    )
