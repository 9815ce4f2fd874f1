"""The engine against queueing theory, conservation laws and its own determinism."""

from __future__ import annotations

import copy
import heapq
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simulator
import simulator.scenario.runner
from simulator.engine.recorder import Recorder
from simulator.metrics import REQUEST_COLUMNS, STEP_COLUMNS
from tests.paths import DATA


def scenario(**over: Any) -> dict[str, Any]:
    """A small loaded scenario with chunked prefill; keyword groups replace whole sections."""
    base: dict[str, Any] = {
        "name": "test",
        "seed": 7,
        "scheduler": {
            "max_num_batched_tokens": 256,
            "max_num_seqs": 32,
            "num_blocks": 200,
            "block_size": 16,
        },
        "cost_model": {"type": "linear", "base_ms": 5, "per_token_ms": 0.05, "per_seq_ms": 0.1},
        "workload": {
            "num_requests": 600,
            "arrival": {"process": "poisson", "rate": 8},
            "prompt_len": {"dist": "lognormal", "mu": 5.5, "sigma": 0.8, "max": 1500},
            "output_len": {"dist": "lognormal", "mu": 4.0, "sigma": 0.8, "max": 400},
        },
    }
    out = copy.deepcopy(base)
    out.update(over)
    return out


def test_md1_mean_ttft_matches_pollaczek_khinchine() -> None:
    service_s, rate = 0.010, 60.0  # rho = 0.6
    result = simulator.run(
        scenario(
            scheduler={
                "max_num_batched_tokens": 512,
                "max_num_seqs": 1,
                "num_blocks": 64,
                "block_size": 16,
            },
            cost_model={"type": "linear", "base_ms": service_s * 1e3},
            workload={
                "num_requests": 40_000,
                "arrival": {"process": "poisson", "rate": rate},
                "prompt_len": {"dist": "fixed", "value": 100},
                "output_len": {"dist": "fixed", "value": 1},
            },
        )
    )
    rho = rate * service_s
    wait = rho * service_s / (2 * (1 - rho))  # Pollaczek-Khinchine, deterministic service
    ttft = result.requests["ttft_s"].mean()
    assert ttft == pytest.approx(wait + service_s, rel=0.04)
    # every step serves exactly one request for exactly the service time
    assert (result.steps["num_seqs"] == 1).all()
    assert np.allclose(result.steps["duration_s"], service_s)
    assert result.summary["tpot_mean_s"] != result.summary["tpot_mean_s"]  # NaN: no 2nd token


def test_littles_law_under_chunked_prefill_and_preemption() -> None:
    result = simulator.run(scenario())
    steps, req = result.steps, result.requests
    assert result.summary["num_preemptions"] > 0, "the scenario should preempt"
    assert (steps["num_prefill_tokens"] > 0).any() and (steps["num_decode_seqs"] > 0).any()
    in_system = steps["num_running"] + steps["num_waiting"]
    horizon = result.summary["duration_s"]
    mean_in_system = float((in_system * steps["duration_s"]).sum() / horizon)
    throughput = len(req) / horizon
    assert mean_in_system == pytest.approx(throughput * req["e2e_s"].mean(), rel=0.05)


def test_tables_have_the_documented_columns_and_consistent_times() -> None:
    result = simulator.run(scenario())
    req, steps = result.requests, result.steps
    assert list(req.columns) == REQUEST_COLUMNS
    assert list(steps.columns) == STEP_COLUMNS
    assert (req["arrival_s"] <= req["first_scheduled_s"]).all()
    assert (req["first_scheduled_s"] < req["first_token_s"]).all()
    assert (req["first_token_s"] <= req["finish_s"]).all()
    np.testing.assert_allclose(req["e2e_s"], req["finish_s"] - req["arrival_s"])
    multi = req["output_len"] > 1
    np.testing.assert_allclose(
        req.loc[multi, "tpot_s"],
        (req.loc[multi, "finish_s"] - req.loc[multi, "first_token_s"])
        / (req.loc[multi, "output_len"] - 1),
    )
    assert req.loc[~multi, "tpot_s"].isna().all()
    # steps tile the busy time without overlap
    ends = steps["start_s"] + steps["duration_s"]
    assert (steps["start_s"].iloc[1:].to_numpy() >= ends.iloc[:-1].to_numpy() - 1e-12).all()
    assert steps["num_tokens"].max() <= 256
    assert (steps["blocks_used"] <= 200).all()
    assert steps["kv_utilization"].between(0, 1).all()
    # every token computed is either a prompt token or a generated one, recomputed on preemption
    assert steps["num_tokens"].sum() >= (req["prompt_len"] + req["output_len"] - 1).sum()
    assert req["num_preemptions"].sum() == result.summary["num_preemptions"]
    # summary percentiles come from the table
    assert result.summary["ttft_p50_s"] == pytest.approx(req["ttft_s"].median())


