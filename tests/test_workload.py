"""Synthetic workloads (distributions, seeding, stream independence), trace options, validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError
from scipy import stats

from simulator.errors import InputError
from simulator.workload import Workload, WorkloadConfig, arrival_times, generate, sample_lengths
from simulator.workload.config import ArrivalConfig, LengthConfig
from tests.paths import DATA, MISSING

SHAREGPT = DATA / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
N = 20_000
LENGTH = TypeAdapter(LengthConfig)


def rng(seed: int = 0) -> np.random.Generator:
    """A fresh generator for one test."""
    return np.random.default_rng(seed)


def lengths(spec: dict[str, Any], n: int = N, seed: int = 0) -> np.ndarray:
    """Draw ``n`` lengths from a length spec given as a plain dict (as YAML would)."""
    return sample_lengths(LENGTH.validate_python(spec), n, rng(seed))


def synthetic(**overrides: Any) -> WorkloadConfig:
    """A small valid synthetic config, with keys replaced by ``overrides``."""
    spec: dict[str, Any] = {
        "num_requests": 500,
        "arrival": {"process": "poisson", "rate": 4.0},
        "prompt_len": {"dist": "uniform", "low": 10, "high": 1000},
        "output_len": {"dist": "lognormal", "mu": 4.0, "sigma": 1.0},
    }
    spec.update(overrides)
    return WorkloadConfig.model_validate(spec)


# -- arrivals ------------------------------------------------------------------------------


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one() -> None:
    t = arrival_times(ArrivalConfig(process="poisson", rate=5.0), N, rng())
    gaps = np.diff(t)
    assert t[0] == 0.0 and len(t) == N and (gaps >= 0).all()
    # Standard error of the mean gap is 0.2 / sqrt(N) = 0.7 %; 3 % is > 4 sigma.
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.04)
    # Exponential gaps: Kolmogorov-Smirnov against Exp(rate) must not reject.
    assert stats.kstest(gaps, "expon", args=(0, 0.2)).pvalue > 0.001


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_gaps_honour_rate_and_cv(cv: float) -> None:
    gaps = np.diff(arrival_times(ArrivalConfig(process="gamma", rate=2.0, cv=cv), N, rng(1)))
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    # Relative standard error of the sample std is <= 2 % for these shapes; 8 % is > 4 sigma.
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_constant_arrivals_are_exact() -> None:
    t = arrival_times(ArrivalConfig(process="constant", rate=4.0), 9, rng())
    assert t.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]


def test_single_request_arrives_at_zero() -> None:
    for process in ("poisson", "gamma", "constant"):
        t = arrival_times(ArrivalConfig(process=process, rate=1.0), 1, rng())
        assert t.tolist() == [0.0]


# -- lengths -------------------------------------------------------------------------------


def test_fixed_length() -> None:
    assert (lengths({"dist": "fixed", "value": 7}, 50) == 7).all()


def test_uniform_is_inclusive_with_mean_midpoint() -> None:
    x = lengths({"dist": "uniform", "low": 3, "high": 8})
    assert x.min() == 3 and x.max() == 8
    assert set(np.unique(x).tolist()) == {3, 4, 5, 6, 7, 8}
    assert x.mean() == pytest.approx(5.5, abs=0.05)


def test_uniform_low_equal_high() -> None:
    assert (lengths({"dist": "uniform", "low": 4, "high": 4}, 10) == 4).all()


def test_normal_mean_and_std() -> None:
    x = lengths({"dist": "normal", "mean": 500, "std": 100})
    assert x.dtype == np.int64
    assert x.mean() == pytest.approx(500, rel=0.01)
    assert x.std() == pytest.approx(100, rel=0.03)


def test_normal_clipping_piles_mass_on_the_bounds() -> None:
    x = lengths({"dist": "normal", "mean": 10, "std": 100, "min": 5, "max": 50})
    assert x.min() == 5 and x.max() == 50
    # After rounding, x == 5 iff the draw is < 5.5 and x == 50 iff it is >= 49.5.
    low = stats.norm.cdf(5.5, 10, 100)
    high = stats.norm.sf(49.5, 10, 100)
    assert (x == 5).mean() == pytest.approx(low, abs=0.015)
    assert (x == 50).mean() == pytest.approx(high, abs=0.015)


def test_lognormal_median_and_mean() -> None:
    x = lengths({"dist": "lognormal", "mu": 6.0, "sigma": 0.5})
    assert np.median(x) == pytest.approx(np.exp(6.0), rel=0.02)
    assert x.mean() == pytest.approx(np.exp(6.0 + 0.5**2 / 2), rel=0.02)


def test_lognormal_never_below_min_or_above_max_even_when_huge() -> None:
    x = lengths({"dist": "lognormal", "mu": 0.0, "sigma": 400.0, "max": 4096}, 2000)
    assert x.min() == 1 and x.max() == 4096
    y = lengths({"dist": "lognormal", "mu": 0.0, "sigma": 400.0}, 2000)
    assert y.min() >= 1 and (y > 0).all()  # no int64 overflow into negatives


def test_empirical_resamples_the_sharegpt_column() -> None:
    assert SHAREGPT.is_file(), f"{SHAREGPT} {MISSING}"
    column = np.loadtxt(SHAREGPT, delimiter=",", skiprows=1, usecols=0)
    x = lengths({"dist": "empirical", "path": str(SHAREGPT), "column": "num_prefill_tokens"})
    assert np.isin(x, column).all()
    # Pool std ~2089 -> standard error of the mean ~15 tokens; 3 % of ~2340 is > 4 sigma.
    assert x.mean() == pytest.approx(column.mean(), rel=0.03)
    assert np.median(x) == pytest.approx(np.median(column), rel=0.05)


def test_empirical_missing_file_or_column(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.csv: file not found"):
        lengths({"dist": "empirical", "path": str(tmp_path / "nope.csv"), "column": "a"})
    (tmp_path / "l.csv").write_text("a\n1\n")
    with pytest.raises(InputError, match=r"l\.csv:1: missing column 'b'"):
        lengths({"dist": "empirical", "path": str(tmp_path / "l.csv"), "column": "b"})


def test_empirical_zero_lengths_are_noted(tmp_path: Path) -> None:
    (tmp_path / "l.csv").write_text("n\n0\n0\n4\n")
    cfg = synthetic(
        output_len={"dist": "empirical", "path": str(tmp_path / "l.csv"), "column": "n"}
    )
    w = generate(cfg, np.random.SeedSequence(3))
    assert set(np.unique(w.output_len).tolist()) <= {1, 4}
    assert w.notes == (f"output_len: 2 zero lengths in {tmp_path / 'l.csv'}:n set to 1",)


# -- generate: seeding ---------------------------------------------------------------------


def test_same_seed_same_workload_even_reusing_the_seed_object() -> None:
    seed = np.random.SeedSequence(42)
    a, b = generate(synthetic(), seed), generate(synthetic(), seed)
    c = generate(synthetic(), np.random.SeedSequence(42))
    for x in (b, c):
        np.testing.assert_array_equal(a.arrival_s, x.arrival_s)
        np.testing.assert_array_equal(a.prompt_len, x.prompt_len)
        np.testing.assert_array_equal(a.output_len, x.output_len)


def test_streams_match_seed_spawn() -> None:
    # The documented contract: stream i is child i of seed.spawn(3) on a fresh seed.
    children = np.random.SeedSequence(9).spawn(3)
    w = generate(synthetic(), np.random.SeedSequence(9))
    expected = arrival_times(ArrivalConfig(rate=4.0), 500, np.random.default_rng(children[0]))
    np.testing.assert_array_equal(w.arrival_s, expected)


def test_different_seed_different_workload() -> None:
    a = generate(synthetic(), np.random.SeedSequence(1))
    b = generate(synthetic(), np.random.SeedSequence(2))
    assert not np.array_equal(a.arrival_s, b.arrival_s)
    assert not np.array_equal(a.prompt_len, b.prompt_len)
    assert not np.array_equal(a.output_len, b.output_len)


def test_changing_one_distribution_leaves_the_other_streams_alone() -> None:
    seed = np.random.SeedSequence(7)
    base = generate(synthetic(), seed)
    other_output = generate(synthetic(output_len={"dist": "normal", "mean": 50, "std": 5}), seed)
    np.testing.assert_array_equal(base.arrival_s, other_output.arrival_s)
    np.testing.assert_array_equal(base.prompt_len, other_output.prompt_len)
    assert not np.array_equal(base.output_len, other_output.output_len)
    other_arrival = generate(synthetic(arrival={"process": "gamma", "rate": 9, "cv": 3}), seed)
    np.testing.assert_array_equal(base.prompt_len, other_arrival.prompt_len)
    np.testing.assert_array_equal(base.output_len, other_arrival.output_len)


# -- generate: traces ----------------------------------------------------------------------


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """Ten requests at t = 100, 101, ..., 109 s with prompt = 10 + i, output = i + 1."""
    rows = "".join(f"{100 + i},{10 + i},{i + 1}\n" for i in range(10))
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_len,output_len\n" + rows)
    return path


def from_trace(path: Path, fmt: str = "csv", **options: Any) -> Workload:
    """Generate a workload from a trace file with the given trace options."""
    cfg = WorkloadConfig.model_validate({"trace": {"path": str(path), "format": fmt, **options}})
    return generate(cfg, np.random.SeedSequence(0))


def test_trace_as_is(small_trace: Path) -> None:
    w = from_trace(small_trace)
    assert w.arrival_s.tolist() == [float(i) for i in range(10)]
    assert w.prompt_len.tolist() == list(range(10, 20))


def test_trace_time_scale(small_trace: Path) -> None:
    assert from_trace(small_trace, time_scale=0.5).arrival_s.tolist() == [i / 2 for i in range(10)]


def test_trace_max_requests(small_trace: Path) -> None:
    w = from_trace(small_trace, max_requests=3)
    assert len(w) == 3 and w.output_len.tolist() == [1, 2, 3]
    assert len(from_trace(small_trace, max_requests=50)) == 10


def test_trace_window_is_half_open_and_rebased(small_trace: Path) -> None:
    # Trace seconds since the first request: 0..9; [2.5, 6) keeps 3, 4, 5.
    w = from_trace(small_trace, start_s=2.5, end_s=6.0, time_scale=2.0)
    assert w.prompt_len.tolist() == [13, 14, 15]
    assert w.arrival_s.tolist() == [0.0, 2.0, 4.0]
    assert from_trace(small_trace, start_s=7).prompt_len.tolist() == [17, 18, 19]
    assert from_trace(small_trace, end_s=2).prompt_len.tolist() == [10, 11]
    assert from_trace(small_trace, start_s=2, max_requests=2).prompt_len.tolist() == [12, 13]


def test_empty_window_is_an_input_error(small_trace: Path) -> None:
    with pytest.raises(InputError, match=r"no requests in the window start_s=20"):
        from_trace(small_trace, start_s=20)


def test_real_azure_trace_through_generate() -> None:
    path = DATA / "azure2023_conv.csv"
    assert path.is_file(), f"{path} {MISSING}"
    w = from_trace(path, "azure", max_requests=1000, start_s=600)
    wide = from_trace(path, "azure")
    assert len(w) == 1000 and w.arrival_s[0] == 0.0
    first = int(np.searchsorted(wide.arrival_s, 600))
    np.testing.assert_array_equal(w.prompt_len, wide.prompt_len[first : first + 1000])


# -- validation ----------------------------------------------------------------------------


def invalid(spec: dict[str, Any]) -> str:
    """The validation message for a workload spec that must be rejected."""
    with pytest.raises(ValidationError) as err:
        WorkloadConfig.model_validate(spec)
    return str(err.value)


def test_trace_with_synthetic_keys_is_rejected() -> None:
    message = invalid({"trace": {"path": "x", "format": "csv"}, "num_requests": 5})
    assert "with 'trace', remove num_requests" in message
    assert "trace.max_requests" in message


def test_synthetic_missing_keys_are_named() -> None:
    message = invalid({"num_requests": 5, "prompt_len": {"dist": "fixed", "value": 1}})
    assert "missing: arrival, output_len" in message
    assert "missing: num_requests, arrival, prompt_len, output_len" in invalid({})


def test_wrong_format_hints_at_the_right_one() -> None:
    path = DATA / "azure2023_code.csv"
    assert path.is_file(), f"{path} {MISSING}"
    with pytest.raises(InputError, match=r"missing column 'arrival_s'.*format 'azure'"):
        from_trace(path, "csv")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"arrival": {"rate": 0}}, "greater than 0"),
        ({"arrival": {"rate": 1, "cv": 2}}, "cv applies to process 'gamma' only"),
        ({"arrival": {"rate": 1, "burst": 2}}, "Extra inputs are not permitted"),
        ({"prompt_len": {"dist": "uniform", "low": 9, "high": 3}}, "high (3) must be >= low (9)"),
        ({"prompt_len": {"dist": "normal", "mean": 9, "std": 1, "max": 0}}, "greater than or"),
        ({"prompt_len": {"dist": "normal", "mean": 9, "std": 1, "min": 8, "max": 3}}, "max (3)"),
        ({"prompt_len": {"dist": "lognormal", "mu": 1, "sigma": -1}}, "sigma"),
        ({"prompt_len": {"dist": "zipf", "a": 2}}, "zipf"),
        ({"num_requests": 0}, "num_requests"),
    ],
)
def test_bad_synthetic_fields(spec: dict[str, Any], fragment: str) -> None:
    base: dict[str, Any] = synthetic().model_dump()
    base.update(spec)
    assert fragment in invalid(base)


@pytest.mark.parametrize(
    ("trace", "fragment"),
    [
        ({"format": "csv"}, "path"),
        ({"path": "x", "format": "tsv"}, "format"),
        ({"path": "x", "format": "csv", "time_scale": 0}, "time_scale"),
        ({"path": "x", "format": "csv", "max_requests": 0}, "max_requests"),
        ({"path": "x", "format": "csv", "start_s": 5, "end_s": 5}, "end_s (5.0) must be >"),
    ],
)
def test_bad_trace_fields(trace: dict[str, Any], fragment: str) -> None:
    assert fragment in invalid({"trace": trace})


def test_field_docstrings_become_the_references_meanings() -> None:
    from simulator.reference import field_docs

    assert (
        field_docs(ArrivalConfig)["cv"]
        == "Gamma only: coefficient of variation of inter-arrival times (1 = Poisson, >1 burstier)."
    )


# -- Workload ------------------------------------------------------------------------------


def test_workload_copies_and_freezes_its_arrays() -> None:
    arrivals = np.array([0.0, 1.0])
    w = Workload(arrivals, np.array([1, 2]), np.array([3, 4]))
    arrivals[1] = 5.0
    assert w.arrival_s.tolist() == [0.0, 1.0] and len(w) == 2
    with pytest.raises(ValueError, match="read-only"):
        w.prompt_len[0] = 9


@pytest.mark.parametrize(
    ("arrival", "prompt", "output", "fragment"),
    [
        ([0.0, 1.0], [1], [1, 1], "differ in length"),
        ([1.0, 0.0], [1, 1], [1, 1], "nondecreasing"),
        ([0.0, 1.0], [1, 0], [1, 1], ">= 1"),
    ],
)
def test_workload_rejects_inconsistent_arrays(
    arrival: list[float], prompt: list[int], output: list[int], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        Workload(np.array(arrival), np.array(prompt), np.array(output))
