"""Ctrl-C and SIGTERM stop ``sweep``, ``capacity`` and ``search`` within 2 s, whatever the
number of jobs, exit 130 / 143, and leave no temporary folder (nor worker) behind."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from tests.interrupt_helpers import EXIT_WITHIN_S, leftovers, start, stop, wait_for
from tests.test_cli import SMALL

STOPS = [
    pytest.param(signal.SIGINT, True, 130, "servesim: interrupted", id="ctrl-c"),
    pytest.param(signal.SIGTERM, False, 143, "servesim: terminated", id="sigterm"),
]


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def _finished_runs(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.tmp-*/runs/*/summary.json"))


@pytest.mark.parametrize(("sig", "group", "code", "said"), STOPS)
def test_a_stopped_sweep_exits_at_once_and_leaves_no_temporary_folder(
    scenario: Path, tmp_path: Path, sig: int, group: bool, code: int, said: str
) -> None:
    parent = tmp_path / "results"
    parent.mkdir()
    out = parent / "sw"
    # one short point that finishes (its folder is in the temporary folder) and three long
    # ones still running on three workers when the signal comes
    grid = "workload.num_requests=50,300000,300001,300002"
    proc = start(["sweep", str(scenario), "--grid", grid, "--jobs", "3", "--out", str(out)])
    wait_for(lambda: bool(_finished_runs(out)), proc, timeout=60)
    took, returncode, stderr = stop(proc, sig, group)
    assert returncode == code, stderr
    assert stderr.rstrip().endswith(said) and "Traceback" not in stderr
    assert took < EXIT_WITHIN_S, f"took {took:.1f} s to exit"
    assert leftovers(parent) == []
