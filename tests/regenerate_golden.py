"""Write the golden figures of the scenario tests anew: ``python -m tests.regenerate_golden
[NAME ...]`` (default: every scenario). Run it only after an intended change of behaviour, and
say why in the commit; each file records the command and the commit that produced it."""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from simulator import __version__
from tests.golden_figures import SCENARIOS, command, figures, golden_path, printable
from tests.paths import ROOT


def _commit() -> str:
    """The checked-out commit (with ``+changes`` when the tree differs from it)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main() -> None:
    """Regenerate the named scenarios' golden files (all by default)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="scenario names (default: all)")
    args = parser.parse_args()
    chosen = [p for p in SCENARIOS if not args.names or p.stem in args.names]
    for path in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            got = figures(path, Path(tmp) / "out")
        record = {
            "command": printable(command(path)),
            "servesim_version": __version__,
            "commit": _commit(),
            "figures": got,
        }
        golden_path(path).write_text(json.dumps(record, indent=2) + "\n")
        print(f"{golden_path(path).relative_to(ROOT)}: {record['command']}")


if __name__ == "__main__":
    main()
