"""The engine's fast path is the plain path, over random whole scenarios: both policies and
their flags, async scheduling, prefix caching on and off (with shared prompts to hit),
priorities, closed loops,
clusters behind routers that read state or not, and prefill/decode disaggregation; the
requests and step tables of a run with ``fast_decode`` equal those without, bit for bit.
(The engine samples no EOS; the schedulers' own property tests cover EOS, and
``test_vllm_v1`` replays the recorded cases through the fast path.)"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator.scenario.runner
from tests.slots import slots_of

ROUTERS = [
    "round_robin",
    "least_outstanding",
    "least_tokens",
    "least_kv",
    "power_of_two",
    "prefix_affinity",
]


@st.composite
def scheduler(draw: st.DrawFn) -> dict[str, Any]:
    """A policy with its flags and budgets (tight KV: preemptions happen)."""
    out: dict[str, Any] = {
        "max_num_batched_tokens": draw(st.sampled_from([32, 64, 256])),
        "max_num_seqs": draw(st.integers(1, 24)),
        "num_blocks": draw(st.integers(40, 160)),
        "block_size": draw(st.sampled_from([4, 16])),
        "enable_prefix_caching": draw(st.booleans()),
    }
    if draw(st.booleans()):
        out["policy"] = "vllm-v1"
        out["reserve_full_isl"] = draw(st.booleans())
        out["long_prefill_token_threshold"] = draw(st.sampled_from([0, 0, 24]))
        out["priority_policy"] = draw(st.sampled_from(["fcfs", "priority"]))
    return out


@st.composite
def whole_scenario(draw: st.DrawFn) -> dict[str, Any]:
    """A small loaded scenario of any shape the engine runs."""
    sched = draw(scheduler())
    cap = sched["num_blocks"] * sched["block_size"] // 2  # every request fits
    workload: dict[str, Any] = {
        "num_requests": draw(st.integers(1, 50)),
        "arrival": {"process": "poisson", "rate": draw(st.sampled_from([2.0, 20.0, 200.0]))},
        "prompt_len": {"dist": "uniform", "low": 1, "high": min(cap, 300)},
        "output_len": {"dist": "uniform", "low": 1, "high": min(cap, 60)},
        "priority": {"values": [0, 1, 2]},
    }
    if draw(st.booleans()):
        workload["shared_prefix"] = {
            "num_prefixes": 2,
            "prefix_len": min(cap // 2, 40),
            "users_per_prefix": 3,
        }
    cfg: dict[str, Any] = {
        "name": "prop",
        "seed": draw(st.integers(0, 2**16)),
        "scheduler": sched,
        "cost_model": {"type": "linear", "base_ms": 2, "per_token_ms": 0.03, "per_seq_ms": 0.1},
        "workload": workload,
    }
    layout = draw(st.sampled_from(["server", "closed", "clients", "cluster", "disaggregated"]))
    if draw(st.booleans()):  # a vLLM stack's overheads: the CPU's share of every step
        cfg["serving"] = {"step_cpu_ms": 2.5, "step_cpu_per_seq_us": 40.0}
        if layout not in ("closed", "clients"):  # delays: open loop only
            cfg["serving"].update(frontend_delay_ms=1.5, response_delay_ms=0.5)
    if layout == "closed":
        workload["max_concurrency"] = draw(st.integers(1, 8))
    elif layout == "clients":  # the cap changes while the windows run
        times = sorted(draw(st.sets(st.floats(0.01, 3.0), min_size=1, max_size=3)))
        caps = [draw(st.integers(0, 8)) for _ in times] + [draw(st.integers(1, 8))]
        workload["max_concurrency_schedule"] = list(zip([0.0, *times], caps, strict=True))
    if layout in ("server", "closed", "clients") and sched.get("policy") == "vllm-v1":
        # vLLM's default: step n + 1 planned before step n is applied (fast_async.py)
        sched["async_scheduling"] = draw(st.booleans())
    if layout == "cluster":
        router = draw(st.sampled_from(ROUTERS))
        cfg["cluster"] = {"replicas": draw(st.integers(1, 3)), "router": router}
    elif layout == "disaggregated":  # decode replicas take KV computed elsewhere: spec only
        sched.update(policy="spec", enable_prefix_caching=False)
        for key in ("reserve_full_isl", "long_prefill_token_threshold", "priority_policy"):
            sched.pop(key, None)
        cfg["cluster"] = {
            "router": draw(st.sampled_from(ROUTERS)),
            "disaggregation": {
                "prefill": {"count": draw(st.integers(1, 2))},
                "decode": {"count": draw(st.integers(1, 2))},
                "kv_transfer": {
                    "bandwidth_gbps": 50,
                    "latency_ms": 0.5,
                    "kv_bytes_per_token": 4096,
                },
            },
        }
    return cfg


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(whole_scenario())
def test_the_fast_path_is_the_plain_path(cfg: dict[str, Any]) -> None:
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    # the ITL mean is a float sum of the gaps, chunked differently by the two paths (every
    # gap is the same: the ITL percentiles are equal); a run whose requests all have one
    # output token has no gap and a NaN ITL on both paths
    fast_itl, slow_itl = fast.summary.pop("itl_mean_s"), slow.summary.pop("itl_mean_s")
    assert fast_itl == pytest.approx(slow_itl, rel=1e-12, nan_ok=True)
    # JSON text compares NaN equal to NaN (a dict compare does not) and everything else exactly
    assert json.dumps(fast.summary, sort_keys=True, default=str) == json.dumps(
        slow.summary, sort_keys=True, default=str
    )
    assert (fast.checksums == slow.checksums).all()


@pytest.mark.parametrize("policy", ["spec", "vllm-v1"])
def test_long_decode_stretches_with_a_prefix_cache(policy: str) -> None:
    """Rare arrivals and long outputs: stretches of many block periods, whose new blocks the
    deferred group hands out a slice per member (``_take_blocks``), and the steps timed in
    long chunks; the tables are those of the plain path, bit for bit."""
    cfg: dict[str, Any] = {
        "name": "long-stretches",
        "seed": 3,
        "scheduler": {
            "policy": policy,
            "max_num_batched_tokens": 256,
            "max_num_seqs": 16,
            "num_blocks": 400,
            "block_size": 4,
            "enable_prefix_caching": True,
        },
        "cost_model": {"type": "linear", "base_ms": 2, "per_token_ms": 0.03, "per_seq_ms": 0.1},
        "workload": {
            "num_requests": 30,
            "arrival": {"process": "poisson", "rate": 2.0},
            "prompt_len": {"dist": "uniform", "low": 1, "high": 120},
            "output_len": {"dist": "uniform", "low": 100, "high": 300},
        },
    }
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    # steps between arrivals: far more than the three block periods past which a stretch's
    # blocks are handed out a slice per member
    gaps = fast.requests["arrival_s"].diff().dropna()
    assert (gaps / fast.steps["duration_s"].max() > 3 * 4).mean() > 0.5


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(
        st.tuples(st.integers(1, 90), st.integers(2, 40), st.integers(0, 38), st.booleans()),
        min_size=1,
        max_size=30,
    ),
    split=st.integers(0, 30),
    steps=st.integers(0, 50),
    with_blocks=st.booleans(),
)
def test_a_group_joined_at_once_is_the_group_joined_one_by_one(
    lengths: list[tuple[int, int, int, bool]], split: int, steps: int, with_blocks: bool
) -> None:
    """``DecodeRun.join_all`` (a new group of every running sequence that sampled) leaves the
    group exactly as ``join`` of each in turn: sums by offset, who finishes when (in running
    order), the heap of finish steps, the members by residue and those with prompt runs."""
    from simulator.scheduling.decode_run import DecodeRun
    from simulator.scheduling.sequence import Sequence

    seqs = []
    for i, (prompt, max_tokens, sampled, shared) in enumerate(lengths):
        seq = Sequence(i, prompt, max_tokens, prompt_runs=((0, prompt),) if shared else None)
        seq.num_tokens = prompt + min(sampled, max_tokens - 1) + 1  # it just sampled
        seq.num_computed = seq.num_tokens - 1
        seqs.append(seq)
    one, many = DecodeRun(16, with_blocks=with_blocks), DecodeRun(16, with_blocks=with_blocks)
    for run in (one, many):
        for seq in seqs[:split]:  # members from before, then the group moves on
            run.join(seq, 16)
        run.steps = steps
    for seq in seqs[split:]:
        one.join(seq, 16)
    many.join_all(seqs[split:], 16)
    for name in slots_of(DecodeRun):
        assert getattr(one, name) == getattr(many, name), name
    assert list(one.finish_at) == list(many.finish_at)  # the same order of finish steps
