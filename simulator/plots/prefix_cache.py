"""The prefix cache over a run: the hit rate of the requests scheduled in each time bin (prompt
tokens served from the cache / prompt tokens, docs/metrics.md) and the free blocks the cache
keeps (from the binned step table of ``step_bins.py``, so a streamed table works too).
Written beside the other run figures when the run had a prefix cache."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

DPI = 120
_MAX_BINS = 200


def has_prefix_cache(requests: pd.DataFrame, binned: pd.DataFrame) -> bool:
    """Whether the run kept anything in a prefix cache (else the figure says nothing);
    ``binned``: the steps binned by ``step_bins.bin_steps``."""
    cached_tokens = requests.get("num_cached_tokens")
    cached_blocks = binned.get("num_cached_blocks_mean")
    return bool(
        (cached_tokens is not None and cached_tokens.sum() > 0)
        or (cached_blocks is not None and len(cached_blocks) and cached_blocks.max() > 0)
    )


def hit_rate_over_time(requests: pd.DataFrame, max_bins: int = _MAX_BINS) -> pd.DataFrame:
    """Per time bin of first scheduling: ``t`` (bin centre, s), ``prompt_tokens``,
    ``cached_tokens`` and ``hit_rate`` of the requests first scheduled in it."""
    done = requests[np.isfinite(requests["first_scheduled_s"].to_numpy(dtype=float))]
    t = done["first_scheduled_s"].to_numpy(dtype=float)
    if t.size == 0:
        return pd.DataFrame({"t": [], "prompt_tokens": [], "cached_tokens": [], "hit_rate": []})
    lo, hi = float(t.min()), float(t.max())
    bins = max(1, min(max_bins, int(np.sqrt(t.size))))
    width = (hi - lo) / bins if hi > lo else 1.0
    b = np.minimum(((t - lo) / width).astype(np.int64), bins - 1)
    prompt = np.bincount(b, weights=done["prompt_len"].to_numpy(dtype=float), minlength=bins)
    cached = np.bincount(b, weights=done["num_cached_tokens"].to_numpy(dtype=float), minlength=bins)
    keep = prompt > 0
    return pd.DataFrame(
        {
            "t": (lo + (np.arange(bins) + 0.5) * width)[keep],
            "prompt_tokens": prompt[keep],
            "cached_tokens": cached[keep],
            "hit_rate": cached[keep] / prompt[keep],
        }
    )


def plot_prefix_cache(requests: pd.DataFrame, binned: pd.DataFrame) -> Figure:
    """Hit rate of the requests scheduled over time, and cached free blocks (mean per time
    bin of the binned step table)."""
    fig = Figure(figsize=(10, 5.6), dpi=DPI, layout="constrained")
    ax_rate, ax_blocks = fig.subplots(2, 1, sharex=True)
    rates = hit_rate_over_time(requests)
    total = requests["prompt_len"][np.isfinite(requests["first_scheduled_s"])].sum()
    overall = requests["num_cached_tokens"].sum() / total if total else float("nan")
    fig.suptitle(f"Prefix cache (hit rate over the run: {100 * overall:.1f}% of prompt tokens)")
    ax_rate.set_title("Hit rate of the requests first scheduled in each time bin")
    ax_rate.set_ylabel("prompt tokens from cache (%)")
    if len(rates):
        ax_rate.plot(rates["t"], 100 * rates["hit_rate"], color="C0", lw=1.4, marker=".", ms=3)
        ax_rate.set_ylim(0, 105)
    ax_blocks.set_title("Free KV blocks the cache keeps for reuse (mean per time bin)")
    ax_blocks.set_ylabel("cached blocks")
    if len(binned) and "num_cached_blocks_mean" in binned:
        ax_blocks.plot(binned["t"], binned["num_cached_blocks_mean"], color="C2", lw=1.2)
        ax_blocks.set_ylim(bottom=0)
    ax_blocks.set_xlabel("simulated time (s)")
    for ax in (ax_rate, ax_blocks):
        ax.grid(True, alpha=0.3)
    return fig
