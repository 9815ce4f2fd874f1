"""LLMServingSim's skew correction: a decode batch whose contexts differ is slower than one of
uniform contexts at their mean (FlashAttention's varlen kernel pads tiles and leaves SMs idle),
so attention is blended toward the uniform batch at the longest context,
``t = t(mean) + alpha * (t(max) - t(mean))``, with ``alpha`` measured per bucket of batch
shape (``tp<N>/skew_fit.csv``; bins in ``meta.yaml``: LLMServingSim's
``docs/docs/profiler/skew-alpha-fit.md``). A bucket the table lacks takes the pooled
``alpha_default``.
"""

from __future__ import annotations

from bisect import bisect_left
from pathlib import Path
from typing import Any

from simulator.cost.profiles.csvfile import read_columns
from simulator.errors import InputError

_AXES = ("n", "skew_rate", "kv_big", "kp")


class SkewTable:
    """Measured ``alpha`` by (prefill chunk, decodes, skew rate, longest context, prefill
    context)."""

    def __init__(
        self,
        bins: dict[str, tuple[list[float], list[str]]],
        alphas: dict[tuple[int, str, str, str, str], float],
        default: float,
    ) -> None:
        self.bins = bins
        """Per axis: upper bin edges (a value ``v`` falls in the first bin with ``v <= edge``)
        and their labels."""
        self.alphas = alphas
        self.default = default
        self._axes = [bins[axis] for axis in _AXES]

    def alpha(self, pc: int, n: int, skew_rate: float, kv_big: float, kp: int) -> float:
        """The bucket's alpha (``skew_rate = (mean - min) / (max - min)`` of the decodes'
        contexts, clipped to 0..1), else the pooled default. Once per simulated step."""
        rate = 0.0 if skew_rate < 0 else (1.0 if skew_rate > 1 else skew_rate)
        labels = []
        for (edges, names), value in zip(self._axes, (n, rate, kv_big, kp), strict=True):
            i = bisect_left(edges, value)
            labels.append(names[i if i < len(names) else -1])
        return self.alphas.get((pc, *labels), self.default)  # type: ignore[arg-type]


def read_skew(meta: dict[str, Any], folder: Path, tp: int, meta_path: Path) -> SkewTable | None:
    """The bundle's skew table for ``tp``, or None when it has none (``skew_fit`` absent or
    disabled)."""
    fit = meta.get("skew_fit")
    if not isinstance(fit, dict) or not fit.get("enabled"):
        return None
    per_tp = fit.get("per_tp") or {}
    entry = per_tp.get(tp, per_tp.get(str(tp)))
    if not isinstance(entry, dict):
        return None
    axes = entry.get("bucket_axes") or fit.get("bucket_axes")
    if not isinstance(axes, dict):
        raise InputError(f"{meta_path}: skew_fit has no bucket_axes")
    bins = {axis: _bins(axes, axis, meta_path) for axis in _AXES}
    try:
        default = float(entry.get("alpha_default", 0.0))
    except (TypeError, ValueError):
        raise InputError(
            f"{meta_path}: skew_fit.per_tp.{tp}.alpha_default is not a number"
        ) from None
    table = folder / "skew_fit.csv"
    if not table.exists():
        return SkewTable(bins, {}, default)
    names = ("n_label", "skew_rate_label", "kv_big_label", "kp_label")
    cols, lines = read_columns(table, {"pc": "int", **dict.fromkeys(names, "str"), "alpha": "str"})
    alphas: dict[tuple[int, str, str, str, str], float] = {}
    for i, line in enumerate(lines):
        try:
            alpha = float(cols["alpha"][i])  # measured alphas may be negative (noise)
        except ValueError:
            raise InputError(
                f"{table}:{line}: column alpha: {cols['alpha'][i]!r} is not a number"
            ) from None
        key = (cols["pc"][i], *(cols[name][i] for name in names))
        alphas[key] = alpha
    return SkewTable(bins, alphas, default)


def _bins(axes: dict[str, Any], axis: str, meta_path: Path) -> tuple[list[float], list[str]]:
    edges, labels = axes.get(f"{axis}_bins"), axes.get(f"{axis}_labels")
    if not isinstance(edges, list) or not isinstance(labels, list) or len(edges) != len(labels) + 1:
        raise InputError(
            f"{meta_path}: skew_fit.bucket_axes.{axis}_bins must list one edge more than "
            f"{axis}_labels"
        )
    # (edge[i], edge[i+1]] is labels[i]: keep the upper edges
    return [float(e) for e in edges[1:]], [str(label) for label in labels]
