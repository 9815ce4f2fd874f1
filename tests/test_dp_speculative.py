"""Speculative decoding on data-parallel ranks (``parallel:`` + ``speculative:``): each rank
verifies its drafts as a single server does, from its own seeded acceptance stream, with its
drafter's passes in its step; against theory, bit-identical with k = 0, seeded."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simulator.scenario.config import validate
from simulator.scenario.parallel import build_dp_simulation, rank_acceptance_rngs
from simulator.scenario.runner import acceptance_rng, build, resolve, run
from tests.test_speculative import BUSY, LONG, STEP_MS, expected_length, with_spec


def with_dp(base: dict[str, Any], dp: int) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    cfg["parallel"] = {"data_parallel_size": dp}
    return cfg


def _frames_equal(a: Any, b: Any) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)


def test_data_parallel_size_one_with_speculation_is_the_single_server() -> None:
    spec = with_spec(BUSY, 3, rate=0.7)
    _frames_equal(run(spec), run(with_dp(spec, 1)))


def test_one_lockstep_rank_applies_speculative_plans_as_the_single_server() -> None:
    # the lockstep engine itself, with one rank: same steps, tokens and accepted drafts as a
    # single server. (With the CPU's step work overlapped, serving.async_scheduling, a rank's
    # engine loop takes in a request arriving during step N after planning step N + 1, which
    # a single server does not model; without it the two take requests in alike.)
    spec = with_spec(BUSY, 3, rate=0.7)
    spec["speculative"].update(method="mtp", draft_cost=0.2)
    spec["serving"] = {"async_scheduling": False}
    single = run(spec)
    cfg = resolve(with_dp(spec, 1))
    workload, _ = build(cfg)
    lockstep = build_dp_simulation(cfg, workload, None).run()
    pd.testing.assert_frame_equal(single.steps, lockstep.steps, check_exact=True)
    # every column but the QUEUED stamp (the end of the step a request arrived in, on a rank)
    mine = [c for c in single.requests.columns if c not in ("queued_s", "queue_delay_s")]
    pd.testing.assert_frame_equal(single.requests[mine], lockstep.requests[mine], check_exact=True)
    assert single.summary["spec_mean_acceptance_length"] > 1.5
    for key in ("spec_acceptance_rate", "spec_mean_acceptance_length", "tpot_p99_s"):
        assert single.summary[key] == lockstep.summary[key]


@pytest.mark.parametrize(("a", "k"), [(0.7, 3), (0.5, 2)])
def test_two_ranks_gain_the_formulas_tokens_per_decode_step(a: float, k: int) -> None:
    res = run(with_dp(with_spec(LONG, k, rate=a), 2))
    length = expected_length(a, k)
    assert res.summary["spec_mean_acceptance_length"] == pytest.approx(length, rel=0.01)
    assert res.summary["spec_acceptance_rate"] == pytest.approx((length - 1) / k, abs=0.01)
    # every lockstep step takes STEP_MS (the constant cost model; an idle rank's dummy step
    # too): TPOT is the step over the tokens a sequence gains per step
    assert np.mean(res.requests["tpot_s"]) * 1e3 == pytest.approx(STEP_MS / length, rel=0.01)
    req = res.requests
    assert (req["num_accepted_tokens"] <= req["num_draft_tokens"]).all()
    assert res.summary["num_finished"] == 24


def test_k_zero_on_two_ranks_is_bit_identical_to_no_speculation() -> None:
    plain = run(with_dp(BUSY, 2))
    zero = run(with_dp(with_spec(BUSY, 0, rate=0.7), 2))
    _frames_equal(plain, zero)
    assert plain.summary.keys() == zero.summary.keys()
    assert plain.summary == pytest.approx(zero.summary, nan_ok=True, rel=0, abs=0)


def test_two_ranks_with_speculation_are_seeded_and_serve_every_token() -> None:
    cfg = with_dp(with_spec(BUSY, 3, rate=0.7), 2)
    cfg["scheduler"]["num_blocks"] = 150  # per rank: tight enough to preempt
    first, again = run(cfg), run(cfg)
    _frames_equal(first, again)
    other = run({**cfg, "seed": 3})
    assert not other.requests["num_accepted_tokens"].equals(first.requests["num_accepted_tokens"])
    assert first.summary["num_finished"] == 300
    assert first.summary["num_preemptions"] > 0  # the run exercises preemption
    # a verify step's row counts its decodes' 1 + d tokens as decode tokens
    steps = first.steps
    assert (steps["num_decode_seqs"] <= steps["num_seqs"]).all()
    assert (steps["num_prefill_tokens"] <= steps["num_tokens"]).all()
    plain = {**with_dp(BUSY, 2), "scheduler": cfg["scheduler"]}
    assert int(steps["num_tokens"].sum()) > int(run(plain).steps["num_tokens"].sum())


def test_each_rank_draws_from_its_own_stream_of_the_runs_seed() -> None:
    cfg = validate(with_dp(with_spec(BUSY, 2, rate=0.5), 4), "t")
    draws = [g.random(8) for g in rank_acceptance_rngs(cfg, 4)]  # type: ignore[union-attr]
    single = acceptance_rng(cfg)
    assert single is not None
    assert draws[0] == pytest.approx(single.random(8), rel=0, abs=0)  # rank 0: the run's
    assert len({tuple(d) for d in draws}) == 4  # the others: their own
    again = [g.random(8) for g in rank_acceptance_rngs(cfg, 4)]  # type: ignore[union-attr]
    assert all((a == b).all() for a, b in zip(draws, again, strict=True))
    assert rank_acceptance_rngs(validate(with_dp(BUSY, 2), "t"), 2) == [None, None]


def test_each_ranks_drafter_is_part_of_its_step() -> None:
    ngram = run(with_dp(with_spec(LONG, 3, rate=0.6), 2))
    cfg = with_dp(with_spec(LONG, 3, rate=0.6), 2)
    cfg["speculative"].update(method="mtp", draft_cost=0.1)
    mtp = run(cfg)
    # a rank that samples adds 3 passes of 0.1 x its 10 ms step, and the lockstep step lasts
    # as long as that rank's: 13 ms, or 10 ms when no rank samples
    durations = mtp.steps["duration_s"].round(12).value_counts()
    assert set(durations.index) <= {0.010, 0.013} and durations[0.013] > 0.99 * len(mtp.steps)
    # the same acceptance model (the draws go to other requests: the balancer sees other
    # queues when steps are longer), so TPOT grows by the drafter's 30%
    key = "spec_mean_acceptance_length"
    assert mtp.summary[key] == pytest.approx(ngram.summary[key], rel=0.01)
    ratio = mtp.summary["tpot_mean_s"] / ngram.summary["tpot_mean_s"]
    assert ratio == pytest.approx(1.3, rel=0.01)


def test_async_scheduling_ranks_verify_drafts_and_serve_every_token() -> None:
    cfg = with_dp(with_spec(BUSY, 2, rate=0.8), 2)
    cfg["scheduler"]["async_scheduling"] = True
    res = run(cfg)
    assert res.summary["num_finished"] == 300
    assert res.summary["spec_mean_acceptance_length"] == pytest.approx(
        expected_length(0.8, 2), rel=0.05
    )
    pd.testing.assert_frame_equal(res.requests, run(cfg).requests, check_exact=True)


def test_speculation_in_a_cluster_is_still_refused_in_one_line() -> None:
    from simulator.errors import InputError

    cfg = with_spec(BUSY, 2, rate=0.5)
    cfg["cluster"] = {"replicas": 2}
    with pytest.raises(InputError, match="speculative: not supported with cluster") as err:
        validate(cfg, "s.yaml")
    assert len(str(err.value).splitlines()) == 1


def test_ranks_with_a_cache_one_request_fills_serve_every_request_that_fits() -> None:
    # found by random scenarios: a request with all but its last token cached was padded to
    # 1 + k rows past the 60-token cache; the rank stopped with "empty step with work
    # pending". Drafts now stop at the cache (vLLM's stop at max_model_len)
    cfg = {
        "name": "tight",
        "seed": 970507,
        "scheduler": {"policy": "vllm-v1", "max_num_batched_tokens": 64, "max_num_seqs": 4,
                      "num_blocks": 60, "block_size": 1, "enable_prefix_caching": True},
        "cost_model": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"},
        "workload": {
            "num_requests": 218,
            "arrival": {"process": "constant", "rate": 50.0},
            "prompt_len": {"dist": "uniform", "low": 1, "high": 300},
            "output_len": {"dist": "lognormal", "mu": 3.0, "sigma": 1.0, "min": 1, "max": 500},
        },
        "parallel": {"data_parallel_size": 2},
        "speculative": {"num_speculative_tokens": 1, "acceptance": {"rate": 0.7}},
    }  # fmt: skip
    result = run(cfg)
    fits = result.requests["status"] == "finished"
    assert fits.sum() == 26 and (result.requests.loc[~fits, "status"] == "rejected").all()
