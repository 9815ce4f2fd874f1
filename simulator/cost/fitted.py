"""The ``fitted`` cost model: roofline-shaped features of a step, weighted by coefficients that
``servesim calibrate`` fits to measured step times (``simulator/cost/calibration/``).

Every feature is a time in milliseconds *at the GPU's peak* (or a count), so a fitted
coefficient reads as an inverse efficiency (``gemm: 2.0`` = GEMMs run at 50% of the roofline) or
as a fixed cost in ms (``overhead``, ``prefill_step``, ``per_prefill_seq``, ``per_decode_seq``).
Coefficients are never negative: each feature is work that can only add time. Formulas and the
measured accuracy: ``docs/fidelity.md``.

A preset file holds the per-GPU constants (``scales``) next to the coefficients, so a fitted
model is self-contained: it does not re-read the model or hardware presets it was fitted for.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from simulator.cost.batch import Batch, StepSums
from simulator.cost.features import (
    FEATURES,
    Array,
    FeatureScales,
    batch_features,
    step_features,
    uniform_features,
)
from simulator.cost.interface import CostModel
from simulator.cost.presets import load_yaml_model, preset_names, resolve_preset

# On a step of >= 1 sequence these features are never below the given floor (features.py):
# overhead 1; gemm max(matmul, weight read) >= weight_read_ms; kv_read (context + tokens) >= 1
# token; attention >= 1 query-key pair. gemm_large is left out: it fades to ~0 on small steps.
_ALWAYS = ("overhead", "gemm", "kv_read", "attention")


def zero_time_steps(coefficients: dict[str, float], scales: FeatureScales) -> list[tuple[str, str]]:
    """The step kinds (decode-only, prefill-only) that ``coefficients`` could time at 0 s,
    each with the coefficients that would make it take time; empty if every step takes time."""
    floors = {
        "overhead": 1.0,
        "gemm": scales.weight_read_ms,
        "kv_read": scales.kv_read_ms_per_token,
        "attention": scales.attention_ms_per_pair,
        # a decode-only step has >= 1 decode; a prefill-only one a prefill and >= 1 prefill seq
        "per_decode_seq": 1.0,
        "prefill_step": 1.0,
        "per_prefill_seq": 1.0,
    }
    kinds = (
        ("decode-only", ("per_decode_seq",)),
        ("prefill-only", ("prefill_step", "per_prefill_seq")),
    )
    out = []
    for kind, own in kinds:
        # seconds, as the engine sees it: one term > 0 s is enough (every term is >= 0)
        terms = [coefficients.get(f, 0.0) * floors[f] * 1e-3 for f in (*own, *_ALWAYS)]
        if max(terms) <= 0:
            out.append((kind, f"{' or '.join(own)} (or one of {', '.join(_ALWAYS)})"))
    return out


class FittedPreset(BaseModel):
    """A fitted cost-model preset file (``configs/fitted/<name>.yaml``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Short identifier, e.g. ``llama-2-70b_a100-80gb_tp8``."""
    model: str
    """Model preset the features were computed for."""
    hardware: str
    """Hardware preset the features were computed for."""
    tp: int = Field(ge=1)
    """Tensor-parallel degree of the measurements."""
    stack: str = ""
    """The serving stack (hardware, software, year) the measurements timed: a fit times
    that stack, not today's; a run with a preset that names one says so once."""
    scales: FeatureScales
    """Per-GPU roofline constants (ms) that turn a step into feature values."""
    coefficients: dict[str, float]
    """Fitted weight per feature: ms for ``overhead`` and ``per_*_seq``, else a multiplier."""
    source: dict[str, Any] = Field(default_factory=dict)
    """Where the measurements came from (file, repository, commit, group, rows)."""
    heldout: dict[str, Any] = Field(default_factory=dict)
    """k-fold held-out error of this fitting recipe on its data, per step kind."""
    notes: str = ""
    """Free text: caveats of the data or of the fit."""

    @field_validator("coefficients")
    @classmethod
    def _known_nonnegative(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown feature(s) {unknown}; known: {list(FEATURES)}")
        bad = {k: v for k, v in value.items() if not (math.isfinite(v) and v >= 0)}
        if bad:
            raise ValueError(f"coefficients must be finite and >= 0, got {bad}")
        if not any(v > 0 for v in value.values()):
            raise ValueError("at least one coefficient must be > 0")
        return value

    @field_validator("coefficients")
    @classmethod
    def _every_step_takes_time(
        cls, value: dict[str, float], info: ValidationInfo
    ) -> dict[str, float]:
        """Refuse coefficients under which some step of >= 1 sequence would take 0 s (the
        engine would stop mid-run), naming the coefficients that would fix it."""
        scales = info.data.get("scales")
        if scales is None:  # invalid scales: that error is reported instead
            return value
        missing = zero_time_steps(value, scales)
        if missing:
            kind, fix = missing[0]
            raise ValueError(f"a {kind} step would take no time; set {fix} > 0")
        return value


class FittedCostConfig(BaseModel):
    """Cost model from a fitted preset (``servesim calibrate`` writes those)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["fitted"] = "fitted"
    """Discriminator of the cost-model union."""
    path: str
    """Preset name under ``configs/fitted/`` (without ``.yaml``) or a path to a preset YAML."""


class FittedCostModel(CostModel):
    """Step time = sum of fitted coefficient x feature (ms), returned in seconds."""

    times_from_sums = True

    def __init__(self, preset: FittedPreset) -> None:
        """Keep the preset and its coefficients in ``FEATURES`` order."""
        self.preset = preset
        self.scales = preset.scales
        self._coef = [preset.coefficients.get(name, 0.0) for name in FEATURES]

    def step_ms(self, batch: Batch) -> float:
        """Milliseconds the step takes (0 for an empty batch)."""
        if not batch.new_tokens:
            return 0.0
        feats = batch_features(batch, self.scales)
        return float(sum(c * f for c, f in zip(self._coef, feats, strict=True)))

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes (0 for an empty batch)."""
        return self.step_ms(batch) * 1e-3

    def time_sums(self, sums: StepSums) -> float:
        """Seconds of a step with these sums: exactly ``step_time`` of its batch, without
        building it."""
        num_seqs, num_decodes, num_tokens, context, _, pairs = sums
        feats = step_features(num_seqs, num_decodes, num_tokens, context, pairs, self.scales)
        return float(sum(c * f for c, f in zip(self._coef, feats, strict=True))) * 1e-3

    def predict_ms(self, num_seqs: Array, new_tokens: Array, context_len: Array) -> Array:
        """Milliseconds of uniform batches, vectorised (what ``servesim predict`` uses)."""
        x = uniform_features(num_seqs, new_tokens, context_len, self.scales)
        return np.asarray(x @ np.asarray(self._coef), dtype=float)


def list_fitted() -> list[str]:
    """Names of the shipped fitted presets, sorted."""
    return preset_names("fitted")


def load_preset(name_or_path: str) -> FittedPreset:
    """Read and validate a fitted preset; any problem -> ``InputError`` naming the file."""
    return load_yaml_model(resolve_preset("fitted", name_or_path), FittedPreset)


def load_fitted(cfg: FittedCostConfig) -> FittedCostModel:
    """The cost model of a fitted preset; a bad or missing file -> ``InputError`` naming it."""
    return FittedCostModel(load_preset(cfg.path))


def stack_warning(cost_model: object) -> str | None:
    """What a run with a fitted preset that names its measured stack models, in one line
    (None for any other cost model): a fit times that stack, not today's."""
    if not isinstance(cost_model, FittedCostConfig):
        return None
    preset = load_preset(cost_model.path)
    if not preset.stack:
        return None
    return f"cost_model: fitted preset {preset.name} times the stack measured: {preset.stack}"
