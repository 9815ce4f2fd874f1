"""The simulation: a simpy clock on which arrivals feed a server; results as DataFrames.

The server's timing rules are in ``server.py`` (and docs/metrics.md). Arrivals that fall on
the same instant as a step's end are handled by simpy in the order they were scheduled (FIFO).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import simpy

from simulator.cost.interface import CostModel
from simulator.engine.recorder import (
    STEP_INT_FIELDS,
    Recorder,
    check_token_counts,
    token_times,
)
from simulator.engine.result import SimulationResult
from simulator.engine.server import Server
from simulator.metrics import build_requests, build_steps, summarize
from simulator.scheduling.interface import Scheduler
from simulator.scheduling.sequence import Sequence
from simulator.workload.workload import Workload


class Simulation:
    """One run of a workload through a scheduler and a cost model on a simpy clock."""

    def __init__(
        self,
        workload: Workload,
        cost_model: CostModel,
        scheduler: Scheduler,
        *,
        slo: dict[str, float | None] | None = None,
        progress: Callable[[int], object] | None = None,
        fast_decode: bool = True,
    ) -> None:
        self.workload = workload
        self.slo = slo
        self.env = simpy.Environment()
        self.recorder = Recorder(len(workload))
        self._next_arrival = 0.0  # when the arrival process next wakes up
        self.server = Server(
            self.env,
            scheduler,
            cost_model,
            self.recorder,
            next_arrival=lambda: self._next_arrival,
            progress=progress,
            fast_decode=fast_decode,
        )

    def _arrivals(self) -> simpy.events.ProcessGenerator:
        env, server = self.env, self.server
        arrival = self.workload.arrival_s.tolist()
        prompt = self.workload.prompt_len.tolist()
        output = self.workload.output_len.tolist()
        for i, t in enumerate(arrival):
            if t > env.now:
                # the instant simpy will resume us (now + delay), which the server's decode
                # windows must not step past
                self._next_arrival = env.now + (t - env.now)
                yield env.timeout(t - env.now)
            server.submit(Sequence(i, int(prompt[i]), int(output[i])))
        self._next_arrival = float("inf")
        server.close()

    def run(self) -> SimulationResult:
        """Simulate until every request has finished or been rejected."""
        self.env.process(self._arrivals())
        server = self.env.process(self.server.run())
        self.env.run(until=server)
        return self._result()

    def _result(self) -> SimulationResult:
        rec = self.recorder
        n = len(self.workload)
        times, ints = rec.step_arrays()
        steps = build_steps(times, ints, STEP_INT_FIELDS, self.server.scheduler.num_blocks)
        ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
        ids, per_step = rec.token_arrays()
        first_token, itl = token_times(ids, per_step, ends, n)
        rejected_ids = [i for i, _ in rec.rejected]
        check_token_counts(ids, self.workload.output_len, rejected_ids)
        requests = build_requests(
            self.workload,
            first_scheduled=np.array(rec.first_scheduled),
            first_token=first_token,
            finish=np.array(rec.finish),
            num_preemptions=np.array(rec.num_preemptions, dtype=np.int64),
            rejected=rejected_ids,
        )
        rejected = pd.DataFrame(
            {
                "request_id": pd.Series(rejected_ids, dtype="int64"),
                "reason": pd.Series([r for _, r in rec.rejected], dtype="object"),
            }
        )
        return SimulationResult(
            requests=requests,
            steps=steps,
            summary=summarize(requests, steps, itl, self.slo),
            rejected=rejected,
            checksums=np.array(rec.checksum, dtype=np.int64),
        )
