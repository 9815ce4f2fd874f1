"""A table held as named numpy columns, made a pandas frame or an Arrow table only when asked.

A ``servesim run`` computes its summary from the columns and writes them through Arrow, so it
never imports pandas: that import was 0.2 s of CPU, a third of a 10,000-request run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


class Columns:
    """Equal-length numpy columns in order; a column of strings may name its categories (a
    pandas ``Categorical`` in the frame, an Arrow dictionary in a file)."""

    def __init__(
        self,
        data: dict[str, np.ndarray],
        categories: dict[str, Sequence[str]] | None = None,
    ) -> None:
        self.data = data
        """Column name -> values, in the table's order."""
        self.categories = dict(categories or {})
        """Column name -> its categories, for the columns that are categorical."""

    def __len__(self) -> int:
        """Number of rows."""
        return len(next(iter(self.data.values()))) if self.data else 0

    def __getitem__(self, name: str) -> np.ndarray:
        """One column's values."""
        return self.data[name]

    def __setitem__(self, name: str, values: np.ndarray) -> None:
        """Add (at the end) or replace a column."""
        self.data[name] = values

    def frame(self) -> pd.DataFrame:
        """The table as a pandas frame (a categorical column as ``pd.Categorical``, a column of
        Python objects as ``object``)."""
        import pandas as pd

        data: dict[str, object] = {}
        for name, values in self.data.items():
            if name in self.categories:
                data[name] = pd.Categorical(values, categories=list(self.categories[name]))
            elif values.dtype == object:  # kept as objects: pandas would infer its own str
                data[name] = pd.Series(values, dtype=object)
            else:
                data[name] = values
        return pd.DataFrame(data, columns=list(self.data))

    def arrow(self) -> pa.Table:
        """The table as Arrow, as pandas would write the frame (a categorical column as a
        dictionary of its categories with int8 indices)."""
        import pyarrow as pa

        arrays = []
        for name, values in self.data.items():
            if name in self.categories:
                cats = list(self.categories[name])
                codes = np.full(len(values), -1, dtype=np.int8)
                for code, cat in enumerate(cats):
                    codes[values == cat] = code
                if (codes < 0).any():
                    raise ValueError(f"column {name}: a value outside its categories {cats}")
                arrays.append(pa.DictionaryArray.from_arrays(arrow_array(codes), _strings(cats)))
            else:
                arrays.append(arrow_array(values))
        return pa.Table.from_arrays(arrays, names=list(self.data))


# pyarrow's own ``pa.array`` imports pandas to check whether it was handed a pandas object,
# even for a numpy array or a list: 0.2 s of CPU a run does not otherwise need. Numbers and
# strings are laid into Arrow's buffers directly instead (numbers zero-copy).


def arrow_array(values: np.ndarray) -> pa.Array:
    """A numpy column as an Arrow array (NaN stays a value, as ``pa.array`` keeps it)."""
    import pyarrow as pa

    if values.dtype.kind not in "iuf":  # flags, text: through pyarrow's own conversion
        return pa.array(values)
    values = np.ascontiguousarray(values)
    kind = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _strings(texts: list[str]) -> pa.Array:
    """A list of strings as an Arrow string array."""
    import pyarrow as pa

    encoded = [t.encode() for t in texts]
    offsets = np.cumsum([0, *map(len, encoded)], dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(texts), buffers)
