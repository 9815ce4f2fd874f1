"""What the engine asks of a cost model: how long a step takes."""

from __future__ import annotations

from abc import ABC, abstractmethod

from simulator.cost.batch import Batch, StepSums, decode_sums


class CostModel(ABC):
    """Times a step. Subclass it and implement ``step_time`` to add a cost model."""

    times_from_sums: bool = False
    """Whether ``time_sums`` is implemented (the engine's fast path: steps timed
    without building their batch)."""

    @abstractmethod
    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes; > 0 for a non-empty batch."""

    def time_sums(self, sums: StepSums) -> float:
        """Seconds of a step with these sums, in ``StepSums`` order: sequences, one-token
        sequences, tokens computed, KV tokens before the step, those of the one-token
        sequences, causal query-key pairs. Read them by position or unpack them: the engine
        may pass a plain tuple (most steps are timed so, and a tuple costs least). Must equal
        ``step_time`` of any batch with them to the last bit (only called when
        ``times_from_sums``)."""
        raise NotImplementedError(f"{type(self).__name__} times steps only from whole batches")

    def time_decodes(self, num_seqs: int, contexts: range) -> list[float]:
        """``time_sums`` of the decode steps of ``num_seqs`` sequences holding ``contexts[i]``
        KV tokens in all before step ``i`` (a stretch of deferred decode steps), to the last
        bit; a cost model may time them all at once."""
        return list(map(self.time_sums, decode_sums(num_seqs, contexts)))
