"""A ``servesim run`` imports only what it uses: without plots, neither matplotlib nor scipy
(nor the download stack), which are most of a small run's start-up when they load, and never
pandas (its tables go from numpy columns to Arrow) nor tqdm off a terminal (issue 24)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from simulator.cli import main
code = main(["run", sys.argv[1], "--out", sys.argv[2], "--no-plots"])
heavy = ("matplotlib", "scipy", "pooch", "requests", "pandas", "tqdm")
print(code, *sorted(m for m in heavy if m in sys.modules))
"""


def probe(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh process, given the quickstart scenario cut to 10 requests and an
    output folder as its two arguments, its output not a terminal."""
    scenario = yaml.safe_load((HERE / "scenarios" / "quickstart.yaml").read_text())
    scenario["workload"]["num_requests"] = 10
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(scenario))
    args = [sys.executable, "-c", code, str(path), str(tmp_path / "out")]
    return subprocess.run(args, capture_output=True, text=True, cwd=HERE)


def test_run_without_plots_imports_neither_matplotlib_nor_scipy(tmp_path: Path) -> None:
    """A fresh process runs the quickstart scenario (10 requests) without plots, its output
    not a terminal, and none of matplotlib, scipy, pooch, requests, pandas or tqdm is
    imported."""
    done = probe(PROBE, tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[-1] == "0"  # exit 0, and nothing heavy after it
    assert (tmp_path / "out" / "requests.parquet").exists()


EXIT_PROBE = """
import atexit, gc, sys
from simulator.cli import entry
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0))
sys.argv = ["servesim", "run", sys.argv[1], "--out", sys.argv[2], "--no-plots"]
entry()
"""


def test_the_command_freezes_what_is_left_before_the_interpreter_exits(tmp_path: Path) -> None:
    """``servesim`` freezes the objects left out of the garbage collector before it exits (the
    exit's full collection over them was a tenth of a small run), with its exit code kept."""
    done = probe(EXIT_PROBE, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "frozen True"


LIBRARY_PROBE = """
import os
os.environ.pop("OPENBLAS_NUM_THREADS", None)
import simulator.cli
print("library", os.environ.get("OPENBLAS_NUM_THREADS"))
"""

COMMAND_PROBE = """
import atexit, os, sys
os.environ.pop("OPENBLAS_NUM_THREADS", None)
from simulator.command import entry
print("numpy loaded before the command", "numpy" in sys.modules)
atexit.register(lambda: print("command", os.environ.get("OPENBLAS_NUM_THREADS")))
sys.argv = ["servesim", "run", sys.argv[1], "--out", sys.argv[2], "--no-plots"]
entry()
"""


def test_only_the_command_asks_for_one_blas_thread(tmp_path: Path) -> None:
    """The ``servesim`` command sets ``OPENBLAS_NUM_THREADS=1`` before numpy loads (OpenBLAS
    reads it then); a program that imports the CLI as a library is left as it was."""
    library = probe(LIBRARY_PROBE, tmp_path)
    assert library.returncode == 0, library.stderr
    assert library.stdout.splitlines() == ["library None"]
    command = probe(COMMAND_PROBE, tmp_path)
    assert command.returncode == 0, command.stderr
    lines = command.stdout.splitlines()
    assert lines[0] == "numpy loaded before the command False"
    assert lines[-1] == "command 1"
