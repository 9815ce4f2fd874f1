"""Multimodal requests' columns of the request table and keys of the summary: each request's
images, the encoder tokens computed for it, and how many of its images the encoder cache (or
another request's encoding in the same step) served (docs/multimodal.md)."""

from __future__ import annotations

import numpy as np

from simulator.metrics.columns import Columns
from simulator.workload.multimodal import MMItems


def add_mm_metrics(
    requests: Columns,
    summary: dict[str, object],
    mm: MMItems,
    encoded: dict[int, dict[int, int]],
) -> None:
    """``mm_items``, ``mm_tokens``, ``encoder_tokens`` and ``encoder_cache_hits`` per request
    (``encoded``: per request, the times each item was encoded for it); the summary's
    totals and ``encoder_cache_hit_rate`` (images served without encoding for the request)."""
    n = len(mm.start) - 1
    items = mm.num_items
    tokens = np.zeros(n, dtype=np.int64)
    hits = items.copy()
    for i, counts in encoded.items():
        lo = int(mm.start[i])
        tokens[i] = sum(int(mm.lengths[lo + j]) * c for j, c in counts.items())
        hits[i] -= len(counts)
    rejected = np.isnan(np.asarray(requests["first_scheduled_s"], dtype=np.float64))
    hits[rejected] = 0  # never scheduled: nothing was served
    requests["mm_items"] = items
    requests["mm_tokens"] = mm.per_request(mm.lengths)
    requests["encoder_tokens"] = tokens
    requests["encoder_cache_hits"] = hits
    served = int(items[~rejected].sum())
    summary["encoder_tokens"] = int(tokens.sum())
    summary["encoder_cache_hit_rate"] = int(hits.sum()) / served if served else float("nan")
