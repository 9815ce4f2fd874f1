"""Input files a workload names."""

from __future__ import annotations

from pathlib import Path

from simulator.errors import InputError


def need_file(path: str, field: str) -> None:
    """A missing input file named by ``workload.<field>``: one line saying which key and how
    to get the public files (the readers would name the file but not the key)."""
    if not Path(path).is_file():
        hint = (
            "`servesim fetch traces` downloads the public traces"
            if field == "trace.path"
            else "`servesim fetch --list` shows the public tables it can download"
        )
        raise InputError(
            f"workload.{field}: {path}: file not found (relative to {Path.cwd()}); {hint}"
        )
