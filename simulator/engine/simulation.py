"""The simulation: a simpy clock on which arrivals feed a server; results as DataFrames.

The server's timing rules are in ``server.py`` (and docs/metrics.md). Arrivals that fall on
the same instant as a step's end are handled by simpy in the order they were scheduled (FIFO).

Closed loop (``max_concurrency``, as ``benchmark_serving --max-concurrency``): a request whose
arrival time has come waits while ``max_concurrency`` requests are in flight, and is sent the
instant one of them finishes; its ``arrival_s`` is when it was sent (TTFT starts there, as the
benchmark measures it). A cap that changes over the run (a schedule of clients) changes at its
times; a raised cap sends waiting requests at that instant, a lowered one lets the requests in
flight finish and sends none until they are fewer than the cap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy
from mypy_extensions import mypyc_attr

from simulator.cost.interface import CostModel
from simulator.cost.vision_encoder import EncoderCost
from simulator.engine.clock import sleep_until
from simulator.engine.drafts import DraftCost
from simulator.engine.lockstep import DataParallelRanks, LockstepServer
from simulator.engine.recorder import Recorder
from simulator.engine.result import SimulationResult, rejection_table
from simulator.engine.server import Server
from simulator.engine.server_shape import ServerShape
from simulator.engine.serving import ServingConfig, StepWithCpu
from simulator.engine.step_sink import MemorySink, StepSink
from simulator.engine.tokens import output_checksums
from simulator.engine.watch import RunState, StopRule, Watch
from simulator.metrics import DEFAULT_PERCENTILES, Columns, build_requests, summarize
from simulator.metrics.multimodal import add_mm_metrics
from simulator.scheduling.interface import Scheduler
from simulator.scheduling.sequence import Sequence
from simulator.workload.workload import Workload


@mypyc_attr(allow_interpreted_subclasses=True)  # a user's run may extend it
class Simulation:
    """One run of a workload through a scheduler and a cost model on a simpy clock, or
    through data-parallel ranks in lockstep (``dp``: ``scheduler`` and ``cost_model`` are
    then its rank 0's, and ``num_speculative_tokens`` and ``draft_cost`` every rank's)."""

    def __init__(
        self,
        workload: Workload,
        cost_model: CostModel,
        scheduler: Scheduler,
        *,
        slo: dict[str, float | None] | None = None,
        progress: Callable[[int], object] | None = None,
        fast_decode: bool = True,
        max_concurrency: int | list[tuple[float, int]] | None = None,
        percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
        step_sink: StepSink | None = None,
        serving: ServingConfig | None = None,
        stop: StopRule | None = None,
        num_speculative_tokens: int = 0,
        draft_cost: float = 0.0,
        dp: DataParallelRanks | None = None,
    ) -> None:
        self.workload = workload
        self.slo = slo
        self.serving = serving or ServingConfig()
        self._delay = self.serving.frontend_delay_ms * 1e-3
        self.percentiles = percentiles
        caps = [(0.0, max_concurrency)] if isinstance(max_concurrency, int) else max_concurrency
        self.max_concurrency = None if caps is None else caps[0][1]
        """The closed loop's cap now (None: open loop)."""
        self._cap_changes = [] if caps is None else caps[1:]
        self._next_cap = self._cap_changes[0][0] if self._cap_changes else float("inf")
        self.env = simpy.Environment()
        num_blocks = scheduler.num_blocks if dp is None else dp.num_blocks
        self.recorder = Recorder(len(workload), num_blocks, step_sink or MemorySink())
        self.arrival_s = workload.arrival_s.copy()
        """When each request reached the server (later than drawn when it waited for a slot)."""
        self.queued_s = workload.arrival_s + self._delay
        """When each request entered the engine's queue: ``serving.frontend_delay_ms`` later."""
        self._next_arrival = 0.0  # when the arrival process next wakes up
        self._in_flight = 0
        self._arrivals_done = False
        self._backlog: deque[int] = deque()  # due requests waiting for a concurrency slot
        self._num_sent = 0
        # A stop rule reads arrival order as drawn: a closed loop sends requests later than
        # drawn, so it is not watched (never stopped early)
        self._watch = Watch(stop, len(workload)) if stop and caps is None else None
        self._progress = progress
        self.num_speculative_tokens = num_speculative_tokens
        """Drafts per decode step (the scheduler's); > 0 adds speculative decoding's columns
        and summary keys (k = 0: the run without speculation, tables and all)."""
        self._prompt = workload.prompt_len.tolist()
        self._output = workload.output_len.tolist()
        told = self._tick if self._watch is not None else progress
        on_done = self._slot_freed if caps is not None else None
        drafts = (num_speculative_tokens, draft_cost)
        self.server = self._server(scheduler, cost_model, dp, fast_decode, told, on_done, drafts)

    def _server(
        self,
        scheduler: Scheduler,
        cost_model: CostModel,
        dp: DataParallelRanks | None,
        fast_decode: bool,
        progress: Callable[[int], object] | None,
        on_done: Callable[[int, float], object] | None,
        drafts: tuple[int, float],
    ) -> ServerShape:
        """The server the run feeds: one, or data-parallel ranks in lockstep (``dp``)."""
        if dp is not None:
            return LockstepServer(
                self.env,
                dp,
                self.recorder,
                progress=progress,
                on_done=on_done,
                async_scheduling=self.serving.async_scheduling,
                on_queued=self._taken_in,
                drafts=[drafts_of(c, *drafts) for c in dp.cost_models],
            )
        return Server(
            self.env,
            scheduler,
            cost_model,
            self.recorder,
            # a plain lambda without a schedule: the windows read it once per step
            next_arrival=self._bound if self._cap_changes else lambda: self._next_arrival,
            progress=progress,
            fast_decode=fast_decode,
            on_done=on_done,
            drafts=drafts_of(cost_model, *drafts),
        )

    def price_encoder(self, cost: EncoderCost | None) -> None:
        """Add the vision encoder's time to the steps that encode images."""
        assert isinstance(self.server, Server), "multimodal runs are not data parallel"
        self.server.encoder = cost

    def _bound(self) -> float:
        """The next instant the server's windows must not pass: an arrival or a change of cap
        (the latter infinite without a schedule)."""
        return min(self._next_arrival, self._next_cap)

    def _tick(self, num: int) -> None:
        """Requests finished or were rejected: progress, and the stop rule when due."""
        if self._progress is not None:
            self._progress(num)
        if self._watch is not None:
            self._watch.tick(self._state)

    def _state(self) -> RunState:
        rec = self.recorder
        return RunState(
            now=self.env.now,
            arrival_s=self.arrival_s,
            num_arrived=self._num_sent,
            first_scheduled=rec.first_scheduled,
            first_token=rec.first_token,
            finish=rec.finish,
            rejected=[i for i, _ in rec.rejected],
        )

    def _taken_in(self, i: int, at: float) -> None:
        """Request ``i`` entered a DP rank's waiting queue at ``at`` (vLLM's QUEUED stamp: the
        end of the step it arrived in, when the engine loop next reads its input)."""
        self.queued_s[i] = at

    def _send(self, i: int, at: float) -> None:
        """Hand request ``i`` to the engine's queue at time ``at``: the front end's delay after
        it reached the server (a constant: the order is the arrival order)."""
        self.queued_s[i] = at
        self.arrival_s[i] = at - self._delay if self._delay else at
        self._num_sent += 1
        if self._watch is not None:
            self._watch.tick(self._state)
        self._in_flight += 1
        priority, runs, mm = self.workload.priority, self.workload.prompt_runs, self.workload.mm
        seq = Sequence(
            i,
            int(self._prompt[i]),
            int(self._output[i]),
            priority=0 if priority is None else int(priority[i]),
            prompt_runs=None if runs is None else runs.runs(i),
            mm_items=() if mm is None else mm.items(i),
        )
        if not self.server.submit(seq):
            self._slot_freed(1, at)  # rejected: it is not in flight
            return
        # vLLM's engine loop takes requests in (its QUEUED stamp) only between steps: a
        # request sent while a step runs is queued as that step ends. Stamped so with the
        # loop's async scheduling (data-parallel ranks always, engine/lockstep.py); a plain
        # server's (and a cluster's) stamp stays its arrival at the engine
        server = self.server
        if isinstance(server, Server) and server.plans_ahead and server.busy_until > at:
            self.queued_s[i] = server.busy_until

    def _slot_freed(self, num_done: int, at: float) -> None:
        """``num_done`` requests ended at ``at`` (inside a decode window, ``at`` may be ahead
        of the clock): send waiting ones at once, so both paths see them at the same step."""
        self._in_flight -= num_done
        while self._backlog and self._in_flight < (self.max_concurrency or 0):
            self._send(self._backlog.popleft(), at)
        self._close_when_sent()

    def _arrivals(self) -> simpy.events.ProcessGenerator:
        env = self.env
        for i, t in enumerate(self.queued_s.tolist()):
            if t > env.now:
                # the instant simpy will resume us, which the server's windows must not pass
                self._next_arrival, wake = sleep_until(env, t)
                yield wake
            limit = self.max_concurrency  # read each time: a schedule changes it
            if limit is not None and (self._backlog or self._in_flight >= limit):
                self._backlog.append(i)
            else:
                self._send(i, env.now)
        self._next_arrival = float("inf")
        self._arrivals_done = True
        self._close_when_sent()

    def _caps(self) -> simpy.events.ProcessGenerator:
        """Change the closed loop's cap at each time of its schedule."""
        for t, cap in self._cap_changes:
            self._next_cap, wake = sleep_until(self.env, t)
            yield wake
            self.max_concurrency = cap
            self._slot_freed(0, self.env.now)  # a raised cap sends waiting requests now
        self._next_cap = float("inf")

    def _close_when_sent(self) -> None:
        """Close the server once every request was sent (those waiting for a concurrency
        slot are sent by ``_slot_freed``)."""
        if self._arrivals_done and not self._backlog:
            self.server.close()

    def run(self) -> SimulationResult:
        """Simulate until every request has finished or been rejected."""
        self.env.process(self._arrivals())
        if self._cap_changes:
            self.env.process(self._caps())
        server = self.env.process(self.server.run())
        self.env.run(until=server)
        return self._result()

    def _result(self) -> SimulationResult:
        rec = self.recorder
        steps = rec.close()
        rejected_ids = [i for i, _ in rec.rejected]
        check_token_count(rec.num_tokens, self.workload.output_len, rejected_ids)
        requests = build_requests(
            self.workload,
            arrival=self.arrival_s,
            queued=self.queued_s,
            first_scheduled=np.array(rec.first_scheduled),
            first_token=np.array(rec.first_token),
            finish=np.array(rec.finish),
            num_preemptions=np.array(rec.num_preemptions, dtype=np.int64),
            num_cached_tokens=np.array(rec.cached_tokens, dtype=np.int64),
            rejected=rejected_ids,
            response_delay=self.serving.response_delay_ms * 1e-3,
        )
        summary = summarize(
            requests, rec.step_stats, rec.itl, self.slo, self.percentiles, rec.tier_hits
        )
        if self.num_speculative_tokens:
            add_spec_metrics(requests, summary, rec)
        if self.workload.mm is not None:
            add_mm_metrics(requests, summary, self.workload.mm, rec.encoded)
        return SimulationResult(
            request_table=requests,
            steps=steps,
            summary=summary,
            rejected_table=rejection_table(rec.rejected),
            checksums=output_checksums(np.array(rec.num_output, dtype=np.int64)),
        )


