"""``python -m tests.fetch_data`` (run by ``make test`` before the tests): download into
``data/`` the registered data files that are neither in ``../shared/data`` nor already
verified in ``data/``, from GitHub or the mirror ``$SERVESIM_DATA_URL`` names.

Silent, and touches no network, when nothing is missing (as on CI, where ../shared/data holds
every file); one line and exit 2 when a download fails.

``python -m tests.fetch_data --mirror DIR`` instead builds such a mirror from our copies:
``DIR/OWNER/REPO/COMMIT/PATH``, what ``SERVESIM_DATA_URL=file://DIR`` serves a fresh clone."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from simulator.errors import InputError
from simulator.workload.datasets import BASE_URL_ENV, DATASETS, DataFile, fetch, file_state
from tests.paths import DATA, FETCHED_DATA, MISSING, SHARED_DATA


def missing(shared: Path = SHARED_DATA, fetched: Path = FETCHED_DATA) -> list[DataFile]:
    """The registered files in neither place (a file in ``fetched`` must match its sha256; the
    tests check the ``shared`` copies' checksums themselves)."""
    return [
        e
        for e in DATASETS.values()
        if not (shared / e.dest).is_file() and file_state(e, fetched) != "verified"
    ]


def fetch_missing(
    shared: Path = SHARED_DATA, fetched: Path = FETCHED_DATA, base_url: str | None = None
) -> int:
    """Fetch what ``missing`` lists into ``fetched``; the exit code (0, or 2 after one line)."""
    todo = missing(shared, fetched)
    if not todo:
        return 0
    print(
        f"fetching {len(todo)} data file(s) the tests read, absent from {shared}, into {fetched}",
        file=sys.stderr,
    )
    try:
        fetch([e.name for e in todo], fetched, base_url, progress=False, report=print)
    except InputError as err:
        print(
            f"fetch_data: error: {err} (set {BASE_URL_ENV} to a mirror laid out as "
            "BASE/OWNER/REPO/COMMIT/PATH, or put the files in ../shared/data)",
            file=sys.stderr,
        )
        return 2
    return 0


def build_mirror(root: Path, entries: list[DataFile] | None = None) -> Path:
    """A ``root/OWNER/REPO/COMMIT/PATH`` tree of the registered files (all by default),
    copied from where the tests find them; returns ``root``."""
    for entry in list(DATASETS.values()) if entries is None else entries:
        source = DATA / entry.dest
        assert source.is_file(), f"{source} {MISSING}"
        target = root / entry.repo / entry.commit / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return root


def main() -> int:
    """Fetch what is missing, or build a mirror (``--mirror DIR``)."""
    parser = argparse.ArgumentParser(prog="python -m tests.fetch_data", description=__doc__)
    parser.add_argument("--mirror", type=Path, metavar="DIR", help="build a mirror in DIR")
    args = parser.parse_args()
    if args.mirror is None:
        return fetch_missing()
    print(f"SERVESIM_DATA_URL={build_mirror(args.mirror).resolve().as_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
