"""Token identity from hash ids (Mooncake's ``hash_ids``, a CSV trace's ``hash_ids`` column):
each id stands for ``hash_block_tokens`` tokens of the prompt, in order, and equal ids at the
same position mean equal tokens up to the end of that block (Mooncake chains its ids over the
prefix). A prompt becomes the runs ``(id, hash_block_tokens)``, the last one cut to the
prompt's end; tokens past the last id are the request's own."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

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
    if not isinstance(value, list):
        raise fail(f"{value!r:.40} is not a list of hash ids")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_HASH_ID:
            raise fail(f"{v!r:.40} is not a hash id (an integer in 0..2**62)")
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
    fresh = 1 + max((max(row) for row in ids if row), default=-1)
    runs: list[list[tuple[int, int]]] = []
    for row, (row_ids, n) in enumerate(zip(ids, prompt_len.tolist(), strict=True)):
        if len(row_ids) * block_tokens - n >= block_tokens:
            need = -(-n // block_tokens)
            raise fail(
                row,
                f"{len(row_ids)} hash ids for a {n}-token prompt (at most {need} of "
                f"{block_tokens} tokens each)",
            )
        out = []
        left = max(n, 1)  # a 0-token prompt is raised to 1 token, its own
        for h in row_ids:
            out.append((h, min(block_tokens, left)))
            left -= out[-1][1]
        if left > 0:
            out.append((fresh, left))
            fresh += 1
        runs.append(out)
    return PromptRuns.from_lists(runs)
