"""Shared helpers for scheduler tests: the spec's invariants I1-I6, the block manager's own
invariants, and a stepping driver; for every policy."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

from simulator.scheduling import Sequence, SequenceStatus, StepScheduler
from simulator.scheduling.kv_manager import KVManager

AnyScheduler = StepScheduler


def base_sampler(bases: dict[Hashable, int]) -> Callable[[Sequence], int]:
    """The spec's sampler: ``base + len(seq.output)`` with a base per sequence."""

    def sample(seq: Sequence) -> int:
        return bases[seq.seq_id] + len(seq.output)

    return sample


def check_invariants(
    sched: AnyScheduler,
    plan: dict[Hashable, int] | None,
    all_seqs: list[Sequence],
    outputs_before: dict[Hashable, list[int]] | None = None,
) -> None:
    """Assert I1-I6 (I4 through ``outputs_before``: outputs only ever grow; I5 only for
    first-come-first-served waiting queues), then the block manager's invariants."""
    # I1: blocks are accounted for exactly and never over-allocated (with a prefix cache a
    # block may be shared, so the sum over sequences is an upper bound there).
    held = sum(s.num_blocks for s in sched.running)
    if sched.blocks.caching:
        assert sched.blocks_used <= held
    else:
        assert sched.blocks_used == held
    assert 0 <= sched.blocks_used <= sched.num_blocks
    for s in sched.waiting:
        assert s.num_blocks == 0 and s.num_computed == 0 and not sched.blocks.block_ids(s)
    for s in sched.finished:
        assert s.num_blocks == 0 and not sched.blocks.block_ids(s)
    if not len(sched.waiting) and not sched.running:
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
    if not getattr(sched, "priority", False):
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
    if sched.blocks.caching:
        check_block_invariants(sched.blocks, sched.running)


def check_block_invariants(blocks: KVManager, running: list[Sequence]) -> None:
    """The block manager's own invariants: reference counts (those written down in the pool
    and the blocks a prompt of its own holds alone) never negative and equal to the holders;
    free + referenced = total; the hash map lists each cached block once, under its own hash;
    every running sequence's blocks referenced, its first ``num_cached_blocks`` cached."""
    pool = blocks.pool
    refs = blocks.references()
    assert min(pool.ref_cnt) >= 0
    holders = Counter(b for s in running for b in blocks.block_ids(s))
    assert all(refs[b] == holders.get(b, 0) for b in range(pool.num_blocks))
    free_cached = list(pool.free_cached())
    free = set(pool.free_blank) | set(free_cached)
    assert len(free) == len(pool.free_blank) + len(free_cached) == pool.num_free
    assert free == {b for b in range(pool.num_blocks) if refs[b] == 0}
    assert pool.num_free + sum(1 for r in refs if r > 0) == pool.num_blocks
    assert all(pool.block_hash[b] is None for b in pool.free_blank)
    # a free cached block without a hash holds content nobody can hit (kv_manager.py)
    assert pool.num_free_cached == len(free_cached)
    assert sum(pool.stale) == pool.num_stale >= 0
    listed = list(pool.cached.values()) + [b for bs in pool.dupes.values() for b in bs]
    assert len(listed) == len(set(listed))  # no block cached twice
    assert set(listed) == {b for b in range(pool.num_blocks) if pool.block_hash[b] is not None}
    for h, b in pool.cached.items():
        assert pool.block_hash[b] == h
        assert all(pool.block_hash[d] == h for d in pool.dupes.get(h, []))
    assert all(pool.dupes.values())  # no empty duplicate lists left behind
    for s in running:
        ids = blocks.block_ids(s)
        assert s.num_blocks == len(ids) and len(set(ids)) == len(ids)
        for j, b in enumerate(ids[: blocks.num_cached_blocks(s)]):
            if s.prompt_runs is None and pool.block_hash[b] is None:
                continue  # its own content, registered when preempted (kv_manager.py)
            assert pool.block_hash[b] == s.block_hashes[j]
        for b in ids[blocks.num_cached_blocks(s) :]:
            assert pool.block_hash[b] is None


def step(
    sched: AnyScheduler, all_seqs: list[Sequence]
) -> tuple[dict[Hashable, int], list[Sequence]]:
    """One ``schedule()`` + ``update()``, with the invariants checked after each half."""
    before = {s.seq_id: list(s.output) for s in all_seqs}
    plan = sched.schedule().num_scheduled_tokens
    check_invariants(sched, plan, all_seqs, before)
    done = sched.update()
    check_invariants(sched, None, all_seqs, before)
    return plan, done
