"""Decode steps timed ahead of the clock and not yet taken: how a replica behind a router that
reads state keeps its fast path (``FastWindow.hold``, docs/cluster.md)."""

from __future__ import annotations

from bisect import bisect_right


class Held:
    """Decode steps of one group timed ahead from the clock and not taken (``FastWindow.hold``):
    what a step-by-step run would do if nothing were handed to the server before their end.
    Nobody finishes before the last of them, so the group keeps its ``num_seqs``."""

    __slots__ = ("starts", "durations", "used", "sizes", "num_blocks", "num_seqs", "end")

    def __init__(
        self,
        starts: list[float],
        durations: list[float],
        used: list[int],
        sizes: list[tuple[int, int, int]],
        num_blocks: int,
    ) -> None:
        self.starts, self.durations, self.used = starts, durations, used
        """Each step's start, duration, and blocks used once it is planned."""
        self.sizes, self.num_blocks = sizes, num_blocks
        """As ``Recorder.record_decode_steps`` takes them."""
        self.num_seqs = sizes[0][1]
        """Sequences decoding in each step."""
        self.end = starts[-1] + durations[-1]
        """End of the last step."""

    def num_started(self, now: float) -> int:
        """Steps started at or before ``now`` (the last of them in flight then)."""
        return bisect_right(self.starts, now)
