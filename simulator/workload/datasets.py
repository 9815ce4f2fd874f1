"""The public data files servesim reads (request traces, length tables, GPU profiles), pinned
to a commit of their repository and verified by sha256: what ``servesim fetch`` downloads.

The registry is data: ``configs/datasets.csv``, one row per file (repository, commit, path,
size, sha256, destination, licence). Each file is saved under one name, everywhere:
``data/NAME`` (``DataFile.dest``) is where the scenarios read it, where ``servesim fetch``
writes it, and the name of our byte-exact copy in the developers' ``../shared/data`` (the
tests look there first, then in ``data/``).

Downloads go through pooch (``simulator.workload.downloader``): a temporary file beside the
destination, checked (size and sha256), and only then moved into place, so the destination is
either absent, the old file, or the verified new one; folders made for a failed download are
removed again.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from simulator.errors import InputError, reason_of
from simulator.workload import downloader

__all__ = [
    "BASE_URL_ENV",
    "DATASETS",
    "DEFAULT_BASE_URL",
    "DEFAULT_DEST",
    "DEFAULT_SELECTION",
    "DataFile",
    "FileState",
    "base_url_from_env",
    "fetch",
    "fetch_files",
    "file_state",
    "format_listing",
    "groups",
    "load_registry",
    "select",
    "sha256_of",
]

DEFAULT_BASE_URL = "https://raw.githubusercontent.com"
"""Where ``{repo}/{commit}/{path}`` is downloaded from unless a mirror is named."""

BASE_URL_ENV = "SERVESIM_DATA_URL"
"""Environment variable naming a mirror (``https://...`` or ``file:///...``)."""

DEFAULT_DEST = Path("data")
"""Base directory of every ``DataFile.dest`` (the scenarios' paths are relative to it)."""

DEFAULT_SELECTION = ("traces",)
"""What ``fetch`` gets when no names are given: the files the trace scenarios read."""

ALL = "all"
"""Selection name meaning every registered file."""

TIMEOUT_S = 60.0
"""Seconds any one connect or read may block before the download is abandoned."""

RETRIES = 2
"""Further attempts after a transient failure (a timeout, an HTTP 5xx, a damaged transfer)."""

FileState = Literal["verified", "missing", "mismatch"]


@dataclass(frozen=True)
class DataFile:
    """One public file: its upstream blob, the checksum it must have, and where it is saved."""

    name: str
    """Registry key, as given to ``servesim fetch``."""
    group: str
    """Selection that includes it: ``traces``, ``lengths``, ``profiles`` or ``llmservingsim``."""
    repo: str
    """GitHub ``owner/name``."""
    commit: str
    """Full commit hash: a branch would let the bytes (and the checksum) move."""
    path: str
    """Path inside the repository."""
    size: int
    """Size in bytes."""
    sha256: str
    """Hex sha256 of the exact bytes."""
    dest: str
    """Where it is saved, relative to the base directory (default ``data``): our name for it,
    the same in ``../shared/data``."""
    license: str
    """SPDX identifier of the file's licence."""

    def url(self, base_url: str = DEFAULT_BASE_URL) -> str:
        """Where to download it from: ``{base_url}/{repo}/{commit}/{path}``."""
        return f"{base_url.rstrip('/')}/{self.repo}/{self.commit}/{self.path}"

    def source(self) -> str:
        """Short human form of the origin: ``owner/name@commit7 path``."""
        return f"{self.repo}@{self.commit[:7]} {self.path}"


REGISTRY = Path(__file__).resolve().parents[2] / "configs" / "datasets.csv"
"""The registry: one row per file (the fields of ``DataFile``); ``#`` lines are notes."""


def load_registry(path: Path = REGISTRY) -> dict[str, DataFile]:
    """The files a registry CSV lists, by name."""
    with path.open(newline="") as handle:
        rows = csv.DictReader(line for line in handle if not line.startswith("#"))
        files = [DataFile(**{**row, "size": int(row["size"])}) for row in rows]  # type: ignore[arg-type]
    return {f.name: f for f in files}


DATASETS: dict[str, DataFile] = load_registry()
"""Every downloadable file, by name."""


def groups() -> dict[str, list[str]]:
    """Selection names that stand for several files (each group, and ``all``) -> file names."""
    out: dict[str, list[str]] = {}
    for f in DATASETS.values():
        out.setdefault(f.group, []).append(f.name)
    out[ALL] = list(DATASETS)
    return out


def select(names: Iterable[str]) -> list[DataFile]:
    """The files named (file names, group names or ``all``), in order, each once; no names
    means ``traces``."""
    names = list(names) or list(DEFAULT_SELECTION)
    by_group = groups()
    chosen: dict[str, DataFile] = {}
    for name in names:
        if name in DATASETS:
            chosen.setdefault(name, DATASETS[name])
        elif name in by_group:
            for member in by_group[name]:
                chosen.setdefault(member, DATASETS[member])
        else:
            raise InputError(
                f"unknown dataset {name!r} (known: {', '.join(DATASETS)}; "
                f"groups: {', '.join(by_group)})"
            )
    return list(chosen.values())


def base_url_from_env() -> str:
    """The mirror named by ``$SERVESIM_DATA_URL``, else raw.githubusercontent.com."""
    return os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return downloader.sha256_of(path)


def file_state(entry: DataFile, dest_dir: str | Path = DEFAULT_DEST) -> FileState:
    """Whether ``entry``'s destination under ``dest_dir`` is verified, missing or wrong."""
    path = Path(dest_dir) / entry.dest
    if not path.is_file():
        return "missing"
    try:
        # the size check spares hashing a file that cannot match
        ok = path.stat().st_size == entry.size and sha256_of(path) == entry.sha256
    except OSError as err:
        raise InputError(f"{entry.name}: cannot read {path}: {reason_of(err)}") from err
    return "verified" if ok else "mismatch"


def format_listing(
    entries: Sequence[DataFile], dest_dir: str | Path = DEFAULT_DEST, with_groups: bool = True
) -> str:
    """A table of ``entries``: name, size, licence, local state, destination and source (and
    the registry's groups, ``with_groups``)."""
    dest_dir = Path(dest_dir)
    width = max(len(e.name) for e in entries)
    lines = [f"{'name':<{width}}  {'size':>9}  {'license':<10}  {'state':<8}  dest / source"]
    for e in entries:
        lines.append(
            f"{e.name:<{width}}  {e.size / 1e6:>6.2f} MB  {e.license:<10}  "
            f"{file_state(e, dest_dir):<8}  {dest_dir / e.dest}"
        )
        lines.append(f"{'':<{width}}  {'':>9}  {'':<10}  {'':<8}  from {e.source()}")
    if not with_groups:
        return "\n".join(lines)
    lines.append("")
    named = [f"{g} = {' '.join(m)}" for g, m in groups().items() if g != ALL]
    lines.append("groups: " + "; ".join(named) + f"; {ALL} = every file")
    return "\n".join(lines)


def fetch(
    names: Iterable[str] = DEFAULT_SELECTION,
    dest_dir: str | Path = DEFAULT_DEST,
    base_url: str | None = None,
    force: bool = False,
    progress: bool = True,
    timeout: float = TIMEOUT_S,
    report: Callable[[str], object] | None = None,
    retries: int = RETRIES,
) -> list[Path]:
    """Download the named files under ``dest_dir``, skipping those already verified; return
    their paths. ``base_url`` None means ``$SERVESIM_DATA_URL`` or GitHub. ``report`` gets
    one line per file saying what was done (the CLI prints them)."""
    return fetch_files(select(names), dest_dir, base_url, force, progress, timeout, report, retries)


def fetch_files(
    entries: Sequence[DataFile],
    dest_dir: str | Path = DEFAULT_DEST,
    base_url: str | None = None,
    force: bool = False,
    progress: bool = True,
    timeout: float = TIMEOUT_S,
    report: Callable[[str], object] | None = None,
    retries: int = RETRIES,
) -> list[Path]:
    """``fetch`` of these entries (of any registry: ``kernel_files`` has its own)."""
    say = report or (lambda _: None)
    base = base_url or base_url_from_env()
    paths: list[Path] = []
    for entry in entries:
        dest = Path(dest_dir) / entry.dest
        state = file_state(entry, dest_dir)
        if state == "verified" and not force:
            say(f"{entry.name}: {dest} up to date")
            paths.append(dest)
            continue
        if state == "mismatch":
            say(f"{entry.name}: {dest} does not match its sha256, downloading it again")
        url = entry.url(base)
        try:
            downloader.download(
                url,
                dest,
                downloader.Expected(entry.name, entry.size, entry.sha256),
                progress=progress,
                timeout=timeout,
                retries=retries,
            )
        except downloader.DownloadError as err:
            raise InputError(f"{entry.name}: {url}: {err}") from err
        except downloader.FolderError as err:
            raise InputError(f"{entry.name}: {err}") from err
        except OSError as err:
            raise InputError(f"{entry.name}: cannot write {dest}: {reason_of(err)}") from err
        say(f"{entry.name}: {dest} downloaded and verified ({entry.size:,} bytes)")
        paths.append(dest)
    return paths
