"""``servesim capacity``: against the M/D/1 formula, and a cut-short probe is always one that
would have failed (the quickstart scenario's capacity in at most 12 simulations, on both
backends: tests/test_ray.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.engine.watch import StoppedEarly
from simulator.explore.cutoff import Cutoff, percentile_past
from simulator.explore.probe import ProbeSpec, load_for, probe_scenario
from simulator.explore.slo import Target, make_target, parse_terms
from simulator.scenario.runner import run
from tests.test_engine import scenario

SERVICE_MS = 10.0


def md1(rate: float = 30.0, num_requests: int = 20_000) -> dict[str, Any]:
    """One server, one request at a time, each a single 10 ms step: M/D/1."""
    return scenario(
        scheduler={"max_num_batched_tokens": 64, "max_num_seqs": 1, "num_blocks": 64},
        cost_model={"type": "linear", "base_ms": SERVICE_MS},
        workload={
            "num_requests": num_requests,
            "arrival": {"process": "poisson", "rate": rate},
            "prompt_len": {"dist": "fixed", "value": 16},
            "output_len": {"dist": "fixed", "value": 1},
        },
    )


def pk_capacity(mean_ttft_s: float, service_s: float) -> float:
    """The largest Poisson rate whose M/D/1 mean TTFT (wait + service) is ``mean_ttft_s``:
    Pollaczek-Khinchine's W = rho D / (2 (1 - rho)) solved for the rate."""
    wait = mean_ttft_s - service_s
    return 2 * wait / (service_s * (service_s + 2 * wait))


def write(tmp_path: Path, data: dict[str, Any], name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_capacity_of_md1_is_within_3_percent_of_pollaczek_khinchine(tmp_path: Path) -> None:
    rho = 0.6  # 8 seeds here: within 1.1% of the formula (1.25% at 0.5)
    d = SERVICE_MS / 1e3
    bound_s = d + rho * d / (2 * (1 - rho))
    want = pk_capacity(bound_s, d)
    assert want == pytest.approx(rho / d)
    out = tmp_path / "cap"
    argv = ["capacity", str(write(tmp_path, md1())), "--slo", f"ttft_mean_ms={bound_s * 1e3}"]
    assert main([*argv, "--out", str(out), "--no-plots", "--jobs", "1", "--seeds", "1"]) == 0
    found = json.loads((out / "capacity.json").read_text())
    assert found["capacity"] == pytest.approx(want, rel=0.03)
    assert found["unit"] == "req/s" and found["status"] == "found"
    bracket = found["per_seed"][0]["bracket"]
    meets, fails = bracket["meets"], bracket["fails"]
    assert meets == found["capacity"] and fails / meets - 1 <= 0.02
    # every probe recorded: those that met it and those that missed it, at their rates
    probes = pd.DataFrame(found["probes"])
    assert len(probes) == found["num_simulations"] == probes["probe"].nunique()
    assert probes.loc[probes["meets"], "value"].max() == found["capacity"]
    assert probes.loc[~probes["meets"], "value"].min() == fails
    met = probes[probes["meets"]]
    assert (met["ttft_mean_s"] <= bound_s).all()


# --------------------------------------------------------------------------- the cutoff


def _full_and_watched(data: dict[str, Any], target: Target) -> tuple[Any, str | None]:
    """The run to its end, and why the cutoff stopped the same run (None: it did not)."""
    full = run(data, steps="none")
    try:
        watched = run(data, steps="none", stop=Cutoff(target))
    except StoppedEarly as stopped:
        return full, stopped.reason
    pd.testing.assert_frame_equal(watched.requests, full.requests)  # watching changes nothing
    assert json.dumps(watched.summary, default=str) == json.dumps(full.summary, default=str)
    return full, None


TARGETS = [
    make_target(["ttft_p99_ms=400"], None, None),
    make_target(["ttft_p90_ms=150,tpot_p99_ms=30"], None, None),
    make_target(["ttft_mean_ms=120"], None, None),
    make_target(["e2e_p50_ms=3000,queue_delay_p99_ms=300"], None, None),
    make_target(["ttft_ms=300,tpot_ms=25"], 0.9, None),
    make_target([], 0.95, {"ttft_ms": 500.0, "e2e_ms": 5000.0}),
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.describe())
def test_the_cutoff_stops_only_runs_that_would_fail(target: Target) -> None:
    stopped = kept = 0
    for rate in (2.0, 4.0, 30.0):
        data = probe_scenario(
            ProbeSpec(scenario(), "test", load_for(validate_cfg(scenario())), rate, 7, target)
        )
        full, reason = _full_and_watched(data, target)
        failures = target.failures(full.summary)
        if reason is not None:
            stopped += 1
            assert failures, f"stopped at {rate} req/s ({reason}) but the full run meets it"
        else:
            kept += 1
    assert stopped and kept  # both cases were seen


def validate_cfg(data: dict[str, Any]) -> Any:
    from simulator.scenario.config import validate

    return validate(data, "test")


def test_an_overloaded_probe_is_cut_short_early() -> None:
    target = make_target(["ttft_p99_ms=500"], None, None)
    data = probe_scenario(
        ProbeSpec(md1(num_requests=20_000), "t", load_for(validate_cfg(md1())), 150.0, 1, target)
    )
    with pytest.raises(StoppedEarly) as stopped:
        run(data, steps="none", stop=Cutoff(target))
    last_arrival = 20_000 / 150.0
    assert stopped.value.at_s < 0.2 * last_arrival  # stopped well before the arrivals end


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=60),
    st.floats(0, 10, allow_nan=False),
    st.sampled_from([50.0, 90.0, 99.0, 99.9, 100.0, 37.5]),
)
def test_percentile_past_agrees_with_numpy(values: list[float], bound: float, p: float) -> None:
    arr = np.asarray(values)
    past = int((arr > bound).sum())
    if percentile_past(past, len(arr), p):
        assert np.percentile(arr, p) > bound
    # with every value past the bound known, the rule is exact on the largest ones
    if np.percentile(arr, p) > bound and past == len(arr):
        assert percentile_past(past, len(arr), p)


