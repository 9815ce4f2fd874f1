"""One inference server on the simpy clock: its scheduler's steps, timed by its cost model.

Timing rules (also in docs/metrics.md):

- A step is ``schedule()`` -> cost model -> ``timeout(duration)`` -> ``update()``. Tokens sampled
  in a step exist at the step's END.
- A request submitted while a step runs joins the scheduler at once, but ``schedule()`` only
  runs at step boundaries, so it is first seen by the next step. When an arrival and a step's
  end fall on the same instant, simpy runs them in the order they were scheduled (FIFO), which
  is deterministic; the arrival is then either in that step's ``update()`` window (harmless:
  it is not in the plan) or before the next ``schedule()``: either way the next step sees it.
- An idle server sleeps on an event that the next submission triggers: no polling, no ticks.
- Steps the scheduler can plan in O(what changed) are taken back to back under one simpy
  timeout until the next arrival could change a decision (``fast_window.py``), timed from
  their sums without building their batch. Every step still gets its own row, whoever reads
  the server sees what a step-by-step run shows at that instant, and the results are
  identical to stepping through ``schedule()`` and ``update()`` (``fast_decode=False``; the
  tests compare the two).
- Speculative decoding (``draft_cost``) takes the plain path. Under async scheduling step
  ``n + 1`` is planned when step ``n`` starts, before its tokens are known (vLLM's batch
  queue of two), and starts when step ``n`` ends, right after its ``update()``: a request
  arriving while step ``n`` runs is first seen by step ``n + 2``'s plan (``ahead.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from simulator.cost.batch import Batch
from simulator.cost.interface import CostModel
from simulator.cost.vision_encoder import EncoderCost
from simulator.engine.ahead import Ahead
from simulator.engine.drafts import DraftCost
from simulator.engine.fast_window import FastWindow, Final, Retire
from simulator.engine.held import Held
from simulator.engine.kv_loads import KVLoads
from simulator.engine.recorder import NO_MOVES, Recorder
from simulator.engine.server_shape import Outcomes, step_counts
from simulator.scheduling.interface import Scheduler, StepPlan
from simulator.scheduling.sequence import Sequence


class Server:
    """A scheduler and a cost model stepping on ``env``, recording into ``recorder`` (a
    ``ServerShape``)."""

    encoder: EncoderCost | None = None
    """The vision encoder's time on the steps that encode images (None: none is priced)."""

    def __init__(
        self,
        env: simpy.Environment,
        scheduler: Scheduler,
        cost_model: CostModel,
        recorder: Recorder,
        *,
        next_arrival: Callable[[], float],
        progress: Callable[[int], object] | None = None,
        fast_decode: bool = True,
        on_done: Callable[[int, float], object] | None = None,
        retire: Retire | None = None,
        drafts: DraftCost | None = None,
        holds: bool = False,
    ) -> None:
        self.env, self.recorder = env, recorder
        self._scheduler, self._cost_model = scheduler, cost_model
        self._outcomes = Outcomes(recorder, progress, on_done)
        # What becomes of the sequences that finished in a step ending at a given time: their
        # finish is recorded (a cluster's prefill replica hands them on instead).
        self._retire = retire or self.record_finished
        self._closed = False  # no more submissions: stop once the work is done
        self._wake: simpy.Event | None = None
        self._busy_until, self._drafts = 0.0, drafts
        plans_ahead = scheduler.plans_ahead
        self._swap_bandwidth = scheduler.swap_bandwidth  # swap copies, timed on their steps
        plain = scheduler.speculates or bool(self._swap_bandwidth) or scheduler.moves_kv
        fast = fast_decode and cost_model.times_from_sums and not plain
        # Fast windows (when the cost model can time steps from sums; the results are identical
        # either way, the tests compare both), bounded by ``next_arrival``: when the next
        # submission can come. ``on_done`` is told ``(number, time)`` when requests finish
        # (``time`` may be ahead of the clock: inside a window, the end of the step that
        # finished them). Async scheduling takes its steps (and stretches) in ``ahead.py``.
        arrival, steps = next_arrival if fast else None, (self._plan, self._apply, self._retire)
        ahead = Ahead(env, scheduler, cost_model, recorder, steps, arrival, on_done is not None)
        self._ahead = ahead if plans_ahead else None
        self._window = (
            FastWindow(
                env,
                scheduler,
                cost_model,
                recorder,
                next_arrival,
                self._retire,
                cut_at_finish=on_done is not None,
                holds=holds,
            )
            if fast and not plans_ahead
            else None
        )
        # Decode steps timed ahead and taken only when a submission comes or they end
        # (``FastWindow.hold``): behind a router that reads state, a request may be handed
        # over at any routing instant, so a window would stop at every one of them
        self._holds = holds and self._window is not None
        self._held: Held | None = None
        self._final: Final | None = None  # the step in flight when a submission cut a hold
        self._process: simpy.Process | None = None
        self._num_submitted, self._first_submit = 0, 0.0  # the horizon of a hold
        # KV loads from the tiers below the GPU's, one FIFO link per tier (``kv_loads.py``)
        self._loads = KVLoads(scheduler.kv_links()) if scheduler.moves_kv else None

    # -- what others may read ------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        """Sequences running now."""
        return self._scheduler.num_running

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission now."""
        return self._scheduler.num_waiting

    @property
    def num_blocks_used(self) -> int:
        """KV blocks held now."""
        held = self._held
        if held is not None:  # the step in flight now is planned
            return held.used[held.num_started(self.env.now) - 1]
        return self._scheduler.num_blocks_used

    @property
    def num_blocks(self) -> int:
        """KV blocks in the cache."""
        return self._scheduler.num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self._scheduler.block_size

    @property
    def num_sampled(self) -> int:
        """Tokens sampled so far."""
        held = self._held
        if held is not None:  # each step ended by now sampled a token per member
            return self.recorder.num_tokens + held.num_seqs * (held.num_started(self.env.now) - 1)
        return self.recorder.num_tokens

    @property
    def plans_ahead(self) -> bool:
        """Whether steps are planned one ahead (``scheduler.async_scheduling``)."""
        return self._ahead is not None

    @property
    def busy_until(self) -> float:
        """End of the step in flight (or of the last one taken)."""
        window = self._window or self._ahead
        return max(self._busy_until, window.end) if window is not None else self._busy_until

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return self._scheduler.has_work()

    def rejection_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never be served here, or None."""
        return self._scheduler.rejection_reason(seq)

    # -- what others may do ----------------------------------------------------------------

    def submit(self, seq: Sequence, prefilled: bool = False) -> bool:
        """Hand a request to the scheduler (waking an idle server); False, recorded with its
        reason, if it can never be served. ``prefilled``: its prompt was computed elsewhere
        and its KV comes with it (``Scheduler.add_prefilled``)."""
        reason = self._scheduler.rejection_reason(seq)
        if reason is not None:
            self._outcomes.refuse(seq, reason)
            return False
        if self._held is not None:
            self._cut()
        if self._holds:
            if not self._num_submitted:
                self._first_submit = self.env.now
            self._num_submitted += 1
        if prefilled:
            self._scheduler.add_prefilled(seq)
        else:
            self._scheduler.add(seq)
        self._poke()
        return True

    def close(self) -> None:
        """No more submissions: finish the work in hand, then stop."""
        self._closed = True
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self) -> simpy.events.ProcessGenerator:
        """The server's process: step while there is work, sleep while there is none."""
        sched, window = self._scheduler, self._window
        self._process = self.env.active_process
        while True:
            if not sched.has_work():
                if self._closed and not sched.num_loading:
                    return
                self._wake = self.env.event()
                yield self._wake
                self._wake = None
                continue
            if self._ahead is not None:
                yield from self._ahead.run()
                continue
            if window is not None:
                if self._holds and not sched.num_waiting:
                    held = window.hold(self._horizon())
                    if held is not None:
                        yield from self._hold(window, held)
                        continue
                if (yield from window.run()):
                    continue
                # the group's last step ended now: its members' last tokens were sampled then
                self.recorder.end_decode_run(sched.decode_batch_ids(), self.env.now)
            yield from self._step()

    # -- held decode steps --------------------------------------------------------------------

    def _horizon(self) -> float:
        """How far ahead to time held steps: twice the mean gap between submissions."""
        now, n = self.env.now, self._num_submitted
        return now + 2 * (now - self._first_submit) / n if n else now

    def _hold(self, window: FastWindow, held: Held) -> Generator[simpy.Event, Any, None]:
        """Sleep to the end of ``held`` and take its steps, unless a submission cuts it
        (``_cut``): then sleep to the end of the step in flight at that instant and apply it."""
        self._held = held
        cut = False
        try:
            yield self.env.timeout(held.end - self.env.now)  # lands there: ``Held``
        except simpy.Interrupt:  # cut before its last step
            cut = True
        if cut:  # not yielded inside ``except``: compiled, the interrupt would outlive it
            assert self._final is not None
            yield self.env.timeout(self._final[2] - self.env.now)  # lands there, as above
        final, self._final = self._final, None
        if final is not None:  # cut: the step that was in flight then ends now
            window.finish(final)
            return
        self._held = None
        window.take_held(held, len(held.starts), False)

    def _cut(self) -> None:
        """A submission comes while steps are held: take those started by now, the last one
        in flight, and wake the server process to see that one end."""
        held, self._held = self._held, None
        assert held is not None and self._window is not None and self._process is not None
        k = held.num_started(self.env.now)
        self._final = self._window.take_held(held, k, True)
        if k < len(held.starts):  # else its end is where the server sleeps to already
            self._process.interrupt()

    def _step(self) -> Generator[simpy.Event, Any, None]:
        """One step through ``schedule()`` and ``update()``."""
        env, sched, rec = self.env, self._scheduler, self.recorder
        plan, duration, ints = self._plan()
        now = env.now
        if plan.loads:
            self._start_loads(plan, now)
        if not plan.seqs and not plan.preempted:
            if not sched.num_loading:  # a lone head always fits: never spin
                raise RuntimeError("scheduler produced an empty step with work pending")
            sched.update()  # nothing runs until a load ends (or a request comes)
            self._wake = env.event()
            yield self._wake
            self._wake = None
            return
        if plan.num_admitted:
            rec.record_admitted(plan, now)
        moved: tuple[int, ...] = NO_MOVES
        if self._loads is not None:
            moved = (*sched.take_kv_moved(), 0, 0)
        if self._swap_bandwidth is not None:  # vLLM v0 copied before the step's forward pass
            out, back = sched.take_swapped()
            duration += (out + back) / self._swap_bandwidth
            moved = (*moved[:4], out, back)
        if plan.encoder:
            rec.record_encoded(plan)
        if not plan.drafts:
            rec.record_step(now, duration, ints, moved, 0, plan.encoder_tokens)
        self._busy_until = now + duration  # where the timeout lands
        yield env.timeout(duration)
        self._apply(plan, now, env.now)
        if plan.drafts:  # how many drafts were accepted is known once applied: the row waits
            accepted = sum(plan.accepted.values())
            rec.record_step(now, duration, ints, moved, accepted, plan.encoder_tokens)

    def _plan(self) -> tuple[StepPlan, float, tuple[int, ...]]:
        """Plan a step: the plan, its duration and its row's ``STEP_INT_FIELDS``."""
        sched = self._scheduler
        num_running, num_waiting = sched.num_running, sched.num_waiting
        plan = sched.schedule()
        new_tokens = plan.num_new_tokens
        # vllm-v1 under priority can preempt every sequence it planned: nothing runs, no time
        duration = self._cost_model.step_time(Batch(new_tokens, plan.context_lens)) if plan else 0.0
        if self._drafts is not None and plan:
            duration += self._drafts.time(plan)
        if plan.encoder and self.encoder is not None:  # images encoded before the forward
            items = [s.mm_items[i][1] for s, idx in plan.encoder.items() for i in idx]
            duration += self.encoder.time(items)
        ints = step_counts(new_tokens, (plan,))
        rest = (num_running, num_waiting, len(plan.preempted), sched.num_cached_blocks)
        return plan, duration, (*ints, sched.num_blocks_used, *rest)

    def _apply(self, plan: StepPlan, start: float, now: float) -> None:
        """``update()`` the oldest planned step, from ``start`` to ``now``: record its tokens
        and finishes (async: its deferred decode group's too, if ``fast_step()`` planned it)."""
        if plan.num_deferred:  # each sampled at ``start`` before: gaps of ``now - start``
            self.recorder.record_decode_step(plan.num_deferred, start, now)
        done = self._scheduler.update()
        self._outcomes.sampled(plan, now)
        if done:
            self._retire(done, now)

    def _start_loads(self, plan: StepPlan, now: float) -> None:
        """Book the KV loads ``plan`` started on the tiers' links; each sequence may be
        scheduled once its load ends (the first step boundary at or after it)."""
        assert self._loads is not None
        env, rec = self.env, self.recorder
        for load in plan.loads:
            end = self._loads.book(now, load.nbytes)
            rec.record_tier_hits(load.seq.seq_id, load.tokens)
            done = env.timeout(end - now)
            done.callbacks.append(self._load_ended(load.seq))

    def _load_ended(self, seq: Sequence) -> Callable[[simpy.Event], None]:
        """What happens when the load of ``seq`` ends: it may be scheduled, wake up."""

        def ended(_: simpy.Event) -> None:
            self._scheduler.finish_load(seq)
            self._poke()

        return ended

    def record_finished(self, done: list[Sequence], end: float) -> None:
        """Record the requests that finished in the step ending at ``end``."""
        self._outcomes.finished(done, end)
