"""Token identity of a workload's prompts, compact and independent of any block size.

Each prompt is a short list of runs ``(segment, tokens)``: the first ``tokens`` tokens of
``segment``. A segment id >= 0 names a token sequence of the workload (a system prompt, a
Mooncake hash block, a question); ``output_segment(j)`` (< 0) names the output of request
``j``, which a later turn of a conversation repeats. Two prompts share their first ``k``
tokens exactly when their runs, cut after ``k`` tokens, are equal; the scheduler's block
manager derives chained block hashes from the runs for its own block size.

Stored as three flat int64 arrays (run offsets per request, segments, lengths): a few runs per
request, so a million requests take tens of MB.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["PromptRuns", "output_segment"]


def output_segment(request: int) -> int:
    """The segment of request ``request``'s output, as a later prompt that repeats it names
    it: ``-(request + 2)``, the scheduler's own name for it (``scheduling.block_hash``; the
    workload imports no scheduling, a test checks the two agree)."""
    return -(request + 2)


class PromptRuns:
    """Per request, the ``(segment, tokens)`` runs of its prompt."""

    __slots__ = ("offsets", "segments", "lengths")

    def __init__(self, offsets: np.ndarray, segments: np.ndarray, lengths: np.ndarray) -> None:
        self.offsets = np.asarray(offsets, dtype=np.int64)
        """Request ``i``'s runs are ``[offsets[i], offsets[i + 1])``; ``len = requests + 1``."""
        self.segments = np.asarray(segments, dtype=np.int64)
        """Segment of each run."""
        self.lengths = np.asarray(lengths, dtype=np.int64)
        """Tokens of each run (>= 1)."""
        for array in (self.offsets, self.segments, self.lengths):
            array.setflags(write=False)

    @classmethod
    def from_lists(cls, runs: Sequence[Sequence[tuple[int, int]]]) -> PromptRuns:
        """From one list of ``(segment, tokens)`` per request."""
        counts = np.fromiter((len(r) for r in runs), dtype=np.int64, count=len(runs))
        offsets = np.concatenate(([0], np.cumsum(counts)))
        flat = [pair for r in runs for pair in r]
        pairs = np.array(flat, dtype=np.int64).reshape(-1, 2)
        return cls(offsets, pairs[:, 0], pairs[:, 1])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def runs(self, i: int) -> tuple[tuple[int, int], ...]:
        """Request ``i``'s runs."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return tuple(zip(self.segments[lo:hi].tolist(), self.lengths[lo:hi].tolist(), strict=True))

    def take(self, index: np.ndarray) -> PromptRuns:
        """The runs of the requests ``index`` (any order), renumbered ``0..len(index)-1``;
        a reference to the output of a request left out is an error."""
        index = np.asarray(index, dtype=np.int64)
        lo, hi = self.offsets[index], self.offsets[index + 1]
        counts = hi - lo
        pick = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        pick += np.arange(int(counts.sum()), dtype=np.int64)
        segments = self.segments[pick].copy()
        answers = segments < 0
        if answers.any():
            new_of = np.full(len(self), -1, dtype=np.int64)
            new_of[index] = np.arange(len(index))
            old = -segments[answers] - 2
            if (new_of[old] < 0).any():
                raise ValueError("a kept prompt repeats the output of a request left out")
            segments[answers] = -new_of[old] - 2
        return PromptRuns(np.concatenate(([0], np.cumsum(counts))), segments, self.lengths[pick])

    def check(self, prompt_len: np.ndarray, output_len: np.ndarray) -> None:
        """ValueError unless every request's runs are >= 1 token each, add up to its prompt,
        and repeat only outputs of earlier requests, no longer than those outputs."""
        n = len(prompt_len)
        if len(self) != n or self.offsets[0] != 0 or (np.diff(self.offsets) < 1).any():
            raise ValueError("prompt runs: one or more runs per request expected")
        if len(self.segments) != self.offsets[-1] or len(self.lengths) != len(self.segments):
            raise ValueError("prompt runs: offsets, segments and lengths disagree")
        if (self.lengths < 1).any():
            raise ValueError("prompt runs: every run must hold >= 1 token")
        sums = np.add.reduceat(self.lengths, self.offsets[:-1]) if n else self.lengths[:0]
        bad = np.flatnonzero(sums != prompt_len)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"prompt runs of request {i} hold {sums[i]} tokens, prompt_len {prompt_len[i]}"
            )
        answers = np.flatnonzero(self.segments < 0)
        if answers.size:
            owner = np.searchsorted(self.offsets, answers, side="right") - 1
            source = -self.segments[answers] - 2
            if (source >= owner).any() or (source < 0).any():
                raise ValueError(
                    "prompt runs: a prompt may only repeat an earlier request's output"
                )
            if (self.lengths[answers] > output_len[source]).any():
                raise ValueError("prompt runs: a repeated output is longer than that output")
