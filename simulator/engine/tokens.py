"""The tokens a simulated model samples: fixed per (request, output position), so outputs
cannot depend on batching or preemption (what a model with fixed seeds would give)."""

from __future__ import annotations

from simulator.scheduling.sequence import Sequence

_REQUEST_STRIDE = 1_000_003
_POSITION_STRIDE = 7_919
_VOCAB = 32_000


def token_for(request_index: int, position: int) -> int:
    """The token request ``request_index`` samples at output position ``position``."""
    return (request_index * _REQUEST_STRIDE + position * _POSITION_STRIDE + 17) % _VOCAB + 1


def sample(seq: Sequence) -> int:
    """The next token of an engine sequence (its id is its request's row index)."""
    return token_for(seq.seq_id, len(seq.output))  # type: ignore[arg-type]


def sample_many(seq: Sequence, k: int) -> list[int]:
    """The next ``k`` tokens ``sample`` would give, in one go (for deferred decode steps)."""
    # token_for()'s linear part stepped by range() in C: one of these lists is built per
    # sequence each time deferred steps settle
    first = token_for(seq.seq_id, len(seq.output)) - 1  # type: ignore[arg-type]
    stop = first + k * _POSITION_STRIDE
    return [x % _VOCAB + 1 for x in range(first, stop, _POSITION_STRIDE)]
