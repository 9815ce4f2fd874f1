"""Images in a CSV trace (docs/multimodal.md, "Traces"): the optional columns ``mm_items``
(images in the row's prompt, at its start), ``mm_tokens`` (placeholder tokens of each) and
``mm_content`` (the content id of its first image, image ``j`` being ``mm_content + j``; rows
with equal ids send the same images; absent: every image new). The row's ``prompt_len``
counts the placeholders, as the server counted them."""

from __future__ import annotations

import numpy as np

from simulator.workload.csv_table import CsvTable
from simulator.workload.multimodal import MMItems, items_at_start

IMAGE_COLUMNS = ("mm_items", "mm_tokens", "mm_content")
"""The trace's image columns (``mm_items`` and ``mm_tokens`` go together)."""


def trace_images(table: CsvTable, prompt: np.ndarray) -> MMItems | None:
    """The rows' images, or None if the trace has no image columns; a row whose images do not
    fit in its prompt, or a count that is not an integer, is an error naming its line and
    column."""
    frame = table.frame
    if "mm_items" not in frame and "mm_tokens" not in frame:
        return None
    columns = {}
    for column in IMAGE_COLUMNS:
        if column not in frame:
            if column == "mm_content":
                continue
            other = "mm_tokens" if column == "mm_items" else "mm_items"
            raise table.fail(0, f"column {column}: required with {other}")
        values = table.numbers(column)
        low = 1 if column == "mm_tokens" else 0
        bad = np.flatnonzero((values != np.rint(values)) | (values < low) | (values > 2**31))
        if len(bad):
            row = int(bad[0])
            why = f"{table.text(column, row)} is not an integer >= {low}"
            raise table.fail(row, f"column {column}: {why}")
        columns[column] = values.astype(np.int64)
    counts, tokens = columns["mm_items"], columns["mm_tokens"]
    over = np.flatnonzero(counts * tokens > prompt)
    if len(over):
        row = int(over[0])
        why = f"{counts[row]} images of {tokens[row]} tokens exceed prompt_len {prompt[row]}"
        raise table.fail(row, f"column mm_items: {why}")
    return items_at_start(counts, tokens, columns.get("mm_content"))
