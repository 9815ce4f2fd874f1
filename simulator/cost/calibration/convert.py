"""Converters from public GPU profiles (Splitwise's ``perf_model.csv``, Vidur's per-operator
``mlp.csv``) to measurement rows (see ``measurements``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator.cost.calibration.measurements import (
    MEAS_COLUMNS,
    aggregate_repeats,
    check_numeric,
    read_csv,
)
from simulator.cost.presets import load_model
from simulator.errors import InputError

SPLITWISE_MODELS: dict[str, str] = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}
"""Splitwise ``model`` value -> servesim model preset."""


SPLITWISE_HARDWARE: dict[str, str] = {
    "a100-80gb": "a100-80gb",
    "h100-80gb": "h100-sxm",
    # Same silicon with a power cap: the fitted coefficients absorb the slowdown.
    "h100-80gb-pcap": "h100-sxm",
}
"""Splitwise ``hardware`` value -> servesim hardware preset (features only)."""


_SPLITWISE_COLUMNS = (
    "model",
    "hardware",
    "tensor_parallel",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
)


def convert_splitwise(src: Path | str, group: str | None = None) -> pd.DataFrame:
    """Splitwise ``perf_model.csv`` -> measurement rows, one per distinct point.

    ``prompt_time`` of B prompts of P tokens -> prefill row ``B, P, 0``; ``token_time`` (mean
    decode iteration over T-1 iterations whose context grows from P to P+T-2) -> decode row
    ``B, 1, P + T//2``. Repeats (5 per run, and the same prefill under every T) -> median.
    ``group`` is ``<model>_<hardware>_tp<N>`` in Splitwise's names; ``model``/``hardware``
    columns hold the servesim presets whose features the fit should use.
    """
    df = read_csv(src, "splitwise file")
    missing = [c for c in _SPLITWISE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{src}: not a Splitwise perf_model.csv: missing {', '.join(missing)}")
    for col in ("tensor_parallel", "prompt_size", "batch_size", "token_size"):
        check_numeric(df, src, col, integer=True, low=1)
    for col in ("prompt_time", "token_time"):
        check_numeric(df, src, col, integer=False, low=0)
    df["group"] = (
        df["model"].astype(str)
        + "_"
        + df["hardware"].astype(str)
        + "_tp"
        + df["tensor_parallel"].astype(str)
    )
    if group is not None:
        known = sorted(df["group"].unique())
        if group not in known:
            raise InputError(f"{src}: no group {group!r}; groups: {', '.join(known)}")
        df = df[df["group"] == group]
    unknown = sorted(set(df["model"].astype(str)) - set(SPLITWISE_MODELS))
    unknown += sorted(set(df["hardware"].astype(str)) - set(SPLITWISE_HARDWARE))
    if unknown:
        raise InputError(f"{src}: no servesim preset for {', '.join(unknown)}")
    prefill = df.assign(
        kind="prefill",
        num_seqs=df["batch_size"],
        new_tokens=df["prompt_size"],
        context_len=0,
        step_ms=df["prompt_time"],
    )
    decode = df.assign(
        kind="decode",
        num_seqs=df["batch_size"],
        new_tokens=1,
        context_len=df["prompt_size"] + df["token_size"] // 2,
        step_ms=df["token_time"],
    )
    rows = pd.concat([prefill, decode], ignore_index=True)
    rows = rows.assign(
        model=rows["model"].map(SPLITWISE_MODELS),
        hardware_src=rows["hardware"],
        hardware=rows["hardware"].map(SPLITWISE_HARDWARE),
        tp=rows["tensor_parallel"],
    )
    keep = ["group", "model", "hardware", "hardware_src", "tp", "kind", *MEAS_COLUMNS]
    return aggregate_repeats(rows[keep])


def convert_vidur_mlp(src: Path | str, model: str, hardware: str | None = None) -> pd.DataFrame:
    """Vidur per-operator ``mlp.csv`` -> measurement rows ``1, num_tokens, 0`` per TP degree.

    Step time = ``num_layers`` x (sum of the per-layer ops' median times) + ``emb``. These are
    token-parallel ops only (projections, MLP, norms, rotary, residual add), profiled on one GPU
    with each TP degree's shard shapes: no attention kernel, LM head, all-reduce or per-step
    overhead, so rows get ``kind = mlp``. ``model`` is the servesim preset (for the layer count,
    checked against the file's shapes); ``hardware`` only names the group.
    """
    df = read_csv(src, "vidur file")
    spec = load_model(model)
    need = ("num_tokens", "num_tensor_parallel_workers", "n_embd", "time_stats.emb.median")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise InputError(f"{src}: not a Vidur mlp.csv: missing {', '.join(missing)}")
    embd = sorted(df["n_embd"].unique())
    if embd != [spec.hidden_size]:
        raise InputError(
            f"{src}: n_embd {embd} does not match model {model} (hidden_size {spec.hidden_size})"
        )
    ops = [
        c
        for c in df.columns
        if c.startswith("time_stats.") and c.endswith(".median") and c != "time_stats.emb.median"
    ]
    for col in (*ops, "time_stats.emb.median"):
        check_numeric(df, src, col, integer=False, low=0)
    for col in ("num_tokens", "num_tensor_parallel_workers"):
        check_numeric(df, src, col, integer=True, low=1)
    step = spec.num_layers * df[ops].sum(axis=1) + df["time_stats.emb.median"]
    hw_label = hardware or "gpu"
    rows = pd.DataFrame(
        {
            "group": [f"{model}_{hw_label}_tp{t}" for t in df["num_tensor_parallel_workers"]],
            "model": model,
            "hardware": hardware if hardware is not None else "",
            "tp": df["num_tensor_parallel_workers"],
            "kind": "mlp",
            "num_seqs": 1,
            "new_tokens": df["num_tokens"],
            "context_len": 0,
            "step_ms": step,
        }
    )
    return aggregate_repeats(rows)
