"""A hybrid model's KV-cache groups in a scenario: derived from its layers as vLLM derives
them on the deployment's GPU (``cost.kv_layout``), turned into the scheduler's ``KVGroup``s,
and its ``num_blocks`` sized by a block of the one pool (one page of every layer of the
largest group), so the resolved scenario says what ran (docs/hybrid-kv.md)."""

from __future__ import annotations

from simulator.cost import CostModelConfig
from simulator.cost.gpus import named_gpus
from simulator.cost.kv_layout import (
    FLASH_ATTENTION,
    FLASHMLA_SPARSE,
    KVLayout,
    derive_layout,
    layer_caches,
)
from simulator.cost.model_spec import ModelSpec
from simulator.cost.presets import derive_num_blocks, load_hardware, load_model
from simulator.errors import DoesNotFit, InputError, in_field
from simulator.scheduling import SchedulerConfig
from simulator.scheduling.kv_group import KVGroup, caching_refusal

__all__ = ["block_bytes", "kv_layout_for", "with_kv_groups"]


def kv_layout_for(sched: SchedulerConfig, model: ModelSpec, tp: int) -> KVLayout:
    """The groups vLLM derives for ``model`` on one GPU of ``tp``: FlashAttention's kernel
    block 16 (FlashMLA sparse's 64 for DeepSeek-V3.2), ``block_size`` as ``--block-size``,
    Mamba states in mode ``align`` with prefix caching (else ``none``), ``max_model_len``
    the scheduler's or else the model's context length (vLLM's default)."""
    layers = model.layers
    assert layers is not None
    backend = FLASHMLA_SPARSE if layers.index_topk else FLASH_ATTENTION
    # no context length in the config: a Mamba group in mode "none" is still one block a request
    limit = sched.max_model_len or layers.max_position_embeddings or 131072
    return derive_layout(
        layer_caches(model, tp),
        backend=backend,
        prefix_caching=bool(sched.enable_prefix_caching),
        max_model_len=limit,
        block_size=max(sched.block_size, backend.default_block),
        mamba_chunk=layers.chunk_size,
    )


def _groups(layout: KVLayout) -> list[KVGroup]:
    return [
        KVGroup(
            kind=g.kind,  # type: ignore[arg-type]  # no chunked_local from a ModelSpec
            block_size=g.block_size,
            num_layers=g.num_layers,
            sliding_window=g.window if g.kind == "sliding_window" else None,
            mamba_cache_mode=g.mamba_mode,
        )
        for g in layout.groups
    ]


def with_kv_groups(
    sched: SchedulerConfig, cm: CostModelConfig, prefix: str = ""
) -> SchedulerConfig:
    """``sched`` with a hybrid model's ``kv_groups`` (unless given) and ``num_blocks`` (unless
    given) filled in; unchanged for a model whose every layer keeps full KV, or a cost model
    that names no model. A cache that cannot hold one ``max_model_len`` request (vLLM's
    start-up check over every layer) -> ``DoesNotFit``."""
    gpus = named_gpus(cm, prefix)
    if gpus is None:
        return sched
    dtypes = (getattr(cm, "weight_dtype", None), getattr(cm, "kv_dtype", None))
    model = in_field(f"{gpus.where}model", lambda m: load_model(m, *dtypes), gpus.model)
    if model.layers is None:
        return sched
    tp = gpus.tp
    layout = in_field(f"{prefix}scheduler.kv_groups", lambda m: kv_layout_for(sched, m, tp), model)
    num_blocks = sched.num_blocks
    if num_blocks is None:
        hw = in_field(f"{gpus.where}hardware", load_hardware, gpus.hardware)
        ep = getattr(cm, "expert_parallel", 1)
        tokens, seqs = sched.budgets()
        try:
            num_blocks = derive_num_blocks(
                model,
                hw,
                tp,
                sched.block_size,
                sched.gpu_memory_utilization,
                max_num_batched_tokens=tokens,
                max_num_seqs=seqs,
                ep=ep if ep > 1 else None,
                block_bytes=layout.bytes_per_block,
            )
        except DoesNotFit as err:
            raise DoesNotFit(f"{prefix}scheduler.num_blocks: {err}") from None
    limit = sched.max_model_len
    if limit is not None:
        need = layout.request_bytes(limit, sched.budgets()[0])
        have = num_blocks * layout.bytes_per_block
        if need > have:
            raise DoesNotFit(
                f"{prefix}scheduler.max_model_len: one request of {limit:,} tokens needs "
                f"{need / 2**30:.2f} GiB of KV over {model.name}'s layers, more than the "
                f"{have / 2**30:.2f} GiB of the cache ({num_blocks:,} blocks), so vLLM would "
                "not start"
            )
    groups = sched.kv_groups if sched.kv_groups is not None else _groups(layout)
    refusal = caching_refusal(groups, bool(sched.enable_prefix_caching))
    if refusal is not None:  # derived groups are not validated by SchedulerConfig: said here
        raise InputError(
            f"{prefix}scheduler.enable_prefix_caching: {model.name}'s KV groups: {refusal}; "
            "set it to false (docs/hybrid-kv.md)"
        )
    return sched.model_copy(update={"kv_groups": groups, "num_blocks": num_blocks})


def block_bytes(sched: SchedulerConfig, model: ModelSpec, tp: int) -> float:
    """Bytes of one KV block on one GPU: a hybrid's block of every layer of its largest
    group, else ``block_size`` tokens of every layer."""
    if model.layers is None or sched.kv_groups is None:
        return sched.block_size * model.kv_bytes_per_token_per_gpu(tp)
    return float(kv_layout_for(sched, model, tp).bytes_per_block)
