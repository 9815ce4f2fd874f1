"""The ``servesim`` command's entry point (``python -m simulator`` too): one BLAS thread for
the command's process, set before numpy is first imported, then the CLI.

A run is one Python thread and its arrays are small; OpenBLAS would start a thread per core
when numpy loads, costing 0.05-0.1 s of CPU a run on 2 cores (and as much in every worker of a
parallel search) for nothing. The user's own setting wins. Set here and not when
``simulator.cli`` is imported, so that a program using servesim as a library keeps its own."""

from __future__ import annotations

import os


def entry() -> None:
    """Run the ``servesim`` command (``simulator.cli.entry``) with one BLAS thread."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from simulator.cli import entry as cli_entry

    cli_entry()
