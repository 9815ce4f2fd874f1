"""The tokens a simulated model samples: fixed per (request, output position), so outputs
cannot depend on batching or preemption (what a model with fixed seeds would give).

The engine never stops a request at an EOS token, so its schedulers keep no tokens: they only
count each request's samples (``Sequence.num_output``), and a request's output is
``token_for(request, p)`` for ``p`` below that count. ``output_checksums`` hashes the outputs
from those counts at the end of a run; ``sample``/``sample_many`` give the tokens one by one
for schedulers that keep them (benchmarks, tests).
"""

from __future__ import annotations

import numpy as np

from simulator.scheduling.sequence import Sequence

_REQUEST_STRIDE = 1_000_003
_POSITION_STRIDE = 7_919
_VOCAB = 32_000


def token_for(request_index: int, position: int) -> int:
    """The token request ``request_index`` samples at output position ``position``."""
    return (request_index * _REQUEST_STRIDE + position * _POSITION_STRIDE + 17) % _VOCAB + 1


def sample(seq: Sequence) -> int:
    """The next token of an engine sequence (its id is its request's row index)."""
    return token_for(seq.seq_id, len(seq.output))


def sample_many(seq: Sequence, k: int) -> list[int]:
    """The next ``k`` tokens ``sample`` would give, in one go (for deferred decode steps)."""
    # token_for()'s linear part stepped by range() in C: one of these lists is built per
    # sequence each time deferred steps settle
    first = token_for(seq.seq_id, len(seq.output)) - 1
    stop = first + k * _POSITION_STRIDE
    return [x % _VOCAB + 1 for x in range(first, stop, _POSITION_STRIDE)]


def output_checksums(num_output: np.ndarray) -> np.ndarray:
    """Per request (row ``i``), a 64-bit hash of its output, ``token_for(i, p)`` for ``p <
    num_output[i]``: an output is its request and its length, so this mixes the two
    (splitmix64's finalizer); 0 where nothing was sampled (a rejected request)."""
    n = np.asarray(num_output, dtype=np.uint64)
    x = np.arange(len(n), dtype=np.uint64) * np.uint64(_REQUEST_STRIDE) + (n << np.uint64(32))
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return np.where(n > 0, x.view(np.int64), 0)
