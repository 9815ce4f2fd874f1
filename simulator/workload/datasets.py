"""The public data files servesim reads (request traces, length tables, GPU profiles), pinned
to a commit of their repository and verified by sha256: what ``servesim fetch`` downloads.

Each file is saved under one name, everywhere: ``data/NAME`` (``DataFile.dest``) is where the
scenarios read it, where ``servesim fetch`` writes it, and the name of our byte-exact copy in
the developers' ``../shared/data`` (the tests look there first, then in ``data/``).

A file is downloaded to a temporary file beside its destination, checked (size and sha256),
and only then renamed into place, so the destination is either absent, the old file, or the
verified new one, never a partial download.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from simulator.errors import InputError, reason_of
from simulator.output_file import nearest_existing
from simulator.workload import llmservingsim_files as lss

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
    "file_state",
    "format_listing",
    "groups",
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

_CHUNK = 1 << 16

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


_AZURE = ("Azure/AzurePublicDataset", "b469a113cedca53ddc3bdea71a143dc4b7d8700c")
_VIDUR = ("microsoft/vidur", "7d47513363ec447a741ac5e47241580b47724fbf")
_VIDUR_DIR = "data/profiling/compute"

DATASETS: dict[str, DataFile] = {
    f.name: f
    for f in (
        DataFile(
            name="azure-conv",
            group="traces",
            repo=_AZURE[0],
            commit=_AZURE[1],
            path="data/AzureLLMInferenceTrace_conv.csv",
            size=719188,
            sha256="2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
            dest="azure2023_conv.csv",
            license="CC-BY-4.0",
        ),
        DataFile(
            name="azure-code",
            group="traces",
            repo=_AZURE[0],
            commit=_AZURE[1],
            path="data/AzureLLMInferenceTrace_code.csv",
            size=320117,
            sha256="54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
            dest="azure2023_code.csv",
            license="CC-BY-4.0",
        ),
        DataFile(
            name="mooncake-conv",
            group="traces",
            repo="kvcache-ai/Mooncake",
            commit="3b5a594133958449a1feaf1c9e0fc1b553e34a28",
            path="FAST25-release/traces/conversation_trace.jsonl",
            size=3029533,
            sha256="b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
            dest="mooncake_fast25_conversation_trace.jsonl",
            license="Apache-2.0",
        ),
        DataFile(
            name="sharegpt-lengths",
            group="lengths",
            repo="microsoft/sarathi-serve",
            # on branch niyama_asplos2026 only: the file is absent from main
            commit="72339db5b120614033b317880ad3a05a5e4c9415",
            path="data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            size=949600,
            sha256="6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f",
            dest="sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            license="Apache-2.0",
        ),
        DataFile(
            name="splitwise-perf",
            group="profiles",
            repo="Mutinifni/splitwise-sim",
            commit="8f99e7dc9b407f4ce2488d03dd44c0b8b946dab0",
            path="data/perf_model.csv",
            size=127281,
            sha256="dbbe505d1d64fc4bd1ec03c50edf944643586de4f68a81e94cbd55dd5bdfbf41",
            dest="splitwise_perf_model.csv",
            license="MIT",
        ),
        DataFile(
            name="vidur-a100-llama2-7b-mlp",
            group="profiles",
            repo=_VIDUR[0],
            commit=_VIDUR[1],
            path=f"{_VIDUR_DIR}/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
            size=706614,
            sha256="2cfacca979f32e83257753cf6fd815a71af8ba9a7a9d0643b18d9f54e8a37688",
            dest="vidur_a100_llama2-7b_mlp.csv",
            license="MIT",
        ),
        DataFile(
            name="vidur-h100-llama2-7b-mlp",
            group="profiles",
            repo=_VIDUR[0],
            commit=_VIDUR[1],
            path=f"{_VIDUR_DIR}/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
            size=715469,
            sha256="b1a2def08857d10e5f66c3b5b2d046b6e8caed5c30b2bc920a0462598e3b2a59",
            dest="vidur_h100_llama2-7b_mlp.csv",
            license="MIT",
        ),
        DataFile(
            name="vidur-a100-llama3-8b-mlp",
            group="profiles",
            repo=_VIDUR[0],
            commit=_VIDUR[1],
            path=f"{_VIDUR_DIR}/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
            size=1204856,
            sha256="98c26488298e324e89db7349e213f75c856ae83dc6b17548a68636d2cb5efff0",
            dest="vidur_a100_llama3-8b_mlp.csv",
            license="MIT",
        ),
        *lss.entries(DataFile),  # LLMServingSim's validation runs
    )
}
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
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def format_listing(entries: Sequence[DataFile], dest_dir: str | Path = DEFAULT_DEST) -> str:
    """A table of ``entries``: name, size, licence, local state, destination and source."""
    dest_dir = Path(dest_dir)
    width = max(len(e.name) for e in entries)
    lines = [f"{'name':<{width}}  {'size':>9}  {'license':<10}  {'state':<8}  dest / source"]
    for e in entries:
        lines.append(
            f"{e.name:<{width}}  {e.size / 1e6:>6.2f} MB  {e.license:<10}  "
            f"{file_state(e, dest_dir):<8}  {dest_dir / e.dest}"
        )
        lines.append(f"{'':<{width}}  {'':>9}  {'':<10}  {'':<8}  from {e.source()}")
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
) -> list[Path]:
    """Download the named files under ``dest_dir``, skipping those already verified; return
    their paths. ``base_url`` None means ``$SERVESIM_DATA_URL`` or GitHub. ``report`` gets
    one line per file saying what was done (the CLI prints them)."""
    say = report or (lambda _: None)
    entries = select(names)
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
        _download(entry, entry.url(base), dest, progress, timeout)
        say(f"{entry.name}: {dest} downloaded and verified ({entry.size:,} bytes)")
        paths.append(dest)
    return paths


def _download(entry: DataFile, url: str, dest: Path, progress: bool, timeout: float) -> None:
    """Fetch ``url`` into a temporary file beside ``dest``, verify it, rename it to ``dest``."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # same directory as dest, so os.replace is an atomic rename, not a copy
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    except OSError as err:
        anchor = nearest_existing(dest.parent)
        why = reason_of(err) if anchor.is_dir() else f"{anchor} is not a folder"
        raise InputError(f"{entry.name}: cannot write into {dest.parent}: {why}") from err
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            try:
                size, digest = _stream(entry, url, handle, progress, timeout)
                handle.flush()
                # durable before the rename, or a crash could leave an empty verified name
                os.fsync(handle.fileno())
            except (OSError, http.client.HTTPException, ValueError) as err:
                raise InputError(f"{entry.name}: {url}: {_download_reason(err, timeout)}") from err
        if size != entry.size:
            got = f"more than {entry.size}" if size > entry.size else f"only {size}"
            raise InputError(f"{entry.name}: {url}: got {got} bytes, expected {entry.size}")
        if digest != entry.sha256:
            raise InputError(
                f"{entry.name}: {url}: sha256 mismatch: got {digest}, expected {entry.sha256}"
            )
        try:
            # mkstemp makes it private (0600); a data file is meant to be shared
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        except OSError as err:
            raise InputError(f"{entry.name}: cannot write {dest}: {reason_of(err)}") from err
    finally:
        # after a failure (or Ctrl-C) the partial download goes; after success it is gone already
        tmp.unlink(missing_ok=True)


