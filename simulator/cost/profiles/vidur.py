"""Reader of Vidur's per-operator MLP profiles (``data/profiling/compute/<gpu>/<model>/mlp.csv``
of microsoft/vidur): the token-parallel operators of one layer, milliseconds, one row per
(token count, TP degree). Attention, the LM head and the sampler are not in these files.

Rows repeated for the same token count (the public files have a few) are combined by their
median.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from simulator.cost.profiles.csvfile import read_columns
from simulator.cost.profiles.curve import Curve
from simulator.cost.profiles.profile import OperatorProfile
from simulator.errors import InputError

_MS = 1e-3

PER_LAYER = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""Operators Vidur times once per transformer layer (as its execution-time predictor sums them)."""
PER_STEP = ("emb",)
SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")


def _column(op: str) -> str:
    return f"time_stats.{op}.median"


def read_vidur_mlp(path: str | Path, tp: int) -> OperatorProfile:
    """The rows of ``path`` profiled at ``num_tensor_parallel_workers == tp``."""
    file = Path(path)
    wanted = {_column(op): "float" for op in (*PER_LAYER, *PER_STEP)}
    wanted.update({name: "int" for name in (*SHAPE, "num_tokens", "num_tensor_parallel_workers")})
    cols, lines = read_columns(file, wanted)  # type: ignore[arg-type]
    rows = [i for i, t in enumerate(cols["num_tensor_parallel_workers"]) if t == tp]
    if not rows:
        have = sorted(set(cols["num_tensor_parallel_workers"]))
        raise InputError(f"{path}: no rows with num_tensor_parallel_workers={tp} (has: {have})")
    shape = {name: cols[name][rows[0]] for name in SHAPE}
    for i in rows:
        for name in SHAPE:
            if cols[name][i] != shape[name]:
                raise InputError(
                    f"{path}:{lines[i]}: column {name}: {cols[name][i]} differs from "
                    f"{shape[name]} on line {lines[rows[0]]} (one model per file)"
                )
    tokens = [cols["num_tokens"][i] for i in rows]
    if 0 in tokens:
        raise InputError(f"{path}:{lines[rows[tokens.index(0)]]}: column num_tokens: 0 tokens")

    def curve(op: str) -> Curve:
        by_tokens: dict[int, list[float]] = {}
        for i in rows:
            by_tokens.setdefault(cols["num_tokens"][i], []).append(cols[_column(op)][i] * _MS)
        xs = sorted(by_tokens)
        return Curve(xs, [statistics.median(by_tokens[x]) for x in xs])

    return OperatorProfile(
        source=str(file),
        tp=tp,
        per_layer={op: (1, curve(op)) for op in PER_LAYER},
        per_step={op: curve(op) for op in PER_STEP},
        includes_tp_comm=False,
        shape=shape,
    )
