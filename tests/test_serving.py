"""Serving overheads (scenario ``serving:``): the front end's delay before the engine queue,
the CPU's per-step time overlapped with the GPU's or not, and the response delay, each moving
exactly the timestamps docs/metrics.md says it moves."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simulator

ONE_REQUEST: dict[str, Any] = {
    "name": "serving",
    "scheduler": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "num_blocks": 64},
    # a prefill of 40 tokens takes 5 + 40 * 0.1 = 9 ms, a decode 5.1 ms
    "cost_model": {"type": "linear", "base_ms": 5, "per_token_ms": 0.1},
    "workload": {
        "num_requests": 1,
        "arrival": {"process": "constant", "rate": 1},
        "prompt_len": {"dist": "fixed", "value": 40},
        "output_len": {"dist": "fixed", "value": 3},
    },
}


def run(**serving: Any) -> pd.DataFrame:
    cfg = copy.deepcopy(ONE_REQUEST)
    cfg["serving"] = serving
    return simulator.run(cfg).requests


def test_defaults_are_the_engine_alone() -> None:
    plain = simulator.run(copy.deepcopy(ONE_REQUEST)).requests
    zeros = run(frontend_delay_ms=0, step_cpu_ms=0, response_delay_ms=0)
    pd.testing.assert_frame_equal(plain, zeros, check_exact=True)
    row = plain.iloc[0]
    assert row.queued_s == row.arrival_s == 0.0 and row.response_s == row.finish_s
    assert row.ttft_s == pytest.approx(0.009) and row.e2e_s == pytest.approx(0.009 + 2 * 0.0051)


def test_frontend_delay_moves_the_engine_queue_and_counts_in_ttft_and_e2e() -> None:
    base, late = run().iloc[0], run(frontend_delay_ms=12).iloc[0]
    assert late.queued_s == pytest.approx(0.012) and late.arrival_s == 0.0
    for col in ("first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "e2e_s"):
        assert late[col] == pytest.approx(base[col] + 0.012, abs=1e-12), col
    assert late.tpot_s == pytest.approx(base.tpot_s, abs=1e-12)


def test_response_delay_counts_in_ttft_and_e2e_not_tpot() -> None:
    base, slow = run().iloc[0], run(response_delay_ms=3).iloc[0]
    assert slow.finish_s == base.finish_s and slow.first_token_s == base.first_token_s
    assert slow.response_s == pytest.approx(slow.finish_s + 0.003, abs=1e-12)
    assert slow.ttft_s == pytest.approx(base.ttft_s + 0.003, abs=1e-12)
    assert slow.e2e_s == pytest.approx(base.e2e_s + 0.003, abs=1e-12)
    assert slow.tpot_s == base.tpot_s


@pytest.mark.parametrize(
    ("cpu_ms", "overlap", "want_ms"),
    [
        (2.0, True, [9.0, 5.1, 5.1]),  # the GPU's time hides the CPU's
        (7.0, True, [9.0, 7.0, 7.0]),  # CPU-bound decodes
        (2.0, False, [11.0, 7.1, 7.1]),  # without async scheduling, one after the other
    ],
)
def test_step_cpu_time_overlapped_or_in_sequence(
    cpu_ms: float, overlap: bool, want_ms: list[float]
) -> None:
    cfg = copy.deepcopy(ONE_REQUEST)
    cfg["serving"] = {"step_cpu_ms": cpu_ms, "async_scheduling": overlap}
    steps = simulator.run(cfg).steps
    np.testing.assert_allclose(steps["duration_s"] * 1e3, want_ms, rtol=1e-12)


def test_per_sequence_cpu_time_grows_with_the_batch() -> None:
    cfg = copy.deepcopy(ONE_REQUEST)
    cfg["workload"]["num_requests"] = 4
    cfg["workload"]["arrival"] = {"process": "constant", "rate": 1e9}  # all at once
    cfg["serving"] = {"step_cpu_per_seq_us": 1000, "async_scheduling": False}
    steps = simulator.run(cfg).steps
    plain = simulator.run(ONE_REQUEST | {"workload": cfg["workload"]}).steps
    extra = (steps["duration_s"] - plain["duration_s"]).to_numpy()
    np.testing.assert_allclose(extra, steps["num_seqs"].to_numpy() * 1e-3, rtol=1e-9)


def test_delays_with_a_closed_loop_are_refused_in_one_line() -> None:
    from simulator.errors import InputError
    from simulator.scenario.config import validate

    cfg = copy.deepcopy(ONE_REQUEST)
    cfg["workload"]["max_concurrency"] = 2
    cfg["serving"] = {"frontend_delay_ms": 5}
    with pytest.raises(InputError, match="not supported with workload.max_concurrency") as exc:
        validate(cfg, "s.yaml")
    assert "\n" not in str(exc.value)
    cfg["serving"] = {"step_cpu_ms": 1}  # per-step CPU time is the engine's own: fine
    validate(cfg, "s.yaml")


@pytest.mark.parametrize("overlap", [True, False])
def test_step_cpu_time_from_sums_equals_step_time(overlap: bool) -> None:
    """With per-step CPU time the engine still times its fast steps from their sums, to the
    bit what ``step_time`` of their batch gives."""
    from simulator.cost import build_cost_model
    from simulator.cost.batch import Batch, StepSums
    from simulator.engine.serving import ServingConfig, StepWithCpu
    from simulator.scenario.config import validate

    cfg = validate(
        dict(
            ONE_REQUEST,
            cost_model={"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"},
        ),
        "t",
    )
    model = StepWithCpu(
        build_cost_model(cfg.cost_model),
        ServingConfig(step_cpu_ms=4, step_cpu_per_seq_us=30, async_scheduling=overlap),
    )
    assert model.times_from_sums
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = rng.integers(1, 80)
        new = np.where(rng.random(n) < 0.8, 1, rng.integers(2, 900, n)).tolist()
        batch = Batch(new, rng.integers(0, 8000, n).tolist())
        assert model.time_sums(StepSums.of(batch)) == model.step_time(batch)


def _two_requests(async_scheduling: bool) -> pd.DataFrame:
    """A second request arriving 2 ms into the first one's 9 ms prefill step."""
    cfg = copy.deepcopy(ONE_REQUEST)
    cfg["scheduler"].update(policy="vllm-v1", async_scheduling=async_scheduling)
    cfg["workload"] = {
        "num_requests": 2,
        "arrival": {"process": "constant", "rate": 500},
        "prompt_len": {"dist": "fixed", "value": 40},
        "output_len": {"dist": "fixed", "value": 3},
    }
    return simulator.run(cfg).requests.sort_values("request_id")


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_engine_loop_takes_a_request_in_as_the_step_in_flight_ends(
    async_scheduling: bool,
) -> None:
    """vLLM stamps QUEUED where its engine loop drains the input queue, between steps: with
    async scheduling (which plans the step after the one in flight already), a request sent
    during step N is queued as step N ends and first scheduled in step N + 2; a plain
    server's stamp stays the arrival (as a cluster's)."""
    first, second = (row for _, row in _two_requests(async_scheduling).iterrows())
    assert second.arrival_s == pytest.approx(0.002)
    step_end = first.first_token_s  # the first request's prefill step (9 ms)
    if async_scheduling:
        assert second.queued_s == pytest.approx(step_end, abs=1e-12)
        assert second.first_scheduled_s > step_end + 1e-9  # N + 1 was planned already
    else:
        assert second.queued_s == second.arrival_s
        assert second.first_scheduled_s == pytest.approx(step_end, abs=1e-12)