def test_itl_counts_every_gap_and_averages_like_tpot() -> None:
    result = simulator.run(scenario())
    req = result.requests
    gaps = int((req["output_len"] - 1).sum())
    # mean ITL over all gaps = total decode time / total gaps
    total = float((req["finish_s"] - req["first_token_s"]).sum())
    assert result.summary["itl_mean_s"] == pytest.approx(total / gaps)


def test_same_seed_gives_identical_frames_other_seed_differs() -> None:
    a, b = simulator.run(scenario()), simulator.run(scenario())
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.summary == pytest.approx(b.summary, nan_ok=True)
    c = simulator.run(scenario(seed=8))
    assert not a.requests["arrival_s"].equals(c.requests["arrival_s"])


def test_tight_kv_preempts_but_outputs_are_identical_to_ample_kv() -> None:
    tight = simulator.run(scenario())
    sched = dict(scenario()["scheduler"], num_blocks=100_000)
    ample = simulator.run(scenario(scheduler=sched))
    assert tight.summary["num_preemptions"] > 50
    assert ample.summary["num_preemptions"] == 0
    np.testing.assert_array_equal(tight.checksums, ample.checksums)
    assert (tight.checksums != 0).all()
    # preemption only makes things later
    assert tight.requests["e2e_s"].mean() > ample.requests["e2e_s"].mean()


