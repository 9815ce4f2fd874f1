"""The drawn acceptance of speculative decoding: how many drafts each verify step accepts,
from a seeded stream of its own (one uniform per verify)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from simulator.scheduling.sequence import Sequence

_BATCH = 4096  # uniforms drawn at once: one Generator call per many verify steps


class DrawnAcceptance:
    """An ``Acceptor``: ``P(at least i accepted) = at_least[i - 1]``, drawn with one uniform
    ``u`` per verify step (accepted = how many of the first ``d`` rates exceed ``u``)."""

    def __init__(self, at_least: Seq[float], rng: np.random.Generator) -> None:
        self._at_least = list(at_least)
        self._rng = rng
        self._uniforms: list[float] = []
        self._next = 0

    def __call__(self, seq: Sequence, num_drafts: int) -> int:
        """The accepted prefix of ``num_drafts`` drafts of ``seq``."""
        if self._next == len(self._uniforms):
            self._uniforms = self._rng.random(_BATCH).tolist()
            self._next = 0
        u = self._uniforms[self._next]
        self._next += 1
        a = 0
        rates = self._at_least
        while a < num_drafts and u < rates[a]:
            a += 1
        return a
