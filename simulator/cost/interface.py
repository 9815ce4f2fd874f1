"""What the engine asks of a cost model: how long a step takes."""

from __future__ import annotations

from abc import ABC, abstractmethod

from simulator.cost.batch import Batch


class CostModel(ABC):
    """Times a step. Subclass it and implement ``step_time`` to add a cost model."""

    times_from_sums: bool = False
    """Whether ``time_from_sums`` is implemented (the engine's fast path: steps timed
    without building their batch)."""

    @abstractmethod
    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes; > 0 for a non-empty batch."""

    def time_from_sums(
        self,
        num_seqs: int,
        num_decodes: int,
        num_tokens: int,
        context: int,
        decode_context: int,
        pairs: int,
    ) -> float:
        """Seconds of a step with these sums (``batch.StepSums``): sequences, one-token
        sequences, tokens computed, KV tokens before the step, those of the one-token
        sequences, causal query-key pairs. Must equal ``step_time`` of any batch with them
        to the last bit (only called when ``times_from_sums``)."""
        raise NotImplementedError(f"{type(self).__name__} times steps only from whole batches")

    def decode_time(self, num_seqs: int, context: int) -> float:
        """Seconds of a step decoding ``num_seqs`` sequences with ``context`` KV tokens in all
        (``time_from_sums`` of such a step; each decode sees its context and itself)."""
        return self.time_from_sums(
            num_seqs, num_seqs, num_seqs, context, context, context + num_seqs
        )
