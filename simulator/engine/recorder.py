"""What a run records as it goes, in flat arrays, and the tables built from them at the end."""

from __future__ import annotations

from array import array

import numpy as np

STEP_INT_FIELDS = (
    "num_seqs",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_seqs",
    "blocks_used",
    "num_running",
    "num_waiting",
    "num_preemptions",
)
"""Integer columns of a step row, in the order ``record_step`` takes them."""


class Recorder:
    """Per-request timestamps, one row per step, and one small integer per sampled token
    (which request sampled it), turned into inter-token gaps after the run by numpy. No
    per-token Python objects survive a step."""

    def __init__(self, num_requests: int) -> None:
        nan = float("nan")
        self.first_scheduled = [nan] * num_requests
        """Per request: start of the first step that computed any of its tokens."""
        self.finish = [nan] * num_requests
        """Per request: end of the step that sampled its last token."""
        self.num_preemptions = [0] * num_requests
        self.checksum = [0] * num_requests
        self.rejected: list[tuple[int, str]] = []
        """``(request, reason)`` of the requests that can never be served."""
        self.step_times = array("d")  # start, duration per step
        self.step_ints = array("q")  # STEP_INT_FIELDS per step
        self.sampled_ids = array("i")  # request of each sampled token, in time order
        self.sampled_per_step = array("i")

    def record_step(self, start: float, duration: float, ints: tuple[int, ...]) -> None:
        """One step row: its start, its duration (checked > 0) and ``STEP_INT_FIELDS``."""
        if not duration > 0:
            raise RuntimeError(f"cost model returned a non-positive step time {duration!r}")
        self.step_times.extend((start, duration))
        self.step_ints.extend(ints)

    def record_tokens(self, request_ids: list[int]) -> None:
        """The requests that sampled a token in the step just recorded, in plan order."""
        self.sampled_ids.extend(request_ids)
        self.sampled_per_step.append(len(request_ids))

    def record_finish(
        self, request: int, end: float, num_preemptions: int, output_hash: int
    ) -> None:
        """A request finished at ``end``."""
        self.finish[request] = end
        self.num_preemptions[request] = num_preemptions
        self.checksum[request] = output_hash

    def step_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(start, duration)`` pairs and the integer columns, one row per step."""
        times = np.frombuffer(self.step_times, dtype=np.float64).reshape(-1, 2)
        ints = np.frombuffer(self.step_ints, dtype=np.int64).reshape(-1, len(STEP_INT_FIELDS))
        return times, ints

    def token_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The request of each sampled token and how many tokens each step sampled."""
        ids = np.frombuffer(self.sampled_ids, dtype=np.int32)
        per_step = np.frombuffer(self.sampled_per_step, dtype=np.int32)
        return ids, per_step


def token_times(
    ids: np.ndarray, per_step: np.ndarray, step_ends: np.ndarray, n: int, chunk: int = 1 << 18
) -> tuple[np.ndarray, np.ndarray]:
    """From the request of every sampled token (in time order) and how many tokens each step
    sampled: each request's first token time (NaN if none) and every gap between a request's
    consecutive tokens (ITL, in no particular order).

    Tokens are the run's largest array, so they are taken ``chunk`` at a time, carrying each
    request's last token time across chunks: memory stays bounded whatever the run's length."""
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    num_gaps = len(ids) - int(np.count_nonzero(token_counts(ids, n, chunk)))
    gaps = np.empty(num_gaps)
    filled = 0
    tokens_through_step = np.cumsum(per_step)
    for lo in range(0, len(ids), chunk):
        hi = min(lo + chunk, len(ids))
        step_of = np.searchsorted(tokens_through_step, np.arange(lo, hi), side="right")
        order = np.argsort(ids[lo:hi], kind="stable")  # stable: time order within a request
        rid, t = ids[lo:hi][order], step_ends[step_of][order]
        del step_of, order
        same = rid[1:] == rid[:-1]
        heads = np.flatnonzero(np.concatenate(([True], ~same)))  # a request's first in chunk
        tails = np.flatnonzero(np.concatenate((~same, [True])))  # and its last
        inner = t[1:][same] - t[:-1][same]
        prev = last[rid[heads]]
        seen = ~np.isnan(prev)
        across = t[heads][seen] - prev[seen]
        for part in (across, inner):
            gaps[filled : filled + len(part)] = part
            filled += len(part)
        fresh = heads[~seen]
        first[rid[fresh]] = t[fresh]
        last[rid[tails]] = t[tails]
    assert filled == num_gaps
    return first, gaps


def token_counts(ids: np.ndarray, n: int, chunk: int = 1 << 18) -> np.ndarray:
    """Tokens sampled per request (bincount a chunk at a time: it would widen all ids at once)."""
    counts = np.zeros(n, dtype=np.int64)
    for lo in range(0, len(ids), chunk):
        counts += np.bincount(ids[lo : lo + chunk], minlength=n)
    return counts


def check_token_counts(ids: np.ndarray, output_len: np.ndarray, rejected: list[int]) -> None:
    """Every finished request sampled exactly ``output_len`` tokens: a preemption that redid
    a sample (instead of recomputing KV only) would show up here, whatever the tokens."""
    counts = token_counts(ids, len(output_len))
    want = np.asarray(output_len, dtype=np.int64).copy()
    want[rejected] = 0
    bad = np.flatnonzero(counts != want)
    if bad.size:
        i = int(bad[0])
        raise RuntimeError(
            f"request {i} sampled {counts[i]} tokens, expected {want[i]} (scheduler bug)"
        )
