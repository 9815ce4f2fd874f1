"""The waiting queue of a vLLM-v1 policy: first come first served, or by priority (vLLM v1's
``request_queue.py``)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from simulator.scheduling.sequence import Sequence


class FCFSQueue:
    """Arrival order; a preempted sequence goes back to the head."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        """A new sequence joins at the tail."""
        self._q.append(seq)

    def prepend(self, seq: Sequence) -> None:
        """A preempted sequence goes back to the head."""
        self._q.appendleft(seq)

    def peek(self) -> Sequence:
        """The sequence admission looks at next."""
        return self._q[0]

    def pop(self) -> Sequence:
        """Remove and return ``peek()``."""
        return self._q.popleft()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)


class PriorityQueue:
    """Lowest ``(priority, arrival_order)`` first; a preempted sequence takes its place again."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Sequence]] = []

    def add(self, seq: Sequence) -> None:
        """Queue ``seq`` by its priority, then by when it was added."""
        heapq.heappush(self._heap, (seq.priority, seq.arrival_order, seq))

    prepend = add

    def peek(self) -> Sequence:
        """The sequence admission looks at next."""
        return self._heap[0][2]

    def pop(self) -> Sequence:
        """Remove and return ``peek()``."""
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Sequence]:
        """Service order (a sorted copy)."""
        return iter([entry[2] for entry in sorted(self._heap, key=lambda e: e[:2])])
