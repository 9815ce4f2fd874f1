"""Chained content hashes of a sequence's full KV blocks, derived from its token identity.

A sequence's tokens are its prompt runs (``Sequence.prompt_runs``: ``(segment, tokens)``, each
the first ``tokens`` tokens of its segment) followed by its own output, a segment no other
sequence's output shares. Block ``j`` holds tokens ``[j * block_size, (j + 1) * block_size)``;
its hash chains the previous block's hash with the pieces of segments it covers, as vLLM
chains a block's token ids onto its parent's hash. Equal hashes therefore mean equal tokens
from the start of the sequence up to the end of the block, whatever the block size.

Hashes are Python's 64-bit ``hash`` of int tuples (deterministic for int segment ids; vLLM
offers the same builtin hash beside sha256): a false hit needs a 64-bit collision.
"""

from __future__ import annotations

from collections.abc import Hashable

from simulator.scheduling.sequence import Sequence

_ROOT = 0x5EED  # the parent of every sequence's first block


def output_segment(seq_id: int) -> Hashable:
    """The segment of ``seq_id``'s output tokens, as a later prompt that repeats them names it
    (for int ids: ``-(seq_id + 2)``; prompt segments are ints >= 0). Never -1: CPython hashes
    -1 like -2, and equal hashes of different segments would be false hits."""
    if isinstance(seq_id, int):
        return -(seq_id + 2)
    return (1, seq_id)


def _own_prompt_segment(seq_id: int) -> Hashable:
    # the segment of a prompt no other sequence shares (prompt_runs None)
    return (0, seq_id)


def extend_hashes(seq: Sequence, num_blocks: int, block_size: int) -> list[int]:
    """``seq.block_hashes`` grown to at least ``num_blocks`` entries (only full blocks of its
    known tokens may be asked for); returns the list."""
    hashes = seq.block_hashes
    j = len(hashes)
    if j >= num_blocks:
        return hashes
    prompt_len = seq.prompt_len
    if (j + 1) * block_size <= prompt_len and seq.prompt_runs is not None:
        return _extend(seq, num_blocks, block_size)
    # the common cases in a few operations: blocks of a prompt of its own, blocks of output
    parent = hashes[-1] if hashes else _ROOT
    start = j * block_size
    own = (0, seq.seq_id) if seq.prompt_runs is None else None
    out = output_segment(seq.seq_id)
    while j < num_blocks:
        end = start + block_size
        if start >= prompt_len:
            parent = hash((parent, out, start - prompt_len, end - prompt_len))
        elif own is not None and end <= prompt_len:
            parent = hash((parent, own, start, end))
        else:
            return _extend(seq, num_blocks, block_size)
        hashes.append(parent)
        start = end
        j += 1
    return hashes


def _extend(seq: Sequence, num_blocks: int, block_size: int) -> list[int]:
    """``extend_hashes`` for blocks that may span runs: one walk over the runs."""
    hashes = seq.block_hashes
    j = len(hashes)
    runs = seq.prompt_runs
    if runs is None:
        runs = ((_own_prompt_segment(seq.seq_id), seq.prompt_len),)
    segments = [*runs, (output_segment(seq.seq_id), 1 << 62)]
    parent = hashes[-1] if hashes else _ROOT
    # walk the runs once: (r, offset) is the run holding token ``start`` and where it begins
    start = j * block_size
    r, offset = 0, 0
    while offset + segments[r][1] <= start:
        offset += segments[r][1]
        r += 1
    while j < num_blocks:
        end = start + block_size
        segment, length = segments[r]
        if offset + length > end:  # the usual block: inside one run
            parent = hash((parent, segment, start - offset, end - offset))
            hashes.append(parent)
            start = end
            j += 1
            continue
        pieces: list[Hashable] = [parent]
        lo = start
        while True:
            segment, length = segments[r]
            if offset + length > end:  # the run goes on past this block
                pieces += (segment, lo - offset, end - offset)
                break
            pieces += (segment, lo - offset, length)
            offset += length
            r += 1
            lo = offset
            if lo == end:
                break
        parent = hash(tuple(pieces))
        hashes.append(parent)
        start = end
        j += 1
    return hashes
