"""One BLAS thread for the ``servesim`` command, set before numpy is first imported (so this
module comes first in ``cli/__init__``'s imports).

A run is one Python thread and its arrays are small; OpenBLAS would start a thread per core
when numpy loads, costing 0.05-0.1 s of CPU a run on 2 cores (and as much in every worker of a
parallel search) for nothing. The user's own setting wins."""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