def _stream(
    entry: DataFile, url: str, out: IO[bytes], progress: bool, timeout: float
) -> tuple[int, str]:
    """Copy ``url`` into ``out`` chunk by chunk: (bytes written, hex sha256)."""
    from tqdm import tqdm

    digest = hashlib.sha256()
    size = 0
    with (
        urllib.request.urlopen(url, timeout=timeout) as response,
        tqdm(
            total=entry.size,
            desc=entry.name,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            # disable=None: tqdm shows itself only on a terminal
            disable=None if progress else True,
            leave=False,
        ) as bar,
    ):
        # one byte past the expected size is enough to know a file is wrong: a wrong file
        # could be huge, so stop there
        limit = entry.size + 1
        while size < limit and (chunk := response.read(min(_CHUNK, limit - size))):
            size += len(chunk)
            digest.update(chunk)
            out.write(chunk)
            bar.update(len(chunk))
    return size, digest.hexdigest()


def _download_reason(err: BaseException, timeout: float) -> str:
    """One line saying why a download failed (HTTP, URL and timeouts; else ``reason_of``)."""
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        # URLError wraps why the URL could not be opened (DNS, refused, no such file, timeout)
        reason = err.reason
        if isinstance(reason, TimeoutError):
            return f"timed out after {timeout:g} s"
        if isinstance(reason, OSError) and reason.strerror:
            return f"cannot open: {reason.strerror}"
        return f"cannot open: {' '.join(str(reason).split())}"
    if isinstance(err, TimeoutError):
        return f"timed out after {timeout:g} s"
    return reason_of(err)
