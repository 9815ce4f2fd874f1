"""Multimodal requests: images in the prompt as runs of placeholder tokens (vLLM's
``PlaceholderRange``), each with a content id that repeats across requests (docs/multimodal.md).

``workload.multimodal`` gives each request ``items_per_request`` items of ``tokens_per_item``
placeholder tokens (or the tokens an ``image_size`` image becomes under the model's patching
rules, ``cost/vision_encoder.py``), placed at the start of the prompt, at its end, or at random
points of its text. Contents: request ``i``'s item ``j`` shows content
``(i // requests_per_item) * items_per_request + j``, modulo ``distinct_items`` if given, so a
content is sent in ``requests_per_item`` back-to-back requests and, with ``distinct_items``,
comes round again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Item = tuple[int, int, int]
"""An item of a prompt: ``(offset, length, content)`` (the scheduler's ``MMItem``)."""


class MultimodalConfig(BaseModel):
    """Images per request, their placeholder tokens, where they sit and how often they repeat."""

    model_config = ConfigDict(extra="forbid")

    items_per_request: int = Field(default=1, ge=0)
    """Images in each request's prompt (0: a text-only run of the same scenario)."""
    tokens_per_item: int | None = Field(default=None, ge=1)
    """Placeholder tokens of one image (what the encoder outputs for it); or give
    ``image_size``, which a resolved scenario turns into this (both: this one is used)."""
    image_size: tuple[int, int] | None = None
    """``[width, height]`` in pixels: the tokens follow from the model's ``vision_config``
    (patch size, spatial merge) and processor's resize rule (``min_pixels``/``max_pixels``)."""
    config_json: str | None = None
    """The model's ``config.json`` with ``vision_config``; omit to take the cost model's
    ``model`` when that is a ``config.json``."""
    min_pixels: int = Field(default=65536, ge=1)
    """The processor's least pixels after resizing (Qwen3-VL's ``size.shortest_edge``)."""
    max_pixels: int = Field(default=16777216, ge=1)
    """The processor's most pixels after resizing (Qwen3-VL's ``size.longest_edge``)."""
    position: Literal["start", "end", "random"] = "start"
    """Where the images sit: before the text, after it, or at random points of it (each
    request's drawn from the workload's multimodal stream)."""
    distinct_items: int | None = Field(default=None, ge=1)
    """Contents cycle through this many (each repeats); None: every image is new."""
    requests_per_item: int = Field(default=1, ge=1)
    """Back-to-back requests that send the same images (2: each image twice in a row)."""

    @model_validator(mode="after")
    def _one_size(self) -> MultimodalConfig:
        if self.tokens_per_item is None and self.image_size is None:
            raise ValueError("give tokens_per_item or image_size")
        if self.image_size is not None and min(self.image_size) < 1:
            raise ValueError(f"image_size must be positive pixels, got {list(self.image_size)}")
        if self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")
        return self


@dataclass(frozen=True)
class MMItems:
    """Every request's items as flat arrays: request ``i`` has ``offsets[start[i]:start[i+1]]``
    and the same slice of ``lengths`` and ``contents``."""

    start: np.ndarray
    """int64, one more than the requests: where each request's items begin."""
    offsets: np.ndarray
    """int64: each item's first placeholder token in its prompt."""
    lengths: np.ndarray
    """int64 >= 1: each item's placeholder tokens."""
    contents: np.ndarray
    """int64: each item's content id (equal ids share an encoder output)."""

    def items(self, i: int) -> tuple[Item, ...]:
        """Request ``i``'s items as the scheduler takes them."""
        lo, hi = int(self.start[i]), int(self.start[i + 1])
        return tuple(
            (int(o), int(n), int(c))
            for o, n, c in zip(
                self.offsets[lo:hi], self.lengths[lo:hi], self.contents[lo:hi], strict=True
            )
        )

    def per_request(self, values: np.ndarray) -> np.ndarray:
        """Per-item ``values`` summed per request."""
        sums = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
        return sums[self.start[1:]] - sums[self.start[:-1]]

    def take(self, order: np.ndarray) -> MMItems:
        """The items of the requests in ``order`` (a trace sorted by arrival)."""
        counts = self.num_items[order]
        start = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        idx = np.concatenate(
            [np.arange(self.start[i], self.start[i + 1], dtype=np.int64) for i in order]
            or [np.zeros(0, dtype=np.int64)]
        )
        return MMItems(start, self.offsets[idx], self.lengths[idx], self.contents[idx])

    @property
    def num_items(self) -> np.ndarray:
        """Items per request."""
        return np.diff(self.start)

    @property
    def largest(self) -> int:
        """The most placeholder tokens of one item (0 without items)."""
        return int(self.lengths.max()) if len(self.lengths) else 0


def place_items(
    cfg: MultimodalConfig, text_len: np.ndarray, tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, MMItems]:
    """The prompts' lengths with their images added (``tokens`` placeholders each) and the
    items, for prompts of ``text_len`` text tokens; ``rng`` places ``random`` ones."""
    n, k = len(text_len), cfg.items_per_request
    total = text_len + k * tokens
    idx = np.arange(n, dtype=np.int64)[:, None]
    contents = (idx // cfg.requests_per_item) * k + np.arange(k, dtype=np.int64)[None, :]
    if cfg.distinct_items is not None:
        contents %= cfg.distinct_items
    if cfg.position == "start":
        cut = np.zeros((n, k), dtype=np.int64)
    elif cfg.position == "end":
        cut = np.repeat(text_len[:, None], k, axis=1)
    else:  # text tokens before each image: sorted points in [0, text_len]
        cut = np.sort(rng.integers(0, text_len[:, None] + 1, size=(n, k)), axis=1)
    offsets = cut + np.arange(k, dtype=np.int64)[None, :] * tokens
    items = MMItems(
        start=np.arange(n + 1, dtype=np.int64) * k,
        offsets=offsets.reshape(-1),
        lengths=np.full(n * k, tokens, dtype=np.int64),
        contents=contents.reshape(-1),
    )
    return total, items


def items_at_start(counts: np.ndarray, tokens: np.ndarray, first: np.ndarray | None) -> MMItems:
    """Each request's ``counts[i]`` images of ``tokens[i]`` placeholders, at the start of its
    prompt (a trace's columns); contents ``first[i] + j`` (None: every image new)."""
    n = len(counts)
    start = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    owner = np.repeat(np.arange(n, dtype=np.int64), counts)
    j = np.arange(int(start[-1]), dtype=np.int64) - start[owner]
    # without ids, new contents: negative, apart from any a trace names (>= 0)
    contents = -1 - (start[:-1][owner] + j) if first is None else first[owner] + j
    return MMItems(start, j * tokens[owner], tokens[owner], contents)
