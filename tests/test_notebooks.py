"""The notebooks run headless (cwd = notebooks/) without errors, and are committed executed.

Re-execute and store them after editing a notebook or changing the simulator:
``.venv/bin/python tests/test_notebooks.py`` (or name some: ``... compare_budgets``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient
from nbformat import NotebookNode

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "python3"
CELL_TIMEOUT_S = 180
MAX_BYTES = 1_500_000

# Figures each notebook must draw: compare_budgets the budget comparison and the trade-off
# map; latency_plots the four run plots, one sweep figure per grid key, the budget comparison
# and the overlaid CDFs; swap_vs_recompute the gain of swapping against the victim's length;
# multimodal_encoder_share the encoder's shares against images per request.
MIN_FIGURES = {
    "compare_budgets": 2,
    "latency_plots": 8,
    "swap_vs_recompute": 1,
    "multimodal_encoder_share": 1,
}

# Appended to a copy of each notebook: prints, as JSON, the state its last cells left behind.
PROBES = {
    "compare_budgets": """
import json as _json
import sys as _sys
print(_json.dumps({
    "prefix": _sys.prefix,
    "budgets": [int(b) for b in table["budget"]],
    "seqs": [int(s) for s in table["max_num_seqs"]],
    "grid_budgets": [int(b) for b in BUDGETS],
    "grid_seqs": [int(s) for s in MAX_NUM_SEQS],
    "status": sorted(set(sweep["status"])),
    "checked": len(CHECKS),
    "workdir_left": workdir.exists(),
}))
""",
    "swap_vs_recompute": """
import json as _json
import sys as _sys
_found = table.dropna(subset=["simulated crossover (tokens)"])
print(_json.dumps({
    "prefix": _sys.prefix,
    "status": ["ok"],
    "links": len(table),
    "crossovers": [[int(s), int(a)] for s, a in zip(
        _found["simulated crossover (tokens)"], _found["analytic crossover (tokens)"])],
    "checked": len(CHECKS),
}))
""",
    "multimodal_encoder_share": """
import json as _json
import sys as _sys
print(_json.dumps({
    "prefix": _sys.prefix,
    "status": ["ok"],
    "images": [int(k) for k in loaded["images"]],
    "lone_share": [float(x) for x in lone["encoder share of TTFT"]],
    "busy_share": [float(x) for x in loaded["encoder share of busy time"]],
    "checked": len(CHECKS),
}))
""",
    "latency_plots": """
import json as _json
import sys as _sys
print(_json.dumps({
    "prefix": _sys.prefix,
    "requests": len(requests),
    "steps": len(steps),
    "sweep_rows": len(sweep),
    "sweep_keys": keys,
    "status": sorted(set(sweep["status"])),
    "scratch_left": scratch is not None and scratch.exists(),
}))
""",
}


def notebook_path(name: str) -> Path:
    """The stored notebook ``notebooks/<name>.ipynb``."""
    return NOTEBOOKS / f"{name}.ipynb"


def execute(nb: NotebookNode) -> NotebookNode:
    """Run every cell in order in a fresh ``python3`` kernel with cwd = notebooks/.

    A cell that raises stops the run with ``CellExecutionError`` naming the cell."""
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL,
        record_timing=False,  # wall-clock metadata would make every re-run a diff
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    return nb


def code_cells(nb: NotebookNode) -> list[NotebookNode]:
    """The notebook's code cells, in order."""
    return [c for c in nb.cells if c.cell_type == "code"]


def outputs(nb: NotebookNode) -> list[NotebookNode]:
    """Every output of every code cell."""
    return [o for c in code_cells(nb) for o in c.get("outputs", [])]


def count_images(nb: NotebookNode) -> int:
    """PNG figures among the outputs."""
    return sum("image/png" in o.get("data", {}) for o in outputs(nb))


def stream_text(nb: NotebookNode, name: str) -> str:
    """All text a notebook wrote to one stream (``stdout`` or ``stderr``)."""
    return "".join(
        o.get("text", "") for o in outputs(nb) if o.output_type == "stream" and o.name == name
    )