# --------------------------------------------------------------------------- input


@pytest.mark.parametrize(
    ("slo", "said"),
    [
        ("ttft_p99=500", "expected <metric>_<stat>_ms=<bound>"),
        ("foo_p99_ms=5", "unknown metric 'foo'"),
        ("ttft_p99_ms=-1", "the bound must be a number of ms > 0"),
        ("ttft_p0_ms=5", "a percentile is in (0, 100]"),
        ("itl_ms=5", "a per-request limit is one of"),
        ("ttft_p99_ms=5,ttft_p99_ms=6", "given twice"),
    ],
)
def test_a_bad_slo_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slo: str, said: str
) -> None:
    out = tmp_path / "cap"
    assert main(["capacity", str(write(tmp_path, md1())), "--slo", slo, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_no_slo_anywhere_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(write(tmp_path, md1())), "--out", str(tmp_path / "o")]) == 2
    assert "no SLO" in capsys.readouterr().err


def test_slo_terms_parse() -> None:
    bounds, limits = parse_terms(["ttft_p99.9_ms=500,queue_delay_mean_ms=20", "e2e_ms=9"])
    assert [(b.metric, b.stat, b.key) for b in bounds] == [
        ("ttft", "p99.9", "ttft_p99.9_s"),
        ("queue_delay", "mean", "queue_delay_mean_s"),
    ]
    assert limits == {"e2e_ms": 9.0}
    assert math.isclose(bounds[0].bound_s, 0.5)


def test_a_load_no_rate_can_meet_says_so_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cap"
    path = write(tmp_path, md1(num_requests=200))
    # TTFT is at least the 10 ms service time: a 5 ms bound is never met
    argv = ["capacity", str(path), "--slo", "ttft_p50_ms=5", "--seeds", "2"]
    assert main([*argv, "--out", str(out)]) == 1
    found = json.loads((out / "capacity.json").read_text())
    assert found["status"] == "none" and found["capacity"] is None
    # one load, then the requests alone: their TTFT is the 10 ms service time, so no load can
    printed = capsys.readouterr().out
    assert "even requests sent one at a time miss it: ttft_p50_ms 10 ms (at most 5)" in printed
    assert found["num_probes"] == 2 and found["num_simulations"] == 4  # a load per seed
    alone = [run["alone"] for run in found["alone"]]
    assert [list(a) for a in alone] == [["ttft_p50_ms=5"]] * 2
    assert [a["ttft_p50_ms=5"] for a in alone] == pytest.approx([SERVICE_MS] * 2)
    # its figure (every probe missed) is drawn, and `servesim plot` redraws it
    figure = out / "plots" / "capacity.png"
    figure.unlink()
    assert main(["plot", str(out)]) == 0
    assert figure.stat().st_size > 10_000


