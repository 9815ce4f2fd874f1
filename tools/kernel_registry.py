"""Write configs/kernels/database.csv, the registry ``servesim fetch kernels`` downloads: every
vLLM table (``<gpu>/<family>/vllm/<version>/<table>.parquet``) and NCCL table
(``<gpu>/comm/nccl/<version>/nccl_perf.parquet``) of NVIDIA's kernel database at one commit of
github.com/ai-dynamo/aiconfigurator, with its size and sha256, read from a git clone.

    .venv/bin/python tools/kernel_registry.py CLONE [--commit SHA]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "configs" / "kernels" / "database.csv"
REPO = "ai-dynamo/aiconfigurator"
PREFIX = "aic-core/src/aiconfigurator_core/systems/data/"
WANTED = re.compile(r"^[^/]+/([^/]+/vllm/[^/]+/[^/]+|comm/nccl/[^/]+/nccl_perf)\.parquet$")
HEADER = """\
# NVIDIA's database of measured vLLM kernels (aiconfigurator-core, Apache-2.0), as files
# `servesim fetch kernels [GPU [VERSION]]` downloads when the package is not installed: every
# vLLM and NCCL table of github.com/ai-dynamo/aiconfigurator at one commit, verified by size
# and sha256, saved as data/kernels/<gpu>/<family>/vllm/<version>/<table>.parquet (the layout
# of the package's systems/data, which simulator/cost/kernel_db.py reads). Written by
# tools/kernel_registry.py from a clone of that repository.
"""


def git(clone: Path, *args: str) -> bytes:
    """A git command's output in ``clone``."""
    return subprocess.run(["git", "-C", str(clone), *args], check=True, capture_output=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("clone", type=Path, help="a git clone (or bare mirror) of the repository")
    parser.add_argument("--commit", default="HEAD", help="commit to pin (default: HEAD)")
    args = parser.parse_args()
    commit = git(args.clone, "rev-parse", f"{args.commit}^{{commit}}").decode().strip()
    listing = git(args.clone, "ls-tree", "-r", "--long", commit, "--", PREFIX).decode()
    rows = []
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        rel = path.removeprefix(PREFIX)
        if not WANTED.match(rel):
            continue
        blob = meta.split()[2]
        data = git(args.clone, "cat-file", "blob", blob)
        digest = hashlib.sha256(data).hexdigest()
        name = f"kernels:{rel}"
        rows.append([name, "kernels", REPO, commit, path, len(data), digest, f"kernels/{rel}"])
    with OUT.open("w", newline="") as handle:
        handle.write(HEADER)
        out = csv.writer(handle, lineterminator="\n")
        out.writerow(
            ["name", "group", "repo", "commit", "path", "size", "sha256", "dest", "license"]
        )
        for row in sorted(rows):
            out.writerow([*row, "Apache-2.0"])
    print(f"{OUT.relative_to(ROOT)}: {len(rows)} files at {REPO}@{commit[:9]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
