"""The waiting queue of a vLLM-v1 policy: first come first served, or by priority (vLLM v1's
``request_queue.py``)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from simulator.scheduling.sequence import Sequence


class FCFSQueue(deque[Sequence]):
    """Arrival order; a preempted sequence goes back to the head. A deque, so that the
    scheduler's reads of it (``len``, the head ``[0]``) cost no Python call."""

    __slots__ = ()

    add = deque.append
    """A new sequence joins at the tail."""
    prepend = deque.appendleft
    """A preempted sequence goes back to the head."""
    pop = deque.popleft
    """Remove and return the head."""


class PriorityQueue:
    """Lowest ``(priority, arrival_order)`` first; a preempted sequence takes its place again."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Sequence]] = []

    def add(self, seq: Sequence) -> None:
        """Queue ``seq`` by its priority, then by when it was added."""
        heapq.heappush(self._heap, (seq.priority, seq.arrival_order, seq))

    prepend = add

    def __getitem__(self, index: int) -> Sequence:
        """The head (``[0]``: the sequence admission looks at next)."""
        if index != 0:
            raise IndexError("only the head of a priority queue can be read")
        return self._heap[0][2]

    def pop(self) -> Sequence:
        """Remove and return the head."""
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queue (it finished while waiting)."""
        self._heap = [e for e in self._heap if e[2] is not seq]
        heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[Sequence]:
        """Service order (a sorted copy)."""
        return iter([entry[2] for entry in sorted(self._heap, key=lambda e: e[:2])])
