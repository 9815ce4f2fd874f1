"""Ctrl-C and SIGTERM stop ``sweep``, ``capacity`` and ``search`` within 2 s, whatever the
number of jobs, local or on Ray, exit 130 / 143, and leave no temporary folder (nor worker)
behind."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.interrupt_helpers import EXIT_WITHIN_S, leftovers, start, stop, wait_for
from tests.test_cli import SMALL

CTRL_C = (signal.SIGINT, True, 130, "servesim: interrupted")
SIGTERM = (signal.SIGTERM, False, 143, "servesim: terminated")
STOPS = [pytest.param(*CTRL_C, id="ctrl-c"), pytest.param(*SIGTERM, id="sigterm")]


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def _finished_runs(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.tmp-*/runs/*/summary.json"))


def _check(took: float, returncode: int, stderr: str, code: int, said: str, parent: Path) -> None:
    assert returncode == code, stderr
    assert stderr.rstrip().endswith(said) and "Traceback" not in stderr, stderr
    assert took < EXIT_WITHIN_S, f"took {took:.1f} s to exit"
    assert leftovers(parent) == []


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
    job = start(["sweep", str(scenario), "--grid", grid, "--jobs", "3", "--out", str(out)])
    wait_for(lambda: bool(_finished_runs(out)), job, timeout=60)
    _check(*stop(job, sig, group), code, said, parent)


# Probes that run long: many requests, an SLO they meet (nothing is cut short)
LONG = ["--set", "workload.num_requests=400000", "--slo", "ttft_p99_ms=100000"]

SEARCHES: list[Any] = [
    pytest.param("capacity", "local", CTRL_C, id="capacity-local-ctrl-c"),
    pytest.param("search", "local", SIGTERM, id="search-local-sigterm"),
    pytest.param("capacity", "ray", SIGTERM, id="capacity-ray-sigterm"),
    pytest.param("search", "ray", CTRL_C, id="search-ray-ctrl-c"),
    pytest.param("sweep", "ray", CTRL_C, id="sweep-ray-ctrl-c"),
]


@pytest.mark.parametrize(("command", "backend", "how"), SEARCHES)
def test_a_stopped_search_exits_at_once_and_leaves_no_temporary_folder(
    request: pytest.FixtureRequest,
    scenario: Path,
    tmp_path: Path,
    command: str,
    backend: str,
    how: tuple[int, bool, int, str],
) -> None:
    sig, group, code, said = how
    parent = tmp_path / "results"
    parent.mkdir()
    out = parent / "o"
    argv = [command, str(scenario), "--out", str(out)]
    if command == "sweep":
        argv += ["--set", "workload.num_requests=400000", "--grid", "seed=1,2,3"]
    else:
        argv += LONG
    if command == "capacity":
        argv += ["--seeds", "3"]  # three simulations at once
    if command == "search":
        argv += ["--grid", "scheduler.max_num_seqs=4,8,16", "--gpu-cost", "2"]
    if backend == "ray":
        argv += ["--backend", "ray", "--address", request.getfixturevalue("ray_address")]
    else:
        argv += ["--jobs", "3"]
    job = start(argv)
    running = "servesim: running on" if backend == "ray" else "under"
    wait_for(lambda: running in job.stderr and bool(list(parent.iterdir())), job, timeout=60)
    time.sleep(1.0)  # the simulations are under way
    _check(*stop(job, sig, group), code, said, parent)
