"""The output folder of a run or sweep: where results go, checked before anything is
simulated, and how they get there (a temporary folder renamed into place, so a failed or
interrupted run never leaves half-written results)."""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from simulator.errors import InputError, reason_of
from simulator.output_file import check_can_create_in, umask

__all__ = ["MARKER", "atomic_dir", "check_out_dir", "default_out_dir", "reserve_out_dir"]

MARKER = ".servesim-output"
"""A file in every folder servesim writes: ``--overwrite`` replaces only such a folder (or an
empty one), never a folder of someone else's files."""


def default_out_dir(name: str) -> Path:
    """``results/<name>/<timestamp>`` (a name only: ``reserve_out_dir`` makes it unique)."""
    return Path("results") / name / time.strftime("%Y%m%d-%H%M%S")


def reserve_out_dir(base: Path) -> Path:
    """Create and return the empty folder ``base``, or ``base-2``, ``base-3``, ... if taken.

    For a folder servesim names itself (the default ``results/<name>/<timestamp>``): ``mkdir``
    either creates a folder or fails, so two runs started in the same second never share one.
    ``atomic_dir`` later renames the results onto the empty folder (atomically)."""
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for i in itertools.count(1):
            candidate = base if i == 1 else base.with_name(f"{base.name}-{i}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return candidate
    except OSError as err:  # as check_out_dir says it of an --out, plus where else to write
        raise InputError(
            f"{base}: cannot create ({reason_of(err)}); the default output folder, under "
            f"{Path.cwd()}: pass --out a folder you can write"
        ) from None
    raise AssertionError("unreachable")


def _label(out: Path, given: bool) -> str:
    return f"--out {out}" if given else str(out)


def _dangerous(path: Path) -> bool:
    """``path`` is ``/``, the working folder or one of its parents: replacing it would pull
    the folder the user works in away from under them."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working folder was deleted
        return path == Path(path.anchor)
    return path == cwd or path in cwd.parents or path == Path(path.anchor)


def check_out_dir(out: Path, overwrite: bool, *, given: bool = True) -> Path:
    """Check, before anything is simulated, that results can be written to ``out``; return
    it absolute (symlinks resolved), the path to write to.

    Refuses ``/``, the working folder and its parents (even with ``overwrite``), a file, a
    non-empty folder unless ``overwrite``, and a place that cannot be written (the nearest
    existing ancestor of ``out``'s parent must be a writable folder). ``given``: ``out`` came
    from ``--out`` (messages say so, and suggest ``--overwrite``); False for a folder servesim
    named itself."""
    label = _label(out, given)
    try:
        path = Path(out).resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (Python < 3.13)
        reason = reason_of(err) if isinstance(err, OSError) else "symlink loop"
        raise InputError(f"{label}: cannot create ({reason})") from None
    if _dangerous(path):
        what = "/" if path == Path(path.anchor) else "the working folder or one of its parents"
        raise InputError(
            f"{label}: refusing to replace {what} (a run replaces its whole output folder); "
            "give a new folder, e.g. --out results/NAME"
        )
    if path.exists() and not path.is_dir():
        raise InputError(f"{label}: exists and is not a folder")
    try:
        non_empty = path.is_dir() and any(path.iterdir())
    except OSError as err:
        raise InputError(f"{label}: cannot read ({reason_of(err)})") from None
    if non_empty and not overwrite:
        hint = " (use --overwrite to replace it)" if given else ""
        raise InputError(f"{label}: folder is not empty{hint}")
    if non_empty:
        _check_ours(path, label)
    # The results are written to a temporary folder beside ``path``, created with its parents
    check_can_create_in(path.parent, label, make_folder=True)
    return path


@contextmanager
def atomic_dir(out: Path, overwrite: bool, *, given: bool = True) -> Iterator[Path]:
    """Yield a temporary folder beside ``out``; rename it to ``out`` only if the body succeeds,
    so a failed or interrupted run never leaves half-written results, nor a temporary folder.

    ``out`` is checked as ``check_out_dir`` does. The results get the permissions of a folder
    made with ``mkdir`` (``0o777 & ~umask``), not ``mkdtemp``'s 0700. An existing ``out`` is
    replaced only if empty, or with ``overwrite``. Any OS error (a full disk, permissions)
    becomes one line naming ``out`` (``InputError``)."""
    label = _label(out, given)
    path = check_out_dir(out, overwrite, given=given)
    mode = 0o777 & ~umask()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as err:
        raise InputError(f"{label}: cannot create ({reason_of(err)})") from None
    try:
        yield tmp
        (tmp / MARKER).write_text("written by servesim; --overwrite may replace this folder\n")
        tmp.chmod(mode)
        _move_into_place(tmp, path, overwrite, label, given)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"{label}: cannot write results ({reason_of(err)})") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_ours(path: Path, label: str) -> None:
    """Refuse to replace a non-empty folder that servesim did not write."""
    if not (path / MARKER).is_file():
        raise InputError(
            f"{label}: not a servesim output folder (it has no {MARKER} file); refusing to "
            "replace it, even with --overwrite: give a new or empty folder"
        )


def _move_into_place(tmp: Path, out: Path, overwrite: bool, label: str, given: bool) -> None:
    try:
        os.replace(tmp, out)  # atomic, when ``out`` is missing or an empty folder
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not overwrite:  # something wrote into ``out`` while this run ran: not ours to delete
        hint = " (use --overwrite to replace it)" if given else ""
        raise InputError(f"{label}: folder was filled during the run; not replaced{hint}")
    _check_ours(out, label)
    trash = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:12]}")
    os.replace(out, trash)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(trash, out)  # put the previous results back
        raise
    shutil.rmtree(trash, ignore_errors=True)
