"""Shared helpers for scheduler tests: the spec's invariants I1-I6 and a stepping driver."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from simulator.scheduling.spec import Sequence, SequenceStatus, SpecScheduler


def base_sampler(bases: dict[Hashable, int]) -> Callable[[Sequence], int]:
    """The spec's sampler: ``base + len(seq.output)`` with a base per sequence."""

    def sample(seq: Sequence) -> int:
        return bases[seq.seq_id] + len(seq.output)

    return sample


def check_invariants(
    sched: SpecScheduler,
    plan: dict[Hashable, int] | None,
    all_seqs: list[Sequence],
    outputs_before: dict[Hashable, list[int]] | None = None,
) -> None:
    """Assert I1-I6 (I4 through ``outputs_before``: outputs only ever grow)."""
    # I1: blocks are accounted for exactly and never over-allocated.
    assert sched.blocks_used == sum(s.num_blocks for s in sched.running)
    assert 0 <= sched.blocks_used <= sched.num_blocks
    for s in sched.waiting:
        assert s.num_blocks == 0 and s.num_computed == 0
    for s in sched.finished:
        assert s.num_blocks == 0
    if not sched.waiting and not sched.running:
        assert sched.blocks_used == 0
    # I2: the plan stays within budget and never schedules nothing.
    if plan is not None:
        assert sum(plan.values()) <= sched.max_num_batched_tokens
        assert all(n >= 1 for n in plan.values())
    # I3: progress is bounded by the tokens known.
    for s in all_seqs:
        assert 0 <= s.num_computed <= s.num_tokens
        if s.status is SequenceStatus.RUNNING:
            # blocks are counted on num_computed + n, never on num_tokens
            n = plan.get(s.seq_id, 0) if plan is not None else 0
            assert s.num_blocks == sched.blocks_for(s.num_computed + n)
        assert len(s.output) <= s.max_tokens
    # I4: outputs are never rewritten (a preemption keeps them).
    if outputs_before is not None:
        for s in all_seqs:
            before = outputs_before.get(s.seq_id, [])
            assert s.output[: len(before)] == before
    # I5: waiting stays in arrival order (preempted ones are earlier than new ones).
    order = {s.seq_id: i for i, s in enumerate(all_seqs)}
    ranks = [order[s.seq_id] for s in sched.waiting]
    assert ranks == sorted(ranks), f"waiting out of arrival order: {ranks}"
    # I6: each sequence lives in exactly one place, with the matching status.
    places = {
        SequenceStatus.WAITING: [s.seq_id for s in sched.waiting],
        SequenceStatus.RUNNING: [s.seq_id for s in sched.running],
        SequenceStatus.FINISHED: [s.seq_id for s in sched.finished],
    }
    seen: list[Hashable] = [i for ids in places.values() for i in ids]
    assert len(seen) == len(set(seen))
    for status, ids in places.items():
        for i in ids:
            assert next(s for s in all_seqs if s.seq_id == i).status is status


def step(
    sched: SpecScheduler, all_seqs: list[Sequence]
) -> tuple[dict[Hashable, int], list[Sequence]]:
    """One ``schedule()`` + ``update()``, with the invariants checked after each half."""
    before = {s.seq_id: list(s.output) for s in all_seqs}
    plan = sched.schedule().num_scheduled_tokens
    check_invariants(sched, plan, all_seqs, before)
    done = sched.update()
    check_invariants(sched, None, all_seqs, before)
    return plan, done
