"""Many searches, one backend: each search (a capacity bisection, a sweep point) is a generator
that yields a batch of work units and is sent back their outcomes, in the batch's order, when
the whole batch is done. Batches of all searches are in flight together, so a backend's workers
stay busy; a search sees only its own outcomes, so the order in which units finish (which
differs between backends and runs) never changes a result."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from simulator.explore.backend import Backend, Done

R = TypeVar("R")


@dataclass(frozen=True)
class Unit:
    """One work unit: a module-level function and its (picklable) arguments."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


Outcome = Done
"""A unit's value, or the exception it raised (``ticket`` is the backend's)."""

Search = Generator[Sequence[Unit], list[Outcome], R]
"""Yields batches of units, receives their outcomes, returns its result."""


@dataclass
class _Batch(Generic[R]):
    search: int
    size: int
    outcomes: dict[int, Outcome] = field(default_factory=dict)


def drive(
    searches: Sequence[Search[R]],
    backend: Backend,
    on_unit: Callable[[int, Outcome], object] | None = None,
    on_search: Callable[[int, R], object] | None = None,
) -> list[R]:
    """Run every search to its end on ``backend``; their results in order.

    ``on_unit(search, outcome)`` is told of every finished unit, ``on_search(search,
    result)`` of every finished search (progress, in the order things finish)."""
    results: dict[int, R] = {}
    slot: dict[int, tuple[_Batch[R], int]] = {}  # ticket -> its batch and place in it

    def advance(i: int, outcomes: list[Outcome] | None) -> None:
        search = searches[i]
        try:
            while True:
                units = next(search) if outcomes is None else search.send(outcomes)
                if units:
                    break
                outcomes = []  # an empty batch: nothing to run, answer at once
        except StopIteration as stop:
            results[i] = stop.value
            if on_search is not None:
                on_search(i, stop.value)
            return
        batch: _Batch[R] = _Batch(i, len(units))
        for place, unit in enumerate(units):
            slot[backend.submit(unit.fn, *unit.args)] = (batch, place)

    for i in range(len(searches)):
        advance(i, None)
    while slot:
        for done in backend.wait():
            batch, place = slot.pop(done.ticket)
            batch.outcomes[place] = done
            if on_unit is not None:
                on_unit(batch.search, done)
            if len(batch.outcomes) == batch.size:
                advance(batch.search, [batch.outcomes[k] for k in range(batch.size)])
    return [results[i] for i in range(len(searches))]


def in_lockstep(searches: Sequence[Search[R]]) -> Search[list[R]]:
    """Several searches as one: each round yields the next batch of every search still going,
    side by side, and hands each its own outcomes (a capacity's per-seed bisections inside
    one point of a design search); returns their results in order."""
    results: dict[int, R] = {}
    pending: dict[int, Sequence[Unit]] = {}
    for i, search in enumerate(searches):
        try:
            pending[i] = next(search)
        except StopIteration as stop:
            results[i] = stop.value
    while pending:
        order = list(pending)
        outcomes = yield [unit for i in order for unit in pending[i]]
        start = 0
        for i in order:
            size = len(pending.pop(i))
            try:
                pending[i] = searches[i].send(outcomes[start : start + size])
            except StopIteration as stop:
                results[i] = stop.value
            start += size
    return [results[i] for i in range(len(searches))]
