"""All layers' attention of a step from the measured attention tables: decodes by their count
and mean context (``generation_attention_perf``), prefill chunks by their count and causal
query-key pairs per chunk (``context_attention_perf``, whose prefills start from empty: a
chunk after cached context is priced as the prefill from empty with as many pairs).

Rows are tabulated per sequence count up to the largest measured batch, each linear between
the measured batch sizes around it and exact at measured points."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.cost.kernel_db import KernelDatabase
from simulator.cost.kernel_tables import batch_curves, bracket, interpolated, pairs_of
from simulator.cost.profiles import Curve
from simulator.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from simulator.cost.kernel_layers import ModelKernels


def _identity(x: np.ndarray) -> np.ndarray:
    return x


class AttentionRows:
    """Per sequence count: a curve of all layers' attention seconds and the measured limit."""

    def __init__(self, db: KernelDatabase, kernels: ModelKernels, layers: int) -> None:
        """Select the head layout's rows (the best-measured kernel) and tabulate them."""
        self.where = kernels.where
        gen, gen_scale = self._slice(db, "generation_attention_perf", kernels, "decode")
        ctx, ctx_scale = self._slice(db, "context_attention_perf", kernels, "prefill")
        self._decode = Rows(batch_curves(gen, "step", _identity), layers * gen_scale)
        self._prefill = Rows(batch_curves(ctx, "isl", pairs_of), layers * ctx_scale)
        m = kernels.model
        token_bytes = 2 * kernels.kv_heads * m.head_dim * m.kv_dtype_bytes  # K and V, a layer
        self.bandwidth = streaming_bandwidth(gen, token_bytes) or kernels.hbm_bandwidth
        """Bytes/s the decode kernel reaches reading a KV cache far larger than L2."""
        self._read = layers * token_bytes / self.bandwidth
        """Seconds per KV token read in all layers from memory (a decode's floor)."""

    def _slice(
        self, db: KernelDatabase, table: str, k: ModelKernels, what: str
    ) -> tuple[pd.DataFrame, float]:
        """The rows of this model's heads per GPU, head size and KV dtype, full attention
        (no window), of the kernel with the most rows (vLLM's choice where it measured); and
        the factor they are scaled by: 1, or where the layout was not measured, ``KV / KV'``
        for the most KV heads ``KV'`` measured at the same query heads per KV head (its bytes
        and FLOPs scale so; e.g. an MHA model's 32 KV heads as 4 x 8, whose decodes the
        database times only up to 8 KV heads)."""
        rows = db.read(
            f"attention/{table}",
            head_dim=k.model.head_dim,
            kv_cache_dtype=k.kv_dtype,
            window_size=0,
        )
        scale = 1.0
        if rows is not None and not rows.empty:
            layout = rows[(rows.num_heads == k.heads) & (rows.num_key_value_heads == k.kv_heads)]
            if layout.empty:
                group = k.heads // k.kv_heads
                found = rows[rows.num_heads == group * rows.num_key_value_heads]
                divides = [
                    int(v) for v in found.num_key_value_heads.unique() if k.kv_heads % v == 0
                ]
                if divides:
                    kv = max(divides)
                    layout, scale = found[found.num_key_value_heads == kv], k.kv_heads / kv
            rows = layout
        if rows is None or rows.empty:
            raise InputError(
                f"cost_model.model: {k.model.name}: no {what} attention of {k.heads} heads, "
                f"{k.kv_heads} KV heads of {k.model.head_dim} per GPU ({k.kv_dtype} KV) "
                f"measured in {self.where}; use cost_model.type: physics"
            )
        lane = rows.kernel_source.value_counts().sort_index().idxmax()
        return rows[rows.kernel_source == lane], scale

    def decode(self, count: int, mean_context: float) -> tuple[float, str | None]:
        """Seconds of ``count`` decodes of this mean context, and why it is extrapolated;
        at least the time to read their KV from memory: the tables repeat one batch on one
        KV cache, which stays in L2 when it fits (on RTX PRO 6000, 64 decodes of 512 tokens
        read 134 MB in 49 us, 2.7 TB/s of its 1.6 TB/s), where a forward pass reads each
        layer's cache once, after the weights between have flushed it."""
        t, why = _look(self._decode, count, mean_context, "decodes", "context")
        floor = count * (mean_context + 1.0) * self._read
        return (floor if floor > t else t), why

    def prefill(self, count: int, pairs: float) -> tuple[float, str | None]:
        """Seconds of ``count`` prefill chunks of ``pairs`` query-key pairs each."""
        return _look(self._prefill, count, pairs, "prefill chunks", "query-key pairs")


def streaming_bandwidth(table: pd.DataFrame, token_bytes: float) -> float | None:
    """The best bandwidth the decode kernel reaches over its measured batches reading 256 MB
    of KV or more (twice the largest L2 of the database's GPUs): its rate from memory."""
    read = table.batch_size * (table.step + 1) * token_bytes
    rates = read / (table.latency * 1e-3)
    rates = rates[read >= 256 * 2**20]
    return float(rates.max()) if len(rates) else None


class Rows:
    """Measured curves by batch size, and per sequence count the row of all layers' seconds
    (built on first use: most runs need a few dozen counts of the thousands measured)."""

    __slots__ = ("curves", "keys", "layers", "rows", "limits")

    def __init__(self, curves: dict[int, Curve], layers: float) -> None:
        self.curves, self.keys, self.layers = curves, sorted(curves), layers
        self.rows: list[Curve | None] = [None] * (self.keys[-1] + 1)
        self.limits = [0.0] * (self.keys[-1] + 1)

    def build(self, count: int) -> Curve:
        """The row of ``count`` sequences (interpolated between the measured batches around
        it), and its limit: the smaller of their largest measured points."""
        i, j, _ = bracket(self.keys, count)
        row = interpolated(self.curves, count)
        curve = Curve(row.xs, [self.layers * y for y in row.ys])
        if count < len(self.rows):
            self.rows[count] = curve
            self.limits[count] = min(self.curves[self.keys[i]].hi, self.curves[self.keys[j]].hi)
        return curve


def _look(rows: Rows, count: int, x: float, noun: str, axis: str) -> tuple[float, str | None]:
    """The row of ``count`` at ``x`` and the reason it is outside the measured grid."""
    table = rows.rows
    if count < len(table):
        row = table[count] or rows.build(count)
        limit = rows.limits[count]
        if x > limit:
            return row.at(x), f"{axis} {x:g} of {count} {noun} beyond the measured {limit:g}"
        return row.at(x), None
    return rows.build(count).at(x), f"{count} {noun} beyond the measured {len(table) - 1}"
