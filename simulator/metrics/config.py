"""The scenario's ``metrics:``: which percentiles the summary reports."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.metrics.summary import DEFAULT_PERCENTILES


class MetricsConfig(BaseModel):
    """What the summary reports."""

    model_config = ConfigDict(extra="forbid")

    percentiles: tuple[float, ...] = Field(default=DEFAULT_PERCENTILES, min_length=1)
    """Percentiles of TTFT, TPOT, ITL, E2E and queue delay in the summary (each in (0, 100]),
    as keys like ``ttft_p99_s`` or ``itl_p99.9_s``."""

    @field_validator("percentiles")
    @classmethod
    def _in_range(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        bad = [p for p in value if not 0 < p <= 100]
        if bad:
            raise ValueError(f"percentiles must be in (0, 100], got {bad}")
        if len(set(value)) != len(value):
            raise ValueError(f"percentiles repeat a value: {list(value)}")
        return tuple(sorted(value))
