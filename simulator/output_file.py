"""The files servesim writes for the user (``--out`` of calibrate, convert, predict; plot
folders): checked before any work, so a long fit never ends in a traceback about its output,
and written atomically (a temporary file beside the target, then a rename), so the target is
either the old file or the complete new one, never half-written."""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from simulator.errors import InputError, reason_of

__all__ = [
    "check_can_create_in",
    "check_output_file",
    "check_output_folder",
    "nearest_existing",
    "umask",
    "write_file",
    "write_text",
]


@functools.cache
def umask() -> int:
    """The process umask (read once: reading it means setting it, then setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a dangling symlink counts as existing)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_can_create_in(folder: Path, label: str, *, make_folder: bool = False) -> None:
    """``folder``, or the folders ``mkdir -p`` would make for it, can hold new files (new
    folders, with ``make_folder``); else an InputError naming ``label``."""
    anchor = nearest_existing(folder)
    if not anchor.is_dir():
        raise InputError(f"{label}: cannot create ({anchor} is not a folder)")
    denied = not os.access(anchor, os.W_OK | os.X_OK)
    try:  # a real attempt: root passes os.access, and /proc does not say; and its error
        # says why (a read-only mount's "Read-only file system", as the default folder's
        # mkdir says it, where os.access only answers no)
        if make_folder:
            os.rmdir(tempfile.mkdtemp(prefix=".servesim-probe-", dir=anchor))
        else:
            fd, probe = tempfile.mkstemp(prefix=".servesim-probe-", dir=anchor)
            os.close(fd)
            os.unlink(probe)
    except OSError as err:
        raise InputError(f"{label}: cannot create ({reason_of(err)})") from None
    if denied:
        raise InputError(f"{label}: cannot create ({os.strerror(errno.EACCES)})")


def check_output_file(path: str | Path, label: str | None = None) -> Path:
    """``path`` as a Path, after checking that a file can be written there: not a folder, and
    its folder exists (or can be made) and takes new files. ``label`` names it in messages
    (default: ``--out PATH``)."""
    p = Path(path)
    label = label or f"--out {p}"
    if p.is_dir():
        raise InputError(f"{label}: is a folder; give a file name")
    if os.path.lexists(p) and not p.is_file():
        raise InputError(f"{label}: exists and is not a regular file")
    check_can_create_in(p.parent, label)
    return p


def check_output_folder(path: str | Path, label: str | None = None) -> Path:
    """``path`` as a Path, after checking that files can be written into it (it is a folder,
    or can be made one)."""
    p = Path(path)
    label = label or str(p)
    if os.path.lexists(p) and not p.is_dir():
        raise InputError(f"{label}: exists and is not a folder")
    check_can_create_in(p, label)
    return p


@contextmanager
def _temporary_beside(path: Path, label: str) -> Iterator[Path]:
    """A fresh temporary path in ``path``'s folder, renamed onto ``path`` when the body
    succeeds and removed whatever happens; OS errors become one line naming ``label``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # same folder, so os.replace is an atomic rename; mkstemp: parallel writers never collide
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as err:
        raise InputError(f"{label}: cannot create ({reason_of(err)})") from None
    tmp = Path(name)
    try:
        yield tmp
        # mkstemp makes it private (0600); a file the user asked for gets open's usual mode
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as err:
        raise InputError(f"{label}: cannot write ({reason_of(err)})") from None
    finally:
        tmp.unlink(missing_ok=True)


def write_file(path: str | Path, write: Callable[[Path], object], label: str | None = None) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file beside it, which is then
    renamed onto ``path``. Returns ``path``."""
    p = Path(path)
    with _temporary_beside(p, label or f"--out {p}") as tmp:
        write(tmp)
    return p


def write_text(path: str | Path, text: str, label: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), label)
