"""A scenario's multimodal requests resolved (``workload.multimodal``, docs/multimodal.md): the
placeholder tokens of an image from the model's patching rules, the scheduler's encoder budget
and cache filled in as vLLM defaults them (so the saved scenario says what ran), and what
vLLM would stall on, or cannot hold, refused in one line naming the field; and the encoder's
cost, priced from the model's ``vision_config``."""

from __future__ import annotations

from simulator.cost.encoder_attention import MeasuredEncoderAttention
from simulator.cost.gpus import named_gpus
from simulator.cost.presets import load_hardware
from simulator.cost.vision_encoder import EncoderCost, VisionEncoder
from simulator.errors import InputError, in_field
from simulator.scenario.config import ScenarioConfig
from simulator.workload.replay import replay
from simulator.workload.trace_images import IMAGE_COLUMNS

WHERE = "workload.multimodal"


def has_images(cfg: ScenarioConfig) -> bool:
    """Whether ``cfg``'s requests carry images: ``workload.multimodal`` with some per request,
    or a CSV trace with image columns (its header read, nothing more)."""
    mm, trace = cfg.workload.multimodal, cfg.workload.trace
    if mm is not None:
        return mm.items_per_request > 0
    if trace is None or trace.format != "csv":
        return False
    with open(trace.path, encoding="utf-8-sig", errors="replace") as fh:
        header = fh.readline()
    return any(c.strip() in IMAGE_COLUMNS for c in header.split(","))


def encoder_of(cfg: ScenarioConfig) -> VisionEncoder:
    """The vision encoder of ``cfg``'s model: ``workload.multimodal.config_json``, else the
    cost model's ``model`` when it is a ``config.json``."""
    mm = cfg.workload.multimodal
    path = mm.config_json if mm is not None else None
    if path is None:
        gpus = named_gpus(cfg.cost_model)
        if gpus is None or not gpus.model.endswith(".json"):
            raise InputError(
                f"{WHERE}.config_json: required (the vision encoder is priced from a "
                "config.json's vision_config, and the cost model names none)"
            )
        path = gpus.model
    return in_field(f"{WHERE}.config_json", VisionEncoder.from_config, path)


def resolve_multimodal(cfg: ScenarioConfig) -> ScenarioConfig:
    """``cfg`` with its images' tokens and its encoder budget and cache filled in; an
    ``InputError`` naming the field for an image larger than either, one longer than a chunk
    under ``disable_chunked_mm_input``, or a setting multimodal is not simulated with."""
    mm, sched = cfg.workload.multimodal, cfg.scheduler
    if not has_images(cfg):
        return cfg
    for setting, on in (
        ("cluster", cfg.cluster is not None),
        ("data parallelism", cfg.parallel is not None and cfg.parallel.is_data_parallel),
        ("speculative decoding", cfg.speculative is not None),
        ("scheduler.async_scheduling", sched.async_scheduling),
        ("workload.shared_prefix", cfg.workload.shared_prefix is not None),
    ):
        if on:
            raise InputError(f"{WHERE}: not simulated with {setting} yet (docs/not-modeled.md)")
    if mm is None:  # a trace's images: the largest one bounds the budget and the cache
        assert cfg.workload.trace is not None
        items = replay(cfg.workload.trace).mm
        tokens = 0 if items is None else items.largest
    elif mm.tokens_per_item is not None:
        tokens = mm.tokens_per_item
    else:
        assert mm.image_size is not None
        width, height = mm.image_size
        tokens = encoder_of(cfg).image_tokens(width, height, mm.min_pixels, mm.max_pixels)
    chunk, _ = sched.budgets()
    budget = sched.max_num_encoder_input_tokens or max(chunk, tokens)
    size = sched.encoder_cache_size or max(budget, tokens)
    for field, limit in (("max_num_encoder_input_tokens", budget), ("encoder_cache_size", size)):
        if tokens > limit:
            raise InputError(
                f"scheduler.{field}: {limit} is smaller than an image of {tokens} tokens "
                "(it could never be encoded)"
            )
    if sched.disable_chunked_mm_input and tokens > chunk:
        raise InputError(
            f"scheduler.disable_chunked_mm_input: an image of {tokens} tokens exceeds "
            f"max_num_batched_tokens {chunk} (vLLM refuses to start: it would never schedule it)"
        )
    workload = cfg.workload
    if mm is not None:
        workload = workload.model_copy(
            update={"multimodal": mm.model_copy(update={"tokens_per_item": tokens})}
        )
    scheduler = sched.model_copy(
        update={"max_num_encoder_input_tokens": budget, "encoder_cache_size": size}
    )
    return cfg.model_copy(update={"workload": workload, "scheduler": scheduler})


def encoder_cost(cfg: ScenarioConfig) -> EncoderCost | None:
    """What encoding a step's images costs on the cost model's GPUs (None: no images)."""
    if not has_images(cfg):
        return None
    gpus = named_gpus(cfg.cost_model)
    if gpus is None:
        raise InputError(
            f"{WHERE}: the vision encoder is priced on the cost model's hardware; "
            f"cost_model.type {cfg.cost_model.type!r} names none"
        )
    hw = in_field(f"{gpus.where}hardware", load_hardware, gpus.hardware)
    cm, vit = cfg.cost_model, encoder_of(cfg)
    attention = None  # the roofline's own FLOPs; the kernel-based models' measured kernels
    if cm.type in ("kernels", "physics") and vit.num_heads % gpus.tp == 0:
        heads = vit.num_heads // gpus.tp
        attention = MeasuredEncoderAttention.load(hw, heads, vit.hidden // vit.num_heads)
    return EncoderCost(
        vit,
        hw,
        gpus.tp,
        getattr(cm, "compute_efficiency", 0.6),
        getattr(cm, "memory_efficiency", 0.8),
        attention,
    )