def test_never_fitting_request_is_rejected_and_others_go_on() -> None:
    cfg = scenario(
        scheduler={
            "max_num_batched_tokens": 256,
            "max_num_seqs": 8,
            "num_blocks": 20,
            "block_size": 16,
        },
        workload={
            "num_requests": 200,
            "arrival": {"process": "poisson", "rate": 5},
            "prompt_len": {"dist": "uniform", "low": 10, "high": 400},
            "output_len": {"dist": "fixed", "value": 5},
        },
    )
    result = simulator.run(cfg)
    req = result.requests
    rejected = req["status"] == "rejected"
    too_big = -(-(req["prompt_len"] + req["output_len"] - 1) // 16) > 20
    assert rejected.any()
    pd.testing.assert_series_equal(rejected, too_big, check_names=False)
    assert req.loc[rejected, ["ttft_s", "e2e_s", "finish_s"]].isna().all().all()
    assert req.loc[~rejected, "finish_s"].notna().all()
    assert result.summary["num_rejected"] == int(rejected.sum())
    assert result.summary["num_finished"] == int((~rejected).sum())
    assert list(result.rejected["request_id"]) == list(req.index[rejected])
    assert "cache has 20" in result.rejected["reason"].iloc[0]


def test_idle_server_sleeps_until_the_next_arrival() -> None:
    cfg = scenario(
        cost_model={"type": "linear", "base_ms": 1},
        workload={
            "num_requests": 5,
            "arrival": {"process": "constant", "rate": 0.5},  # one every 2 s
            "prompt_len": {"dist": "fixed", "value": 10},
            "output_len": {"dist": "fixed", "value": 3},
        },
    )
    result = simulator.run(cfg)
    req = result.requests
    # no queueing at all: first scheduled at arrival, 3 steps of 1 ms each
    np.testing.assert_allclose(req["queue_delay_s"], 0.0, atol=1e-12)
    np.testing.assert_allclose(req["e2e_s"], 0.003)
    assert len(result.steps) == 15


def test_slo_goodput_counts_requests_meeting_every_target() -> None:
    cfg = scenario(slo={"ttft_ms": 500, "tpot_ms": 50})
    result = simulator.run(cfg)
    req = result.requests
    ok = (req["ttft_s"] <= 0.5) & ((req["tpot_s"] <= 0.05) | req["tpot_s"].isna())
    assert result.summary["goodput"] == pytest.approx(ok.sum() / result.summary["duration_s"])


# conversations sharing 4 system prompts, with priorities: prefix-cache hits and evictions
SHARED_CHATS = dict(
    scenario()["workload"],
    prompt_len={"dist": "lognormal", "mu": 3.5, "sigma": 0.8, "max": 300},
    shared_prefix={
        "num_prefixes": 4,
        "prefix_len": 200,
        "users_per_prefix": 30,
        "multi_turn": True,
    },
    priority={"values": [0, 1, 2]},
)

VLLM = dict(scenario()["scheduler"], policy="vllm-v1")

# issue 15's benchmark, small: fixed 512-token prompts and 256-token outputs, Llama-3-8B
# roofline on an H100, KV for everybody (no preemption: 256 sequences hold at most 12,288
# blocks). BLIS's 26,312 blocks are 0.1 GB more than an H100 holds beside the weights and the
# activation peak, a deployment servesim refuses (issue 23); 24,000 fit.
BLIS: dict[str, Any] = {
    "scheduler": {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256,
        "num_blocks": 24_000,
        "block_size": 16,
    },
    "cost_model": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"},
    "workload": {
        "num_requests": 400,
        "arrival": {"process": "poisson", "rate": 30},
        "prompt_len": {"dist": "fixed", "value": 512},
        "output_len": {"dist": "fixed", "value": 256},
    },
}


@pytest.mark.parametrize(
    "over",
    [
        {},  # linear, tight KV: preemptions interrupt decode runs
        {"cost_model": {"type": "linear", "base_ms": 1, "per_context_token_ms": 0.001}},
        {  # seed 17: a decode window whose float end one timeout cannot land on exactly
            "seed": 17,
            "cost_model": {"type": "linear", "base_ms": 1, "per_context_token_ms": 0.001},
            "workload": dict(scenario()["workload"], num_requests=150),
        },
        {"cost_model": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"}},
        {"cost_model": {"type": "fitted", "path": "llama-2-70b_h100-sxm_tp8"}},
        {  # round numbers: arrivals land exactly on step boundaries
            "cost_model": {"type": "linear", "base_ms": 5},
            "workload": {
                "num_requests": 300,
                "arrival": {"process": "constant", "rate": 20},
                "prompt_len": {"dist": "uniform", "low": 1, "high": 64},
                "output_len": {"dist": "uniform", "low": 1, "high": 64},
            },
        },
        {  # operator profiles measured on an RTX 4090 (no skew table: sums suffice)
            "cost_model": {
                "type": "profiled",
                "profile": str(DATA / "llmservingsim" / "profiles" / "RTX4090" / "Llama-3.1-8B"),
                "model": "llama-3.1-8b",
                "hardware": "rtx-4090",
            }
        },
        {  # per-step CPU time, overlapped: some steps are CPU-bound, some GPU-bound
            "cost_model": {"type": "linear", "base_ms": 2, "per_token_ms": 0.05},
            "serving": {"step_cpu_ms": 3, "step_cpu_per_seq_us": 40, "async_scheduling": True},
        },
        {  # per-step CPU time in sequence with the GPU's, front-end and response delays
            "serving": {
                "frontend_delay_ms": 7,
                "step_cpu_ms": 1.5,
                "async_scheduling": False,
                "response_delay_ms": 2,
            },
        },
        {"scheduler": VLLM},
        {"scheduler": dict(VLLM, enable_prefix_caching=False)},
        {"scheduler": dict(VLLM, long_prefill_token_threshold=48), "workload": SHARED_CHATS},
        {"scheduler": dict(VLLM, reserve_full_isl=False, enable_prefix_caching=False)},
        {
            "scheduler": BLIS["scheduler"],
            "cost_model": BLIS["cost_model"],
            "workload": BLIS["workload"],
        },
        {"scheduler": dict(VLLM, priority_policy="priority"), "workload": SHARED_CHATS},
        {
            "scheduler": dict(scenario()["scheduler"], enable_prefix_caching=True),
            "workload": SHARED_CHATS,
        },
    ],
    ids=[
        "linear-tight-kv",
        "context-cost",
        "float-landing",
        "roofline",
        "fitted",
        "ties",
        "profiled",
        "cpu-overlapped",
        "cpu-serial",
        "vllm-v1",
        "vllm-v1-no-cache",
        "vllm-v1-threshold-chats",
        "vllm-v1-no-reserve",
        "blis-shaped",
        "vllm-v1-priority-chats",
        "spec-cache-chats",
    ],
)
def test_deferred_decode_windows_change_nothing(over: dict[str, Any]) -> None:
    cfg = scenario(**over)
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    np.testing.assert_array_equal(fast.checksums, slow.checksums)
    decodes_only = (fast.steps["num_decode_seqs"] == fast.steps["num_seqs"]).mean()
    assert decodes_only > 0.3  # the fast path had work to do


@pytest.mark.pure
@pytest.mark.parametrize(
    "sched",
    [
        BLIS["scheduler"],
        dict(BLIS["scheduler"], enable_prefix_caching=True),
        dict(BLIS["scheduler"], policy="vllm-v1"),
        dict(BLIS["scheduler"], policy="vllm-v1", enable_prefix_caching=False),
    ],
    ids=["spec", "spec-cache", "vllm-v1", "vllm-v1-no-cache"],
)
def test_without_preemption_no_step_walks_the_batch(
    sched: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With KV for everybody, every step, arrivals and prefills included, is a fast step or
    part of a stretch of pure decodes: ``schedule()`` (which walks every running sequence)
    never runs, and the tables are those of the plain path."""
    from simulator.scheduling import StepScheduler

    cfg = dict(BLIS, name="t", seed=3, scheduler=sched)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    calls = {"schedule": 0, "fast": 0, "stretch": 0}
    for kind, name in (
        ("schedule", "schedule"),
        ("fast", "fast_step"),
        ("stretch", "take_decodes"),
    ):
        for cls in (StepScheduler,):
            original = getattr(cls, name)

            def counted(self: Any, *a: Any, _f: Any = original, _k: str = kind) -> Any:
                calls[_k] += 1
                return _f(self, *a)

            monkeypatch.setattr(cls, name, counted)
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    assert calls["schedule"] == 0
    # every step that prefills (admissions included) is a fast step, and there are many
    assert calls["fast"] >= (fast.steps["num_prefill_tokens"] > 0).sum() > 200
    if not sched.get("enable_prefix_caching", sched.get("policy") == "vllm-v1"):
        assert calls["stretch"] > 0  # pure decodes in stretches (blocks without identities)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


@pytest.mark.pure
def test_token_counts_are_checked_per_request_and_per_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine keeps no tokens, but two independent counts: each sequence's own (checked
    when it finishes) and the tokens each step reports sampling (checked for the run)."""
    from simulator.scheduling.decode_run import DecodeRun
    from simulator.scheduling.step_scheduler import StepScheduler

    cfg = dict(BLIS, name="t", workload=dict(BLIS["workload"], num_requests=30))
    ok = simulator.scenario.runner.run(cfg)
    assert (ok.checksums != 0).all() and len(set(ok.checksums.tolist())) == 30
    join = DecodeRun.join

    def one_late(self: DecodeRun, seq: Any, block_size: int) -> None:
        join(self, seq, block_size)
        if seq.seq_id == 7:  # a group that lets request 7 decode one step too many
            last = max(t for t, seqs in self.finish_at.items() if seq in seqs)
            self.finish_at[last].remove(seq)
            self.finish_at.setdefault(last + 1, []).append(seq)
            heapq.heappush(self.finish_steps, last + 1)

    monkeypatch.setattr(DecodeRun, "join", one_late)
    with pytest.raises(RuntimeError, match="request 7 finished with 257 tokens, expected 256"):
        simulator.scenario.runner.run(cfg)
    monkeypatch.undo()
    apply = StepScheduler._apply

    def skips_one(self: StepScheduler, plan: Any) -> Any:
        done = apply(self, plan)
        for seq in plan.sampled:  # request 7's first sample counts as two tokens
            if seq.seq_id == 7 and seq.num_output == 1:
                seq.num_tokens += 1
        return done

    monkeypatch.setattr(StepScheduler, "_apply", skips_one)
    with pytest.raises(RuntimeError, match="sampled 7679 tokens, expected 7680"):
        simulator.scenario.runner.run(cfg)


def test_plan_sums_are_those_of_the_whole_batch() -> None:
    """A fast step's sums, from its group's two numbers and its other sequences, are the
    sums of the batch it stands for, whatever the group members' own contexts."""
    from simulator.cost.batch import Batch, StepSums
    from simulator.engine.fast_window import plan_sums
    from simulator.scheduling.interface import StepPlan
    from simulator.scheduling.sequence import Sequence

    rng = np.random.default_rng(0)
    for _ in range(200):
        members = rng.integers(0, 5000, size=rng.integers(0, 30)).tolist()
        others = rng.integers(1, 3, size=rng.integers(0 if members else 1, 6)).tolist()
        new = [int(n) if n == 1 else int(rng.integers(2, 700)) for n in others]
        ctx = rng.integers(0, 3000, size=len(new)).tolist()
        plan = StepPlan([Sequence(i, 5, 5) for i in range(len(new))], new, ctx, 0, [])
        plan.num_deferred, plan.deferred_context = len(members), sum(members)
        batch = Batch([1] * len(members) + new, members + ctx)
        assert plan_sums(plan) == tuple(StepSums.of(batch))


def logging_recorder(logs: list[list[tuple[int, float]]]) -> type[Recorder]:
    """A Recorder that also logs every sampled token as (request, time) into a new list of
    ``logs``: the plain replay the streamed gaps are checked against."""

    class LoggingRecorder(Recorder):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.log: list[tuple[int, float]] = []
            logs.append(self.log)

        def record_samples(self, seqs: list[Any], end: float) -> None:
            self.log.extend((int(s.seq_id), end) for s in seqs)
            super().record_samples(seqs, end)

    return LoggingRecorder


@pytest.mark.pure
@pytest.mark.parametrize("chunk", [1, 7, 1 << 16])
def test_streamed_itl_equals_the_gaps_of_a_token_log(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import simulator.engine.recorder as recorder
    import simulator.engine.simulation as simulation

    cfg = scenario(workload=dict(scenario()["workload"], num_requests=200))
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    logs: list[list[tuple[int, float]]] = []
    monkeypatch.setattr(recorder, "CHUNK_GAPS", chunk)
    monkeypatch.setattr(recorder, "CHUNK_STEPS", chunk)
    monkeypatch.setattr(simulation, "Recorder", logging_recorder(logs))
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    last: dict[int, float] = {}
    gaps = []
    for i, t in logs[0]:
        if i in last:
            gaps.append(t - last[i])
        last[i] = t
    assert len(gaps) == int((slow.requests["output_len"] - 1).sum())
    want = np.percentile(gaps, [50, 90, 99])
    got = [slow.summary[f"itl_p{p}_s"] for p in (50, 90, 99)]
    np.testing.assert_array_equal(got, want)
    assert slow.summary["itl_mean_s"] == pytest.approx(np.mean(gaps), rel=1e-12)
    # the fast path records a whole decode step as one weighted gap: the same distribution,
    # and chunking the step table changes none of its rows
    for key in ("itl_p50_s", "itl_p90_s", "itl_p99_s"):
        assert fast.summary[key] == slow.summary[key]
    assert fast.summary["itl_mean_s"] == pytest.approx(slow.summary["itl_mean_s"], rel=1e-12)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)


def test_rejections_are_warned_about_once(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = scenario(
        scheduler={
            "max_num_batched_tokens": 64,
            "max_num_seqs": 4,
            "num_blocks": 4,
            "block_size": 4,
        },
        workload={
            "num_requests": 30,
            "arrival": {"process": "constant", "rate": 10},
            "prompt_len": {"dist": "uniform", "low": 1, "high": 40},
            "output_len": {"dist": "fixed", "value": 2},
        },
    )
    result = simulator.run(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert result.summary["num_rejected"] > 1
    assert len(err) == 1 and f"{result.summary['num_rejected']} request(s) rejected" in err[0]


def test_the_inlined_samplers_give_token_for() -> None:
    from simulator.engine.tokens import sample as _sample
    from simulator.engine.tokens import sample_many as _sample_many
    from simulator.engine.tokens import token_for
    from simulator.scheduling.sequence import Sequence

    for rid in (0, 1, 4_321, 10**6):
        seq = Sequence(rid, 3, 100)
        seq.output = [7] * 5
        assert _sample(seq) == token_for(rid, 5)
        assert _sample_many(seq, 9) == [token_for(rid, p) for p in range(5, 14)]
        assert _sample_many(seq, 0) == []


def test_prefix_cache_serves_shared_prompts_and_cuts_ttft() -> None:
    sched = dict(VLLM, num_blocks=400)
    shared = dict(SHARED_CHATS, shared_prefix=dict(SHARED_CHATS["shared_prefix"], multi_turn=False))
    on = simulator.run(scenario(scheduler=sched, workload=shared))
    no_cache = dict(sched, enable_prefix_caching=False)
    off = simulator.run(scenario(scheduler=no_cache, workload=shared))
    req = on.requests
    # a hit is whole blocks, leaves the last prompt token, and is 0 without the cache
    assert ((req["num_cached_tokens"] % 16) == 0).all()
    assert (req["num_cached_tokens"] <= req["prompt_len"] - 1).all()
    assert (off.requests["num_cached_tokens"] == 0).all()
    assert off.summary["prefix_cache_hit_rate"] == 0
    rate = req["num_cached_tokens"].sum() / req["prompt_len"].sum()
    assert on.summary["prefix_cache_hit_rate"] == pytest.approx(rate)
    assert rate > 0.5  # 200 of ~240 prompt tokens are one of 4 system prompts
    assert on.summary["ttft_mean_s"] < off.summary["ttft_mean_s"]
    assert (on.steps["num_cached_blocks"] > 0).any() and (off.steps["num_cached_blocks"] == 0).all()
    # same outputs, whatever the cache did
    np.testing.assert_array_equal(on.checksums, off.checksums)
