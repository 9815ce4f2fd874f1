"""What one step computes, as the cost model sees it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import mul
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's work: for each scheduled sequence, the tokens it computes now
    (``new_tokens[i]``) and the tokens already in its KV cache before the step
    (``context_lens[i]``). A decode has ``new_tokens == 1``; a prefill chunk more.
    (Lists are taken as they are, not copied: do not change them.)"""

    new_tokens: Sequence[int]
    context_lens: Sequence[int]

    @property
    def num_seqs(self) -> int:
        """Sequences in the step."""
        return len(self.new_tokens)

    def attention_pairs(self) -> int:
        """Causal (query, key) pairs of the step: each sequence's ``n`` new queries see its
        ``c`` cached keys and a causal triangle of the chunk, ``n * c + n (n + 1) / 2``."""
        new, ctx = self.new_tokens, self.context_lens
        # summed as dot products: map(mul) runs in C, ~10x faster than a Python loop
        return sum(map(mul, new, ctx)) + (sum(map(mul, new, new)) + sum(new)) // 2

    @classmethod
    def uniform(cls, num_seqs: int, new_tokens: int, context_len: int) -> Batch:
        """``num_seqs`` identical sequences (the shape of a profiled step)."""
        return cls((new_tokens,) * num_seqs, (context_len,) * num_seqs)


class StepSums(NamedTuple):
    """What a step's time can depend on when a cost model times it from sums
    (``CostModel.time_sums``). Every field is an exact integer, so any
    order of summing gives the same value."""

    num_seqs: int
    """Sequences in the step."""
    num_decodes: int
    """Sequences computing one token (``new_tokens == 1``)."""
    num_tokens: int
    """Tokens computed (``sum(new_tokens)``)."""
    context: int
    """Tokens in KV before the step (``sum(context_lens)``)."""
    decode_context: int
    """Of ``context``, the tokens of the one-token sequences."""
    pairs: int
    """Causal query-key pairs (``Batch.attention_pairs()``)."""

    @classmethod
    def decode(cls, num_seqs: int, context: int) -> StepSums:
        """The sums of a step decoding ``num_seqs`` sequences with ``context`` KV tokens in
        all (each decode sees its context and itself)."""
        return cls(num_seqs, num_seqs, num_seqs, context, context, context + num_seqs)

    @classmethod
    def of(cls, batch: Batch) -> StepSums:
        """The sums of ``batch``."""
        new, ctx = batch.new_tokens, batch.context_lens
        decode_context = sum(c for n, c in zip(new, ctx, strict=True) if n == 1)
        return cls(
            len(new), new.count(1), sum(new), sum(ctx), decode_context, batch.attention_pairs()
        )


def decode_sums(m: int, contexts: range) -> Iterator[StepSums]:
    """The sums of decode steps of ``m`` sequences over ``contexts``, as plain tuples in
    ``StepSums`` order (built in C, and no object the garbage collector tracks: most steps
    of a run are timed from these; ``CostModel.time_sums`` reads its record by position)."""
    pairs = range(contexts.start + m, contexts.stop + m, contexts.step)
    return zip(repeat(m), repeat(m), repeat(m), contexts, contexts, pairs)  # type: ignore[return-value]


def uniform_attention_pairs(
    num_seqs: ArrayLike, new_tokens: ArrayLike, context_len: ArrayLike
) -> NDArray[np.float64]:
    """``Batch.attention_pairs`` of uniform batches, vectorised over arrays of shapes."""
    b, n, c = (np.asarray(x, dtype=float) for x in (num_seqs, new_tokens, context_len))
    return np.asarray(b * (n * c + n * (n + 1) / 2), dtype=float)
