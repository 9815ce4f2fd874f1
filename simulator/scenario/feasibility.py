"""Whether a deployment can exist: per GPU, the weights' shard, the activation peak of a
``max_num_batched_tokens`` step and the KV cache that ``scheduler.num_blocks`` implies must fit
in ``gpu_memory_utilization`` x the GPU's memory, as vLLM's start-up would require.

A derived ``num_blocks`` fits by construction (``derive_num_blocks``); a given one may not (the
quickstart's 4,000 blocks of Llama-3-70B on one 80 GB GPU), and then the scenario is refused
with the arithmetic rather than simulated. A linear cost model names no model or GPU, so its
scenarios cannot be checked and are not. Nor can vLLM start with a cache that cannot hold one
request of ``scheduler.max_model_len`` tokens (``check_max_model_len``), with a token budget
below ``max_num_seqs`` (``check_budgets``), or with a TP group spanning nodes whose network
the scenario does not describe (``check_nodes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.cost.presets import activation_peak_bytes, load_hardware, load_model
from simulator.errors import DoesNotFit, InputError, in_field
from simulator.scenario.kv_groups import block_bytes

if TYPE_CHECKING:
    from simulator.cost import CostModelConfig
    from simulator.scenario.config import ScenarioConfig
    from simulator.scheduling import SchedulerConfig

__all__ = [
    "DoesNotFit",
    "MemoryBudget",
    "check_budgets",
    "check_max_model_len",
    "check_memory",
    "check_nodes",
    "check_scenario_memory",
    "memory_budget",
]


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as a deployment uses it, bytes."""

    model: str
    hardware: str
    tp: int
    num_blocks: int
    weights: float
    """The GPU's shard of the weights."""
    activations: float
    """The activation peak of a ``max_num_batched_tokens`` step (``activation_peak_bytes``)."""
    kv: float
    """The GPU's share of ``num_blocks`` KV blocks."""
    usable: float
    """``gpu_memory_utilization`` x memory."""
    memory: float
    """The GPU's memory."""
    utilization: float
    """``gpu_memory_utilization``."""

    @property
    def needed(self) -> float:
        """Weights + activations + KV."""
        return self.weights + self.activations + self.kv

    @property
    def fits(self) -> bool:
        """The deployment fits in the usable memory."""
        return self.needed <= self.usable

    def explain(self) -> str:
        """The arithmetic, in one line."""
        gb = 1e9
        over = self.needed - self.usable
        return (
            f"{self.model} does not fit on {self.tp} x {self.hardware}: per GPU "
            f"{self.weights / gb:,.1f} GB of weights + {self.activations / gb:,.1f} GB activation "
            f"peak + {self.kv / gb:,.1f} GB KV ({self.num_blocks:,} blocks) = "
            f"{self.needed / gb:,.1f} GB, {over / gb:,.1f} GB more than the "
            f"{self.usable / gb:.1f} GB that gpu_memory_utilization={self.utilization:g} "
            f"leaves of {self.memory / gb:.0f} GB"
        )


def memory_budget(
    sched: SchedulerConfig, cm: CostModelConfig, prefix: str = ""
) -> MemoryBudget | None:
    """The per-GPU memory a resolved scheduler and cost model use, or None when the cost model
    names no model and GPU (or ``num_blocks`` is not set yet)."""
    from simulator.cost.gpus import named_gpus

    gpus = named_gpus(cm, prefix)
    if gpus is None or sched.num_blocks is None:
        return None
    tp, where = gpus.tp, gpus.where
    # sized as the KV budget is (runner.num_blocks_for): the config's dtypes, each EP rank's
    # share of the routed experts
    dtypes = (getattr(cm, "weight_dtype", None), getattr(cm, "kv_dtype", None))
    ep = getattr(cm, "expert_parallel", 1)
    model = in_field(f"{where}model", lambda m: load_model(m, *dtypes), gpus.model)
    hw = in_field(f"{where}hardware", load_hardware, gpus.hardware)
    activations = activation_peak_bytes(model, tp, *sched.budgets())
    kv = sched.num_blocks * block_bytes(sched, model, tp)  # a hybrid's: its groups' blocks
    return MemoryBudget(
        model=model.name,
        hardware=hw.name,
        tp=tp,
        num_blocks=sched.num_blocks,
        weights=model.weight_bytes_per_gpu(tp, ep if ep > 1 else None),
        activations=float(activations),
        kv=kv,
        usable=hw.memory_bytes * sched.gpu_memory_utilization,
        memory=float(hw.memory_bytes),
        utilization=sched.gpu_memory_utilization,
    )