@pytest.fixture(scope="session")
def kernel_prefix() -> str:
    """The kernel spec resolves and its interpreter is this venv's (so it imports simulator)."""
    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:  # pragma: no cover - only on a broken install
        pytest.fail(f"no {KERNEL!r} kernel spec: reinstall the dev extras (ipykernel)")
    # jupyter_client replaces a bare "python" with the interpreter running this test.
    assert spec.argv[0] in ("python", "python3", sys.executable), spec.argv
    return sys.prefix


def run_with_probe(name: str) -> tuple[NotebookNode, Any]:
    """A freshly executed copy of the notebook and the probe's JSON (the probe cell removed)."""
    nb = nbformat.read(notebook_path(name), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBES[name]))
    execute(nb)
    probe_out = nb.cells.pop().outputs
    text = "".join(o.get("text", "") for o in probe_out if o.output_type == "stream")
    return nb, json.loads(text)


# One test per notebook, so that pytest-xdist never executes a notebook twice.
@pytest.mark.parametrize("name", sorted(PROBES))
def test_notebook_executes(name: str, kernel_prefix: str) -> None:
    """Runs in this venv's kernel with no error output and nothing on stderr (warnings
    count), draws its figures, covers the whole grid, and removes its temporary folders."""
    nb, probe = run_with_probe(name)
    assert probe["prefix"] == kernel_prefix, "the notebook ran in another Python environment"
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    assert stream_text(nb, "stderr") == "", f"{name} wrote to stderr"
    assert count_images(nb) >= MIN_FIGURES[name]
    assert probe["status"] == ["ok"]
    if name == "compare_budgets":
        grid = [(s, b) for s in probe["grid_seqs"] for b in probe["grid_budgets"]]
        assert len(probe["grid_budgets"]) >= 5 and len(probe["grid_seqs"]) >= 2
        # One row per (max_num_seqs, budget), in grid order.
        assert list(zip(probe["seqs"], probe["budgets"], strict=True)) == grid
        assert probe["checked"] >= 5
        assert not probe["workdir_left"]
    elif name == "swap_vs_recompute":
        # the simulated crossover prompt length within 5% of the analytic one, on every link
        # where swapping wins from some length (the PCIe x16 generations at least)
        assert len(probe["crossovers"]) >= 4
        for simulated, analytic in probe["crossovers"]:
            assert abs(simulated / analytic - 1) <= 0.05, (simulated, analytic)
        assert probe["checked"] >= 10
    elif name == "multimodal_encoder_share":
        # images per request from none to several; the encoder's shares grow with them
        assert probe["images"][0] == 0 and len(probe["images"]) >= 4
        assert probe["lone_share"][0] == 0 and probe["busy_share"][0] == 0
        assert all(0 < x < 1 for x in probe["lone_share"][1:] + probe["busy_share"][1:])
        assert probe["checked"] >= 7
    else:
        assert probe["requests"] > 0 and probe["steps"] > probe["requests"]
        assert probe["sweep_rows"] == 4 and len(probe["sweep_keys"]) == 2
        assert not probe["scratch_left"]


@pytest.mark.parametrize("name", sorted(PROBES))
def test_stored_notebook_is_executed(name: str) -> None:
    """The committed file holds a complete top-to-bottom run in one fresh kernel, small enough
    to read on a code host: counts 1..n, no errors, figures present."""
    path = notebook_path(name)
    assert path.stat().st_size < MAX_BYTES, f"{path.name}: lower the figure dpi"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    counts = [c.get("execution_count") for c in code_cells(nb)]
    assert None not in counts, f"{path.name}: unexecuted cells; run tests/test_notebooks.py"
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: not run top to bottom"
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    assert stream_text(nb, "stderr") == ""
    assert count_images(nb) >= MIN_FIGURES[name]
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL


def update(names: list[str]) -> None:
    """Execute the named notebooks (all when empty) and store them with their outputs."""
    for name in names or sorted(PROBES):
        path = notebook_path(name)
        nb = execute(nbformat.read(path, as_version=4))
        nbformat.write(nb, path)
        print(f"{path.relative_to(ROOT)}: {count_images(nb)} figures, {path.stat().st_size:,} B")


if __name__ == "__main__":
    update(sys.argv[1:])
