"""Speculative decoding and async scheduling in timed runs: against theory, bit-identical
with k = 0, seeded, and bad input refused (docs/scheduler.md, "Speculative decoding")."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.scenario.runner import run

STEP_MS = 10.0

# A constant cost model (every step takes STEP_MS, whatever its tokens) and long outputs:
# the step time is held fixed, so TPOT is the step time over the tokens gained per step.
LONG: dict[str, Any] = {
    "name": "spec-theory",
    "seed": 5,
    "scheduler": {
        "policy": "vllm-v1",
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 64,
        "num_blocks": 20_000,
    },
    "cost_model": {"type": "linear", "base_ms": STEP_MS},
    "workload": {
        "num_requests": 24,
        "arrival": {"process": "poisson", "rate": 200},
        "prompt_len": {"dist": "fixed", "value": 64},
        "output_len": {"dist": "fixed", "value": 4000},
    },
}

BUSY: dict[str, Any] = {
    "name": "spec-busy",
    "seed": 2,
    "scheduler": {
        "policy": "vllm-v1",
        "max_num_batched_tokens": 512,
        "max_num_seqs": 24,
        "num_blocks": 400,
    },
    "cost_model": {"type": "linear", "base_ms": 4, "per_token_ms": 0.03, "per_seq_ms": 0.05},
    "workload": {
        "num_requests": 300,
        "arrival": {"process": "poisson", "rate": 25},
        "prompt_len": {"dist": "uniform", "low": 1, "high": 600},
        "output_len": {"dist": "uniform", "low": 1, "high": 200},
    },
}


def with_spec(base: dict[str, Any], k: int, **acceptance: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    cfg["speculative"] = {"num_speculative_tokens": k, "acceptance": acceptance}
    return cfg


def expected_length(a: float, k: int) -> float:
    """Tokens per sequence per decode step: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    return k + 1.0 if a == 1 else (1 - a ** (k + 1)) / (1 - a)


@pytest.mark.parametrize(("a", "k"), [(0.0, 3), (0.5, 3), (0.8, 3), (0.6, 1), (0.9, 5), (1.0, 2)])
def test_tokens_per_step_and_tpot_follow_the_formula(a: float, k: int) -> None:
    res = run(with_spec(LONG, k, rate=a))
    length = expected_length(a, k)
    assert res.summary["spec_mean_acceptance_length"] == pytest.approx(length, rel=0.01)
    assert res.summary["spec_acceptance_rate"] == pytest.approx((length - 1) / k, abs=0.01)
    # every verify step takes STEP_MS: TPOT = STEP_MS / (tokens per step), to 1%
    tpot = res.requests["tpot_s"].to_numpy()
    assert np.mean(tpot) * 1e3 == pytest.approx(STEP_MS / length, rel=0.01)
    # gained tokens per verify step, counted from the tables: drafts accepted + 1 per verify
    req = res.requests
    assert (req["num_accepted_tokens"] <= req["num_draft_tokens"]).all()
    assert (req["output_len"] == 4000).all() and res.summary["num_finished"] == 24


def test_tpot_falls_with_the_acceptance_rate_as_the_formula_says() -> None:
    plain = run(LONG).summary["tpot_mean_s"]
    assert plain * 1e3 == pytest.approx(STEP_MS, rel=1e-9)
    for a in (0.3, 0.7, 0.95):
        tpot = run(with_spec(LONG, 4, rate=a)).summary["tpot_mean_s"]
        assert plain / tpot == pytest.approx(expected_length(a, 4), rel=0.01)


def test_per_position_rates_are_vllms_at_least_i_accepted() -> None:
    res = run(with_spec(LONG, 3, per_position=[0.8, 0.5, 0.2]))
    assert res.summary["spec_mean_acceptance_length"] == pytest.approx(1 + 1.5, rel=0.01)


@pytest.mark.parametrize("fast", [True, False])
def test_k_zero_is_bit_identical_to_no_speculation(fast: bool) -> None:
    plain = run(BUSY, fast_decode=fast)
    zero = run(with_spec(BUSY, 0, rate=0.7), fast_decode=fast)
    pd.testing.assert_frame_equal(plain.requests, zero.requests, check_exact=True)
    pd.testing.assert_frame_equal(plain.steps, zero.steps, check_exact=True)
    assert plain.summary == pytest.approx(zero.summary, nan_ok=True, rel=0, abs=0)
    assert plain.summary.keys() == zero.summary.keys()
    assert plain.summary["num_preemptions"] > 0  # the run exercises preemption


