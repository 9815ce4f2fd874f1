"""The vision encoder of a multimodal model, from its ``config.json``'s ``vision_config``: how
many placeholder tokens an image becomes, and what encoding a step's images costs
(docs/multimodal.md, "The encoder's cost").

The shape is a ViT (Qwen2-VL / Qwen2.5-VL / Qwen3-VL keys): ``depth`` blocks of ``hidden_size``
with ``num_heads`` heads and an MLP of ``intermediate_size``, over an image's patches of
``patch_size`` pixels, then a patch merger (``spatial_merge_size``² patches -> one token of
``out_hidden_size``), plus one merger per ``deepstack_visual_indexes`` entry (Qwen3-VL). A
placeholder token is ``spatial_merge_size``² patches.

Time is a roofline: the FLOPs of every image's patches (projections, MLP, and attention over
the image's own patches, which is quadratic in them) against the GPU's peak, and the
encoder's weights read once per step against its HBM bandwidth, whichever is longer, split
over the tensor-parallel GPUs. With a measured attention (``encoder_attention.py``: the
``kernels`` and ``physics`` cost models, on GPUs aiconfigurator-core measured), the attention
is its measured time per layer instead of its FLOPs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.cost.hardware_spec import HardwareSpec
from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.cost.encoder_attention import MeasuredEncoderAttention

BYTES_PER_WEIGHT = 2
"""The encoder's weights and activations in bf16 (vLLM runs the ViT in the model's dtype)."""


@dataclass(frozen=True)
class VisionEncoder:
    """A ViT's shape and its patching rules."""

    depth: int
    hidden: int
    intermediate: int
    num_heads: int
    patch_size: int
    merge: int
    temporal_patch: int
    in_channels: int
    out_hidden: int
    num_mergers: int
    source: str
    """The file it was read from."""

    @classmethod
    def from_config(cls, path: str | Path) -> VisionEncoder:
        """The encoder a ``config.json`` describes; no file, or no ``vision_config``, or a
        key missing -> ``InputError`` naming the file and the key."""
        file = Path(path)
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise InputError(f"{file}: not a readable config.json ({err})") from None
        vc = raw.get("vision_config") if isinstance(raw, dict) else None
        if not isinstance(vc, dict):
            raise InputError(f"{file}: vision_config: missing (not a multimodal model)")

        def key(name: str, default: int | None = None) -> int:
            value = vc.get(name, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{file}: vision_config.{name}: expected a positive integer")
            return value

        hidden = key("hidden_size")
        return cls(
            depth=key("depth"),
            hidden=hidden,
            intermediate=key("intermediate_size"),
            num_heads=key("num_heads"),
            patch_size=key("patch_size"),
            merge=key("spatial_merge_size", 1),
            temporal_patch=key("temporal_patch_size", 1),
            in_channels=key("in_channels", 3),
            out_hidden=key("out_hidden_size", hidden),
            num_mergers=1 + len(vc.get("deepstack_visual_indexes") or ()),
            source=str(file),
        )

    def image_tokens(self, width: int, height: int, min_pixels: int, max_pixels: int) -> int:
        """Placeholder tokens of a ``width`` x ``height`` image: resized to multiples of
        ``patch_size * merge`` within ``[min_pixels, max_pixels]`` keeping its aspect (the
        Qwen-VL processors' ``smart_resize``), one token per ``merge``² patches."""
        f = self.patch_size * self.merge
        h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
        if h * w > max_pixels:
            beta = math.sqrt(height * width / max_pixels)
            h = max(f, math.floor(height / beta / f) * f)
            w = max(f, math.floor(width / beta / f) * f)
        elif h * w < min_pixels:
            beta = math.sqrt(min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return (h // f) * (w // f)

    def flops(self, tokens: int) -> float:
        """FLOPs of encoding one item of ``tokens`` placeholder tokens."""
        p = tokens * self.merge**2  # patches
        h, i = self.hidden, self.intermediate
        embed = 2 * p * self.in_channels * self.temporal_patch * self.patch_size**2 * h
        blocks = self.depth * (2 * p * (4 * h * h + 2 * h * i) + 4 * p * p * h)
        wide = h * self.merge**2
        mergers = self.num_mergers * 2 * tokens * (wide * wide + wide * self.out_hidden)
        return float(embed + blocks + mergers)

    def attention_flops(self, tokens: int) -> float:
        """The part of ``flops`` in the blocks' attention over the image's patches."""
        p = tokens * self.merge**2
        return float(self.depth * 4 * p * p * self.hidden)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the encoder's weights."""
        h, wide = self.hidden, self.hidden * self.merge**2
        embed = self.in_channels * self.temporal_patch * self.patch_size**2 * h
        blocks = self.depth * (4 * h * h + 2 * h * self.intermediate)
        mergers = self.num_mergers * (wide * wide + wide * self.out_hidden)
        return (embed + blocks + mergers) * BYTES_PER_WEIGHT


@dataclass(frozen=True)
class EncoderCost:
    """The time a step spends encoding its images, on ``tp`` GPUs of ``hardware``."""

    encoder: VisionEncoder
    hardware: HardwareSpec
    tp: int = 1
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    attention: MeasuredEncoderAttention | None = None
    """The attention's measured time per layer (on one of ``tp`` GPUs), or None: its FLOPs."""

    def time(self, items: list[int]) -> float:
        """Seconds to encode items of these placeholder tokens in one step (0: none)."""
        if not items:
            return 0.0
        enc, attention = self.encoder, self.attention
        flops = sum(enc.flops(t) for t in items)
        measured = 0.0
        if attention is not None:
            flops -= sum(enc.attention_flops(t) for t in items)
            measured = enc.depth * sum(attention.seconds(t * enc.merge**2) for t in items)
        compute = flops / (self.hardware.peak_flops * self.compute_efficiency * self.tp)
        compute += measured
        memory = self.encoder.weight_bytes / (
            self.hardware.hbm_bandwidth * self.memory_efficiency * self.tp
        )
        return max(compute, memory)
