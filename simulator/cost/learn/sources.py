"""What ``servesim learn`` fits on (``configs/physics/sources.yaml``): public operator
profiles, each read into sets of measured operator times with the term that predicts them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.cost import physics_terms as terms
from simulator.cost.learn.allreduce import AllReduceSource
from simulator.cost.learn.kernel_source import KernelDbSources, kernel_sets, load_gpu
from simulator.cost.physics_terms import Array, Params, RankShape
from simulator.cost.presets import (
    HardwareSpec,
    ModelSpec,
    configs_dir,
    load_hardware,
    load_model,
    load_yaml_model,
)
from simulator.cost.profiles.csvfile import read_columns
from simulator.cost.profiles.vidur import read_vidur_mlp
from simulator.errors import InputError

_US = 1e-6
VIDUR_WEIGHT = 0.15
"""Weight of each of Vidur's matmul sets (16 per file: 4 matmuls x 4 TP degrees) against 1
for each matmul of an LLMServingSim bundle: Vidur's 2024 profiler is not the stack the model
prices, so its A100 and H100 points shape the curves without outvoting vLLM 0.19's."""
DECODE_TOKENS = 256
"""Token counts up to this are the decode end of a matmul's curve (weighed on their own)."""
DECODE_WEIGHT = 3.0
"""Weight of a bundle's decode-only attention in the serving region against 1 for its
prefills and mixed steps: decode-only steps are most of a serving run's steps (95% in
LLMServingSim's runs), and the mixed sets' far more points would otherwise set the curve
the decodes share with them."""
MIXED_STRIDE = 3
"""Every third mixed attention point is fitted (in file order: deterministic): the grid's
~19,000 mixed points are near neighbours, and a third of them halves the fit's time."""


class Source(BaseModel):
    """One profile the fit reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Group name (``gpu/model/tp``), as the errors are reported."""
    format: Literal["llmservingsim", "vidur-mlp"]
    """``llmservingsim`` bundle folder or Vidur ``mlp.csv``."""
    path: str
    """Under the data folder."""
    tp: int | list[int]
    """TP degree(s) of the profile's tables to read."""
    model: str
    """Model preset (name or path) of the profiled shape."""
    hardware: str
    """Hardware preset (name or path) of the GPU profiled."""


class Sources(BaseModel):
    """The training set: which stack, which files, which left out and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str | None = None
    """The serving stack the profiles measure (from ``base`` when not given)."""
    sources: list[Source] = Field(default_factory=list)
    """The profiles fitted."""
    allreduce: list[AllReduceSource] = Field(default_factory=list)
    """All-reduce profiles of NVLink GPUs (not in the project: read where present)."""
    excluded: list[str] = Field(default_factory=list)
    """Public measurements left out, each with its reason."""
    kernels: KernelDbSources | None = None
    """GPUs of NVIDIA's measured-kernel database read too (``learn/kernel_source.py``)."""
    base: str | None = None
    """Another sources file (beside this one) whose sources, all-reduce profiles and
    exclusions are fitted too, ahead of this file's."""


def default_sources_path() -> Path:
    """``configs/physics/sources.yaml``."""
    return configs_dir() / "physics" / "sources.yaml"


def load_sources(path: Path) -> Sources:
    """The training set described by ``path`` (with its ``base`` file's, if it names one)."""
    own = load_yaml_model(path, Sources)
    if own.base is None:
        if not own.sources and own.kernels is None:
            raise InputError(f"{path}: sources: none given (and no kernels)")
        if own.stack is None:
            raise InputError(f"{path}: stack: not given (nor a base file giving it)")
        return own
    base = load_sources(path.parent / own.base)
    return own.model_copy(
        update={
            "base": None,
            "sources": [*base.sources, *own.sources],
            "allreduce": [*base.allreduce, *own.allreduce],
            "excluded": [*base.excluded, *own.excluded],
            "kernels": own.kernels or base.kernels,
            "stack": own.stack or base.stack,
        }
    )


Predict = Callable[[Params, float, float], Array]
"""A term: (parameters, achieved peak FLOP/s, achieved bandwidth) -> predicted seconds."""


@dataclass(frozen=True)
class ObservationSet:
    """Measured times of one operator of one profiled group, and the term predicting them."""

    group: str
    """The source's name."""
    op: str
    """Operator (``gemm:qkv_proj``, ``attention``, ...)."""
    hardware: HardwareSpec
    """The GPU measured."""
    measured: Array
    """Seconds."""
    predict: Predict
    """The term, evaluated at the set's points."""
    weight: float
    """Weight of the whole set in the fit."""
    scaled: bool = True
    """Whether the GPU's fitted DRAM scale applies (not to the small memory-bound operators:
    ``physics_terms.token_time``)."""
    own_stack: bool = True
    """Measured on the stack the model prices (else another stack's profile: it shapes the
    curves, its GPU's scales absorb its level)."""