def test_a_speculative_run_is_seeded_and_busy_runs_stay_exact() -> None:
    cfg = with_spec(BUSY, 3, rate=0.7)
    first, again = run(cfg), run(cfg)
    pd.testing.assert_frame_equal(first.requests, again.requests, check_exact=True)
    pd.testing.assert_frame_equal(first.steps, again.steps, check_exact=True)
    other = run({**cfg, "seed": 3})
    assert not other.requests["num_accepted_tokens"].equals(first.requests["num_accepted_tokens"])
    # the workload's stream is not the acceptance stream: same requests with or without drafts
    plain = run(BUSY)
    assert first.requests["output_len"].equals(plain.requests["output_len"])
    assert first.summary["num_preemptions"] > 0
    assert first.summary["num_finished"] == 300  # each request emitted exactly its output
    # a verify step of d drafts computes 1 + d tokens, and its row counts it as a decode
    steps = first.steps
    assert (steps["num_decode_seqs"] <= steps["num_seqs"]).all()
    assert (steps["num_prefill_tokens"] <= steps["num_tokens"]).all()


def test_the_drafter_costs_k_passes_of_draft_cost() -> None:
    ngram = run(with_spec(LONG, 3, rate=0.6))
    cfg = with_spec(LONG, 3, rate=0.6)
    cfg["speculative"].update(method="mtp", draft_cost=0.1)
    mtp = run(cfg)
    # same draws, and every step with drafts is 3 passes of 0.1 x a 10 ms step longer
    assert (
        mtp.summary["spec_mean_acceptance_length"] == ngram.summary["spec_mean_acceptance_length"]
    )
    ratio = mtp.summary["tpot_mean_s"] / ngram.summary["tpot_mean_s"]
    assert ratio == pytest.approx(1.3, rel=1e-6)


def test_async_scheduling_plans_ahead_and_serves_every_token() -> None:
    cfg = copy.deepcopy(BUSY)
    cfg["scheduler"]["async_scheduling"] = True
    asyn, sync = run(cfg), run(BUSY)
    assert asyn.summary["num_finished"] == sync.summary["num_finished"] == 300
    # an arrival is first planned one step later than in a sync run (the next step was
    # planned before it came): admissions wait longer
    assert asyn.summary["queue_delay_mean_s"] > sync.summary["queue_delay_mean_s"]
    again = run(cfg)
    pd.testing.assert_frame_equal(asyn.requests, again.requests, check_exact=True)
    spec = with_spec(cfg, 2, rate=0.8)
    assert run(spec).summary["spec_mean_acceptance_length"] > 2


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("speculative.num_speculative_tokens=-1", "speculative.num_speculative_tokens"),
        ("speculative.acceptance.rate=1.5", "speculative.acceptance.rate"),
        ("speculative.acceptance.rate=-0.1", "speculative.acceptance.rate"),
        ("speculative.acceptance={per_position: [0.5, 1.2]}", "per_position"),
        ("scheduler.policy=spec", "speculative"),
    ],
)
def test_bad_speculative_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, field: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(with_spec(BUSY, 2, rate=0.5)))
    out = tmp_path / "never"
    assert main(["run", str(path), "--out", str(out), "--no-plots", "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servesim: error:") and field in err
    assert len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("layout", ["server", "async", "dp2"])
def test_each_step_row_counts_the_drafts_it_accepted(layout: str) -> None:
    # the steps table's num_accepted_tokens: per step what the requests table counts per
    # request, so the two sum to the same; a step without drafts accepts none
    cfg = with_spec(BUSY, 3, rate=0.6)
    if layout == "async":
        cfg["scheduler"]["async_scheduling"] = True
    if layout == "dp2":
        cfg["parallel"] = {"data_parallel_size": 2}
    res = run(cfg)
    steps, accepted = res.steps, res.steps["num_accepted_tokens"]
    assert accepted.sum() == res.requests["num_accepted_tokens"].sum() > 0
    assert (accepted[steps["num_decode_seqs"] == 0] == 0).all()
    # at most k accepted per verifying decode of the step
    assert (accepted <= 3 * steps["num_decode_seqs"]).all()
    assert steps["step"].is_monotonic_increasing and steps["start_s"].is_monotonic_increasing
    assert (run(BUSY).steps["num_accepted_tokens"] == 0).all()
