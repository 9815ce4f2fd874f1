"""The engine's fast path: the steps a scheduler can take without walking every sequence,
taken back to back under as few simpy timeouts as exactness allows (docs/scheduler.md, "Fast
steps").

The scheduler offers two kinds of such steps: ``fast_step()`` (its deferred decode group
decodes, a few others prefill or are admitted, nobody is preempted) and ``decode_stretch()``
(steps in which only the group runs, with their sums). Only an arrival can change the
scheduler's mind between them, so every step that starts before the next arrival joins the
window; each is timed from its sums (``CostModel.time_sums``) and gets its own row. The
window's final step, the one in flight when the next arrival comes, is planned but applied
only when the clock reaches its end, as ``schedule()`` and ``update()`` would: whoever reads
the server in between sees it planned, not applied. The window's end must be exactly where
step-by-step timeouts would have landed (``start + sum`` in float is not always ``start +
(end - start)``): when one would not, the window yields at that step's start first.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator
from itertools import accumulate, islice
from operator import mul
from typing import Any

import simpy

from simulator.cost.batch import StepSums
from simulator.cost.interface import CostModel
from simulator.engine.held import Held
from simulator.engine.recorder import Recorder
from simulator.scheduling.interface import DecodeStretch, Scheduler, StepPlan
from simulator.scheduling.sequence import Sequence

Retire = Callable[[list[Sequence], float], None]
"""What becomes of the sequences that finished in a step ending at a given time."""

Final = tuple[StepPlan | None, float, float, int]
"""A step planned and not applied: its plan (None: the last of a stretch), start, end, and
the sequences of its deferred decode group."""


class FastWindow:
    """Windows of fast steps of one server's scheduler on its clock."""

    def __init__(
        self,
        env: simpy.Environment,
        scheduler: Scheduler,
        cost_model: CostModel,
        recorder: Recorder,
        next_arrival: Callable[[], float],
        retire: Retire,
        cut_at_finish: bool,
        holds: bool = False,
    ) -> None:
        self.env, self.scheduler, self.recorder = env, scheduler, recorder
        self.next_arrival = next_arrival
        """When the next submission (or read) can come: no step starts at or after it."""
        self.retire = retire
        self.cut_at_finish = cut_at_finish
        """End a stretch where requests finish (in a closed loop their slots send new ones)."""
        self.holds = holds
        """Decode stretches are held (``hold``): a window ends where one begins."""
        self._time_sums = cost_model.time_sums
        self._time_decodes = cost_model.time_decodes
        self.end = 0.0
        """End of the latest step the window took (ahead of the clock while it runs)."""
        self._guess = 0.0  # the last stretch step's time: how many steps to time at once

    def run(self) -> Generator[simpy.Event, Any, int]:
        """Take one window from now; return how many steps it took (0: none could)."""
        env, sched = self.env, self.scheduler
        steps = 0
        start = end = env.now
        final: Final | None = None  # the step in flight as the window ends: applied then
        while end < self.next_arrival() or not steps:
            stretch = sched.decode_stretch()
            if stretch is not None and steps and self.holds:
                break  # held from its first step's start (``hold``)
            if stretch is not None:
                end, last_start, k, final = self._stretch(stretch, start, end, not steps)
                steps += k
            else:
                last_start = end
                final = self._plan(end)
                if final is None:
                    break
                steps += 1
                end = final[2]
                if end < self.next_arrival():  # not the final one: nobody reads before its end
                    self._apply(*final)
                    final = None
            if start + (end - start) != end:
                yield env.timeout(last_start - start)  # lands exactly there, checked before
                start = last_start
            if final is not None:
                break
        if steps:
            self.end = end
            yield env.timeout(end - start)
            if final is not None:
                self._apply(*final)
        return steps

    # -- one step planned by fast_step() ---------------------------------------------------

    def _plan(self, start: float) -> Final | None:
        """Plan the step from ``start`` by ``fast_step()`` and record its row: (plan, start,
        end, sequences of its deferred decode group); None if the scheduler could not take
        it so."""
        sched, rec = self.scheduler, self.recorder
        num_running, num_waiting = sched.num_running, sched.num_waiting
        plan = sched.fast_step()
        if plan is None:
            return None
        sums = plan_sums(plan)
        duration = self._time_sums(sums)
        if plan.num_admitted:
            rec.record_admitted(plan, start)
        num_seqs, decodes, num_tokens = sums[0], sums[1], sums[2]
        used = sched.num_blocks_used
        ints = (num_seqs, num_tokens, num_tokens - decodes, decodes, used, num_running)
        rec.record_step(start, duration, (*ints, num_waiting, 0, sched.num_cached_blocks))
        return plan, start, start + duration, plan.num_deferred

    def _apply(self, plan: StepPlan | None, start: float, end: float, num_deferred: int) -> None:
        """Apply a step planned (by ``_plan``, or the last of a stretch): its samples, and
        who finished."""
        rec = self.recorder
        if num_deferred:
            rec.record_decode_step(num_deferred, start, end)
        done = self.scheduler.finish_fast_step()
        if plan is not None and plan.sampled:
            rec.record_samples(plan.sampled, end)
        if done:
            self.retire(done, end)

    # -- decode steps held ahead (behind a router that reads state) ---------------------------

    def hold(self, horizon: float) -> Held | None:
        """The decode steps the scheduler offers from now, timed up to about ``horizon`` (at
        least one) and at most to the first in which members finish, not taken; None if it
        offers none, or none whose end a timeout from any instant since now lands on exactly
        (ends past twice now), or if a window would reach two steps before being stopped."""
        now = self.env.now
        if self.next_arrival() - now > 2 * self._guess or now <= 0:
            return None  # a window reaches two steps or more: as far as a hold mostly does
        stretch = self.scheduler.decode_stretch()
        segment = None if stretch is None else next(stretch.segments, None)
        if segment is None:
            return None
        assert stretch is not None
        m, contexts, used, _, kept = segment
        guess = self._guess or self._time_sums(StepSums.decode(m, contexts[0]))
        n = min(len(contexts), max(int((horizon - now) / guess), 0) + 2)
        each = self._time_decodes(m, contexts[:n])
        ends = list(accumulate(each, initial=now))
        # a timeout from ``t`` >= now to an end at most ``2 t`` lands there (Sterbenz)
        k = bisect_right(ends, 2 * now, 1, n + 1) - 1
        if k < 1:
            return None
        self._guess = each[k - 1]
        used_k = list(islice(used, k))
        return Held(ends[:k], each[:k], used_k, [(0, m, kept)], stretch.num_blocks)

    def take_held(self, held: Held, k: int, in_flight: bool) -> Final | None:
        """Take the first ``k`` steps of ``held``: their rows, their tokens, who finished at
        their ends; with ``in_flight`` the last is only planned, and returned (``finish``
        applies it when the clock reaches its end)."""
        starts, durations = held.starts[:k], held.durations[:k]
        self.recorder.record_decode_steps(
            held.sizes, starts, durations, held.used[:k], held.num_blocks, open_last=in_flight
        )
        for j, seqs in self.scheduler.take_decodes(k, in_flight):
            self.retire(seqs, starts[j] + durations[j])
        self.end = starts[-1] + durations[-1]
        return (None, starts[-1], self.end, held.num_seqs) if in_flight else None

    def finish(self, final: Final) -> None:
        """Apply the step ``take_held`` left in flight, now at its end."""
        self._apply(*final)

    # -- a stretch of pure decode steps ----------------------------------------------------

    def _stretch(
        self, stretch: DecodeStretch, start: float, end: float, first: bool
    ) -> tuple[float, float, int, Final | None]:
        """Time the steps of ``stretch`` from ``end`` (``_time_stretch``) and take them, the
        last only planned if it is the window's final one; return the end of the last, its
        start, the steps taken, and the final step if it is."""
        starts, durations, sizes, used = self._time_stretch(stretch, start, end, first)
        k = len(durations)
        last_start = starts[-1]
        self._guess = durations[-1]
        last_end = last_start + durations[-1]
        held = last_end >= self.next_arrival()
        self.recorder.record_decode_steps(
            sizes, starts, durations, used, stretch.num_blocks, open_last=held
        )
        for j, seqs in self.scheduler.take_decodes(k, held):
            self.retire(seqs, starts[j] + durations[j])
        final = (None, last_start, last_end, sizes[-1][1]) if held else None
        return last_end, last_start, k, final

    def _time_stretch(
        self, stretch: DecodeStretch, start: float, end: float, first: bool
    ) -> tuple[list[float], list[float], list[tuple[int, int, int]], list[int]]:
        """Time the steps of ``stretch`` from ``end`` while they start before the next
        arrival (the first anyway when ``first``), up to one whose end a timeout from
        ``start`` would not land on exactly (or that finishes requests, with
        ``cut_at_finish``); return their starts, durations, (first step, sequences, free
        blocks the cache keeps before it) of each segment, and the blocks used once each was
        planned."""
        arrival = self.next_arrival()  # nothing arrives before it while the window runs
        starts: list[float] = []
        durations: list[float] = []
        used_blocks: list[int] = []
        sizes: list[tuple[int, int, int]] = []
        for m, contexts, used, finishing, kept in stretch.segments:
            sizes.append((len(durations), m, kept))
            n, cut, end = self._time_segment(
                m, contexts, (start, end, arrival), first, starts, durations
            )
            used_blocks.extend(islice(used, n))
            first = False
            if cut or n < len(contexts) or finishing and self.cut_at_finish:
                if not n:  # the arrival came before it
                    sizes.pop()
                break
        return starts, durations, sizes, used_blocks

    def _time_segment(
        self,
        m: int,
        contexts: range,
        times: tuple[float, float, float],
        first: bool,
        starts: list[float],
        durations: list[float],
    ) -> tuple[int, bool, float]:
        """``time_segment`` with this window's cost model and last step's time."""
        guess = self._guess or self._time_sums(StepSums.decode(m, contexts[0]))
        return time_segment(self._time_decodes, guess, m, contexts, times, first, starts, durations)


