"""How far a cost model's step times may be off: the band of its measured held-out step-time
error (``configs/error_bands.yaml``, written by ``benchmarks/error_bands.py`` from operator
and step measurements only), which the model-uncertainty runs put at both ends
(docs/metrics.md, "Model uncertainty")."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simulator.errors import InputError

BANDS_PATH = Path(__file__).resolve().parents[2] / "configs" / "error_bands.yaml"


class Band(BaseModel):
    """The signed relative step-time error (predicted / measured - 1) of one kind of cost
    model, at the ends of its interval."""

    model_config = ConfigDict(extra="forbid")

    low: float = Field(gt=-1, lt=0, allow_inf_nan=False)
    """The error at the band's low end: the model times steps this much too short."""
    high: float = Field(gt=0, lt=10, allow_inf_nan=False)
    """The error at the band's high end: the model times steps this much too long."""
    groups: int = Field(ge=1)
    """Held-out groups (GPU, model, TP degree) the band was measured on."""
    source: str = Field(min_length=1)
    """What was held out and against which measurements."""
    biases: list[float] = Field(default_factory=list)
    """Each held-out group's median signed step-time error, where the band came from them."""

    def scales(self) -> tuple[float, float]:
        """The step-time scales that put a prediction at the band's ends: the true times
        when the model is ``high`` too slow, then when it is ``low`` too fast."""
        return 1.0 / (1.0 + self.high), 1.0 / (1.0 + self.low)


class ErrorBands(BaseModel):
    """Every kind of cost model's band, at one level."""

    model_config = ConfigDict(extra="forbid")

    level: float = Field(gt=0, lt=1)
    """The share of held-out groups a band is to contain (0.9: a 90% interval)."""
    method: str
    """How the bands were derived from the held-out errors."""
    written_by: str
    """The command that wrote the file."""
    bands: dict[str, Band]
    """Cost-model kind (``band_kind``) -> its band."""


@cache
def load_bands(path: Path = BANDS_PATH) -> ErrorBands:
    """The shipped bands (read once)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
        return ErrorBands.model_validate(data)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not a valid error-band file ({err})") from None


def band_kind(cost_model: Any) -> str | None:
    """Which band a cost-model config takes: its ``type``, split for ``physics`` by whether
    its GPU was in the fit (``physics-fitted-gpu``) or priced from its spec sheet alone
    (``physics-unseen-gpu``); None for a model with no measured error (``linear``, one of
    the user's own)."""
    kind = getattr(cost_model, "type", None)
    if kind == "physics":
        from simulator.cost.physics_params import load_params

        params = load_params(cost_model.params)
        return "physics-fitted-gpu" if cost_model.hardware in params.gpus else "physics-unseen-gpu"
    return kind if kind in ("roofline", "profiled", "fitted", "kernels") else None


def band_for(cost_models: list[Any]) -> tuple[str, Band] | None:
    """The band of a scenario's cost models (a cluster's groups may have several: the widest
    ends of theirs), with the kinds it came from; None when one has no measured error."""
    bands = load_bands()
    found: list[tuple[str, Band]] = []
    for cm in cost_models:
        kind = band_kind(cm)
        if kind is None or kind not in bands.bands:
            return None
        found.append((kind, bands.bands[kind]))
    if not found:
        return None
    kinds = "+".join(sorted({k for k, _ in found}))
    low = min(b.low for _, b in found)
    high = max(b.high for _, b in found)
    sources = "; ".join(sorted({f"{k}: {b.source}" for k, b in found}))
    groups = min(b.groups for _, b in found)
    return kinds, Band(low=low, high=high, groups=groups, source=sources)
