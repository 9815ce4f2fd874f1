"""Every scenario in scenarios/ runs as it stands (shortened), and matches its golden figures
(each golden file says which command produced them; tests/golden_figures.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.golden_figures import SCENARIOS, command, figures, golden_path, printable


def test_there_are_the_documented_scenarios() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {
        "quickstart",
        "chunked-prefill-budgets",
        "tight-kv-preemption",
        "load-sweep",
        "azure-conv-replay",
        "azure-code-replay",
        "mooncake-replay",
    } <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_runs_and_matches_golden(path: Path, tmp_path: Path) -> None:
    golden = golden_path(path)
    assert golden.exists(), f"no golden file: run `python -m tests.regenerate_golden {path.stem}`"
    want = json.loads(golden.read_text())
    assert want["command"] == printable(command(path)), "the golden recipe changed: regenerate"
    got = figures(path, tmp_path / "out")
    assert got == pytest.approx(want["figures"], rel=1e-9, abs=1e-12)


def test_some_golden_figures_come_from_runs_that_preempt() -> None:
    preempting = [
        p.stem
        for p in SCENARIOS
        if json.loads(golden_path(p).read_text())["figures"]["num_preemptions"] > 0
    ]
    assert "tight-kv-preemption" in preempting
