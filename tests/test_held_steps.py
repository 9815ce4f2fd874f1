"""Decode steps held ahead behind routers that read state (``FastWindow.hold``): a replica
times its decode stretch beyond the next routing instants and takes the steps only when a
request is handed to it or they end, while routers read it as a step-by-step run shows it.
The tables must be the plain path's, bit for bit, and holds must really be cut and ended."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

import simulator.scenario.runner
from simulator.engine.fast_window import FastWindow

STATE_ROUTERS = ["least_outstanding", "least_tokens", "least_kv", "power_of_two", "prefix_affinity"]


def scenario(router: str, policy: str) -> dict[str, Any]:
    """Four replicas at about 60% load, outputs long enough for stretches between arrivals."""
    return {
        "name": "held",
        "seed": 11,
        "scheduler": {
            "policy": policy,
            "max_num_batched_tokens": 512,
            "max_num_seqs": 32,
            "num_blocks": 600,
            "block_size": 16,
        },
        "cost_model": {"type": "linear", "base_ms": 4, "per_token_ms": 0.02, "per_seq_ms": 0.05},
        "workload": {
            "num_requests": 600,
            "arrival": {"process": "poisson", "rate": 60},
            "prompt_len": {"dist": "lognormal", "mu": 5.0, "sigma": 0.8, "max": 1500},
            "output_len": {"dist": "lognormal", "mu": 4.0, "sigma": 0.8, "max": 400},
        },
        "cluster": {"replicas": 4, "router": router},
    }


@pytest.mark.pure
@pytest.mark.parametrize("policy", ["spec", "vllm-v1"])
@pytest.mark.parametrize("router", STATE_ROUTERS)
def test_held_steps_give_the_plain_paths_tables(
    router: str, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    takes = {True: 0, False: 0}  # holds cut by a request, holds that ran to their end
    take_held = FastWindow.take_held

    def counting(self: FastWindow, held: Any, k: int, in_flight: bool) -> Any:
        takes[in_flight] += 1
        return take_held(self, held, k, in_flight)

    monkeypatch.setattr(FastWindow, "take_held", counting)
    cfg = scenario(router, policy)
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    assert takes[True] > 50 and takes[False] > 50, takes
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    # the ITL mean is a float sum of chunks of gaps, which the paths pass on at other times
    fast_itl, slow_itl = fast.summary.pop("itl_mean_s"), slow.summary.pop("itl_mean_s")
    assert fast_itl == pytest.approx(slow_itl, rel=1e-12)
    assert json.dumps(fast.summary, sort_keys=True, default=str) == json.dumps(
        slow.summary, sort_keys=True, default=str
    )


def test_nothing_is_held_behind_a_router_that_reads_no_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held: list[int] = []
    hold = FastWindow.hold

    def watching(self: FastWindow, horizon: float) -> Any:
        held.append(1)
        return hold(self, horizon)

    monkeypatch.setattr(FastWindow, "hold", watching)
    simulator.scenario.runner.run(scenario("round_robin", "spec"), fast_decode=True)
    assert not held
