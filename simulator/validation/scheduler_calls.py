"""Replay of an async-scheduling case: the calls of vLLM's engine loop with a queue of two
batches in flight (``EngineCore.step_with_batch_queue``; the rules are in
tools/vllm_recorder/README.md, "Kinds async, async_spec").

Per call ``t``: add the requests arriving at ``t``; if the scheduler has requests, plan a
batch and queue it, and stop there while fewer than two are queued and (the batch scheduled
a token or requests remain); with nothing to plan and nothing queued the call is idle;
otherwise apply the oldest batch.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from simulator.scheduling.interface import StepPlan
from simulator.scheduling.sequence import Sequence, SequenceStatus
from simulator.scheduling.step_scheduler import StepScheduler

QUEUE_DEPTH = 2
"""Batches in flight at most (vLLM's batch queue with async scheduling and one PP stage)."""


def _ids(seqs: Any) -> list[str]:
    return [str(i) for i in sorted(s.seq_id for s in seqs)]


def _schedule_record(
    sched: StepScheduler, plan: StepPlan, batch: int, members: list[Any]
) -> dict[str, Any]:
    cached = {}
    if plan.num_admitted:
        admitted = plan.admitted
        cached = {str(s.seq_id): n for s, n in zip(admitted, plan.cached_tokens, strict=True) if n}
    return {
        "scheduled": [[str(i), 1] for i in members]
        + [[str(s.seq_id), n] for s, n in zip(plan.seqs, plan.num_new_tokens, strict=True)],
        "spec": {str(s.seq_id): d for s, d in plan.drafts.items()},
        "preempted": _ids(plan.preempted),
        "cached": cached,
        "batch": batch,
        "free_blocks": sched.num_blocks - sched.num_blocks_used,
    }


def _update_record(
    sched: StepScheduler, plan: StepPlan, batch: int, members: list[Any]
) -> dict[str, Any]:
    """The record of applying ``plan`` (``members``: its deferred decode group, if
    ``fast_step()`` planned it; a later plain plan may have written them into it)."""
    stale = [s for s in plan.seqs if s.stale > 0 and s.status is not SequenceStatus.FINISHED]
    done = sched.update()  # a plan of fast_step()'s too (async: its group applies with it)
    sampled = [str(i) for i in members] if plan.num_deferred else []
    return {
        "batch": batch,
        "sampled": sorted(sampled + _ids(plan.sampled), key=int),
        "accepted": {str(s.seq_id): a for s, a in plan.accepted.items()},
        "stale": _ids(stale),
        "finished": _ids(done),
        "free_blocks": sched.num_blocks - sched.num_blocks_used,
    }


def replay_calls(
    name: str,
    sched: StepScheduler,
    arrivals: dict[int, list[Sequence]],
    last: int,
    limit: int,
    fast: bool = False,
) -> list[dict[str, Any]]:
    """Every engine-loop call of an async case, as the recorder writes them (``fast``: each
    step the scheduler can take through ``fast_step()`` is taken so)."""
    queue: deque[tuple[StepPlan, int, list[Any]]] = deque()
    calls: list[dict[str, Any]] = []
    num_batches = 0
    for t in range(limit):
        for seq in arrivals.get(t, ()):
            sched.add(seq)
        call: dict[str, Any] = {"schedule": None, "update": None}
        if sched.has_requests():
            fast_plan = sched.fast_step() if fast else None
            members: list[Any] = sched.decode_batch_ids() if fast_plan is not None else []
            plan = fast_plan if fast_plan is not None else sched.schedule()
            call["schedule"] = _schedule_record(sched, plan, num_batches, members)
            queue.append((plan, num_batches, members))
            num_batches += 1
            if len(queue) < QUEUE_DEPTH and (len(plan) or sched.has_requests()):
                calls.append(call)
                continue
        elif not queue:
            if t >= last:
                return calls
            calls.append(call)  # idle: nothing has arrived yet
            continue
        plan, batch, members = queue.popleft()
        call["update"] = _update_record(sched, plan, batch, members)
        calls.append(call)
        if t >= last and not sched.has_requests() and not queue:
            return calls
    raise RuntimeError(f"{name}: no end after {limit} calls (scheduler made no progress)")
