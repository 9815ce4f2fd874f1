"""A group of running sequences stepped by deferred decode steps, with the sums that let a
step over it be planned in O(1) (``deferred.py``)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import accumulate, cycle, islice

from simulator.scheduling.sequence import Sequence

Segment = tuple[int, range, Iterator[int], int, int]
"""Steps of a deferred decode group with the same members (``DecodeRun.segments``)."""


def _steps_that_fit(pattern: list[int], m: int, free: int) -> int:
    """How many steps fit in ``free`` blocks when step ``i`` takes ``pattern[i % len]``
    (which add up to ``m`` over a period)."""
    if free < 0:
        return 0
    periods, left = divmod(free, m) if m else (len(pattern), 0)
    steps = periods * len(pattern)
    for grow in pattern:
        left -= grow
        if left < 0:
            break
        steps += 1
    return steps


class DecodeRun:
    """The deferred decode group: the first ``num_seqs`` running sequences, each of which
    decodes one token in every step since it joined (its fields stay as they were then).

    A member that joined when the group had taken ``s`` steps, with ``c`` tokens of KV, holds
    ``c + t - 1 - s`` tokens before the group's step ``t``: its *offset* ``c - s`` is fixed,
    so the group keeps its members' sums by offset, and who finishes at which step."""

    __slots__ = (
        "num_seqs",
        "context",
        "finish_at",
        "finish_steps",
        "crossing",
        "steps",
        "by_residue",
        "num_shared",
        "applied",
        "lag",
    )

    def __init__(self, block_size: int, *, with_blocks: bool) -> None:
        self.num_seqs = 0
        """Sequences in the group."""
        self.context = 0
        """The members' offsets in all: they hold ``context + num_seqs * (t - 1)`` tokens of
        KV before step ``t``."""
        self.finish_at: dict[int, list[Sequence]] = {}
        """``[t]``: the members that sample their last token in step ``t``, in running order."""
        self.finish_steps: list[int] = []
        """A heap of the steps in ``finish_at`` (and of some already taken out of it)."""
        self.crossing = [0] * block_size
        """``[r]``: how many members have an offset ``r`` modulo the block size."""
        self.steps = 0
        """Steps the group has taken."""
        self.by_residue: list[list[Sequence]] | None = (
            [[] for _ in range(block_size)] if with_blocks else None
        )
        """With blocks that have identities (a prefix cache): ``[r]``, the members with
        offset ``r`` modulo the block size in running order, so that each step takes new
        blocks for exactly those entering one and caches exactly the blocks it fills, in the
        order ``schedule()`` would."""
        self.num_shared = 0
        """Members with prompt runs (others may hit their blocks: those are hashed as they
        fill, step by step)."""
        self.applied = 0
        """Async scheduling: steps of the group applied (``steps`` are planned)."""
        self.lag = 0
        """Async scheduling: steps in flight when each step is planned (0 or 1): a member's
        KV block is cached ``lag`` steps after the step that fills it, once its last token
        is known (``KVManager.cache_full`` caches known tokens only)."""

    def join(self, seq: Sequence, block_size: int) -> None:
        """Add ``seq`` (it just sampled, its fields are true) behind the members."""
        steps = self.steps
        seq.deferred_from = steps
        offset = seq.num_computed - steps
        self.num_seqs += 1
        self.context += offset
        r = offset % block_size
        self.crossing[r] += 1
        # async: the placeholders of steps in flight are tokens it will have
        last = steps + seq.max_tokens - (seq.num_tokens + seq.placeholders - seq.prompt_len)
        members = self.finish_at.get(last)
        if members is None:
            self.finish_at[last] = [seq]
            heapq.heappush(self.finish_steps, last)
        else:
            members.append(seq)
        if self.by_residue is not None:
            self.by_residue[r].append(seq)
            if seq.prompt_runs is not None:
                self.num_shared += 1

    def join_all(self, seqs: list[Sequence], block_size: int) -> None:
        """``join(seq)`` of each of ``seqs`` in order, in one loop (a group starts with every
        running sequence that sampled: dozens at once after each step ``schedule()`` took)."""
        steps = self.steps
        finish_at, finish_steps, crossing = self.finish_at, self.finish_steps, self.crossing
        by_residue = self.by_residue
        context = 0
        for seq in seqs:
            seq.deferred_from = steps
            offset = seq.num_computed - steps
            context += offset
            r = offset % block_size
            crossing[r] += 1
            last = steps + seq.max_tokens - (seq.num_tokens + seq.placeholders - seq.prompt_len)
            members = finish_at.get(last)
            if members is None:
                finish_at[last] = [seq]
                heapq.heappush(finish_steps, last)
            else:
                members.append(seq)
            if by_residue is not None:
                by_residue[r].append(seq)
                if seq.prompt_runs is not None:
                    self.num_shared += 1
        self.num_seqs += len(seqs)
        self.context += context

    def drop(self, seq: Sequence, block_size: int) -> None:
        """Take a member out (its fields still as when it joined)."""
        offset = seq.num_computed - seq.deferred_from
        self.num_seqs -= 1
        self.context -= offset
        r = offset % block_size
        self.crossing[r] -= 1
        if self.by_residue is not None:
            self.by_residue[r].remove(seq)
            if seq.prompt_runs is not None:
                self.num_shared -= 1

    def next_finish(self) -> int:
        """The first step in which a member finishes (the group must not be empty)."""
        heap, finish_at = self.finish_steps, self.finish_at
        while heap[0] not in finish_at:
            heapq.heappop(heap)
        return heap[0]

    def context_before(self, t: int) -> int:
        """Tokens of KV the members hold before step ``t``."""
        return self.context + self.num_seqs * (t - 1)

    def blocks_over(self, t: int, u: int, block_size: int) -> int:
        """Blocks the members need for steps ``t + 1`` .. ``u`` (nobody leaving)."""
        k = u - t
        # every member enters a new block once in ``block_size`` steps; the ``r`` steps left
        # over take ``crossing[(1 - s) % block_size]``: a run of residues going down from
        # ``i``, wrapping around, summed as slices
        grow = k // block_size * self.num_seqs
        crossing, r, i = self.crossing, k % block_size, -t % block_size
        if r <= i + 1:
            return grow + sum(crossing[i - r + 1 : i + 1])
        return grow + sum(crossing[: i + 1]) + sum(crossing[i - r + 1 + block_size :])

    def segments(
        self, used: int, num_blocks: int, block_size: int, cached: int | None = None
    ) -> Iterator[Segment]:
        """The steps ahead while members remain and their blocks fit in ``num_blocks``
        (``used`` now; with a prefix cache, ``cached`` of the free ones keep content), in
        segments that end where members finish: per segment, (members, their KV tokens before
        each step, blocks used once each step is planned, members that finish in its last
        step, free blocks keeping content before its first step: 0 without a prefix cache).
        The group is not changed.

        A step takes free blocks without content first, so ``min(cached, num_blocks - used)``
        of the free blocks keep content after it; a member that finishes hands its full blocks
        to them (with a prefix cache its blocks are its own: no member has prompt runs)."""
        m, offsets, crossing = self.num_seqs, self.context, self.crossing.copy()
        finish_at = self.finish_at
        heap = self.finish_steps.copy()
        t = self.steps + 1
        keep = cached is not None
        kept = cached or 0
        while m:
            while heap[0] < t or heap[0] not in finish_at:
                heapq.heappop(heap)
            last = heap[0]
            # the members' new blocks repeat with the block size: ``pattern[i]`` at step t + i
            r = (1 - t) % block_size  # pattern[i] = crossing[(r - i) % block_size]
            pattern = crossing[r::-1] + crossing[:r:-1]
            # the blocks the steps up to the finish take, if they fit (they mostly do); else
            # as many steps as fit
            length = last - t + 1
            grown = length // block_size * m + sum(pattern[: length % block_size])
            if grown > num_blocks - used:
                length = _steps_that_fit(pattern, m, num_blocks - used)
                if not length:
                    return
                grown = length // block_size * m + sum(pattern[: length % block_size])
            used_each = islice(accumulate(cycle(pattern), initial=used), 1, length + 1)
            start = offsets + m * (t - 1)
            if t + length - 1 < last:  # the blocks run out first
                yield m, range(start, start + m * length, m), used_each, 0, kept
                return
            leaving = finish_at[last]
            yield m, range(start, start + m * length, m), used_each, len(leaving), kept
            used += grown
            if keep:
                kept = min(kept, num_blocks - used)
            for seq in leaving:  # as drop(), and their blocks freed
                offset = seq.num_computed - seq.deferred_from
                m -= 1
                offsets -= offset
                crossing[offset % block_size] -= 1
                used -= -(-(offset + last) // block_size)
                if keep:
                    kept += (offset + last) // block_size
            t = last + 1

    def blocks_to_grow(self, block_size: int) -> int:
        """Blocks the members need for their next step: one per member whose KV fills its
        last block exactly before it."""
        return self.crossing[-self.steps % block_size]

    def growing(self, t: int, block_size: int) -> list[Sequence]:
        """The members that need a new block in step ``t`` (with ``by_residue``)."""
        assert self.by_residue is not None
        return self.by_residue[(1 - t) % block_size]

    def filling(self, t: int, block_size: int) -> list[Sequence]:
        """The members whose step ``t`` fills their last block (with ``by_residue``)."""
        assert self.by_residue is not None
        return self.by_residue[-t % block_size]
