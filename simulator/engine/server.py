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
- Steps the scheduler can plan in O(what changed) (``fast_step()``: its deferred decode group
  decodes, a few others prefill or are admitted, nobody is preempted) are taken back to back
  under one simpy timeout until the next arrival could change a decision, and timed from
  their sums (``CostModel.time_sums``) without building their batch. Every step still
  gets its own row, and the results are identical to stepping through ``schedule()`` and
  ``update()`` (``fast_decode=False``; the tests compare the two).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Generator, Iterator
from functools import partial
from itertools import accumulate, islice, repeat
from operator import mul
from typing import Any

import simpy

from simulator.cost.batch import Batch, StepSums
from simulator.cost.interface import CostModel
from simulator.engine.recorder import Recorder
from simulator.scheduling.interface import DecodeStretch, Scheduler, StepPlan
from simulator.scheduling.sequence import Sequence


class Server:
    """A scheduler and a cost model stepping on ``env``, recording into ``recorder``."""

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
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.recorder = recorder
        self.next_arrival = next_arrival
        """When the next submission can come (the end of a deferred decode window)."""
        self.progress = progress
        self.on_done = on_done
        """Told ``(number, time)`` when requests finish (``time`` may be ahead of the clock:
        inside a decode window, the end of the step that finished them)."""
        # Fast steps skip the scheduler's per-sequence loops when the cost model can time
        # them from sums; the results are identical either way (tests compare both).
        self.fast_decode = fast_decode and cost_model.times_from_sums
        self.closed = False
        """No more submissions will come: the server stops once its work is done."""
        self.retire: Callable[[list[Sequence], float], None] = self.record_finished
        """What becomes of the sequences that finished in a step ending at a given time:
        their finish is recorded (a cluster's prefill replica hands them on instead)."""
        self.step_end = 0.0
        """End of the latest step taken (deferred decode steps run ahead of the clock)."""
        self._wake: simpy.Event | None = None
        # The last deferred decode step, taken whole before its end: (end, tokens sampled,
        # sequences retired, blocks freed), undone by the num_* views until the clock gets there.
        self._deferred = (0.0, 0, 0, 0)

    # -- state as a step-by-step run shows it at this instant (what a router may read) -------

    @property
    def num_running(self) -> int:
        """Sequences running now (a deferred step in flight has retired nobody yet)."""
        end, _, retired, _ = self._deferred
        n = self.scheduler.num_running
        return n + retired if self.env.now < end else n

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission now."""
        return self.scheduler.num_waiting

    @property
    def num_blocks_used(self) -> int:
        """KV blocks held now (a deferred step in flight has freed none yet)."""
        end, _, _, freed = self._deferred
        n = self.scheduler.num_blocks_used
        return n + freed if self.env.now < end else n

    @property
    def num_sampled(self) -> int:
        """Tokens sampled so far (a deferred step in flight has sampled none yet)."""
        end, tokens, _, _ = self._deferred
        n = self.recorder.num_tokens
        return n - tokens if self.env.now < end else n

    def submit(self, seq: Sequence, prefilled: bool = False) -> bool:
        """Hand a request to the scheduler (waking an idle server); False, recorded with its
        reason, if it can never be served. ``prefilled``: its prompt was computed elsewhere
        and its KV comes with it (``Scheduler.add_prefilled``)."""
        reason = self.scheduler.rejection_reason(seq)
        if reason is not None:
            self.recorder.rejected.append((seq.seq_id, reason))  # type: ignore[arg-type]
            if self.progress is not None:
                self.progress(1)
            return False
        if prefilled:
            self.scheduler.add_prefilled(seq)
        else:
            self.scheduler.add(seq)
        self._poke()
        return True

    def close(self) -> None:
        """No more submissions: finish the work in hand, then stop."""
        self.closed = True
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self) -> simpy.events.ProcessGenerator:
        """The server's process: step while there is work, sleep while there is none."""
        sched = self.scheduler
        while True:
            if not sched.has_work():
                if self.closed:
                    return
                self._wake = self.env.event()
                yield self._wake
                self._wake = None
                continue
            if self.fast_decode:
                if (yield from self._fast_window()):
                    continue
                # the group's last step ended now: its members' last tokens were sampled then
                self.recorder.end_decode_run(sched.decode_batch_ids(), self.env.now)  # type: ignore[arg-type]
            yield from self._step()

    def _step(self) -> Generator[simpy.Event, Any, None]:
        """One step through ``schedule()`` and ``update()``."""
        env, sched, rec = self.env, self.scheduler, self.recorder
        num_running, num_waiting = sched.num_running, sched.num_waiting
        plan = sched.schedule()
        if not plan.seqs and not plan.preempted:  # a lone head always fits: never spin
            raise RuntimeError("scheduler produced an empty step with work pending")
        now = env.now
        if plan.num_admitted:
            rec.record_admitted(plan, now)
        new_tokens = plan.num_new_tokens
        # vllm-v1 under priority can preempt every sequence it planned: nothing runs, no time
        duration = self.cost_model.step_time(Batch(new_tokens, plan.context_lens)) if plan else 0.0
        num_tokens = sum(new_tokens)
        decodes = new_tokens.count(1)
        rec.record_step(
            now,
            duration,
            (
                len(new_tokens),
                num_tokens,
                num_tokens - decodes,
                decodes,
                sched.num_blocks_used,
                num_running,
                num_waiting,
                len(plan.preempted),
                sched.num_cached_blocks,
            ),
        )
        self.step_end = now + duration  # where the timeout lands
        yield env.timeout(duration)
        done = sched.update()
        rec.record_samples(plan.sampled, env.now)
        if done:
            self.retire(done, env.now)

    def _fast_window(self) -> Generator[simpy.Event, Any, int]:
        """Run the steps the scheduler takes on its fast path, back to back, under as few
        simpy timeouts as exactness allows; return how many steps ran (0: none could).

        Only an arrival can change the scheduler's mind between such steps, so every step
        that starts before the next arrival joins the window. The window's end must be
        exactly where step-by-step timeouts would have landed (``start + sum`` in float is not
        always ``start + (end - start)``): when one would not, the window is cut there. Its
        last step is still in flight while the window's timeout runs: until the clock gets to
        its end, the ``num_*`` views undo what that step did early (retire, free, sample)."""
        env, sched = self.env, self.scheduler
        steps = 0
        start = end = env.now
        retired = (0.0, 0, 0)  # the latest step that retired anybody: end, how many, blocks
        while end < self.next_arrival() or not steps:
            stretch = sched.decode_stretch()
            if stretch is not None:
                starts, durations, tokens, used = self._time_stretch(stretch, start, end, not steps)
                k = len(durations)
                finished = sched.take_decodes(k)
                for j, seqs in finished:
                    self.retire(seqs, starts[j] + durations[j])
                last_start, new_end = starts[-1], starts[-1] + durations[-1]
                done = finished[-1][1] if finished and finished[-1][0] == k - 1 else []
            else:
                last_start = end
                new_end, done, tokens, used = self._fast_step(end)
                if new_end < 0:
                    break
                k = 1
                if done:
                    self.retire(done, new_end)
            steps += k
            retired = (new_end, len(done), used - sched.num_blocks_used) if done else retired
            if start + (new_end - start) != new_end:
                yield env.timeout(last_start - start)  # lands exactly there, checked before
                start = last_start
            end = new_end
        if steps:
            self.step_end = end
            _, num_retired, freed = retired if retired[0] == end else (end, 0, 0)
            self._deferred = (end, tokens, num_retired, freed)
            yield env.timeout(end - start)
        return steps

    def _time_stretch(
        self, stretch: DecodeStretch, start: float, end: float, first: bool
    ) -> tuple[list[float], list[float], int, int]:
        """Time and record the steps of ``stretch`` from ``end`` while they start before the
        next arrival (the first anyway when ``first``), up to one whose end a timeout from
        ``start`` would not land on exactly (or, in a closed loop, that finishes requests:
        their slots may send new ones); return their starts and durations, and the tokens
        sampled in the last and the blocks used once it was planned."""
        arrival = self.next_arrival()  # nothing arrives before it while the window runs
        starts: list[float] = []
        durations: list[float] = []
        used_blocks: list[int] = []
        sizes: list[tuple[int, int]] = []  # (first step, sequences) of each segment
        last_m = 0
        for m, contexts, used, finishing in stretch.segments:
            sizes.append((len(durations), m))
            n, cut, end = self._time_segment(
                m, contexts, (start, end, arrival), first, starts, durations
            )
            used_blocks.extend(islice(used, n))
            last_m = m if n else last_m
            first = False
            if cut or n < len(contexts) or finishing and self.on_done is not None:
                break
        self.recorder.record_decode_steps(
            sizes, starts, durations, used_blocks, stretch.num_cached_blocks
        )
        return starts, durations, last_m, used_blocks[-1]

    def _time_segment(
        self,
        m: int,
        contexts: range,
        times: tuple[float, float, float],
        first: bool,
        starts: list[float],
        durations: list[float],
    ) -> tuple[int, bool, float]:
        """Time the decode steps of ``m`` sequences over ``contexts`` from ``end`` that start
        before ``arrival`` (the first anyway when ``first``), adding to ``starts`` and
        ``durations``, a chunk at a time (the cost model called from C, the ends summed in
        C, in the same order as one by one); stop after a step whose end a timeout from
        ``start`` would not land on exactly. ``times`` is (start, end, arrival). Return the
        steps taken, whether that cut them, and the end of the last."""
        time_sums = self.cost_model.time_sums
        start, end, arrival = times
        taken, total = 0, len(contexts)
        while taken < total:
            if arrival == float("inf"):
                chunk = total - taken
            else:  # about the steps left before the arrival, from the last step's time
                guess = (
                    durations[-1] if durations else time_sums(StepSums.decode(m, contexts[taken]))
                )
                chunk = min(total - taken, max(int((arrival - end) / guess), 0) + 2)
            each = list(map(time_sums, decode_sums(m, contexts[taken : taken + chunk])))
            ends = list(accumulate(each, initial=end))
            k = bisect_left(ends, arrival, 0, chunk)  # steps that start before the arrival
            if not k and first and not taken:
                k = 1
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

    def _fast_step(self, start: float) -> tuple[float, list[Sequence], int, int]:
        """One step planned by ``fast_step()`` from ``start``: its end, who finished, the
        tokens sampled and the blocks used once it was planned; or (-1, [], 0, 0) if the
        scheduler could not take it so."""
        sched, rec = self.scheduler, self.recorder
        num_running, num_waiting = sched.num_running, sched.num_waiting
        plan = sched.fast_step()
        if plan is None:
            return -1.0, [], 0, 0
        sums = plan_sums(plan)
        duration = self.cost_model.time_sums(sums)
        if plan.num_admitted:
            rec.record_admitted(plan, start)
        num_seqs, decodes, num_tokens = sums[0], sums[1], sums[2]
        used = sched.num_blocks_used
        rec.record_step(
            start,
            duration,
            (
                num_seqs,
                num_tokens,
                num_tokens - decodes,
                decodes,
                used,
                num_running,
                num_waiting,
                0,
                sched.num_cached_blocks,
            ),
        )
        end = start + duration
        if plan.num_deferred:
            rec.record_decode_step(plan.num_deferred, start, end)
        done = sched.finish_fast_step()
        if plan.sampled:
            rec.record_samples(plan.sampled, end)
        return end, done, plan.num_deferred + len(plan.sampled), used

    def record_finished(self, done: list[Sequence], end: float) -> None:
        """Record the requests that finished in the step ending at ``end``."""
        rec = self.recorder
        for seq in done:
            if seq.num_tokens - seq.prompt_len != seq.max_tokens:
                raise RuntimeError(
                    f"request {seq.seq_id} finished with {seq.num_tokens - seq.prompt_len} "
                    f"tokens, expected {seq.max_tokens} (scheduler bug)"
                )
            rec.record_finish(seq.seq_id, end, seq.num_preemptions, seq.num_output)  # type: ignore[arg-type]
        if self.progress is not None:
            self.progress(len(done))
        if self.on_done is not None:
            self.on_done(len(done), end)


