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
- Plain decode steps (every running sequence decodes one token, nobody can be admitted or
  preempted; some may finish) are taken through the scheduler's ``decode_step()`` in O(1)
  each, back to back under one simpy timeout until the next arrival could change a decision.
  Every step still gets its own row, and the results are identical to stepping one by one
  (``fast_decode=False``; the tests compare the two).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from simulator.cost.batch import Batch
from simulator.cost.interface import CostModel
from simulator.engine.recorder import Recorder
from simulator.scheduling.interface import Scheduler
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
        # Plain decode steps skip the scheduler's per-sequence loops when the cost model can
        # time them from sums; the results are identical either way (tests compare both).
        self.fast_decode = fast_decode and cost_model.times_decodes_from_sums
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
            if self.fast_decode and (yield from self._decode_window()):
                continue
            yield from self._step()

    def _step(self) -> Generator[simpy.Event, Any, None]:
        """One step through ``schedule()`` and ``update()``."""
        env, sched, rec = self.env, self.scheduler, self.recorder
        num_running, num_waiting = sched.num_running, sched.num_waiting
        plan = sched.schedule()
        if not plan.seqs and not plan.preempted:  # a lone head always fits: never spin
            raise RuntimeError("scheduler produced an empty step with work pending")
        now = env.now
        first_sched = rec.first_scheduled
        for seq, cached in zip(plan.admitted, plan.cached_tokens, strict=True):
            i: int = seq.seq_id  # type: ignore[assignment]
            if first_sched[i] != first_sched[i]:  # NaN: scheduled for the first time
                first_sched[i] = now
                rec.cached_tokens[i] = cached
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

    def _decode_window(self) -> Generator[simpy.Event, Any, int]:
        """Run the plain decode steps the scheduler accepts, back to back, under as few simpy
        timeouts as exactness allows; return how many steps ran (0: none was plain).

        Only an arrival can change the scheduler's mind between plain decode steps, so every
        step that starts before the next arrival joins the window. The window's end must be
        exactly where step-by-step timeouts would have landed (``start + sum`` in float is not
        always ``start + (end - start)``): when one would not, the window is cut there. Its
        last step is still in flight while the window's timeout runs: until the clock gets to
        its end, the ``num_*`` views undo what that step did early (retire, free, sample)."""
        env, sched, rec = self.env, self.scheduler, self.recorder
        decode_time = self.cost_model.decode_time
        steps = num_seqs = 0
        start = end = env.now
        retired = (0.0, 0, 0)  # the latest step that retired anybody: end, how many, blocks
        while end < self.next_arrival() or not steps:
            num_running, num_waiting = sched.num_running, sched.num_waiting
            batch, kv_tokens = sched.decode_step()
            if not batch:
                break
            num_seqs = batch
            duration = decode_time(num_seqs, kv_tokens)
            used = sched.num_blocks_used
            rec.record_step(
                end,
                duration,
                (
                    num_seqs,
                    num_seqs,
                    0,
                    num_seqs,
                    used,
                    num_running,
                    num_waiting,
                    0,
                    sched.num_cached_blocks,
                ),
            )
            steps += 1
            new_end = end + duration
            rec.record_decode_step(num_seqs, end, new_end)
            done = sched.finish_decode_step()
            if done:
                self.retire(done, new_end)
                retired = (new_end, len(done), used - sched.num_blocks_used)
            if start + (new_end - start) != new_end:
                yield env.timeout(end - start)  # lands exactly on ``end``, checked last round
                start = end
            end = new_end
        if steps:
            rec.end_decode_run(sched.decode_batch_ids(), end)  # type: ignore[arg-type]
            self.step_end = end
            _, num_retired, freed = retired if retired[0] == end else (end, 0, 0)
            self._deferred = (end, num_seqs, num_retired, freed)
            yield env.timeout(end - start)
        return steps

    def record_finished(self, done: list[Sequence], end: float) -> None:
        """Record the requests that finished in the step ending at ``end``."""
        rec = self.recorder
        for seq in done:
            if seq.num_tokens - seq.prompt_len != seq.max_tokens:
                raise RuntimeError(
                    f"request {seq.seq_id} finished with {seq.num_tokens - seq.prompt_len} "
                    f"tokens, expected {seq.max_tokens} (scheduler bug)"
                )
            rec.record_finish(seq.seq_id, end, seq.num_preemptions, hash(tuple(seq.output)))  # type: ignore[arg-type]
        if self.progress is not None:
            self.progress(len(done))
        if self.on_done is not None:
            self.on_done(len(done), end)