def test_a_first_load_that_misses_asks_the_requests_alone_then_searches_down(
    tmp_path: Path,
) -> None:
    # M/D/1 from 150 req/s (over 1/D = 100): alone each request takes D = 10 ms, within the
    # bound, so a lower load can meet it and the search finds Pollaczek-Khinchine's rate
    d, bound_s = SERVICE_MS / 1e3, 0.0175
    out = tmp_path / "cap"
    argv = ["capacity", str(write(tmp_path, md1())), "--slo", f"ttft_mean_ms={bound_s * 1e3}"]
    argv += ["--start", "150", "--seeds", "1", "--jobs", "1", "--no-plots"]
    assert main([*argv, "--out", str(out)]) == 0
    found = json.loads((out / "capacity.json").read_text())
    assert found["capacity"] == pytest.approx(pk_capacity(bound_s, d), rel=0.03)
    [alone] = found["alone"]
    assert alone["meets"] and alone["alone"] == {}
    assert alone["ttft_mean_s"] == pytest.approx(d) and alone["ttft_p99_s"] == pytest.approx(d)
    assert found["num_simulations"] == len(found["probes"]) + 1


def test_a_cluster_of_identical_replicas_asks_one_replica_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {**md1(num_requests=200), "cluster": {"replicas": 2, "router": "round_robin"}}
    out = tmp_path / "cap"
    argv = ["capacity", str(write(tmp_path, data)), "--slo", "ttft_p50_ms=5", "--seeds", "1"]
    assert main([*argv, "--out", str(out), "--jobs", "1", "--no-plots"]) == 1
    found = json.loads((out / "capacity.json").read_text())
    assert found["status"] == "none" and found["num_simulations"] == 2
    assert found["alone"][0]["alone"] == {"ttft_p50_ms=5": pytest.approx(SERVICE_MS)}
    assert "even requests sent one at a time miss it" in capsys.readouterr().out


def test_replica_groups_cannot_send_requests_alone_so_their_search_halves_the_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    groups = [{"count": 1}, {"count": 1}]  # groups may differ: which one is the best case?
    data = {**md1(num_requests=200), "cluster": {"replicas": groups, "router": "round_robin"}}
    out = tmp_path / "cap"
    argv = ["capacity", str(write(tmp_path, data)), "--slo", "ttft_p50_ms=5", "--seeds", "1"]
    assert main([*argv, "--out", str(out), "--jobs", "1", "--no-plots"]) == 1
    found = json.loads((out / "capacity.json").read_text())
    assert found["status"] == "none" and found["alone"] == []
    assert found["num_probes"] == 12  # the start, then halved until below 1/1024 of it
    assert "the SLO is missed even at 0.01465 req/s" in capsys.readouterr().out


def test_a_trace_capacity_is_its_smallest_time_scale(tmp_path: Path) -> None:
    # the M/D/1 workload as a trace: Poisson arrivals at 30 req/s, 10 ms each
    n, rate = 20_000, 30.0
    gaps = np.random.default_rng(5).exponential(1 / rate, n - 1)
    arrivals = np.concatenate(([0.0], np.cumsum(gaps)))
    trace = tmp_path / "trace.csv"
    pd.DataFrame({"arrival_s": arrivals, "prompt_len": 16, "output_len": 1}).to_csv(
        trace, index=False
    )
    data = md1()
    data["workload"] = {"trace": {"path": str(trace), "format": "csv", "time_scale": 1.0}}
    d = SERVICE_MS / 1e3
    bound_s = d + 0.6 * d / (2 * (1 - 0.6))
    out = tmp_path / "cap"
    argv = ["capacity", str(write(tmp_path, data)), "--slo", f"ttft_mean_ms={bound_s * 1e3}"]
    assert main([*argv, "--out", str(out), "--no-plots", "--jobs", "1", "--seeds", "1"]) == 0
    found = json.loads((out / "capacity.json").read_text())
    assert found["unit"] == "time_scale" and found["load_key"] == "workload.trace.time_scale"
    # slower replays meet it: the bracket's missing time_scale is the smaller one
    assert found["per_seed"][0]["bracket"]["fails"] < found["capacity"]
    trace_rate = (n - 1) / arrivals[-1]
    assert found["capacity"] == pytest.approx(trace_rate / pk_capacity(bound_s, d), rel=0.03)
