"""Async scheduling on one server's clock (docs/scheduler.md, "Async scheduling").

Step ``n + 1`` is planned when step ``n`` starts, before its tokens are known (vLLM's batch
queue of two), and starts when step ``n`` ends, right after its ``update()``: a request
arriving while step ``n`` runs is first seen by step ``n + 2``'s plan. With fast steps each
step is planned by ``fast_step()`` where the scheduler can (timed from its sums), and the
steps that end before the next arrival are taken back to back under one simpy timeout, as
``fast_window.py`` takes its windows: only an arrival can change a plan, whoever reads the
server after the window sees what a step-by-step run shows, and the tables are those of one
simpy timeout per step (``fast_decode=False``; the tests compare the two).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from itertools import islice
from typing import Any

import simpy

from simulator.cost.interface import CostModel
from simulator.engine.fast_window import Retire, plan_sums, time_segment
from simulator.engine.recorder import NO_MOVES, Recorder
from simulator.scheduling.interface import Scheduler, StepPlan

Planned = tuple[StepPlan, float, tuple[int, ...]]
"""A step planned: its plan, its duration and its row's ``STEP_INT_FIELDS``."""

Segment = tuple[int, range, Iterator[int], int, int]
"""Steps of an async decode stretch with the same sequences (``async_run.AsyncSegment``)."""

Following = tuple[int, int, int, int, int] | None
"""The step after a stretch's last, planned before the next arrival (``_time_stretch``)."""