def decode_sums(m: int, contexts: range) -> Iterator[StepSums]:
    """The ``StepSums`` of decode steps of ``m`` sequences over ``contexts`` (built in C:
    most steps of a run are timed from these)."""
    pairs = range(contexts.start + m, contexts.stop + m, contexts.step)
    return map(_SUMS, zip(repeat(m), repeat(m), repeat(m), contexts, contexts, pairs))


_SUMS = partial(tuple.__new__, StepSums)


def plan_sums(plan: StepPlan) -> StepSums:
    """The ``StepSums`` of a step from its plan: O(1) for its deferred decode group, O(1) for
    each other sequence."""
    m, ctx = plan.num_deferred, plan.deferred_context
    new, context = plan.num_new_tokens, plan.context_lens
    if not new:
        return StepSums.decode(m, ctx)
    tokens = sum(new)
    decode_context = ctx + sum(c for n, c in zip(new, context, strict=True) if n == 1)
    # each decode of the group sees its context and itself; a chunk of n on c tokens sees
    # n * c + n (n + 1) / 2 pairs (``Batch.attention_pairs``)
    pairs = ctx + m + sum(map(mul, new, context)) + (sum(map(mul, new, new)) + tokens) // 2
    return StepSums(
        m + len(new), m + new.count(1), m + tokens, ctx + sum(context), decode_context, pairs
    )
