"""Compile servesim's hot path with mypyc (``make`` runs this; ``simulator/native.py``).

The modules in ``simulator.native.COMPILED`` become C extensions beside their sources, and
``simulator/_native.json`` records the hash of each source compiled. Nothing is done when that
record matches the sources. Where no C compiler works, it says so in one line and leaves
servesim pure Python (identical results, slower); it never fails the build.

mypyc comes with mypy, which the dev extra installs. Why mypyc rather than Cython or a
hand-written extension: it compiles the type-annotated sources as they are, so there is one
implementation, checked by the same tests compiled and not.

Run by hand: ``.venv/bin/python tools/build_native.py [--force]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from simulator import native  # noqa: E402 (the tree's own, whether installed or not)

LOG = HERE / "build" / "native.log"
"""What a failed build said."""


def clean() -> None:
    """Remove the record and every extension a build left in the package."""
    native.MANIFEST.unlink(missing_ok=True)
    for so in native.ROOT.rglob("*.so"):
        so.unlink()


def build(tmp: Path) -> None:
    """Compile into ``tmp`` and move the extensions into the package."""
    from mypyc.build import mypycify
    from setuptools import setup

    sources = [str(native.source_of(m).relative_to(HERE)) for m in native.COMPILED]
    cwd = Path.cwd()
    os.chdir(HERE)  # mypyc names modules by their paths from here
    try:
        ext = mypycify(
            sources, opt_level="3", group_name="simulator.native", target_dir=str(tmp / "c")
        )
    finally:
        os.chdir(cwd)
    os.chdir(tmp)  # away from pyproject.toml, which setuptools would otherwise read
    try:
        lib = tmp / "lib"
        args = ["build_ext", "--build-lib", str(lib), "--build-temp", str(tmp / "o")]
        setup(name="servesim-native", ext_modules=ext, script_args=[*args, "-j", "2"])
    finally:
        os.chdir(cwd)
    for so in lib.rglob("*.so"):
        target = HERE / so.relative_to(lib)
        shutil.move(str(so), target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="compile even if up to date")
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    hashes = native.source_hashes()
    record = {"python": sys.implementation.cache_tag, "modules": hashes}
    if args.clean:
        clean()
        return 0
    if not args.force and native.MANIFEST.exists():
        with contextlib.suppress(ValueError):
            if json.loads(native.MANIFEST.read_text()) == record:
                return 0
    clean()
    print("compiling servesim's hot path with mypyc (about a minute)...", flush=True)
    log = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                build(Path(tmp))
        except (Exception, SystemExit) as err:
            clean()
            LOG.parent.mkdir(exist_ok=True)
            LOG.write_text(log.getvalue())
            print(
                f"servesim: not compiled ({type(err).__name__}: {str(err)[:200]}; "
                "build/native.log); servesim runs as pure Python"
            )
            return 0
    LOG.unlink(missing_ok=True)  # a failed build's, now stale
    tmp_manifest = native.MANIFEST.with_suffix(".tmp")
    tmp_manifest.write_text(json.dumps(record, indent=1) + "\n")
    tmp_manifest.replace(native.MANIFEST)
    return 0


if __name__ == "__main__":
    sys.exit(main())
