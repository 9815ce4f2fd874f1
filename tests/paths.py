"""Where the tests find the repository and the real data files.

Each data file has one name (``DataFile.dest`` in simulator/workload/datasets.py), looked up
first in ``../shared/data`` (our byte-exact copies, beside the checkout on CI and the
developers' machines), then in ``data/`` (what ``servesim fetch`` saves, under the same names).
``make test`` fetches whatever is in neither place before the tests run (``tests.fetch_data``),
so a missing file is a failure, never a skip."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
"""The copies beside the checkout (may be absent: a fresh clone has none)."""
FETCHED_DATA = ROOT / "data"
"""What ``servesim fetch`` saves when run in the repository (its default ``--dest``)."""
MISSING = "missing: `make test` fetches the data files (or run `servesim fetch all`)"
"""What a test says when a data file is nowhere."""


class DataFolder:
    """``DATA / "name"``: the data file ``name`` in ``../shared/data`` if it is there, else in
    ``data/`` (where it may be missing too: the test's assertion then says so)."""

    places = (SHARED_DATA, FETCHED_DATA)

    def __truediv__(self, name: str) -> Path:
        for place in self.places:
            if (place / name).exists():
                return place / name
        return self.places[-1] / name

    def __repr__(self) -> str:
        return " or ".join(str(p) for p in self.places)


DATA = DataFolder()
