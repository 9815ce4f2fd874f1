"""Time a server spends outside the GPU's steps: the front end before a request reaches the
engine's queue, the CPU's work in every step (overlapped with the GPU's under async
scheduling), and the way back from a sampled token to the client. Each timestamp they move is
defined in docs/metrics.md; the values for a vLLM stack, and where they come from, are in
docs/cost_models.md."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.batch import Batch, StepSums
from simulator.cost.interface import CostModel

_MS = 1e-3
_US = 1e-6
HOUR_MS = 3_600_000.0
"""The most a serving delay may be: an hour (milliseconds of a web stack, not a queue)."""


class ServingConfig(BaseModel):
    """Serving overheads around the engine's steps. Every default is 0: the engine alone, as
    the scheduler spec and the cost models' measurements see it."""

    model_config = ConfigDict(extra="forbid")

    frontend_delay_ms: float = Field(default=0.0, ge=0, le=HOUR_MS, allow_inf_nan=False)
    """From a request's arrival at the API server to its entry in the engine's waiting queue
    (HTTP, tokenization, input processing, IPC to the engine), ms. Counts in TTFT and E2E."""
    step_cpu_ms: float = Field(default=0.0, ge=0, le=HOUR_MS, allow_inf_nan=False)
    """CPU time of every step (scheduling, input preparation, output processing), ms."""
    step_cpu_per_seq_us: float = Field(default=0.0, ge=0, le=HOUR_MS * 1e3, allow_inf_nan=False)
    """CPU time per scheduled sequence of a step (its share of the same work), microseconds."""
    async_scheduling: bool = True
    """The CPU prepares a step while the GPU runs the previous one (vLLM's async scheduling,
    vLLM 0.19's default): a step takes ``max(GPU, CPU)``; False: ``GPU + CPU``."""
    response_delay_ms: float = Field(default=0.0, ge=0, le=HOUR_MS, allow_inf_nan=False)
    """From a token's sampling at the end of a step to the client receiving it
    (detokenization, output processing, streaming), ms. Counts in TTFT and E2E, not in TPOT."""

    gpu_time_scale: float = Field(default=1.0, gt=0, le=1000, allow_inf_nan=False)
    """Every step's GPU time multiplied by this: a what-if for GPUs slower (> 1) or faster
    (< 1) than the cost model says. ``servesim run`` and ``capacity`` set it at the ends of
    the cost model's measured error band for their model-uncertainty runs (docs/metrics.md)."""

    @property
    def has_step_cpu(self) -> bool:
        """Whether steps carry any CPU time."""
        return self.step_cpu_ms > 0 or self.step_cpu_per_seq_us > 0

    @property
    def changes_steps(self) -> bool:
        """Whether a step's time on the server differs from its GPU time (``StepWithCpu``)."""
        return self.has_step_cpu or self.gpu_time_scale != 1.0


class StepWithCpu(CostModel):
    """A step's duration on the server: the GPU's time from ``gpu`` (times
    ``gpu_time_scale``) and the CPU's per-step work, overlapped (``max``) under async
    scheduling, else in sequence (``+``)."""

    def __init__(self, gpu: CostModel, serving: ServingConfig) -> None:
        self.gpu = gpu
        """The cost model timing the GPU's part of a step."""
        self.times_from_sums = gpu.times_from_sums
        self._fixed = serving.step_cpu_ms * _MS
        self._per_seq = serving.step_cpu_per_seq_us * _US
        self._overlap = serving.async_scheduling
        self._scale = serving.gpu_time_scale

    def _with_cpu(self, gpu: float, num_seqs: int) -> float:
        gpu *= self._scale
        cpu = self._fixed + self._per_seq * num_seqs
        return (gpu if gpu >= cpu else cpu) if self._overlap else gpu + cpu

    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes on the server."""
        return self._with_cpu(self.gpu.step_time(batch), len(batch.new_tokens))

    def time_sums(self, sums: StepSums) -> float:
        """``step_time`` of a step, from its sums (when the GPU model allows it)."""
        return self._with_cpu(self.gpu.time_sums(sums), sums[0])
