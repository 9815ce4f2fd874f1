"""One verified download through pooch: ``https://`` and ``http://`` by pooch's HTTP
downloader, ``file://`` (a local mirror) by a copy; pooch writes a temporary file beside the
destination, checks its sha256 and only then moves it into place, and retries transient
failures. Folders made for a download that fails are removed again, so a failed fetch leaves
nothing behind (not even an empty ``data/``)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pooch

from simulator.errors import reason_of
from simulator.output_file import nearest_existing

__all__ = ["DownloadError", "Expected", "FolderError", "download", "sha256_of"]


class DownloadError(Exception):
    """A download that cannot succeed by trying again: the message says why, on one line.

    Not a ``ValueError``: pooch retries those (and network errors), and retrying a 404 or a
    wrong file only wastes time."""


class FolderError(Exception):
    """The destination's folder cannot be made or written: the message names it and why."""


@dataclass(frozen=True)
class Expected:
    """What the downloaded bytes must be."""

    name: str
    """Registry name (for the progress bar)."""
    size: int
    """Size in bytes."""
    sha256: str
    """Hex sha256."""


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return str(pooch.file_hash(str(path), alg="sha256"))


def download(
    url: str, dest: Path, expected: Expected, progress: bool, timeout: float, retries: int
) -> None:
    """Download ``url`` to ``dest`` (replacing any file there only once the new one is
    verified), or raise ``DownloadError`` / ``FolderError`` and leave no trace."""
    with _folders_removed_on_failure(dest.parent):
        # a temporary folder beside dest: pooch then downloads even when dest is there and
        # verified (--force), and the move into dest is a rename on the same file system
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
        try:
            fetcher = pooch.create(
                path=staging,
                base_url="",
                registry={dest.name: f"sha256:{expected.sha256}"},
                urls={dest.name: url},
                retry_if_failed=retries,
            )
            with _bar(expected, progress) as bar, _quiet_pooch():
                got = Path(fetcher.fetch(dest.name, downloader=_Downloader(expected, bar, timeout)))
            # pooch's temporary file is private (0600); a data file is meant to be shared
            os.chmod(got, 0o644)
            os.replace(got, dest)
        except _Transient as err:
            raise DownloadError(str(err)) from err
        except ValueError as err:
            # pooch's own check, after the retries: the bytes are not the ones registered
            digest = _digest_in(str(err))
            raise DownloadError(
                f"sha256 mismatch: got {digest}, expected {expected.sha256}"
            ) from err
        finally:
            shutil.rmtree(staging, ignore_errors=True)


class _Downloader:
    """pooch's downloader protocol, ``(url, output_file, pooch)``: a local copy for
    ``file://``, pooch's HTTPDownloader otherwise; permanent failures as ``DownloadError``."""

    def __init__(self, expected: Expected, bar: Any, timeout: float) -> None:
        self.expected = expected
        self.bar = bar
        self.timeout = timeout

    def __call__(self, url: str, output_file: str, fetcher: Any) -> None:
        """Write ``url``'s bytes into ``output_file``, then check their size."""
        local = urllib.parse.urlparse(url).scheme == "file"
        if local:
            self._copy(url, output_file)
        else:
            self._http(url, output_file, fetcher)
        size = os.path.getsize(output_file)
        if size != self.expected.size:
            got = f"more than {self.expected.size}" if size > self.expected.size else f"only {size}"
            raise DownloadError(f"got {got} bytes, expected {self.expected.size}")
        if local:
            # a local copy cannot improve by trying again: say so now rather than after
            # pooch's retries (over HTTP pooch checks the hash and retries a damaged transfer)
            digest = sha256_of(Path(output_file))
            if digest != self.expected.sha256:
                raise DownloadError(
                    f"sha256 mismatch: got {digest}, expected {self.expected.sha256}"
                )

    def _copy(self, url: str, output_file: str) -> None:
        source = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        # one byte past the expected size is enough to know a file is wrong
        limit = self.expected.size + 1
        try:
            with open(source, "rb") as src, open(output_file, "wb") as out:
                out.write(src.read(limit))
        except OSError as err:
            raise DownloadError(f"cannot open: {reason_of(err)}") from err

    def _http(self, url: str, output_file: str, fetcher: Any) -> None:
        import requests

        http = pooch.HTTPDownloader(progressbar=self.bar, timeout=self.timeout)
        try:
            http(url, output_file, fetcher)
        except requests.exceptions.HTTPError as err:
            response = err.response
            code = "" if response is None else f" {response.status_code} {response.reason}"
            if response is not None and response.status_code >= 500:
                raise _Transient(f"HTTP{code}") from err  # perhaps passing: pooch tries again
            raise DownloadError(f"HTTP{code}") from err
        except requests.exceptions.Timeout as err:
            raise _Transient(f"timed out after {self.timeout:g} s") from err
        except requests.exceptions.RequestException as err:
            raise DownloadError(f"cannot open: {_root_reason(err)}") from err


class _Transient(ValueError):
    """A failure worth retrying (pooch retries ``ValueError``); after the last retry it
    surfaces as a ``DownloadError`` with the same message."""


def _root_reason(err: BaseException) -> str:
    """The innermost cause's message, on one line: requests wraps urllib3's error, which wraps
    the socket's (``Connection refused``, a DNS failure)."""
    seen: list[BaseException] = []
    node: BaseException | None = err
    while node is not None and node not in seen:
        seen.append(node)
        inner = getattr(node, "reason", None)
        if not isinstance(inner, BaseException):
            first = node.args[0] if node.args else None
            inner = first if isinstance(first, BaseException) else None
        node = inner or node.__cause__ or node.__context__
    for cause in reversed(seen):
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
    return " ".join(str(seen[-1]).split())


def _digest_in(message: str) -> str:
    """The hash of the downloaded file in pooch's mismatch message (its first 64-hex word)."""
    for word in message.replace("(", " ").replace(")", " ").split():
        if len(word) == 64 and all(c in "0123456789abcdef" for c in word):
            return word
    return "another hash"


@contextmanager
def _bar(expected: Expected, progress: bool) -> Iterator[Any]:
    """A byte progress bar on stderr for pooch to drive, shown only on a terminal."""
    from tqdm import tqdm

    with tqdm(
        total=expected.size,
        desc=expected.name,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        # disable=None: tqdm shows itself only on a terminal
        disable=None if progress else True,
        leave=False,
    ) as bar:
        yield bar


@contextmanager
def _quiet_pooch() -> Iterator[None]:
    """pooch logs each download on stderr; servesim reports through its caller instead."""
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def _folders_removed_on_failure(folder: Path) -> Iterator[None]:
    """Make ``folder`` (and its missing parents); if the body fails, remove those made."""
    made = []
    for path in [*reversed(folder.parents), folder]:
        if not path.exists():
            made.append(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        anchor = nearest_existing(folder)
        why = reason_of(err) if anchor.is_dir() else f"{anchor} is not a folder"
        raise FolderError(f"cannot write into {folder}: {why}") from err
    try:
        yield
    except BaseException:
        for path in reversed(made):
            try:
                path.rmdir()  # only if empty: a file another fetch put there stays
            except OSError:
                break
        raise
