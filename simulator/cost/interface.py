"""What the engine asks of a cost model: how long a step takes."""

from __future__ import annotations

from abc import ABC, abstractmethod

from simulator.cost.batch import Batch


class CostModel(ABC):
    """Times a step. Subclass it and implement ``step_time`` to add a cost model."""

    times_decodes_from_sums: bool = False
    """Whether ``decode_time`` is implemented (the engine's fast path for plain decodes)."""

    @abstractmethod
    def step_time(self, batch: Batch) -> float:
        """Seconds the step takes; > 0 for a non-empty batch."""

    def decode_time(self, num_seqs: int, context: int) -> float:
        """Seconds of a step decoding ``num_seqs`` sequences with ``context`` KV tokens in all;
        must equal ``step_time`` of any such batch to the last bit (only called when
        ``times_decodes_from_sums``)."""
        raise NotImplementedError(f"{type(self).__name__} times steps only from whole batches")
