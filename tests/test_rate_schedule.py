"""Arrival rates that change over time (rate_schedule, rate_schedule_csv, diurnal, a trace's
time_scale_schedule): identity with today's constant rate, agreement with the theory of
non-homogeneous Poisson and time-rescaled renewal processes, and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import ValidationError
from scipy import stats

from simulator.cli import main
from simulator.errors import InputError
from simulator.workload import WorkloadConfig, arrival_times, generate
from simulator.workload.arrivals import rate_schedule
from simulator.workload.config import ArrivalConfig, TraceConfig
from simulator.workload.diurnal import DiurnalRate
from simulator.workload.rate_schedule import PiecewiseRate, RateSchedule
from simulator.workload.replay import scaled_clock

# The chi-square tests below reject a correct generator with probability 0.001 per seed; the
# seeds are fixed, so they pass or fail deterministically, and a wrong rate shape (an
# off-by-one piece, a linear piece read as a step) gives a statistic many times the bound.
ALPHA = 0.001


def arrivals(spec: dict[str, Any], n: int, seed: int = 0) -> np.ndarray:
    """``n`` arrival times from an arrival spec given as YAML would give it."""
    return arrival_times(ArrivalConfig.model_validate(spec), n, np.random.default_rng(seed))


def csv_file(tmp_path: Path, rows: str, name: str = "rate.csv") -> str:
    """A ``time_s, rate`` CSV with the given body rows."""
    path = tmp_path / name
    path.write_text("time_s,rate\n" + rows)
    return str(path)


# -- a constant schedule is today's constant rate, bit for bit ------------------------------


@pytest.mark.parametrize(
    "process", [{"process": "poisson"}, {"process": "gamma", "cv": 2.5}, {"process": "constant"}]
)
def test_constant_schedule_is_bit_identical_to_a_constant_rate(
    process: dict[str, Any], tmp_path: Path
) -> None:
    today = arrivals({**process, "rate": 7.3}, 50_000, seed=3)
    same = [
        arrivals({**process, "rate_schedule": [[0, 7.3]]}, 50_000, seed=3),
        arrivals({**process, "rate_schedule_csv": csv_file(tmp_path, "0,7.3\n")}, 50_000, seed=3),
        arrivals({**process, "diurnal": {"peak": 7.3, "trough": 7.3}}, 50_000, seed=3),
    ]
    for got in same:
        assert got.tobytes() == today.tobytes()


def test_constant_time_scale_schedule_is_bit_identical_to_time_scale() -> None:
    trace_s = np.sort(np.random.default_rng(1).uniform(0, 5000, 10_000))
    trace_s -= trace_s[0]
    fixed = TraceConfig(path="x.csv", format="csv", time_scale=0.37)
    schedule = TraceConfig(path="x.csv", format="csv", time_scale_schedule=[[0, 0.37]])
    assert scaled_clock(trace_s, schedule).tobytes() == scaled_clock(trace_s, fixed).tobytes()
    assert scaled_clock(trace_s, fixed).tobytes() == (trace_s * 0.37).tobytes()


def test_time_scale_schedule_integrates_the_scale() -> None:
    cfg = TraceConfig(path="x.csv", format="csv", time_scale_schedule=[[0, 2.0], [10, 0.5]])
    got = scaled_clock(np.array([0.0, 4.0, 10.0, 14.0, 30.0]), cfg)
    # 2 s of simulated time per trace second up to trace time 10, then 0.5
    np.testing.assert_allclose(got, [0.0, 8.0, 20.0, 22.0, 30.0], rtol=1e-15)


# -- the schedule's own arithmetic ----------------------------------------------------------


def schedules(tmp_path: Path) -> dict[str, RateSchedule]:
    """One schedule of each kind, with zero-rate stretches, slopes of both signs."""
    csv = csv_file(tmp_path, "0,0\n30,12\n60,12\n90,2\n130,0\n150,0\n170,6\n")
    specs: dict[str, dict[str, Any]] = {
        "steps": {"rate_schedule": [[0, 5], [40, 20], [70, 0], [100, 8], [120, 1.5]]},
        "linear": {"rate_schedule_csv": csv},
        "diurnal": {"diurnal": {"peak": 20, "trough": 0, "period_s": 90, "peak_at_s": 20}},
        "diurnal-floor": {"diurnal": {"peak": 12, "trough": 3, "period_s": 50}},
    }
    out = {}
    for name, spec in specs.items():
        schedule = rate_schedule(ArrivalConfig.model_validate(spec))
        assert schedule is not None
        out[name] = schedule
    return out


def test_times_invert_units_and_the_integral_matches_quadrature(tmp_path: Path) -> None:
    for name, schedule in schedules(tmp_path).items():
        t = np.sort(np.random.default_rng(2).uniform(0, 400, 20_000))
        u = schedule.units(t)
        assert (np.diff(u) >= 0).all(), name
        # where the rate is 0 many times share the same units: the earliest is returned
        back = schedule.times(u)
        np.testing.assert_allclose(schedule.units(back), u, rtol=0, atol=1e-9, err_msg=name)
        # where the rate nears 0, units(t) is flat and a rounding of u moves t by more (1e-7 s
        # at a trough of 0): the inverse is checked where the rate is not tiny
        clear = schedule.rate(t) > 0.01
        assert (back[clear] <= t[clear] + 1e-9).all() and clear.mean() > 0.7, name
        np.testing.assert_allclose(back[clear], t[clear], rtol=1e-12, atol=1e-9, err_msg=name)
        grid = np.linspace(0, 400, 400_001)
        integral = np.trapezoid(schedule.rate(grid), grid)
        # (the trapezoid rule errs by ~1e-6 at the steps' jumps)
        assert schedule.expected(0, 400) == pytest.approx(integral, rel=1e-5), name


def test_step_and_linear_rates_at_known_points(tmp_path: Path) -> None:
    s = schedules(tmp_path)
    np.testing.assert_allclose(
        s["steps"].rate(np.array([0, 39.9, 40, 75, 110, 1e6])), [5, 5, 20, 0, 8, 1.5]
    )
    np.testing.assert_allclose(
        s["linear"].rate(np.array([0, 15, 45, 75, 140, 160, 500])), [0, 6, 12, 7, 0, 3, 6]
    )
    # diurnal: the peak at peak_at_s and every period after, the trough half a period away
    np.testing.assert_allclose(s["diurnal"].rate(np.array([20, 110, 65])), [20, 20, 0], atol=1e-12)
    # peak_at_s defaults to half a period: the run starts at the trough
    np.testing.assert_allclose(s["diurnal-floor"].rate(np.array([0, 25])), [3, 12])


# -- against the theory of a non-homogeneous Poisson process -------------------------------


def _counts_match_the_integral(schedule: RateSchedule, t: np.ndarray, bin_s: float) -> None:
    """Counts of arrivals per bin are independent Poisson with mean the rate's integral over
    the bin: chi-square over the bins, up to a horizon the n arrivals surely reach."""
    horizon = float(t[-1]) * 0.9
    edges = np.arange(0.0, horizon, bin_s)
    counts, _ = np.histogram(t[1:], bins=edges)  # t[0] = 0 is the process's given start
    mean = np.diff(schedule.units(edges)) * schedule.ref
    zero = mean == 0
    assert (counts[zero] == 0).all(), "an arrival where the rate is 0"
    keep = ~zero
    chi2 = float((((counts - mean) ** 2)[keep] / mean[keep]).sum())
    assert chi2 < stats.chi2.ppf(1 - ALPHA, int(keep.sum())), (chi2, int(keep.sum()))
    # and the total is right within 4 standard deviations
    assert abs(counts.sum() - mean.sum()) < 4 * np.sqrt(mean.sum())


@pytest.mark.parametrize("kind", ["steps", "linear", "diurnal", "diurnal-floor"])
def test_poisson_counts_per_interval_match_the_integral_of_the_rate(
    kind: str, tmp_path: Path
) -> None:
    schedule = schedules(tmp_path)[kind]
    cfg = {
        "steps": {"rate_schedule": [[0, 5], [40, 20], [70, 0], [100, 8], [120, 1.5]]},
        "linear": {"rate_schedule_csv": str(tmp_path / "rate.csv")},
        "diurnal": {"diurnal": {"peak": 20, "trough": 0, "period_s": 90, "peak_at_s": 20}},
        "diurnal-floor": {"diurnal": {"peak": 12, "trough": 3, "period_s": 50}},
    }[kind]
    t = arrivals(cfg, 200_000, seed=11)
    assert t[0] == 0 and (np.diff(t) >= 0).all()
    _counts_match_the_integral(schedule, t, bin_s=5.0)


@pytest.mark.parametrize("process", [{"process": "poisson"}, {"process": "gamma", "cv": 0.5}])
def test_time_rescaled_gaps_follow_the_renewal_law(process: dict[str, Any]) -> None:
    """Mapped back through the cumulative rate, the gaps are the renewal process's at unit
    rate: Exp(1) for Poisson, Gamma(k = 1/cv^2, scale 1/k) for gamma (Kolmogorov-Smirnov)."""
    spec = {**process, "diurnal": {"peak": 30, "trough": 1, "period_s": 600}}
    cfg = ArrivalConfig.model_validate(spec)
    t = arrival_times(cfg, 100_000, np.random.default_rng(5))
    schedule = rate_schedule(cfg)
    assert schedule is not None
    gaps = np.diff(schedule.units(t) * schedule.ref)
    if process["process"] == "poisson":
        assert stats.kstest(gaps, "expon").pvalue > ALPHA
    else:
        k = 1 / process["cv"] ** 2
        assert stats.kstest(gaps, "gamma", args=(k, 0, 1 / k)).pvalue > ALPHA
        # a wrong law is rejected by the same test: these gaps are not exponential
        assert stats.kstest(gaps, "expon").pvalue < ALPHA


def test_constant_process_lands_on_whole_expected_counts() -> None:
    cfg = {"process": "constant", "rate_schedule": [[0, 2], [10, 8], [20, 0.5]]}
    t = arrivals(cfg, 200)
    schedule = rate_schedule(ArrivalConfig.model_validate(cfg))
    assert schedule is not None
    np.testing.assert_allclose(schedule.units(t) * schedule.ref, np.arange(200), atol=1e-9)


def test_same_seed_same_arrivals_other_seed_other(tmp_path: Path) -> None:
    spec = {"process": "gamma", "cv": 1.7, "diurnal": {"peak": 9, "trough": 2, "period_s": 60}}
    a, b = arrivals(spec, 5000, seed=4), arrivals(spec, 5000, seed=4)
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a, arrivals(spec, 5000, seed=5))


def test_a_rate_that_ends_at_zero_holds_only_so_many_requests() -> None:
    cfg = {"process": "constant", "rate_schedule": [[0, 10], [5, 0]]}
    assert len(arrivals(cfg, 50)) == 50  # 0.0, 0.1, ..., 4.9
    with pytest.raises(InputError, match=r"only 51 of the 60 requests \(num_requests\)"):
        arrivals(cfg, 60)


def test_a_schedule_runs_through_generate() -> None:
    spec = {
        "num_requests": 1000,
        "arrival": {"rate_schedule": [[0, 1.0], [100, 50.0]]},
        "prompt_len": {"dist": "fixed", "value": 10},
        "output_len": {"dist": "fixed", "value": 5},
    }
    w = generate(WorkloadConfig.model_validate(spec), np.random.SeedSequence(0))
    # about 100 requests in the first 100 s, then 50 per second
    early = int((w.arrival_s < 100).sum())
    assert abs(early - 100) < 4 * 10
    assert w.arrival_s[-1] == pytest.approx(100 + (1000 - early) / 50, abs=4)


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"rate_schedule": []}, "the schedule is empty"),
        ({"rate_schedule": [[0, 5], [10, -1]]}, "entry 1: rate -1.0 is not a finite number >= 0"),
        ({"rate_schedule": [[0, 5], [10, 2], [5, 1]]}, "entry 2: time 5.0 is not after"),
        ({"rate_schedule": [[0, 5], [10, 2], [10, 1]]}, "entry 2: time 10.0 is not after"),
        ({"rate_schedule": [[3, 5]]}, "entry 0: the first time must be 0"),
        ({"rate_schedule": [[0, 0], [9, 0]]}, "every rate is 0"),
        ({"rate_schedule": [[0, float("inf")]]}, "entry 0: rate inf"),
        ({"rate": 3, "rate_schedule": [[0, 5]]}, "give exactly one of rate"),
        ({"process": "gamma"}, "give exactly one of rate"),
        ({"diurnal": {"peak": 2, "trough": 3}}, "trough (3.0) must be <= peak (2.0)"),
        ({"diurnal": {"peak": 2, "trough": -1}}, "trough"),
    ],
)
def test_bad_schedules_are_rejected(spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        ArrivalConfig.model_validate(spec)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        ("0,1\n10,2\n5,3\n", "rate.csv:4: time 5.0 is not after the previous time 10.0"),
        ("0,1\n10,2\n10,3\n", "rate.csv:4: time 10.0 is not after"),
        ("0,1\n10,-2\n", "rate.csv:3: rate -2.0 is not a finite number >= 0"),
        ("0,1\n10,fast\n", "rate.csv:3: column rate: 'fast' is not a number"),
        ("5,1\n", "rate.csv:2: the first time must be 0"),
        ("0,0\n10,0\n", "rate.csv: every rate is 0"),
        ("", "rate.csv: no rows in the file (header only)"),
    ],
)
def test_bad_schedule_csv_names_file_and_line(rows: str, fragment: str, tmp_path: Path) -> None:
    cfg = ArrivalConfig(rate_schedule_csv=csv_file(tmp_path, rows))
    with pytest.raises(InputError) as err:
        rate_schedule(cfg)
    assert fragment in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_bad_time_scale_schedules() -> None:
    for bad, fragment in [
        ([[0, 1], [5, 0]], "entry 1: scale 0 is not > 0"),
        ([[0, 1], [5, -2]], "entry 1: scale -2.0"),
        ([[0, 1], [0, 2]], "entry 1: time 0.0 is not after"),
    ]:
        with pytest.raises(ValidationError, match=fragment):
            TraceConfig(path="x", format="csv", time_scale_schedule=bad)
    with pytest.raises(ValidationError, match="time_scale or time_scale_schedule"):
        TraceConfig(path="x", format="csv", time_scale=2, time_scale_schedule=[[0, 1]])


def _scenario(tmp_path: Path, arrival: dict[str, Any]) -> Path:
    spec = {
        "name": "sched",
        "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 16, "num_blocks": 500},
        "cost_model": {"type": "linear", "base_ms": 5, "per_token_ms": 0.01},
        "workload": {
            "num_requests": 50,
            "arrival": arrival,
            "prompt_len": {"dist": "fixed", "value": 20},
            "output_len": {"dist": "fixed", "value": 4},
        },
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("arrival", "fragment"),
    [
        ({"rate_schedule": [[0, 2], [10, -1]]}, "workload.arrival.rate_schedule"),
        ({"rate_schedule": [[0, 2], [10, 1], [4, 1]]}, "entry 2: time 4.0 is not after"),
        ({"rate_schedule_csv": "BAD_CSV"}, "rate.csv:3: rate -1.0"),
        (
            {"rate_schedule_csv": "/nonexistent.csv"},
            "error: workload.arrival.rate_schedule_csv: /nonexistent.csv: file not found",
        ),
        ({"rate_schedule": [[0, 10], [1, 0]]}, "the rate ends at 0 and only 11 of the 50"),
    ],
)
def test_cli_bad_schedule_is_one_line_exit_2_and_writes_nothing(
    arrival: dict[str, Any],
    fragment: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if arrival.get("rate_schedule_csv") == "BAD_CSV":
        arrival = {"rate_schedule_csv": csv_file(tmp_path, "0,1\n10,-1\n")}
    out = tmp_path / "never"
    assert main(["run", str(_scenario(tmp_path, arrival)), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servesim: error:") and fragment in err, err
    assert len(err.splitlines()) == 1
    assert not out.exists()


def test_diurnal_inverse_is_exact_at_the_trough_of_zero() -> None:
    # the rate touches 0 once a period: Newton alone stalls there, the bracket does not
    d = DiurnalRate(peak=10.0, trough=0.0, period_s=100.0, peak_at_s=50.0)
    u = np.array([0.0, 1e-12, 1e-6, 0.5, 50.0, 99.999, 100.0, 1e5 + 3e-7])
    t = d.times(u)
    np.testing.assert_allclose(d.units(t), u, rtol=1e-12, atol=1e-9)
    assert t[0] == 0.0 and (np.diff(t) > 0).all()


def test_step_schedule_with_zero_rate_first_piece() -> None:
    # no arrival can come before 10 s except the process's given first one at 0
    p = PiecewiseRate.steps(np.array([0.0, 10.0]), np.array([0.0, 4.0]))
    assert p.ref == 4.0
    np.testing.assert_allclose(p.times(np.array([0.0, 1e-9, 1.0])), [0.0, 10.0, 11.0])


def test_a_search_refuses_a_schedule_in_one_line(tmp_path: Path) -> None:
    from simulator.explore.probe import load_for
    from simulator.scenario.config import load_scenario

    cfg = load_scenario(_scenario(tmp_path, {"diurnal": {"peak": 4, "trough": 1}}))
    with pytest.raises(InputError, match=r"a search varies workload\.arrival\.rate"):
        load_for(cfg)


def test_a_closed_loop_throttles_scheduled_arrivals(tmp_path: Path) -> None:
    # with max_concurrency the schedule's arrivals wait for a slot: none is sent before its
    # drawn time, and never more than the cap are in flight
    from simulator.scenario.runner import build, resolve, run

    path = _scenario(tmp_path, {"rate_schedule": [[0, 1.0], [5, 200.0]]})
    spec = yaml.safe_load(path.read_text())
    spec["workload"]["max_concurrency"] = 3
    result = run(spec)
    # the fast window frees a slot at the step that finishes a request, as the plain path does
    # (it once sent a waiting request one step early)
    pd.testing.assert_frame_equal(result.requests, run(spec, fast_decode=False).requests)
    drawn = build(resolve(spec))[0].arrival_s
    sent = result.requests["arrival_s"].to_numpy()
    assert (sent >= drawn - 1e-12).all() and (sent > drawn + 1e-9).any()
    finish = result.requests["finish_s"].to_numpy()
    in_flight = [int(((sent <= t) & (finish > t)).sum()) for t in sent]
    assert max(in_flight) <= 3


def test_validate_reads_the_schedule_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = csv_file(tmp_path, "0,1\n10,2\n10,3\n")
    assert main(["validate", str(_scenario(tmp_path, {"rate_schedule_csv": bad}))]) == 2
    err = capsys.readouterr().err.strip()
    assert "rate.csv:4: time 10.0 is not after the previous time 10.0" in err
    assert len(err.splitlines()) == 1
