"""Token identity from hash ids (Mooncake's ``hash_ids``, a CSV trace's ``hash_ids`` column):
each id stands for ``hash_block_tokens`` tokens of the prompt, in order, and equal ids at the
same position mean equal tokens up to the end of that block (Mooncake chains its ids over the
prefix). A prompt becomes the runs ``(id, hash_block_tokens)``, the last one cut to the
prompt's end; tokens past the last id are the request's own."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

from simulator.errors import InputError
from simulator.workload.prompt_runs import PromptRuns

_SEPARATORS = re.compile(r"[\s,;]+")
#: Largest hash id accepted (ids are stored as int64 segments).
MAX_HASH_ID = 2**62


def parse_cell(cell: object, fail: Callable[[str], InputError]) -> list[int]:
    """The ids of one CSV cell: integers separated by spaces, commas or semicolons, optionally
    in brackets (``"3 4 5"``, ``"[3, 4, 5]"``); an empty cell has none."""
    if cell is None or cell != cell:  # missing (NaN)
        return []
    text = str(cell).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    ids = []
    for part in _SEPARATORS.split(text.strip()):
        if not part:
            continue
        if not part.isdigit() or int(part) > MAX_HASH_ID:
            raise fail(f"{part!r} is not a hash id (an integer in 0..2**62)")
        ids.append(int(part))
    return ids


def check_json_ids(value: object, fail: Callable[[str], InputError]) -> list[int]:
    """A JSON ``hash_ids`` value: a list of integers in 0..2**62."""
    # type() is: bool is an int subclass, and true/false are not ids (map/set run in C)
    if type(value) is not list or (value and set(map(type, value)) != {int}):
        bad = value if type(value) is not list else next(v for v in value if type(v) is not int)
        raise fail(f"{bad!r:.40} is not a hash id (an integer in 0..2**62)")
    if value and not 0 <= min(value) <= max(value) <= MAX_HASH_ID:
        bad = next(v for v in value if not 0 <= v <= MAX_HASH_ID)
        raise fail(f"{bad!r:.40} is not a hash id (an integer in 0..2**62)")
    return value


def runs_from_hash_ids(
    ids: Sequence[Sequence[int]],
    prompt_len: np.ndarray,
    block_tokens: int,
    fail: Callable[[int, str], InputError],
) -> PromptRuns:
    """Per request, its ids' runs of ``block_tokens`` tokens (the last cut at the prompt's
    end) and a run of its own for tokens past the last id. More ids than the prompt needs
    is an error on that row (``fail(row, reason)``)."""
    counts = np.fromiter((len(r) for r in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(counts.sum()))
    n = np.maximum(np.asarray(prompt_len, dtype=np.int64), 1)  # a 0-token prompt is raised
    need = -(-n // block_tokens)
    too_many = np.flatnonzero(counts > need)
    if too_many.size:
        row = int(too_many[0])
        raise fail(
            row,
            f"{counts[row]} hash ids for a {prompt_len[row]}-token prompt (at most "
            f"{need[row]} of {block_tokens} tokens each)",
        )
    tail = n - counts * block_tokens  # > 0: tokens past the ids; <= 0: the last id is cut
    own = tail > 0
    per_row = counts + own
    offsets = np.concatenate(([0], np.cumsum(per_row)))
    segments = np.empty(int(offsets[-1]), dtype=np.int64)
    lengths = np.full(len(segments), block_tokens, dtype=np.int64)
    # ids go first in each row's runs
    id_pos = np.repeat(offsets[:-1], counts) + _ranks(counts)
    segments[id_pos] = flat
    cut = np.flatnonzero(~own & (counts > 0))
    lengths[offsets[cut] + counts[cut] - 1] += tail[cut]
    # then a run of the request's own, with a fresh segment id
    rows = np.flatnonzero(own)
    fresh = 1 + (int(flat.max()) if flat.size else -1)
    segments[offsets[rows] + counts[rows]] = fresh + np.arange(len(rows))
    lengths[offsets[rows] + counts[rows]] = tail[rows]
    return PromptRuns(offsets, segments, lengths)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """``0..counts[i]-1`` for each ``i``, concatenated."""
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(int(counts.sum()), dtype=np.int64) - starts