def check_token_count(num_tokens: int, output_len: np.ndarray, rejected: list[int]) -> None:
    """The run sampled exactly the tokens its finished requests asked for: a preemption that
    redid a sample (instead of recomputing KV only) would show up here, whatever the tokens.
    (The server checks each request's own count when it finishes.)"""
    want = int(np.asarray(output_len, dtype=np.int64).sum())
    want -= int(np.asarray(output_len, dtype=np.int64)[rejected].sum())
    if num_tokens != want:
        raise RuntimeError(f"the run sampled {num_tokens} tokens, expected {want} (scheduler bug)")


def drafts_of(cost_model: CostModel, k: int, draft_cost: float) -> DraftCost | None:
    """The drafter's time per step (``k`` passes of ``draft_cost`` of a decode step), priced
    on the GPU's model (not the CPU's share); None when it costs nothing."""
    if not draft_cost or not k:
        return None
    gpu = cost_model.gpu if isinstance(cost_model, StepWithCpu) else cost_model
    return DraftCost(gpu, k, draft_cost)


def add_spec_metrics(requests: Columns, summary: dict[str, object], rec: Recorder) -> None:
    """Speculative decoding's columns (drafts verified and accepted per request) and summary
    keys: ``spec_acceptance_rate`` (accepted / verified drafts) and
    ``spec_mean_acceptance_length`` (tokens a sequence gains per verify step, the bonus token
    included: vLLM's mean acceptance length)."""
    n = len(requests)
    zeros = [0] * n
    drafts = np.array(rec.num_draft_tokens or zeros, dtype=np.int64)
    accepted = np.array(rec.num_accepted_tokens or zeros, dtype=np.int64)
    verifies = int(sum(rec.num_verify_steps or zeros))
    requests["num_draft_tokens"] = drafts
    requests["num_accepted_tokens"] = accepted
    total, good = int(drafts.sum()), int(accepted.sum())
    summary["spec_acceptance_rate"] = good / total if total else float("nan")
    summary["spec_mean_acceptance_length"] = 1 + good / verifies if verifies else float("nan")
