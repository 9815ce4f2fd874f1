"""Reader of LLMServingSim's profile bundles (``profiler/perf/<GPU>/<model>/<variant>/``:
``meta.yaml`` and ``tp<N>/{dense,per_sequence,attention}.csv``, times in microseconds; format:
LLMServingSim's ``docs/docs/profiler/output-bundle.md``).

Each token-parallel layer name is one operator of the model's layer or step; the catalog below
says how often it runs. ``skew_fit.csv``, the fitted correction for decodes of different
lengths, is read (``skew.py``); the raw ``skew.csv`` shots behind it are not. An MoE
bundle's ``moe.csv`` (the MoE block by local tokens and distinct experts) is read
(``moe.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.cost.profiles.attention import AttentionTable
from simulator.cost.profiles.csvfile import read_columns
from simulator.cost.profiles.curve import Curve
from simulator.cost.profiles.moe import read_moe
from simulator.cost.profiles.profile import OperatorProfile
from simulator.cost.profiles.skew import read_skew
from simulator.errors import InputError
from simulator.yaml_file import read_yaml_file

_US = 1e-6

PER_LAYER_CALLS = {
    "layernorm": 2,  # input and post-attention RMSNorm (the CSV holds the mean of the two)
    "qkv_proj": 1,
    "qk_norm": 2,  # q_norm and k_norm (Qwen3), likewise averaged
    "rotary_emb": 1,
    "o_proj": 1,
    "gate_up_proj": 1,
    "act_fn": 1,
    "down_proj": 1,
}
"""Calls per transformer layer of each per-layer operator (LLMServingSim's layer catalog)."""
PER_STEP = ("embedding", "final_layernorm")
PER_SEQUENCE = ("lm_head", "sampler")
_PROVENANCE = ("model", "gpu", "vllm_version", "cuda_version", "profiled_at", "variant")


def read_llmservingsim(path: str | Path, tp: int) -> OperatorProfile:
    """The ``tp<tp>/`` tables of the bundle at ``path`` (the folder holding ``meta.yaml``)."""
    root = Path(path)
    if not root.exists():
        raise InputError(
            f"{path}: not found (relative to {Path.cwd()}; `servesim fetch llmservingsim` "
            "downloads the bundles the real-* scenarios read)"
        )
    if not root.is_dir():
        raise InputError(
            f"{path}: not a folder (an LLMServingSim profile bundle holds meta.yaml and tp<N>/)"
        )
    meta = _meta(root / "meta.yaml")
    folder = root / f"tp{tp}"
    if not folder.is_dir():
        have = sorted(p.name for p in root.glob("tp*") if p.is_dir())
        raise InputError(f"{root}: no tp{tp}/ folder (profiled: {', '.join(have) or 'none'})")
    per_layer, per_step = _dense(folder / "dense.csv")
    return OperatorProfile(
        source=str(root),
        tp=tp,
        per_layer=per_layer,
        per_step=per_step,
        per_sequence=_per_sequence(folder / "per_sequence.csv"),
        attention=_attention(folder / "attention.csv"),
        skew=read_skew(meta, folder, tp, root / "meta.yaml"),
        moe=read_moe(folder / "moe.csv") if (folder / "moe.csv").exists() else None,
        includes_tp_comm=False,
        provenance={k: str(meta[k]) for k in _PROVENANCE if meta.get(k) is not None},
    )


def _meta(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"{path}: file not found (every bundle has a meta.yaml)")
    # strictly, as a scenario: UTF-8 only, a key given twice is an error naming its line
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of keys")
    return data


def _curves(path: Path, key: str, known: tuple[str, ...]) -> dict[str, Curve]:
    """One curve per ``layer`` of a ``layer, <key>, time_us`` table."""
    cols, lines = read_columns(path, {"layer": "str", key: "int", "time_us": "float"})
    points: dict[str, dict[int, tuple[float, int]]] = {}
    for name, x, t, line in zip(cols["layer"], cols[key], cols["time_us"], lines, strict=True):
        if name not in known:
            raise InputError(f"{path}:{line}: unknown layer {name!r} (known: {', '.join(known)})")
        seen = points.setdefault(name, {})
        if x in seen:
            raise InputError(f"{path}:{line}: {name} at {key}={x} repeats line {seen[x][1]}")
        seen[x] = (t * _US, line)
    return {name: Curve(sorted(p), [p[x][0] for x in sorted(p)]) for name, p in points.items()}


def _dense(path: Path) -> tuple[dict[str, tuple[int, Curve]], dict[str, Curve]]:
    curves = _curves(path, "tokens", (*PER_LAYER_CALLS, *PER_STEP))
    per_layer = {n: (PER_LAYER_CALLS[n], c) for n, c in curves.items() if n in PER_LAYER_CALLS}
    if not per_layer:
        raise InputError(f"{path}: no per-layer operators (e.g. qkv_proj, down_proj)")
    return per_layer, {n: c for n, c in curves.items() if n in PER_STEP}


def _per_sequence(path: Path) -> dict[str, Curve]:
    if not path.exists():
        return {}
    return _curves(path, "sequences", PER_SEQUENCE)


def _attention(path: Path) -> AttentionTable | None:
    if not path.exists():  # the roofline prices attention then
        return None
    axes = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
    cols, lines = read_columns(path, {**{a: "int" for a in axes}, "time_us": "float"})
    keys = list(zip(*(cols[a] for a in axes), strict=True))
    if len(set(keys)) < len(keys):
        first: dict[tuple[int, ...], int] = {}
        for key, line in zip(keys, lines, strict=True):
            if key in first:
                raise InputError(f"{path}:{line}: the point {key} repeats line {first[key]}")
            first[key] = line
    for key, line in zip(keys, lines, strict=True):
        if key[0] == 0 and key[2] == 0:
            raise InputError(f"{path}:{line}: a point with no prefill and no decode")
    return AttentionTable([(*k, t * _US) for k, t in zip(keys, cols["time_us"], strict=True)])
