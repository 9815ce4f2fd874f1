"""The one shape of a server: what a simulation and a cluster ask of it (``ServerShape``),
and the parts every server writes the same way (``Outcomes``: a request refused with its
reason, the tokens a step sampled, the finish check; ``step_counts``: a step row's counts).

A single server (``server.py``) and data-parallel ranks in lockstep (``lockstep.py``) both
have this shape; a cluster's replica holds one, and a simulation runs one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import simpy

from simulator.engine.recorder import Recorder
from simulator.scheduling.interface import StepPlan
from simulator.scheduling.sequence import Sequence


class ServerShape(Protocol):
    """A server on a simpy clock: requests go in, steps are recorded, finishes come out."""

    env: simpy.Environment
    """The clock it steps on."""
    recorder: Recorder
    """Where its requests and steps are recorded."""

    @property
    def num_running(self) -> int:
        """Sequences running now."""
        ...

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission now."""
        ...

    @property
    def num_blocks_used(self) -> int:
        """KV blocks held now."""
        ...

    @property
    def num_blocks(self) -> int:
        """KV blocks in the cache (over all ranks)."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        ...

    @property
    def num_sampled(self) -> int:
        """Tokens sampled so far."""
        ...

    @property
    def busy_until(self) -> float:
        """End of the step in flight (or of the last one taken)."""
        ...

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        ...

    def rejection_reason(self, seq: Sequence) -> str | None:
        """Why ``seq`` can never be served here, or None."""
        ...

    def submit(self, seq: Sequence, prefilled: bool = False) -> bool:
        """Hand a request over; False, recorded with its reason, if it can never be served."""
        ...

    def close(self) -> None:
        """No more submissions: finish the work in hand, then stop."""
        ...

    def run(self) -> simpy.events.ProcessGenerator:
        """The server's process: step while there is work, sleep while there is none."""
        ...

    def record_finished(self, done: list[Sequence], end: float) -> None:
        """Record the requests that finished in the step ending at ``end``."""
        ...


class Outcomes:
    """Where a server's requests end up in its recorder: refused, sampled, finished; and
    who is told (``progress`` of each request done, ``on_done`` of how many and when)."""

    def __init__(
        self,
        recorder: Recorder,
        progress: Callable[[int], object] | None,
        on_done: Callable[[int, float], object] | None,
    ) -> None:
        self.recorder = recorder
        self._progress, self._on_done = progress, on_done

    def refuse(self, seq: Sequence, reason: str) -> None:
        """``seq`` can never be served: recorded with ``reason``, and done."""
        self.recorder.record_rejected(seq.seq_id, reason)
        if self._progress is not None:
            self._progress(1)

    def sampled(self, plan: StepPlan, end: float) -> None:
        """The tokens ``plan``'s sequences sampled in the step ending at ``end`` (applied)."""
        rec = self.recorder
        if plan.drafts:  # speculative: more than one token per sequence, at times
            rec.record_samples(plan.sampled, end, plan.num_extra_tokens)
            rec.record_drafts(plan)
        else:
            rec.record_samples(plan.sampled, end)

    def finished(self, done: list[Sequence], end: float) -> None:
        """The requests that finished in the step ending at ``end``, each with the tokens it
        asked for (else the scheduler lost or invented one: an error, not a result)."""
        rec = self.recorder
        for seq in done:
            if seq.num_tokens - seq.prompt_len != seq.max_tokens:
                raise RuntimeError(
                    f"request {seq.seq_id} finished with {seq.num_tokens - seq.prompt_len} "
                    f"tokens, expected {seq.max_tokens} (scheduler bug)"
                )
            rec.record_finish(seq.seq_id, end, seq.num_preemptions, seq.num_output)
        if self._progress is not None:
            self._progress(len(done))
        if self._on_done is not None:
            self._on_done(len(done), end)


def step_counts(new_tokens: list[int], plans: Iterable[StepPlan]) -> tuple[int, int, int, int]:
    """The first counts of a step's row (``STEP_INT_FIELDS``): sequences, tokens, prefill
    tokens, decodes, of a step computing ``new_tokens`` as planned by ``plans`` (a decode
    verifying ``d`` drafts computes ``1 + d`` tokens and counts as a decode)."""
    num_tokens = sum(new_tokens)
    decodes = decode_tokens = new_tokens.count(1)
    for plan in plans:
        if plan.drafts:
            decodes += len(plan.drafts)
            decode_tokens += len(plan.drafts) + sum(plan.drafts.values())
    return len(new_tokens), num_tokens, num_tokens - decode_tokens, decodes
