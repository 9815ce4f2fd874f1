"""What one step computes, as the cost model sees it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's work: for each scheduled sequence, the tokens it computes now
    (``new_tokens[i]``) and the tokens already in its KV cache before the step
    (``context_lens[i]``). A decode has ``new_tokens == 1``; a prefill chunk more."""

    new_tokens: tuple[int, ...]
    context_lens: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        """Sequences in the step."""
        return len(self.new_tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens computed in the step (prefill chunks plus decodes)."""
        return sum(self.new_tokens)

    @property
    def num_context_tokens(self) -> int:
        """Tokens already in KV, summed over the batch."""
        return sum(self.context_lens)

    @property
    def num_decode_seqs(self) -> int:
        """Sequences computing exactly one token (decodes)."""
        return sum(1 for n in self.new_tokens if n == 1)

    @classmethod
    def uniform(cls, num_seqs: int, new_tokens: int, context_len: int) -> Batch:
        """``num_seqs`` identical sequences (the shape of a profiled step)."""
        return cls((new_tokens,) * num_seqs, (context_len,) * num_seqs)
