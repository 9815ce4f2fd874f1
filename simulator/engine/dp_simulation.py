"""A simulation whose server is ``data_parallel_size`` ranks in lockstep (``lockstep.py``):
the same arrivals, front-end delays and results (speculative decoding's columns and summary
keys included) as a single server's ``Simulation``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.cost.interface import CostModel
from simulator.engine.dp_padding import DPPadding
from simulator.engine.lockstep import LockstepServer
from simulator.engine.recorder import Recorder
from simulator.engine.simulation import Simulation, drafts_of
from simulator.engine.step_sink import MemorySink, StepSink
from simulator.scheduling.interface import Scheduler
from simulator.workload.workload import Workload


class DataParallelSimulation(Simulation):
    """One run of a workload through data-parallel ranks (one scheduler and cost model each;
    ``num_speculative_tokens`` and ``draft_cost`` as a ``Simulation``'s, for every rank)."""

    def __init__(
        self,
        workload: Workload,
        cost_models: list[CostModel],
        ranks: list[Scheduler],
        *,
        step_sink: StepSink | None = None,
        progress: Callable[[int], object] | None = None,
        padding: DPPadding | None = None,
        with_cpu: Callable[[float, int], float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(workload, cost_models[0], ranks[0], progress=progress, **kwargs)
        total = sum(r.num_blocks for r in ranks)
        self.recorder = Recorder(len(workload), total, step_sink or MemorySink())
        on_done = self._slot_freed if self.max_concurrency is not None else None
        k, share = self.num_speculative_tokens, kwargs.get("draft_cost", 0.0)
        self.server = LockstepServer(
            self.env,
            ranks,
            cost_models,
            self.recorder,
            progress=self._tick if self._watch is not None else progress,
            on_done=on_done,
            padding=padding,
            with_cpu=with_cpu,
            async_scheduling=self.serving.async_scheduling,
            on_queued=self._taken_in,
            drafts=[drafts_of(cost, k, share) for cost in cost_models],
        )

    def _taken_in(self, i: int, at: float) -> None:
        """Request ``i`` entered a rank's waiting queue at ``at`` (vLLM's QUEUED stamp: the
        end of the step it arrived in, when the engine loop next reads its input)."""
        self.queued_s[i] = at
