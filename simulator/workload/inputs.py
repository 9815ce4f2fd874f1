"""Input files a workload names."""

from __future__ import annotations

from pathlib import Path

from simulator.errors import MissingFile


def existing_file(path: str | Path, field: str | None = None) -> Path:
    """``path`` as a Path, or a one-line InputError if it is no file. ``field``: the key
    ``workload.<field>`` that names it, said first, with how to fetch a registered file (the
    readers would name the file but not the key); without it, where to list the public files."""
    file = Path(path)
    where = f"{path}" if field is None else f"workload.{field}: {path}"
    if file.is_dir():
        raise MissingFile(f"{where}: is a folder, not a file")
    if not file.is_file():
        # the public files are not shipped: point at the downloader
        missing = f"{where}: file not found (relative to {Path.cwd()}"
        if field is None:
            raise MissingFile(
                f"{missing}; `servesim fetch --list` shows the public traces it can download)"
            )
        raise MissingFile(f"{missing}); {fetch_hint(path, field)}")
    return file


def registered_hint(path: str | Path) -> str | None:
    """How to fetch a missing file that is where ``servesim fetch`` saves a public file (its
    whole path, from any folder: ``data/llmservingsim/runs/.../requests.jsonl``), else None.
    A real run's file names the ``llmservingsim`` selection, which the real-* scenarios need
    whole (the run, its workload and its GPU's profile)."""
    from simulator.workload.datasets import DATASETS, DEFAULT_DEST

    parts = Path(path).parts
    for entry in DATASETS.values():
        saved = (DEFAULT_DEST / entry.dest).parts
        if parts[-len(saved) :] == saved:
            name = entry.group if entry.group == "llmservingsim" else entry.name
            return f"`servesim fetch {name}` downloads it"
    return None


def fetch_hint(path: str | Path, field: str = "trace.path") -> str:
    """How to get a missing file: the registered file it names (by our name or upstream's),
    saved where ``servesim fetch`` puts it; else which fetch lists or brings such files."""
    from simulator.workload.datasets import DATASETS, DEFAULT_DEST

    exact = registered_hint(path)
    if exact is not None:  # where fetch saves it (a real run's: the whole selection)
        return exact
    name = Path(path).name
    for entry in DATASETS.values():
        if name in (Path(entry.dest).name, Path(entry.path).name):
            saved = (DEFAULT_DEST / entry.dest).as_posix()
            if Path(path).as_posix() == saved:
                return f"`servesim fetch {entry.name}` downloads it"
            return (
                f"`servesim fetch {entry.name}` saves it as {saved}: set workload.{field} to that"
            )
    if field == "trace.path":
        traces = ", ".join(
            (DEFAULT_DEST / e.dest).as_posix() for e in DATASETS.values() if e.group == "traces"
        )
        return f"`servesim fetch traces` downloads the public traces as {traces}"
    return "`servesim fetch --list` shows the public tables it can download"