def sha256(path: Path) -> str:
    """Hex digest of a file (recorded in the parameters' ``fitted_on``)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_model(src: Source) -> ModelSpec:
    """The shape of ``src``'s profiled model: a YAML beside sources.yaml (a shape only the fit
    needs), else a model preset or path."""
    beside = configs_dir() / "physics" / f"{src.model}.yaml"
    return load_model(str(beside) if beside.is_file() else src.model)


def read_source(src: Source, data: Path) -> tuple[list[ObservationSet], list[Path]]:
    """The observation sets of ``src`` (files under ``data``), and the files read."""
    model = source_model(src)
    hw = load_hardware(src.hardware)
    tps = src.tp if isinstance(src.tp, list) else [src.tp]
    out: list[ObservationSet] = []
    files: list[Path] = []
    for tp in tps:
        shape = RankShape.of(model, tp)
        if src.format == "vidur-mlp":
            out += _vidur(src, data / src.path, tp, shape, hw)
            files.append(data / src.path)
        else:
            folder = data / src.path / f"tp{tp}"
            out += _bundle(src, folder, shape, hw)
            files += [folder / f for f in ("dense.csv", "per_sequence.csv", "attention.csv")]
            if shape.moe_layers and (folder / "moe.csv").is_file():
                out.append(_moe(src, folder / "moe.csv", shape, hw))
                files.append(folder / "moe.csv")
    return out, sorted(set(files))


def read_kernels(cfg: KernelDbSources, hardware: str) -> list[ObservationSet]:
    """The observation sets of one database GPU (``kernel_source.py``), on the stack priced."""
    hw = load_gpu(hardware)
    group = f"{hw.name}/kernels"
    return [
        ObservationSet(group, op, hw, measured, predict, cfg.weight * share)
        for op, measured, predict, share in kernel_sets(cfg, hw)
    ]


def _gemm(k: int, n: int, m: Array, dt: int) -> Predict:
    return lambda p, f, b: terms.gemm_time(m, k, n, f, b, p, dt)


def _elem(kind: str, elems: int, m: Array, dt: int) -> Predict:
    return lambda p, f, b: terms.elementwise_time(m, kind, elems, b, p, dt)


def _vidur(src: Source, path: Path, tp: int, shape: RankShape, hw: HardwareSpec) -> list:
    """Vidur's matmuls (its other operators are another stack's kernels: not fitted)."""
    prof = read_vidur_mlp(path, tp)
    names = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj"}
    names.update({"mlp_up_proj": "gate_up_proj", "mlp_down_proj": "down_proj"})
    out = []
    for vidur_name, op in names.items():
        curve = prof.per_layer[vidur_name][1]
        m = np.asarray(curve.xs)
        k, n = shape.gemms()[op]
        out.append(
            ObservationSet(
                f"{src.name}",
                f"gemm:{op}:tp{tp}",
                hw,
                np.asarray(curve.ys),
                _gemm(k, n, m, shape.dtype_bytes),
                VIDUR_WEIGHT,
                own_stack=False,
            )
        )
    return out


def _bundle(src: Source, folder: Path, shape: RankShape, hw: HardwareSpec) -> list:
    """An LLMServingSim bundle's matmuls, memory-bound operators, LM head, sampler and
    attention (its ``qk_norm`` is not priced: see sources.yaml; ``moe.csv``: ``_moe``)."""
    dt, out = shape.dtype_bytes, []
    cols, _ = read_columns(
        folder / "dense.csv", {"layer": "str", "tokens": "int", "time_us": "float"}
    )
    layer, tokens, times = (np.asarray(cols[c]) for c in ("layer", "tokens", "time_us"))
    gemms, elems = shape.gemms(), shape.elementwise()
    for op in sorted(set(cols["layer"])):
        if op in gemms:
            # decode steps (a few to a few hundred tokens) are most of a serving run's steps:
            # the matmuls' memory-bound end weighs as much as all the rest
            for part, rows, weight in (
                ("", (layer == op) & (tokens <= DECODE_TOKENS), 1.0),
                (":large", (layer == op) & (tokens > DECODE_TOKENS), 1.0),
            ):
                m, t = tokens[rows].astype(float), times[rows] * _US
                predict = _gemm(*gemms[op], m, dt)
                out.append(ObservationSet(src.name, op + part, hw, t, predict, weight))
        elif op in elems:
            rows = layer == op
            m, t = tokens[rows].astype(float), times[rows] * _US
            predict = _elem(elems[op][0], elems[op][1], m, dt)
            out.append(ObservationSet(src.name, op, hw, t, predict, 0.1, False))
    out += _per_sequence(src, folder / "per_sequence.csv", shape, hw)
    out += _attention(src, folder / "attention.csv", shape, hw)
    return out


def _moe(src: Source, path: Path, shape: RankShape, hw: HardwareSpec) -> ObservationSet:
    """``moe.csv``: one MoE layer by (tokens on the rank, distinct experts touched), each token
    routed to ``top_k`` of them; predicted as the router's matmul and the experts' grouped
    GEMM (the profiled MoE block is both: ``dense.csv`` has no router)."""
    cols, _ = read_columns(path, {"tokens": "int", "activated_experts": "int", "time_us": "float"})
    m = np.asarray(cols["tokens"], dtype=float)
    experts = np.asarray(cols["activated_experts"], dtype=float)
    measured = np.asarray(cols["time_us"]) * _US
    pairs, (k, n), dt = m * shape.top_k, shape.gemms()["router"], shape.dtype_bytes

    def predict(p: Params, f: float, b: float) -> Array:
        router = terms.gemm_time(m, k, n, f, b, p, dt)
        return np.asarray(router + terms.moe_time(pairs, experts, shape, f, b, p))

    return ObservationSet(src.name, "moe", hw, measured, predict, 1.0)


def _per_sequence(src: Source, path: Path, shape: RankShape, hw: HardwareSpec) -> list:
    cols, _ = read_columns(path, {"layer": "str", "sequences": "int", "time_us": "float"})
    layer, seqs = np.asarray(cols["layer"]), np.asarray(cols["sequences"], dtype=float)
    times = np.asarray(cols["time_us"]) * _US
    head = layer == "lm_head"
    s_head, s_samp = seqs[head], seqs[layer == "sampler"]
    k, n, dt, v = shape.hidden, shape.vocab, shape.dtype_bytes, shape.full_vocab
    return [
        ObservationSet(src.name, "lm_head", hw, times[head], _gemm(k, n, s_head, dt), 1.0),
        ObservationSet(
            src.name,
            "sampler",
            hw,
            times[layer == "sampler"],
            lambda p, f, b: terms.sampler_time(s_samp, v, b, p),
            0.1,
            False,
        ),
    ]


def _attention(src: Source, path: Path, shape: RankShape, hw: HardwareSpec) -> list:
    """Three sets, weighed alike: pure decodes, pure prefills, and the mixed steps (the
    profile's grid holds ~50 mixed points for each pure one)."""
    axes = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
    cols, _ = read_columns(path, {**{a: "int" for a in axes}, "time_us": "float"})
    pc, kvp, nd, kvd = (np.asarray(cols[a], dtype=float) for a in axes)
    measured = np.asarray(cols["time_us"]) * _US
    out = []
    # the serving region (what real steps hold: tens to hundreds of decodes of hundreds to
    # thousands of tokens, chunks of hundreds) weighs 1; the grid's corners 0.2
    core = (kvd >= 256) & (kvd <= 4096) & (nd >= 8) & ((pc == 0) | (pc >= 128))
    mixed = np.zeros(len(pc), dtype=bool)
    mixed[np.flatnonzero((pc > 0) & (nd > 0))[::MIXED_STRIDE]] = True
    for kind, rows, weight in (
        ("decode", (pc == 0) & core, DECODE_WEIGHT),
        ("decode-edge", (pc == 0) & ~core, 0.2),
        ("prefill", nd == 0, 1.0),
        ("mixed", mixed & core, 1.0),
        ("mixed-edge", mixed & ~core, 0.2),
    ):
        # the profile's kv_decode is each decode's context: the term takes the decodes' total
        a = (pc[rows], kvp[rows], pc[rows] * kvp[rows] + pc[rows] * (pc[rows] + 1) / 2)
        b = (nd[rows], nd[rows] * kvd[rows])

        def predict(
            p: Params, f: float, bw: float, a: tuple[Array, ...] = a, b: tuple[Array, ...] = b
        ) -> Array:
            return terms.attention_time(a[0], a[1], a[2], b[0], b[1], shape, f, bw, p)

        out.append(
            ObservationSet(src.name, f"attention:{kind}", hw, measured[rows], predict, weight)
        )
    return out