def check_memory(sched: SchedulerConfig, cm: CostModelConfig, prefix: str = "") -> None:
    """Refuse (``InputError``, one line with the arithmetic) a deployment that does not fit."""
    budget = memory_budget(sched, cm, prefix)
    if budget is not None and not budget.fits:
        raise DoesNotFit(f"{prefix}scheduler.num_blocks: {budget.explain()}")


def check_scenario_memory(cfg: ScenarioConfig) -> None:
    """Every replica group of a resolved scenario fits in its GPUs' memory (one line naming
    the first that does not)."""
    if cfg.cluster is None:
        check_memory(cfg.scheduler, cfg.cost_model)
        return
    from simulator.cluster.config import replica_groups

    for spec in replica_groups(cfg.cluster, cfg.scheduler, cfg.cost_model):
        check_memory(spec.scheduler, spec.cost_model, f"{spec.field}.")


def check_max_model_len(sched: SchedulerConfig, prefix: str = "") -> None:
    """Refuse a cache that cannot hold one request of ``max_model_len`` tokens, as vLLM
    refuses to start (``DoesNotFit``, saying the longest that fits)."""
    limit, num_blocks = sched.max_model_len, sched.num_blocks
    if sched.kv_groups is not None:  # checked over the groups' layers (scenario/kv_groups.py)
        return
    if limit is None or num_blocks is None or -(-limit // sched.block_size) <= num_blocks:
        return
    raise DoesNotFit(
        f"{prefix}scheduler.max_model_len: one request of {limit:,} tokens needs "
        f"{-(-limit // sched.block_size):,} KV blocks, more than the {num_blocks:,} of the "
        f"cache, so vLLM would not start; the longest that fits is "
        f"{num_blocks * sched.block_size:,} tokens"
    )


def check_nodes(cm: CostModelConfig, prefix: str = "") -> None:
    """Refuse (``DoesNotFit``) a TP group larger than one node of its GPUs when the cost model
    does not say how the nodes connect (``network.nodes_spanned``); a fitted preset's ``tp``
    is what it was measured at, and is not checked."""
    from simulator.cost.gpus import named_gpus
    from simulator.cost.network import nodes_spanned

    gpus = named_gpus(cm, prefix)
    if gpus is None or getattr(cm, "tp", None) is None:
        return
    hw = in_field(f"{gpus.where}hardware", load_hardware, gpus.hardware)
    per_node = hw.gpus_per_node
    if "network" not in type(cm).model_fields and per_node is not None and gpus.tp > per_node:
        raise DoesNotFit(  # kernels: all-reduces measured within one node only
            f"{gpus.where}tp: {gpus.tp} GPUs span more than one node of {hw.name} ({per_node} "
            f"GPUs a node), which cost model {cm.type} cannot price (its all-reduces are "
            f"measured within a node): use tp <= {per_node} with more replicas, or type "
            "physics or roofline with cost_model.network"
        )
    nodes_spanned(gpus.tp, hw, getattr(cm, "network", None), gpus.where)


def check_budgets(sched: SchedulerConfig, prefix: str = "", defaulted: bool = False) -> None:
    """Refuse budgets vLLM refuses at start-up (its ``SchedulerConfig``): a step's token budget
    below ``max_num_seqs`` (every running sequence needs a token per step). Its other check,
    a budget below ``max_model_len`` without chunked prefill, cannot arise: both policies
    always chunk prefills, as vLLM v1 does by default. ``defaulted``: the budget is the one
    ``vllm serve`` sets, not the scenario's (the message says so)."""
    tokens, seqs = sched.budgets()
    if tokens < seqs:
        given = " (vllm serve's default on this GPU)" if defaulted else ""
        raise InputError(
            f"{prefix}scheduler.max_num_batched_tokens: {tokens:,}{given} is below max_num_seqs "
            f"({seqs:,}); vLLM refuses to start (it must be at least max_num_seqs)"
        )
