"""A closed loop whose number of clients changes over the run
(``workload.max_concurrency_schedule``): the cap holds at every instant, a full population
keeps exactly its count in flight, throughput follows Little's law phase by phase, a schedule
that never changes is today's ``max_concurrency`` table for table, and bad input is one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.scenario.runner import run

# Three phases of a population (rate inf: every request is due at 0, so a client sends its
# next request the instant its last one ends): 4 clients, then 24, then 2.
CAPS = [[0.0, 4], [6.0, 24], [14.0, 2]]


def scenario(caps: list[list[float]] | None = None, **workload: Any) -> dict[str, Any]:
    """A population of clients on one server with a linear cost model."""
    return {
        "name": "clients",
        "seed": 3,
        "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 64, "num_blocks": 4000},
        "cost_model": {"type": "linear", "base_ms": 5, "per_token_ms": 0.02, "per_seq_ms": 0.1},
        "workload": {
            "num_requests": 2500,
            "arrival": {"process": "poisson", "rate": "inf"},
            "prompt_len": {"dist": "uniform", "low": 32, "high": 256},
            "output_len": {"dist": "uniform", "low": 8, "high": 64},
            "max_concurrency_schedule": CAPS if caps is None else caps,
            **workload,
        },
    }


def cap_at(t: np.ndarray, caps: list[list[float]]) -> np.ndarray:
    """The scheduled cap at each time (the entry from whose time on it holds)."""
    times = np.array([c[0] for c in caps])
    counts = np.array([c[1] for c in caps])
    return counts[np.searchsorted(times, t, side="right") - 1]


def in_flight(requests: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """Requests sent at or before each time and not finished by then."""
    sent = np.sort(requests["arrival_s"].to_numpy())
    done = np.sort(requests["finish_s"].to_numpy())
    return np.searchsorted(sent, t, side="right") - np.searchsorted(done, t, side="right")


@pytest.fixture(scope="module")
def result() -> Any:
    """The three-phase run (fast path)."""
    return run(scenario())


def test_the_cap_holds_at_every_send(result: Any) -> None:
    req = result.requests
    sent = req["arrival_s"].to_numpy()
    assert (in_flight(req, sent) <= cap_at(sent, CAPS)).all()
    # a raised cap sends at its instant: requests go out exactly at 6 s
    assert (np.isclose(sent, 6.0)).sum() == 24 - 4


def test_a_full_population_keeps_its_count_in_flight(result: Any) -> None:
    # inside each phase (after the requests of a higher cap drained) exactly `count` requests
    # are in flight: each client has one outstanding request at every instant
    req = result.requests
    last_send = req["arrival_s"].max()
    for (start, count), end in zip(CAPS, [c[0] for c in CAPS[1:]] + [last_send], strict=True):
        settle = req["e2e_s"].max() if count < max(c[1] for c in CAPS) else 0.0
        grid = np.linspace(start + settle + 1e-6, end - 1e-6, 200)
        grid = grid[grid < end]
        assert len(grid) > 50
        np.testing.assert_array_equal(in_flight(req, grid), count)


def test_throughput_follows_littles_law_in_each_phase(result: Any) -> None:
    # closed population, no think time: X = N / R (Little's law); measured over the requests
    # sent inside each phase's interior
    req = result.requests
    sent, e2e = req["arrival_s"].to_numpy(), req["e2e_s"].to_numpy()
    finish = req["finish_s"].to_numpy()
    for (start, count), end in zip(CAPS[:2], [c[0] for c in CAPS[1:]], strict=True):
        lo, hi = start + 1.0, end - 1.0
        done = ((finish > lo) & (finish <= hi)).sum()
        mean_response = e2e[(sent > lo) & (sent <= hi)].mean()
        assert done / (hi - lo) * mean_response == pytest.approx(count, rel=0.05)


def test_fast_path_equals_plain_path(result: Any) -> None:
    plain = run(scenario(), fast_decode=False)
    pd.testing.assert_frame_equal(result.requests, plain.requests)
    pd.testing.assert_frame_equal(result.steps, plain.steps)


@pytest.mark.parametrize("caps", [[[0.0, 5]], [[0.0, 5], [3.0, 5], [7.5, 5]]])
def test_a_schedule_that_never_changes_is_max_concurrency(caps: list[list[float]]) -> None:
    # a change to the same count still bounds the fast windows at its instant: tables equal
    fixed = scenario(max_concurrency=5, num_requests=600)
    del fixed["workload"]["max_concurrency_schedule"]
    want = run(fixed)
    got = run(scenario(caps, num_requests=600))
    pd.testing.assert_frame_equal(got.requests, want.requests)
    pd.testing.assert_frame_equal(got.steps, want.steps)


def test_open_loop_arrivals_are_throttled_by_the_schedule() -> None:
    # a finite rate: requests are sent at their drawn time unless the cap is reached
    spec = scenario([[0.0, 1], [4.0, 8]], num_requests=400)
    spec["workload"]["arrival"] = {"process": "poisson", "rate": 40}
    req = run(spec).requests
    sent = req["arrival_s"].to_numpy()
    assert (in_flight(req, sent) <= cap_at(sent, [[0.0, 1], [4.0, 8]])).all()
    assert in_flight(req, np.array([3.9]))[0] <= 1


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"max_concurrency_schedule": [[0, 2], [5, 3], [4, 1]]}, "is not after the previous"),
        ({"max_concurrency_schedule": [[1, 2]]}, "the first time must be 0"),
        ({"max_concurrency_schedule": [[0, 2], [5, -1]]}, "count -1.0 is not a finite number"),
        ({"max_concurrency_schedule": [[0, 2], [5, 0]]}, "the last count must be >= 1"),
        ({"max_concurrency_schedule": [[0, 2]], "max_concurrency": 2}, "not both"),
    ],
)
def test_bad_schedules_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workload: dict[str, Any], message: str
) -> None:
    spec = scenario()
    spec["workload"].update(workload)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "max_concurrency" in err
    assert len(err.splitlines()) == 1


def test_data_parallel_ranks_follow_the_schedule_too() -> None:
    # two ranks in lockstep: the same clients, the same caps at every send
    spec = scenario(num_requests=800)
    spec["parallel"] = {"data_parallel_size": 2}
    req = run(spec).requests
    sent = req["arrival_s"].to_numpy()
    assert (in_flight(req, sent) <= cap_at(sent, CAPS)).all()
    np.testing.assert_array_equal(in_flight(req, np.array([3.0, 10.0])), [4, 24])


def test_an_arrival_after_a_raised_cap_is_sent_under_the_new_cap() -> None:
    # no client at first, then one: a request arriving after the first two were served must be
    # sent under the cap of its time, not the first one (which left it waiting forever)
    spec = scenario([[0.0, 0], [1.0, 1]], num_requests=3)
    spec["workload"]["arrival"] = {"process": "poisson", "rate": 2.0}
    spec["seed"] = 0
    req = run(spec).requests
    sent = req["arrival_s"].to_numpy()
    assert (sent >= 1.0).all() and req["finish_s"].notna().all()
    assert (in_flight(req, sent) <= 1).all()
