"""What a run records as it goes: per-request timestamps, the step table (a chunk at a time, to
memory or to a file) and the inter-token gaps (into a streaming distribution), so memory stays
proportional to requests, not to steps or tokens."""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from simulator.engine.step_sink import StepSink
from simulator.metrics import Distribution, StepStats, build_steps
from simulator.scheduling.sequence import Sequence

STEP_INT_FIELDS = (
    "num_seqs",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_seqs",
    "blocks_used",
    "num_running",
    "num_waiting",
    "num_preemptions",
    "num_cached_blocks",
)
"""Integer columns of a step row, in the order ``record_step`` takes them."""

CHUNK_STEPS = 1 << 16
"""Step rows buffered before they go to the sink (~5 MiB)."""
CHUNK_GAPS = 1 << 16
"""Inter-token gaps buffered before they go to the distribution."""


class Recorder:
    """A run's records. Requests are indexed by their row in the workload."""

    def __init__(
        self, num_requests: int, num_blocks: int, sink: StepSink, shared: Recorder | None = None
    ) -> None:
        nan = float("nan")
        self.first_scheduled = [nan] * num_requests
        """Per request: start of the first step that computed any of its tokens."""
        self.first_token = [nan] * num_requests
        """Per request: end of the step that sampled its first token."""
        self.finish = [nan] * num_requests
        """Per request: end of the step that sampled its last token."""
        self.num_preemptions = [0] * num_requests
        self.cached_tokens = [0] * num_requests
        """Per request: prompt tokens served from the prefix cache when first scheduled."""
        self.checksum = [0] * num_requests
        self.rejected: list[tuple[int, str]] = []
        """``(request, reason)`` of the requests that can never be served."""
        self.num_tokens = 0
        """Tokens sampled in all."""
        self.itl = Distribution()
        """Every gap between two consecutive tokens of a request."""
        self.step_stats = StepStats()
        self._last_token = [nan] * num_requests  # when each request last sampled
        if shared is not None:
            # another server of a cluster: its own steps, aggregates, token count and gap
            # buffers, and ``shared``'s per-request records and ITL distribution (a request
            # is on one replica at a time)
            self.first_scheduled, self.first_token = shared.first_scheduled, shared.first_token
            self.finish, self.num_preemptions = shared.finish, shared.num_preemptions
            self.checksum, self.rejected = shared.checksum, shared.rejected
            self.cached_tokens = shared.cached_tokens
            self.itl, self._last_token = shared.itl, shared._last_token
        self._num_blocks = num_blocks
        self._sink = sink
        self._step_times = array("d")  # start, duration per buffered step
        self._step_ints = array("q")  # STEP_INT_FIELDS per buffered step
        self._num_flushed = 0
        self._gaps = array("d")  # gaps of single tokens
        self._run_gaps = array("d")  # gaps shared by a whole deferred decode step ...
        self._run_counts = array("q")  # ... and how many tokens share each

    # -- steps ---------------------------------------------------------------------------------

    def record_step(self, start: float, duration: float, ints: tuple[int, ...]) -> None:
        """One step row: its start, its duration (checked > 0, or 0 for a step that scheduled
        nothing) and ``STEP_INT_FIELDS``."""
        if not (duration > 0 or duration == 0 and ints[0] == 0):
            raise RuntimeError(f"cost model returned a non-positive step time {duration!r}")
        self._step_times.extend((start, duration))
        self._step_ints.extend(ints)
        if len(self._step_times) >= 2 * CHUNK_STEPS:
            self._flush_steps()

    def _flush_steps(self) -> None:
        times = np.frombuffer(self._step_times, dtype=np.float64).reshape(-1, 2)
        ints = np.frombuffer(self._step_ints, dtype=np.int64).reshape(-1, len(STEP_INT_FIELDS))
        chunk = build_steps(times, ints, STEP_INT_FIELDS, self._num_blocks, self._num_flushed)
        self._num_flushed += len(chunk)
        self.step_stats.add(chunk)
        self._sink.write(chunk)
        del times, ints  # release the buffers' exports before resizing them
        self._step_times = array("d")
        self._step_ints = array("q")

    # -- tokens --------------------------------------------------------------------------------

    def record_samples(self, seqs: list[Sequence], end: float) -> None:
        """The sequences that sampled a token in the step ending at ``end``."""
        first, last, gaps = self.first_token, self._last_token, self._gaps
        for seq in seqs:
            i: int = seq.seq_id  # type: ignore[assignment]
            prev = last[i]
            if prev != prev:  # NaN: its first token
                first[i] = end
            else:
                gaps.append(end - prev)
            last[i] = end
        self.num_tokens += len(seqs)
        if len(gaps) >= CHUNK_GAPS:
            self._flush_gaps()

    def record_decode_step(self, num_seqs: int, start: float, end: float) -> None:
        """A deferred decode step from ``start`` to ``end``: each of its ``num_seqs``
        sequences sampled in the step just before (the fast path takes only such steps), at
        ``start``, so each adds the gap ``end - start``."""
        self._run_gaps.append(end - start)
        self._run_counts.append(num_seqs)
        self.num_tokens += num_seqs
        if len(self._run_gaps) >= CHUNK_GAPS:
            self._flush_gaps()

    def end_decode_run(self, request_ids: list[int], end: float) -> None:
        """Deferred decode steps stop at ``end``: the last token of each request still in
        the batch was sampled then."""
        last = self._last_token
        for i in request_ids:
            last[i] = end

    def _flush_gaps(self) -> None:
        self.itl.add(np.frombuffer(self._gaps, dtype=np.float64))
        self.itl.add(
            np.frombuffer(self._run_gaps, dtype=np.float64),
            np.frombuffer(self._run_counts, dtype=np.int64),
        )
        self._gaps, self._run_gaps, self._run_counts = array("d"), array("d"), array("q")

    # -- requests ------------------------------------------------------------------------------

    def record_finish(
        self, request: int, end: float, num_preemptions: int, output_hash: int
    ) -> None:
        """A request finished at ``end``."""
        self.finish[request] = end
        self.num_preemptions[request] = num_preemptions
        self.checksum[request] = output_hash

    def close(self) -> pd.DataFrame | None:
        """Flush what is buffered; the step table if the sink keeps it in memory."""
        self._flush_steps()
        self._flush_gaps()
        return self._sink.close()
