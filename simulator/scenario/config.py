"""A scenario: everything a run needs, validated by pydantic and loaded from YAML."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simulator.cluster.config import ClusterConfig
from simulator.cost import CostModelConfig
from simulator.engine.parallel import ParallelConfig
from simulator.engine.serving import ServingConfig
from simulator.errors import InputError
from simulator.field_errors import format_validation_error
from simulator.metrics.config import MetricsConfig
from simulator.scheduling.config import SchedulerConfig
from simulator.scheduling.spec_config import SpeculativeConfig
from simulator.strict_types import find_loose_scalar
from simulator.workload.config import WorkloadConfig
from simulator.yaml_file import parse_yaml, read_yaml_file


class SLOConfig(BaseModel):
    """Latency targets; a request meets the SLO when it meets every one given."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(default=None, gt=0)
    """Time to first token, in milliseconds."""
    tpot_ms: float | None = Field(default=None, gt=0)
    """Time per output token after the first, in milliseconds."""
    e2e_ms: float | None = Field(default=None, gt=0)
    """End-to-end latency, in milliseconds."""


def _plans_ahead(model: Any) -> bool:
    """Whether any scheduler config inside ``model`` asks for async scheduling."""
    if isinstance(model, SchedulerConfig):
        return model.async_scheduling
    if isinstance(model, BaseModel):
        return any(_plans_ahead(getattr(model, name)) for name in type(model).model_fields)
    if isinstance(model, list | tuple):
        return any(_plans_ahead(item) for item in model)
    return False


class ScenarioConfig(BaseModel):
    """One simulation: server, cost model, workload, and optional SLOs."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    """Scenario name; names the default output folder."""
    seed: int = Field(default=0, ge=0)
    """Root of every random stream (one ``SeedSequence``)."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """The scheduler's policy and budgets; left out, the ``spec`` policy with ``vllm serve``'s
    budgets for the cost model's GPU and the KV cache its memory holds."""
    cost_model: CostModelConfig
    """How long a step takes: ``linear``, ``roofline``, ``fitted``, ``profiled``, ``physics``
    or ``kernels``; with ``model`` and ``hardware`` but no ``type``, ``kernels`` where the
    kernel database measured the GPU, else ``physics``."""
    workload: WorkloadConfig
    """Synthetic arrivals and lengths, or a trace to replay."""
    serving: ServingConfig = Field(default_factory=ServingConfig)
    """Serving overheads around the engine's steps: front end, per-step CPU, response."""
    slo: SLOConfig | None = None
    """Latency targets for goodput (optional)."""
    metrics: MetricsConfig = MetricsConfig()
    """What the summary reports."""
    cluster: ClusterConfig | None = None
    """Several replicas behind a router, or prefill/decode disaggregation (optional; without
    it, one server with ``scheduler`` and ``cost_model``)."""
    parallel: ParallelConfig | None = None
    """Data-parallel ranks (and expert parallelism) of the one server, as vLLM runs them
    (optional; not with ``cluster``)."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (optional; policy ``vllm-v1``, one server or its data-parallel
    ranks, not a cluster): drafts per decode step and how many are accepted."""

    @model_validator(mode="after")
    def _speculation_supported(self) -> ScenarioConfig:
        if self.speculative is not None:
            if self.scheduler.policy != "vllm-v1":
                raise ValueError("speculative: needs scheduler.policy 'vllm-v1' (as vLLM does it)")
            if self.cluster is not None:
                raise ValueError("speculative: not supported with cluster yet")
        if self.cluster is not None and _plans_ahead(self.cluster):
            raise ValueError("cluster: a replica's scheduler.async_scheduling is not supported yet")
        if self.scheduler.async_scheduling:
            if self.cluster is not None:
                raise ValueError("scheduler.async_scheduling: not supported with cluster yet")
            if not self.serving.async_scheduling:
                raise ValueError(
                    "scheduler.async_scheduling: true contradicts serving.async_scheduling: "
                    "false (the CPU's step work overlaps the GPU's exactly when it plans ahead)"
                )
        if self.scheduler.kv_offload is not None and (
            self.speculative is not None or self.scheduler.async_scheduling
        ):
            raise ValueError(
                "scheduler.kv_offload: not supported with speculative decoding or "
                "scheduler.async_scheduling yet"
            )
        return self

    @model_validator(mode="after")
    def _parallel_single_server(self) -> ScenarioConfig:
        if self.parallel is not None and self.parallel.is_data_parallel and self.cluster:
            raise ValueError("parallel.data_parallel_size > 1 is not supported with cluster yet")
        return self

    @model_validator(mode="after")
    def _delays_open_loop_only(self) -> ScenarioConfig:
        # closed loop: a slot frees when the client has the response and the next request
        # needs the front end again; the engine's exact send times do not model that yet
        delays = self.serving.frontend_delay_ms or self.serving.response_delay_ms
        if self.workload.concurrency_caps is not None and delays:
            raise ValueError(
                "serving.frontend_delay_ms and response_delay_ms are not supported with "
                "workload.max_concurrency or max_concurrency_schedule yet (set them to 0)"
            )
        return self


def parse_value(text: str) -> Any:
    """A ``--set`` value: YAML scalars and lists (``3``, ``0.5``, ``true``, ``[1, 2]``, ``abc``)."""
    try:
        return parse_yaml(text)
    except yaml.YAMLError:
        return text


DISCRIMINATORS = ("dist", "type")
"""Keys that choose a variant (a length distribution, a cost model): overriding one with
another value replaces its mapping, whose other keys belonged to the old variant."""


def _variants_first(overrides: dict[str, Any]) -> list[tuple[str, Any]]:
    """The overrides with variant choices first, so a new variant's keys land in it."""
    chooses = [(k, v) for k, v in overrides.items() if k.rsplit(".", 1)[-1] in DISCRIMINATORS]
    return chooses + [(k, v) for k, v in overrides.items() if (k, v) not in chooses]


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    """Set each dotted key in a copy of ``data``, creating mappings on the way; setting a
    ``dist`` or ``type`` to a new value first drops the old variant's other keys."""
    out = copy.deepcopy(data)
    for key, value in _variants_first(overrides):
        parts = key.split(".")
        if not all(parts):
            raise InputError(f"{source}: --set {key}: empty part in dotted key")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise InputError(f"{source}: --set {key}: {where} is not a mapping")
            node = child
        if parts[-1] in DISCRIMINATORS and parts[-1] in node and node[parts[-1]] != value:
            node.clear()  # the old variant's parameters do not apply to the new one
        node[parts[-1]] = value
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", ...]`` -> ``{"a.b": 1}``; a malformed item is an InputError naming it."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected dotted.key=value")
        out[key.strip()] = parse_value(value)
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from a file, or an InputError naming the file and the reason."""
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of scenario keys at the top level")
    return data


def validate(data: dict[str, Any], source: str) -> ScenarioConfig:
    """A ScenarioConfig from plain data, or an InputError naming ``source`` and the field."""
    try:
        cfg = ScenarioConfig.model_validate(data)
    except ValidationError as err:
        raise InputError(format_validation_error(err, source, data, ScenarioConfig)) from None
    loose = find_loose_scalar(data, cfg)
    if loose:
        raise InputError(f"{source}: {loose}")
    return cfg


def load_scenario(path: str | Path, overrides: dict[str, Any] | None = None) -> ScenarioConfig:
    """Read a scenario YAML, apply dotted ``--set`` overrides, and validate it."""
    data = read_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides, str(path))
    return validate(data, str(path))


def dump_scenario(cfg: BaseModel) -> str:
    """The resolved scenario as YAML (every default spelled out)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
