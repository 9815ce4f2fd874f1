"""Bounded memory: the streamed ITL distribution, the step table in chunks, and the closed-loop
and infinite-rate arrivals of benchmark_serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import simulator.engine.recorder as recorder
import simulator.scenario.runner
from simulator.engine.step_sink import SAMPLE_EVERY
from simulator.errors import InputError
from simulator.metrics import Distribution
from simulator.metrics.distribution import RELATIVE_ERROR
from simulator.scenario.config import validate
from tests.test_engine import scenario

QS = [1, 10, 50, 90, 99, 99.9, 100]


def test_sketched_percentiles_are_within_the_stated_error() -> None:
    values = np.random.default_rng(3).lognormal(-4, 1.5, 300_000)
    dist = Distribution(exact_limit=1000)
    for chunk in np.array_split(values, 37):
        dist.add(chunk)
    assert not dist.exact
    want = np.percentile(values, QS)
    got = np.array(dist.percentiles(QS))
    assert np.all(np.abs(got - want) <= RELATIVE_ERROR * want)
    assert np.max(np.abs(got - want) / want) > 0  # a sketch, not the exact values
    assert dist.count == len(values)
    assert dist.mean() == pytest.approx(values.mean(), rel=1e-12)


def test_weighted_values_count_as_repeats_exact_or_sketched() -> None:
    rng = np.random.default_rng(4)
    values, weights = rng.random(500) + 0.01, rng.integers(0, 40, 500)
    for limit in (10**9, 100):
        weighted, repeated = Distribution(limit), Distribution(limit)
        weighted.add(values, weights)
        repeated.add(np.repeat(values, weights))
        assert weighted.percentiles(QS) == repeated.percentiles(QS)
        assert weighted.count == repeated.count == weights.sum()
    exact = Distribution()
    exact.add(values, weights)
    assert exact.percentiles(QS) == list(np.percentile(np.repeat(values, weights), QS))


def test_empty_distribution_is_nan() -> None:
    dist = Distribution()
    dist.add(np.zeros(0))
    assert np.isnan(dist.mean()) and all(np.isnan(dist.percentiles([50, 99])))


def test_step_table_streamed_in_chunks_equals_the_one_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = scenario()
    whole = simulator.scenario.runner.run(cfg)
    monkeypatch.setattr(recorder, "CHUNK_STEPS", 333)
    path = tmp_path / "steps.parquet"
    streamed = simulator.scenario.runner.run(cfg, steps_path=path)
    assert streamed.steps is None
    pd.testing.assert_frame_equal(pd.read_parquet(path), whole.steps, check_exact=True)
    assert streamed.summary == pytest.approx(whole.summary, nan_ok=True)


def test_sampled_and_no_steps_keep_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = scenario()
    whole = simulator.scenario.runner.run(cfg)
    assert whole.steps is not None
    monkeypatch.setattr(recorder, "CHUNK_STEPS", 1000)
    sampled = simulator.scenario.runner.run(cfg, steps="sampled")
    assert sampled.steps is not None
    kept = (whole.steps["step"] % SAMPLE_EVERY == 0) | (whole.steps["num_preemptions"] > 0)
    want = whole.steps[kept].reset_index(drop=True)
    pd.testing.assert_frame_equal(sampled.steps, want, check_exact=True)
    assert whole.summary["num_preemptions"] > 0  # preempting steps are kept
    none = simulator.scenario.runner.run(cfg, steps="none")
    assert none.steps is None
    for res in (sampled, none):
        assert res.summary == pytest.approx(whole.summary, nan_ok=True)
    with pytest.raises(ValueError, match="steps mode"):
        simulator.scenario.runner.run(cfg, steps="some")


def small(**workload: Any) -> dict[str, Any]:
    """A scenario with fixed lengths and a fixed step time (5 ms) on an ample server."""
    return scenario(
        scheduler={"max_num_batched_tokens": 4096, "max_num_seqs": 64, "num_blocks": 10_000},
        cost_model={"type": "linear", "base_ms": 5},
        workload={
            "num_requests": 40,
            "arrival": {"process": "poisson", "rate": 50},
            "prompt_len": {"dist": "fixed", "value": 32},
            "output_len": {"dist": "fixed", "value": 10},
            **workload,
        },
    )


def test_infinite_rate_sends_everything_at_zero() -> None:
    res = simulator.scenario.runner.run(small(arrival={"process": "poisson", "rate": "inf"}))
    assert (res.requests["arrival_s"] == 0).all()
    cfg = validate(small(arrival={"process": "gamma", "rate": float("inf"), "cv": 2}), "t")
    assert cfg.workload.arrival is not None and np.isinf(cfg.workload.arrival.rate)
    with pytest.raises(InputError, match="rate"):
        validate(small(arrival={"process": "poisson", "rate": "nan"}), "t")


def test_closed_loop_of_one_client_sends_each_request_when_the_last_finishes() -> None:
    res = simulator.scenario.runner.run(
        small(arrival={"process": "poisson", "rate": "inf"}, max_concurrency=1)
    )
    req = res.requests.sort_values("arrival_s")
    assert req["arrival_s"].iloc[0] == 0
    # each is sent the instant the previous one finishes (one prefill + 9 decode steps each)
    np.testing.assert_array_equal(req["arrival_s"].to_numpy()[1:], req["finish_s"].to_numpy()[:-1])
    assert req["e2e_s"].to_numpy() == pytest.approx(0.05)
    assert res.summary["ttft_mean_s"] == pytest.approx(0.005)


@pytest.mark.parametrize("limit", [1, 3, 16])
def test_closed_loop_caps_requests_in_flight_and_fast_equals_plain(limit: int) -> None:
    cfg = scenario(workload=dict(scenario()["workload"], num_requests=300, max_concurrency=limit))
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    req = fast.requests
    events = np.concatenate([req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()])
    delta = np.concatenate([np.ones(len(req)), -np.ones(len(req))])
    order = np.lexsort((delta, events))  # at a tie, the finish frees the slot first
    assert np.cumsum(delta[order]).max() == limit
    drawn = simulator.scenario.runner.run(
        scenario(workload=dict(cfg["workload"], max_concurrency=None))
    )
    assert (req["arrival_s"] >= drawn.requests["arrival_s"]).all()  # sent no earlier than due


def test_percentiles_are_configurable() -> None:
    cfg = small()
    cfg["metrics"] = {"percentiles": [99.9, 50]}
    res = simulator.scenario.runner.run(cfg)
    assert {"ttft_p50_s", "ttft_p99.9_s", "itl_p99.9_s"} <= set(res.summary)
    assert "ttft_p90_s" not in res.summary
    ttft = res.requests["ttft_s"].to_numpy()
    assert res.summary["ttft_p99.9_s"] == np.percentile(ttft, 99.9)
    for bad, why in (([0], "in \\(0, 100\\]"), ([50, 50], "repeat"), ([], "at least 1")):
        cfg["metrics"] = {"percentiles": bad}
        with pytest.raises(InputError, match=why):
            validate(cfg, "t")


MEAN_OF_A_LONG_SERIES = """
import numpy as np
from simulator.metrics.distribution import Distribution
values = np.random.default_rng(0).random(3_000_000)
d = Distribution()
d.add(values)
d.add(values[:1000], np.full(1000, 3, dtype=np.int64))
print(repr(d.mean()))
"""


def test_a_mean_does_not_depend_on_the_number_of_blas_threads() -> None:
    # A Ray worker runs with OMP_NUM_THREADS=1; np.dot split its sum over BLAS threads, so
    # the same run's itl_mean_s differed in its last bit between backends.
    import os
    import subprocess
    import sys

    means = {
        threads: subprocess.run(
            [sys.executable, "-c", MEAN_OF_A_LONG_SERIES],
            env={**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for threads in ("1", "4")
    }
    assert means["1"] == means["4"]


def test_a_settled_recorder_closes_to_the_same_steps_gaps_and_stats() -> None:
    """``Recorder.settle`` (a drained replica of a fleet) passes its rows on early and holds
    its gaps as arrays: the step table, the step aggregates and the ITL distribution that
    ``close`` then gives are those of a recorder closed at once."""
    from simulator.engine.step_sink import MemorySink

    def record(rec: recorder.Recorder) -> None:
        ints = (3, 40, 37, 3, 20, 3, 1, 0, 0)
        rec.record_step(0.0, 0.05, ints)
        starts = [0.05 + 0.01 * k for k in range(30)]
        rec.record_decode_steps([(0, 4, 0), (12, 3, 0)], starts, [0.01] * 30, [21] * 30, 0)
        rec.record_decode_step(3, 0.35, 0.36)

    settled, direct = recorder.Recorder(8, 64, MemorySink()), recorder.Recorder(8, 64, MemorySink())
    for rec in (settled, direct):
        record(rec)
    settled.settle()
    assert not settled._run_a  # held as arrays now, not as Python floats
    a, b = settled.close(), direct.close()
    assert a is not None and b is not None and len(a) == 31
    pd.testing.assert_frame_equal(a, b)
    assert vars(settled.step_stats) == vars(direct.step_stats)
    assert settled.itl.mean() == direct.itl.mean()
    assert settled.itl.percentiles(QS) == direct.itl.percentiles(QS)


def step_chunk(n: int, first: int, seed: int) -> dict[str, np.ndarray]:
    """A chunk of ``n`` step rows from ``first``, as the step buffer passes them on."""
    from simulator.engine.step_buffer import STEP_INT_FIELDS
    from simulator.metrics import step_columns

    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.random(n) * 0.01)
    ints = rng.integers(0, 500, size=(len(STEP_INT_FIELDS), n))
    return step_columns(starts, rng.random(n) * 0.01, ints, STEP_INT_FIELDS, 600, first)


def test_a_parquet_sink_fed_columns_writes_what_it_writes_fed_frames(tmp_path: Path) -> None:
    """The step buffer hands a parquet sink each chunk's columns, which it writes through
    Arrow without pandas: the file reads back as pandas writes the whole table (same column
    types), as a sink fed frames writes it, and the step aggregates agree exactly."""
    from simulator.engine.step_sink import ParquetSink
    from simulator.metrics import StepStats, frame_of

    chunks = [step_chunk(n, first, seed) for seed, (n, first) in enumerate([(50, 0), (7, 50)])]
    by_frame, by_columns = ParquetSink(tmp_path / "f.parquet"), ParquetSink(tmp_path / "c.parquet")
    frame_stats, column_stats = StepStats(), StepStats()
    for cols in chunks:
        by_frame.write(frame_of(cols))
        frame_stats.add(frame_of(cols))
        by_columns.write_columns(cols)
        column_stats.add(cols)
    by_frame.close()
    by_columns.close()
    whole = pd.concat([frame_of(c) for c in chunks], ignore_index=True)
    whole.to_parquet(tmp_path / "p.parquet", index=False)
    a, b = pd.read_parquet(tmp_path / "p.parquet"), pd.read_parquet(tmp_path / "c.parquet")
    assert len(a) == 57 and a["step"].tolist() == list(range(57))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "f.parquet"), b, check_exact=True)
    schema = pq.read_schema(tmp_path / "p.parquet").remove_metadata()
    assert schema.equals(pq.read_schema(tmp_path / "c.parquet"))
    assert vars(frame_stats) == vars(column_stats)


def test_weighted_percentiles_are_numpys_of_the_repeated_values_bit_for_bit() -> None:
    """Percentiles of values standing for several copies each equal ``np.percentile`` of the
    values repeated, exactly: continuous, rounded (ties) and integer values, zero weights,
    the 0th and 100th percentiles, one value; and NaN for all when a counted value is NaN."""
    from simulator.metrics.distribution import weighted_percentiles

    rng = np.random.default_rng(7)
    for trial in range(600):
        n = int(rng.integers(1, 40))
        values = rng.random(n) * 10.0 ** int(rng.integers(-4, 3))
        if trial % 3 == 1:
            values = np.round(values, 2)
        elif trial % 3 == 2:
            values = rng.integers(0, 4, n).astype(np.float64)
        weights = rng.integers(0, 4, n)
        weights[rng.integers(n)] += 1
        qs = [0.0, 50.0, 90.0, 99.0, 99.9, 100.0, float(rng.random() * 100)]
        want = np.percentile(np.repeat(values, weights), qs)
        assert np.array_equal(weighted_percentiles(values, weights, qs), want), trial
    values, weights = np.array([1.0, np.nan, 2.0]), np.array([1, 1, 1])
    assert np.isnan(weighted_percentiles(values, weights, [50.0, 99.0])).all()
    weights[1] = 0  # an uncounted NaN counts for nothing
    assert weighted_percentiles(values, weights, [50.0]).tolist() == [1.5]