def time_segment(
    time_decodes: Callable[[int, range], list[float]],
    guess: float,
    m: int,
    contexts: range,
    times: tuple[float, float, float],
    first: bool,
    starts: list[float],
    durations: list[float],
) -> tuple[int, bool, float]:
    """Time the decode steps of ``m`` sequences over ``contexts`` from ``end`` that start
    before ``arrival`` (the first anyway when ``first``), adding to ``starts`` and
    ``durations``, a chunk at a time (``CostModel.time_decodes``, the ends summed in C, in the
    same order as one by one; ``guess``, a step's time, says how many steps a chunk holds);
    stop after a step whose end a timeout from ``start`` would not land on exactly. ``times``
    is (start, end, arrival). Return the steps taken, whether that cut them, and the end of
    the last."""
    start, end, arrival = times
    # an end at most twice ``start`` is always landed on: ``end - start`` is then exact
    # (Sterbenz), and so is ``start`` plus it; only past that are the ends checked
    exact_below = 2 * start if start > 0 else float("inf")
    taken, total = 0, len(contexts)
    while taken < total:
        if arrival == float("inf"):
            chunk = total - taken
        else:  # about the steps left before the arrival, from the last step's time
            # (any guess gives the same steps: a chunk taken whole is followed by another)
            if durations:
                guess = durations[-1]
            chunk = min(total - taken, max(int((arrival - end) / guess), 0) + 2)
        each = time_decodes(m, contexts[taken : taken + chunk])
        ends = list(accumulate(each, initial=end))
        k = bisect_left(ends, arrival, 0, chunk)  # steps that start before the arrival
        if not k and first and not taken:
            k = 1
        if ends[k] > exact_below:
            for i in range(1, k + 1):
                if start + (ends[i] - start) != ends[i]:
                    starts += ends[:i]
                    durations += each[:i]
                    return taken + i, True, ends[i]
        starts += ends[:k]
        durations += each[:k]
        taken += k
        end = ends[k]
        if k < chunk:
            break
    return taken, False, end


def plan_sums(plan: StepPlan) -> StepSums:
    """The ``StepSums`` of a step from its plan: O(1) for its deferred decode group, O(1) for
    each other sequence."""
    m, ctx = plan.num_deferred, plan.deferred_context
    new, context = plan.num_new_tokens, plan.context_lens
    if not new:
        return StepSums.decode(m, ctx)
    if len(new) == 1:  # the usual one: an admission or a prefill going on beside the group
        n, c = new[0], context[0]
        one = n == 1
        pairs = ctx + m + n * c + (n * n + n) // 2
        return StepSums(m + 1, m + one, m + n, ctx + c, ctx + c if one else ctx, pairs)
    tokens = sum(new)
    decode_context = ctx + sum(c for n, c in zip(new, context, strict=True) if n == 1)
    # each decode of the group sees its context and itself; a chunk of n on c tokens sees
    # n * c + n (n + 1) / 2 pairs (``Batch.attention_pairs``)
    pairs = ctx + m + sum(map(mul, new, context)) + (sum(map(mul, new, new)) + tokens) // 2
    return StepSums(
        m + len(new), m + new.count(1), m + tokens, ctx + sum(context), decode_context, pairs
    )
