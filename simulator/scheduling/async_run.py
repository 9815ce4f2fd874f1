"""Stretches of async decode steps (docs/scheduler.md, "Async scheduling"): the steps ahead in
which only the deferred decode group runs, as ``fast_async.py`` plans them one by one.

Under async scheduling a member that samples its last token in step ``L`` is out of the
group's sums from step ``L + 1`` on, but it holds its slot and its blocks until step ``L`` is
applied, which is after step ``L + 1`` is planned: its blocks come back (their full ones kept
by the prefix cache) one step later than without async scheduling, and the row of step
``L + 1`` still counts it running. So each step right after a finish is a segment of its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import accumulate, cycle, islice

from simulator.scheduling.decode_run import DecodeRun, _steps_that_fit
from simulator.scheduling.sequence import Sequence

AsyncSegment = tuple[int, range, Iterator[int], int, int]
"""Steps of an async stretch with the same members: (members, their KV tokens before each
step, blocks used once each step is planned, members out of the sums that hold their slots
until the step before the first is applied (then they finish; the segment is that one step),
free blocks the prefix cache keeps before the first)."""


def async_segments(
    run: DecodeRun,
    leaving: list[Sequence],
    used: int,
    num_blocks: int,
    cached: int | None = None,
) -> Iterator[AsyncSegment]:
    """The steps after the group's last planned one (``run.steps``), while members remain and
    their blocks fit in ``num_blocks`` (``used`` now; with a prefix cache, ``cached`` of the
    free ones keep content); ``leaving`` are the members planned for the last time in the last
    step planned (still in the group's sums), whose blocks come back once it is applied, after
    the first step ahead is planned. The group is not changed."""
    m, offsets, crossing = run.num_seqs, run.context, run.crossing.copy()
    finish_at, heap = run.finish_at, run.finish_steps.copy()
    t = run.steps + 1
    keep = cached is not None
    kept = cached or 0
    freed = freed_full = 0  # blocks the members out of the sums give back, full ones
    num_out = 0  # members out of the sums, holding their blocks until the step is applied
    last = t - 1
    while True:
        if leaving:  # their blocks come back after the next step is planned
            num_out = len(leaving)
            gone, freed, freed_full = _leave(leaving, last, crossing)
            m -= num_out
            offsets -= gone
            leaving = []
        if not m:
            return
        while heap[0] < t or heap[0] not in finish_at:
            heapq.heappop(heap)
        last = heap[0]
        bs = len(crossing)
        r = (1 - t) % bs  # the members' new blocks at step t + i: pattern[i % bs]
        pattern = crossing[r::-1] + crossing[:r:-1]
        length = 1 if num_out else last - t + 1
        grown = length // bs * m + sum(pattern[: length % bs])
        fits = grown <= num_blocks - used
        if not fits:
            length = _steps_that_fit(pattern, m, num_blocks - used)
            if not length:
                return
            grown = length // bs * m + sum(pattern[: length % bs])
        used_each = islice(accumulate(cycle(pattern), initial=used), 1, length + 1)
        start = offsets + m * (t - 1)
        yield m, range(start, start + m * length, m), used_each, num_out, kept
        if not fits:
            return
        used += grown
        if keep:
            kept = min(kept, num_blocks - used)
        if num_out:  # the step before this one is applied: its last samplers leave
            used -= freed
            kept += freed_full if keep else 0
            num_out = 0
        t += length
        if t - 1 == last:
            leaving = finish_at[last]


def _leave(leaving: list[Sequence], last: int, crossing: list[int]) -> tuple[int, int, int]:
    """Take ``leaving``, planned for the last time in step ``last``, out of ``crossing`` (as
    ``DecodeRun.drop``): their offsets in all, the blocks they hold and the full ones."""
    bs = len(crossing)
    offsets = freed = full = 0
    for seq in leaving:
        offset = seq.num_computed - seq.deferred_from
        offsets += offset
        crossing[offset % bs] -= 1
        freed += -(-(offset + last) // bs)
        full += (offset + last) // bs
    return offsets, freed, full
