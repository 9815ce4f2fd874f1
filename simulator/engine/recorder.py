"""What a run records as it goes: per-request timestamps, the step table (a chunk at a time, to
memory or to a file) and the inter-token gaps (into a streaming distribution), so memory stays
proportional to requests, not to steps or tokens. The per-request records are typed arrays
(``array.array``: 8 bytes a request, no Python object each), read by index as lists are."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np

from simulator.engine.step_buffer import STEP_INT_FIELDS, StepBuffer
from simulator.engine.step_sink import StepSink
from simulator.metrics import Distribution, StepStats
from simulator.scheduling.interface import StepPlan
from simulator.scheduling.sequence import Sequence

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHUNK_GAPS", "CHUNK_STEPS", "NO_MOVES", "STEP_INT_FIELDS", "Recorder"]

CHUNK_STEPS = 1 << 16
"""Step rows buffered before they go to the sink (~5 MiB)."""
CHUNK_GAPS = 1 << 16
"""Inter-token gaps buffered before they go to the distribution."""
NAN = float("nan")
"""The one NaN object the per-request lists point to where no time is known."""
NO_MOVES = (0, 0, 0, 0, 0, 0)
"""The KV bytes a step without KV tiers or swaps moves (cpu and shared tiers, stored and
loaded; swapped out and in)."""


class Recorder:
    """A run's records. Requests are indexed by their row in the workload."""

    def __init__(
        self, num_requests: int, num_blocks: int, sink: StepSink, shared: Recorder | None = None
    ) -> None:
        nan = NAN
        self.first_scheduled = array("d", [nan]) * num_requests
        """Per request: start of the first step that computed any of its tokens."""
        self.first_token = array("d", [nan]) * num_requests
        """Per request: end of the step that sampled its first token."""
        self.finish = array("d", [nan]) * num_requests
        """Per request: end of the step that sampled its last token."""
        self.num_preemptions = array("q", [0]) * num_requests
        self.cached_tokens = array("q", [0]) * num_requests
        """Per request: prompt tokens served from the prefix cache when first scheduled."""
        self.num_output = array("q", [0]) * num_requests
        """Per finished request: the tokens it sampled, as its sequence counted them."""
        self.tier_hits: dict[int, list[int]] = {}
        """Per request that loaded KV from a tier below the GPU's before it was first
        scheduled: the prompt tokens each tier (cpu, shared) served."""
        self.rejected: list[tuple[int, str]] = []
        self.encoded: dict[int, dict[int, int]] = {}
        """Multimodal: per request, the times each of its items was encoded for it."""
        """``(request, reason)`` of the requests that can never be served."""
        self.num_tokens = 0
        """Tokens sampled in all."""
        self.itl = Distribution()
        """Every gap between two consecutive tokens of a request."""
        self.step_stats = StepStats()
        # speculative decoding, per request (None until a step verifies drafts)
        self.num_draft_tokens: list[int] | None = None
        """Per request: draft tokens verified."""
        self.num_accepted_tokens: list[int] | None = None
        """Per request: draft tokens accepted."""
        self.num_verify_steps: list[int] | None = None
        """Per request: steps that verified drafts of it."""
        # when each request last sampled: a list (read at every token sampled outside a decode
        # stretch, where a typed array would box a new float each time), reset to the one NaN
        # when the request finishes, so a finished request costs its 8-byte slot only
        self._last_token = [nan] * num_requests
        if shared is not None:
            # another server of a cluster: its own steps, aggregates, token count and gap
            # buffers, and ``shared``'s per-request records and ITL distribution (a request
            # is on one replica at a time)
            self.first_scheduled, self.first_token = shared.first_scheduled, shared.first_token
            self.finish, self.num_preemptions = shared.finish, shared.num_preemptions
            self.num_output, self.rejected = shared.num_output, shared.rejected
            self.cached_tokens, self.tier_hits = shared.cached_tokens, shared.tier_hits
            self.itl, self._last_token = shared.itl, shared._last_token
        self._sink = sink
        self._steps = StepBuffer(num_blocks, sink, self.step_stats, CHUNK_STEPS)
        self._gaps: list[float] = []  # gaps of single tokens
        # gaps shared by a whole deferred decode step, each ``(a + b) - c`` (worked out a
        # chunk at a time by numpy, the same float operations: a stretch's steps pass their
        # starts and durations as they are, with no Python operation per step) ...
        self._run_a: list[float] = []
        self._run_b: list[float] = []
        self._run_c: list[float] = []
        self._run_counts: list[int] = []  # ... how many tokens share each, in runs of
        self._run_lengths: list[int] = []  # ... this many gaps (a segment's steps share one)
        self._settled: tuple[np.ndarray, ...] | None = None  # ``settle``: gaps held as arrays

    # -- steps ---------------------------------------------------------------------------------

    def record_step(
        self,
        start: float,
        duration: float,
        ints: tuple[int, ...],
        moved: tuple[int, ...] = NO_MOVES,
        accepted: int = 0,
        encoder: int = 0,
    ) -> None:
        """One step row: its start, its duration (checked > 0, or 0 for a step that scheduled
        nothing), ``STEP_INT_FIELDS`` but the last eight, then those: the KV bytes moved, the
        draft tokens accepted (speculative decoding; 0 without) and the placeholder tokens the
        vision encoder computed (multimodal; 0 without)."""
        if not (duration > 0 or duration == 0 and ints[0] == 0):
            raise RuntimeError(f"cost model returned a non-positive step time {duration!r}")
        self._steps.add(start, duration, (*ints, *moved, accepted, encoder))

    def record_decode_steps(
        self,
        sizes: list[tuple[int, int, int]],
        starts: list[float],
        durations: list[float],
        blocks_used: list[int],
        num_blocks: int,
        open_last: bool = False,
        running: list[int] | None = None,
    ) -> None:
        """Consecutive steps in which every running sequence decodes one token and nobody
        waits: their starts, durations and blocks used; ``sizes`` lists (first step, number of
        sequences, free blocks the prefix cache keeps before it) wherever that number changes
        (``running``: the sequences running as each segment's steps are planned, if more:
        under async scheduling those that sampled their last token in the step in flight);
        with a prefix cache of ``num_blocks`` blocks (0: none), a step's kept blocks are at most
        its free ones (``DecodeStretch.num_blocks``). Their tokens are recorded as
        ``record_decode_step`` would, but for the last one's with ``open_last`` (it is still
        in flight: ``record_decode_step`` records them when it ends)."""
        k = len(durations)
        if not k:
            return
        if not min(durations) > 0:
            raise RuntimeError(f"cost model returned a non-positive step time {min(durations)!r}")
        counts, lengths = self._run_counts, self._run_lengths
        # each segment's row: m sequences decode a token each, all running, none waiting
        segments: list[int] = []
        rows = [lo for lo, _, _ in sizes[1:]]  # where each segment ends: the next starts
        rows.append(k)
        tokens = 0
        for j, (lo, m, kept) in enumerate(sizes):
            num_running = m if running is None else running[j]
            segments += (m, m, 0, m, 0, num_running, 0, 0, kept, 0, 0, 0, 0, 0, 0, 0, 0)
            n = rows[j] = rows[j] - lo
            counts.append(m)
            lengths.append(n)
            tokens += m * n
        if open_last:  # its tokens are recorded when it ends (``record_decode_step``)
            lengths[-1] -= 1
            tokens -= sizes[-1][1]
        self.num_tokens += tokens
        self._steps.add_segments(starts, durations, blocks_used, segments, rows, num_blocks)
        # each token's gap as the plain path takes it: its step's end (a float sum) - start
        if open_last:
            starts, durations = starts[:-1], durations[:-1]
        self._run_a += starts
        self._run_b += durations
        self._run_c += starts
        if len(self._run_a) >= CHUNK_GAPS:
            self._flush_gaps()

    def record_admitted(self, plan: StepPlan, start: float) -> None:
        """The sequences ``plan`` admitted, in a step starting at ``start``: the first
        scheduling of each that was never scheduled before, with its prefix-cache hit."""
        first_sched = self.first_scheduled
        seqs, context = plan.seqs, plan.context_lens  # the admitted are the last ones
        for j in range(len(seqs) - plan.num_admitted, len(seqs)):
            i = seqs[j].seq_id
            if first_sched[i] != first_sched[i]:  # NaN: scheduled for the first time
                first_sched[i] = start
                self.cached_tokens[i] = context[j]  # its prefix-cache hit (``cached_tokens``)

    def record_encoded(self, plan: StepPlan) -> None:
        """The items ``plan`` encodes, for each request they are encoded for."""
        assert plan.encoder is not None
        for seq, items in plan.encoder.items():
            counts = self.encoded.setdefault(seq.seq_id, {})
            for j in items:
                counts[j] = counts.get(j, 0) + 1

    def record_tier_hits(self, request: int, tokens: list[int]) -> None:
        """Request ``request`` loads ``tokens`` prompt tokens from each tier (cpu, shared);
        kept only before it is first scheduled (as its prefix-cache hit is)."""
        first = self.first_scheduled[request]
        if first != first and request not in self.tier_hits:  # NaN: not scheduled yet
            self.tier_hits[request] = tokens

    # -- tokens --------------------------------------------------------------------------------

    def record_samples(self, seqs: list[Sequence], end: float, num_extra: int = 0) -> None:
        """The sequences that sampled in the step ending at ``end`` (one token each, and
        ``num_extra`` more in all: accepted drafts). A sequence's tokens of one step arrive
        together, as one streamed chunk: one gap, as vLLM's benchmark counts ITL."""
        first, last, gaps = self.first_token, self._last_token, self._gaps
        for seq in seqs:
            i = seq.seq_id
            prev = last[i]
            if prev != prev:  # NaN: its first token
                first[i] = end
            else:
                gaps.append(end - prev)
            last[i] = end
        self.num_tokens += len(seqs) + num_extra
        if len(gaps) >= CHUNK_GAPS:
            self._flush_gaps()

    def record_drafts(self, plan: StepPlan) -> None:
        """Speculative decoding: the drafts each sequence of ``plan`` verified, and how many
        it had accepted (a request that stopped early still counts them, as vLLM does)."""
        if self.num_draft_tokens is None:
            self.num_draft_tokens = [0] * len(self.first_token)
            self.num_accepted_tokens = [0] * len(self.first_token)
            self.num_verify_steps = [0] * len(self.first_token)
        drafts, accepted, steps = (
            self.num_draft_tokens,
            self.num_accepted_tokens,
            self.num_verify_steps,
        )
        assert accepted is not None and steps is not None
        for seq, a in plan.accepted.items():
            i = seq.seq_id
            drafts[i] += plan.drafts[seq]
            accepted[i] += a
            steps[i] += 1

    def record_decode_step(self, num_seqs: int, start: float, end: float) -> None:
        """A deferred decode step from ``start`` to ``end``: each of its ``num_seqs``
        sequences sampled in the step just before (the fast path takes only such steps), at
        ``start``, so each adds the gap ``end - start``."""
        self._run_a.append(end)  # (end + 0.0) - start: end - start
        self._run_b.append(0.0)
        self._run_c.append(start)
        self._run_counts.append(num_seqs)
        self._run_lengths.append(1)
        self.num_tokens += num_seqs
        if len(self._run_a) >= CHUNK_GAPS:
            self._flush_gaps()

    def end_decode_run(self, request_ids: list[int], end: float) -> None:
        """A deferred decode group ends: its last step ended at ``end``, so the last token of
        each of its requests was sampled then."""
        last = self._last_token
        for i in request_ids:
            last[i] = end

    def _flush_gaps(self) -> None:
        gaps, run_gaps, run_counts = self._settled or self._gap_arrays()
        self.itl.add(gaps)
        self.itl.add(run_gaps, run_counts)
        self._clear_gaps()
        self._settled = None

    def _gap_arrays(self) -> tuple[np.ndarray, ...]:
        """The buffered gaps, the run gaps and each run gap's token count, as arrays."""
        return (
            np.array(self._gaps, dtype=np.float64),
            (np.array(self._run_a, dtype=np.float64) + np.array(self._run_b, dtype=np.float64))
            - np.array(self._run_c, dtype=np.float64),
            np.repeat(
                np.array(self._run_counts, dtype=np.int64),
                np.array(self._run_lengths, dtype=np.int64),
            ),
        )

    def _clear_gaps(self) -> None:
        self._gaps, self._run_counts, self._run_lengths = [], [], []
        self._run_a, self._run_b, self._run_c = [], [], []

    def pass_gaps_to(self, itl: Distribution) -> None:
        """Pass the inter-token gaps on to ``itl`` from now on (a cluster running replicas
        one after the other logs each one's chunks, then replays them in time order)."""
        self.itl = itl

    def settle(self) -> None:
        """This server will step no more (a drained replica of an autoscaled fleet): pass
        its buffered step rows on now, and hold its buffered gaps as arrays (8 bytes each,
        not a Python float) until ``close`` adds them to the shared ITL distribution, in the
        same order as ever. Nothing may be recorded here after."""
        self._steps.flush(whole=True)
        self._settled = self._gap_arrays()
        self._clear_gaps()

    # -- requests ------------------------------------------------------------------------------

    def record_rejected(self, request: int, reason: str) -> None:
        """A request that can never be served, and why."""
        self.rejected.append((request, reason))

    def record_finish(
        self, request: int, end: float, num_preemptions: int, num_output: int
    ) -> None:
        """A request finished at ``end`` with ``num_output`` tokens."""
        self.finish[request] = end
        self.num_preemptions[request] = num_preemptions
        self.num_output[request] = num_output
        self._last_token[request] = NAN  # it samples no more

    def close(self) -> pd.DataFrame | None:
        """Flush what is buffered; the step table if the sink keeps it in memory."""
        self._flush()
        return self._sink.close()

    def close_columns(self) -> dict[str, np.ndarray] | None:
        """``close()``, the step table as its columns."""
        self._flush()
        return self._sink.close_columns()

    def _flush(self) -> None:
        if self._settled is None:  # else its rows have gone already (``settle``)
            self._steps.flush(whole=True)
        self._flush_gaps()