class Ahead:
    """The steps of one server whose scheduler plans ahead."""

    def __init__(
        self,
        env: simpy.Environment,
        scheduler: Scheduler,
        cost_model: CostModel,
        recorder: Recorder,
        steps: tuple[Callable[[], Planned], Callable[[StepPlan, float, float], None], Retire],
        next_arrival: Callable[[], float] | None,
        cut_at_finish: bool = False,
    ) -> None:
        self.env, self.scheduler, self.recorder = env, scheduler, recorder
        self._time_sums, self._time_decodes = cost_model.time_sums, cost_model.time_decodes
        # the server's plain plan, applying any plan, and what becomes of the sequences that
        # finished in a step of a decode stretch (applied here, not through ``_apply``)
        self._plan, self._apply, self._retire = steps
        self.next_arrival = next_arrival
        """When the next submission can come (None: no fast steps, one timeout a step)."""
        self.cut_at_finish = cut_at_finish
        """End a stretch where requests finish (in a closed loop their slots send new ones)."""
        self.end = 0.0
        """End of the step in flight (ahead of the clock while steps are taken at once)."""
        self._next: Planned | None = None  # the step planned to run next, with its row
        self._ints: tuple[int, ...] = ()  # the row of the step begun last
        self._num_empty = 0  # empty steps in a row (a few are normal, many a bug)

    def run(self) -> Generator[simpy.Event, Any, None]:
        """Run the step planned last (or plan one now), plan the next one while it runs,
        then apply it; with fast steps, every step that ends before the next arrival at once
        (the clock then stops at the end of the last one applied, or of the one in flight)."""
        env, fast = self.env, self.next_arrival
        start = now = env.now  # the clock, and the start of the step taken
        # each step's end is where a timeout from ``now`` lands (``now + duration``, as a
        # step-by-step run has it); the clock stays at ``start`` while ``start + (end -
        # start)`` lands exactly there too, and moves up first where it would not
        while True:
            taken = self._stretch(start, now) if fast is not None else None
            if taken is None:
                plan, duration, _ = self._begin(now)
            else:
                plan, duration, now = taken
            end = self.end = now + duration
            final = fast is None or bool(plan.drafts) or end >= fast()
            if start + (end - start) != end:
                if start != now:
                    yield env.timeout(now - start)  # lands exactly there, checked before
                    start = now
                if not final:
                    yield env.timeout(duration)
                    start = end
            if final:
                break
            self._apply(plan, now, end)
            now = end
            if self._next is None:  # nothing planned: the server looks for work
                yield env.timeout(now - start)
                return
        yield env.timeout(duration if start == now else end - start)
        self._apply(plan, now, end)
        if plan.drafts:  # as in ``Server._step``: the row waits for the drafts' fate
            accepted = sum(plan.accepted.values())
            self.recorder.record_step(now, duration, self._ints, NO_MOVES, accepted)

    def _begin(self, now: float) -> Planned:
        """Start the step planned last (or plan one now) at ``now``, recording its row, and
        plan the next one if the scheduler has requests."""
        sched, rec = self.scheduler, self.recorder
        current, self._next = self._next, None
        if current is None:
            current = self._plan_ahead(now)
        plan, duration, ints = current
        self._ints = ints
        if plan.num_admitted:
            rec.record_admitted(plan, now)
        if plan:  # an empty batch (all in flight, or nothing fits yet) runs nothing
            if not plan.drafts:
                rec.record_step(now, duration, ints)
            self._num_empty = 0
        else:
            self._num_empty += 1
            if self._num_empty > 4:  # two in flight, both empty, and then more: stuck
                raise RuntimeError("async scheduler planned empty steps with work pending")
        if sched.has_requests():
            self._next = self._plan_ahead(now)
        return current

    def _stretch(self, start: float, now: float) -> tuple[StepPlan, float, float] | None:
        """Take the steps from the one planned to run next (at ``now``, the clock at
        ``start``) in which only the scheduler's deferred decode group runs, while they start
        before the next arrival and a timeout from ``start`` lands on their starts; the last
        of them is begun as ``_begin`` does (the next step planned at its start, in the
        stretch too if it is one of its steps), not applied. Return its plan (the scheduler's
        plan in flight, which now stands for it), duration and start; None (nothing taken)
        if no step but the next one can be."""
        assert self.next_arrival is not None
        current = self._next
        if current is None or current[0].seqs:
            return None
        plan, duration, ints = current
        end, arrival = now + duration, self.next_arrival()
        if end >= arrival or start + (end - start) != end:
            return None
        stretch = self.scheduler.decode_stretch()
        if stretch is None:
            return None
        timed = self._time_stretch(stretch.segments, (start, end, arrival), duration)
        starts, durations, used_blocks, sizes, running, following = timed
        if not durations:
            return None
        rec, sched = self.recorder, self.scheduler
        rec.record_step(now, duration, ints)  # the step in flight, applied with the stretch
        rec.record_decode_step(plan.num_deferred, now, starts[0])
        rec.record_decode_steps(
            sizes, starts, durations, used_blocks, stretch.num_blocks, True, running
        )
        hold = following is not None
        for j, seqs in sched.take_decodes(len(durations) + hold, hold):
            self._retire(seqs, starts[j])  # the end of the j-th step applied
        now = starts[-1]
        self._num_empty = 0
        self._next = None
        if following is not None:  # planned as ``_plan_ahead`` would, from the stretch
            m, context, used, num_running, kept = following
            cached = min(kept, stretch.num_blocks - used) if stretch.num_blocks else 0
            step = (m, m, 0, m, used, num_running, 0, 0, cached)
            last = sched.last_planned()  # type: ignore[attr-defined]
            self._next = (last, self._time_decodes(m, range(context, context + m, m))[0], step)
        elif sched.has_requests():
            self._next = self._plan_ahead(now)
        return plan, durations[-1], now  # the plan in flight now stands for the last step

    def _time_stretch(
        self, segments: Iterator[Segment], times: tuple[float, float, float], guess: float
    ) -> tuple[
        list[float], list[float], list[int], list[tuple[int, int, int]], list[int], Following
    ]:
        """Time the steps of a stretch's ``segments`` from ``times`` (the clock, the first
        step's start, the next arrival) as ``FastWindow`` times its stretches; return their
        starts, durations, blocks used, (first step, sequences, cached blocks kept) and
        sequences running per segment, and the step after the last if the arrival came
        before it starts: (sequences, their KV tokens, blocks used, sequences running,
        cached blocks kept before it), else None."""
        start, end, arrival = times
        starts: list[float] = []
        durations: list[float] = []
        used_blocks: list[int] = []
        sizes: list[tuple[int, int, int]] = []
        running: list[int] = []
        for m, contexts, used, num_out, kept in segments:
            k, cut, end = time_segment(
                self._time_decodes, guess, m, contexts, times, False, starts, durations
            )
            if not k:  # the arrival came before it
                return (
                    starts,
                    durations,
                    used_blocks,
                    sizes,
                    running,
                    ((m, contexts[0], next(used), m + num_out, kept) if durations else None),
                )
            sizes.append((len(durations) - k, m, kept))
            running.append(m + num_out)
            used_blocks.extend(islice(used, k))
            if cut or num_out and self.cut_at_finish:
                break
            if k < len(contexts):  # (a segment with members out of the sums is one step)
                following = (m, contexts[k], next(used), m, kept)
                return starts, durations, used_blocks, sizes, running, following
            times = (start, end, arrival)
        return starts, durations, used_blocks, sizes, running, None

    def _plan_ahead(self, now: float) -> Planned:
        """Plan a step by ``fast_step()`` if the scheduler can (the row from its sums), else
        by ``schedule()`` (the deferred decode group's last tokens were sampled at ``now``,
        the end of the last step applied)."""
        sched = self.scheduler
        if self.next_arrival is not None:
            num_running, num_waiting = sched.num_running, sched.num_waiting
            plan = sched.fast_step()
            if plan is not None:
                sums = plan_sums(plan)
                n, decodes, tokens = sums[0], sums[1], sums[2]
                ints = (n, tokens, tokens - decodes, decodes, sched.num_blocks_used)
                rest = (num_running, num_waiting, 0, sched.num_cached_blocks)
                return plan, self._time_sums(sums), (*ints, *rest)
            self.recorder.end_decode_run(sched.decode_batch_ids(), now)
        return self._plan()
