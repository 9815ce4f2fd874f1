"""The scheduler's part of a scenario: which policy, its flags and its budgets; and the
registry of policies a scenario may name."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.registry import Registry
from simulator.scheduling.interface import Scheduler
from simulator.scheduling.kv_group import KVGroup, caching_refusal
from simulator.scheduling.offload_config import KVOffloadConfig
from simulator.scheduling.step_scheduler import PRESETS, StepScheduler

POLICIES: Registry[type[Scheduler]] = Registry(
    "policy", {"spec": StepScheduler, "vllm-v1": StepScheduler}, check=Scheduler
)
"""Policy name (``scheduler.policy``) -> its class: a ``StepScheduler`` (the built-in names
are presets of its flags, ``PRESETS``), or any ``Scheduler`` taking ``(config, sample,
sample_many)``; a scenario may also name one by import path, ``module:Class``."""


class SchedulerConfig(BaseModel):
    """The step scheduler's policy and budgets (the contract: docs/scheduler.md)."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "spec"
    """Scheduling policy: ``spec`` (the project's spec, the default), ``vllm-v1`` (vLLM
    0.33's v1 scheduler, step-exact to recorded traces), or a policy class by import path
    (``module:Class``); docs/scheduler.md."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    """Token budget of one step, shared by decodes and prefill chunks; omit it for what
    ``vllm serve`` sets on the cost model's GPU: 8192 on a GPU of 70 GiB or more that is not
    an A100, else 2048 (also with a cost model that names no GPU). At least ``max_num_seqs``,
    or the scenario is refused as vLLM refuses to start; prefills are always chunked, so it
    may be below ``max_model_len``."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most sequences running at once (an admission limit only); omit it for what ``vllm
    serve`` sets: 1024 on a GPU of 70 GiB or more that is not an A100, else 256, and never
    more than ``max_num_batched_tokens``."""
    max_model_len: int | None = Field(default=None, ge=1)
    """Most tokens a request may ask for, prompt plus output (vLLM's ``--max-model-len``): a
    request asking for more is rejected with its reason, as vLLM's server refuses it, and a
    cache that cannot hold one such request is a deployment that cannot exist (vLLM will not
    start). vLLM's own default is the model's context length; here None: no limit."""
    num_blocks: int | None = Field(default=None, ge=1)
    """KV-cache blocks; omit to derive them from GPU memory as vLLM does (needs a roofline,
    fitted or profiled cost model): memory x ``gpu_memory_utilization`` - weights - the
    activation peak of a ``max_num_batched_tokens`` step. A value given is checked against the
    same budget with those cost models: a deployment whose blocks do not fit is refused."""
    block_size: int = Field(default=16, ge=1, le=4096)
    """Tokens per KV block (vLLM's default is 16; at most 4096 here)."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of GPU memory for weights, activations and KV: what ``num_blocks`` is derived
    from, or checked against when given."""
    enable_prefix_caching: bool | None = None
    """Reuse the KV of full blocks whose tokens an earlier request already computed (needs
    token identity in the workload to hit anything but a request's own blocks after a
    preemption); default: on for ``vllm-v1`` (as in vLLM), off for ``spec``."""
    priority_policy: Literal["fcfs", "priority"] = "fcfs"
    """``vllm-v1`` only: serve the waiting queue first come first served, or by each
    request's ``priority`` (lower first, then arrival), preempting the lowest first."""
    reserve_full_isl: bool | None = None
    """``vllm-v1`` only: admit a request only when blocks for all its known tokens are free,
    not just for its first prefill chunk (vLLM's ``scheduler_reserve_full_isl``); default on
    for ``vllm-v1``, and always off for ``spec``."""
    long_prefill_token_threshold: int = Field(default=0, ge=0)
    """``vllm-v1`` only: most tokens one request computes in a step while others run or wait
    (0: no cap)."""
    async_scheduling: bool = False
    """``vllm-v1`` only: plan step ``n + 1`` before step ``n``'s tokens are known, with
    output placeholders (vLLM's ``async_scheduling``, its default since 0.19; here off by
    default, and its runs take the plain path): docs/scheduler.md, "Async scheduling"."""
    admit_after_preemption: bool | None = None
    """Admit waiting requests in a step that preempted someone; default on for ``spec`` (its
    text), off for ``vllm-v1`` (as in vLLM)."""

    preemption_mode: Literal["recompute", "swap"] = "recompute"
    """What preemption does with the victim's KV: ``recompute`` drops it and computes it again
    on resumption (vLLM v1, the only mode there); ``swap`` copies it to CPU memory over the
    host link and back on resumption (vLLM v0's ``--preemption-mode swap``), recomputing only
    when ``swap_space_gb`` is full (docs/swap.md)."""
    swap_space_gb: float = Field(default=4.0, ge=0, allow_inf_nan=False)
    """``swap`` only: CPU memory per GPU for swapped-out KV, GiB (vLLM v0's ``--swap-space``,
    4 by default); the replica's is this times its GPUs, and it must fit in its host's
    memory (``configs/host_memory.yaml``)."""
    host_link_gb_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """``swap`` only: bytes per second (GB/s, 1e9) one GPU's host link copies one way; omit
    for the hardware preset's PCIe link (``pcie_generation`` x ``pcie_lanes``, the raw link
    rate: copies reach ~80-90% of it). A replica's GPUs copy their shards at once."""
    swap_kv_bytes_per_token: int | None = Field(default=None, ge=1)
    """``swap`` only: KV bytes of one token over all layers and GPUs; omit to take it from the
    cost model's model preset (required with a cost model that names no model)."""

    max_num_encoder_input_tokens: int | None = Field(default=None, ge=1)
    """Multimodal: placeholder tokens the vision encoder may compute in one step (vLLM's
    encoder compute budget); an item is encoded whole, in the step its first tokens are
    scheduled, or the chunk stops before it. Omit for vLLM's default,
    ``max_num_batched_tokens`` (at least the largest item); smaller than an item is refused
    (docs/multimodal.md)."""
    encoder_cache_size: int | None = Field(default=None, ge=1)
    """Multimodal: placeholder tokens of encoder outputs kept at once, by content, freed
    oldest-first once no request needs them (vLLM's ``EncoderCacheManager``). Omit for vLLM's
    default, the encoder budget; smaller than an item is refused."""
    disable_chunked_mm_input: bool = False
    """Multimodal: never end a chunk inside an image (vLLM's ``disable_chunked_mm_input``);
    an image longer than ``max_num_batched_tokens`` is then refused (vLLM would stall)."""

    kv_groups: list[KVGroup] | None = None
    """The KV-cache groups of a hybrid model (sliding-window, Mamba or linear-attention layers
    beside full attention), grouped as vLLM groups them; omit to derive them from the cost
    model's model (``config.json``). None: every layer keeps full KV, one group of
    ``block_size`` (docs/hybrid-kv.md)."""

    kv_offload: KVOffloadConfig | None = None
    """KV tiers below the GPU's (a CPU tier; needs prefix caching): blocks the GPU computed
    are kept there, and a prefix found there is loaded back instead of recomputed
    (docs/kv-offload.md). None: none."""

    def budgets(self) -> tuple[int, int]:
        """``(max_num_batched_tokens, max_num_seqs)`` of a resolved config (``resolve``
        fills in those left out)."""
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        assert tokens is not None and seqs is not None, "resolve the scenario first (budgets)"
        return tokens, seqs

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        return POLICIES.validate(value)

    @model_validator(mode="after")
    def _policy_defaults(self) -> SchedulerConfig:
        preset = PRESETS.get(self.policy, {})
        if self.policy == "spec":
            for key, off in (
                ("admit_after_preemption", self.admit_after_preemption is not False),
                ("priority_policy", self.priority_policy == "fcfs"),
                ("reserve_full_isl", not self.reserve_full_isl),
                ("long_prefill_token_threshold", self.long_prefill_token_threshold == 0),
                ("async_scheduling", not self.async_scheduling),
            ):
                if not off:
                    raise ValueError(f"{key} applies to policy 'vllm-v1' only, not {self.policy!r}")
        # resolved here, so a saved scenario says what ran
        for key, default in (
            ("enable_prefix_caching", False),
            ("reserve_full_isl", False),
            ("admit_after_preemption", True),
        ):
            if getattr(self, key) is None:
                setattr(self, key, preset.get(key, default))
        if self.preemption_mode == "swap" and (self.kv_offload or self.async_scheduling):
            raise ValueError(
                "preemption_mode 'swap' is not simulated with kv_offload or async_scheduling "
                "(vLLM v0 swapped, and had neither)"
            )
        refusal = caching_refusal(self.kv_groups or [], bool(self.enable_prefix_caching))
        if refusal is not None:
            raise ValueError(f"kv_groups: {refusal}; set enable_prefix_caching: false")
        if self.kv_offload is not None and not self.enable_prefix_caching:
            raise ValueError(
                "kv_offload needs enable_prefix_caching (tiers find blocks by their content)"
            )
        return self
