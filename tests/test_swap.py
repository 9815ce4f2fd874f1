"""Swap preemption (``scheduler.preemption_mode: swap``, docs/swap.md): outputs identical token
by token to a run that never preempts (the spec's I4), each victim's KV copied out and back
once (twice its bytes), the fallback to recompute when the swap space is full, the copies
timed on their steps, and a swap space larger than the host's memory refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from simulator.cli import main
from simulator.explore.swap_crossover import analytic_gains, crossover, simulated_gain
from simulator.scenario.runner import run
from simulator.scheduling import Sequence, StepScheduler
from tests.scheduler_helpers import base_sampler, step

BLOCK_BYTES = 1000  # bytes of one block's KV (any figure: the scheduler counts in blocks)


def _requests(seed: int, n: int = 24) -> list[tuple[int, int]]:
    """``(prompt, output)`` lengths of ``n`` requests, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(1, 60)), int(rng.integers(1, 40))) for _ in range(n)]


def _drive(
    policy: str, num_blocks: int, reqs: list[tuple[int, int]], swap_blocks: int | None
) -> tuple[dict[int, list[int]], StepScheduler, int]:
    """Run ``reqs`` (all queued at once) to completion, checking the spec's invariants at
    every step: each request's output, the scheduler, and the bytes swapped out."""
    bases = {i: 1000 * i for i in range(len(reqs))}
    make = StepScheduler.vllm_v1 if policy == "vllm-v1" else StepScheduler
    sched = make(num_blocks, 4, 8, 64, base_sampler(bases))
    if swap_blocks is not None:
        sched.enable_swap(swap_blocks, BLOCK_BYTES, 1e9)
    seqs = [Sequence(i, p, o) for i, (p, o) in enumerate(reqs)]
    for s in seqs:
        sched.add(s)
    moved = 0
    while sched.has_work():
        step(sched, seqs)
        moved += sched.take_swapped()[0]
    return {s.seq_id: s.output for s in seqs}, sched, moved


@pytest.mark.parametrize("policy", ["spec", "vllm-v1"])
@pytest.mark.parametrize("seed", range(6))
def test_swapped_outputs_are_those_of_a_run_without_preemption(policy: str, seed: int) -> None:
    reqs = _requests(seed)
    ample, sched_ample, _ = _drive(policy, 10_000, reqs, None)
    assert sched_ample.num_preemptions == 0
    tight, sched, _ = _drive(policy, 30, reqs, 10_000)
    assert sched.num_preemptions > 0 and sched.swap is not None
    assert sched.swap.num_fallbacks == 0
    assert tight == ample


@pytest.mark.parametrize("policy", ["spec", "vllm-v1"])
def test_each_victims_kv_is_copied_out_and_back_once(policy: str) -> None:
    reqs = _requests(7, 40)
    bases = {i: 1000 * i for i in range(len(reqs))}
    make = StepScheduler.vllm_v1 if policy == "vllm-v1" else StepScheduler
    sched = make(30, 4, 8, 64, base_sampler(bases))
    sched.enable_swap(10_000, BLOCK_BYTES, 1e9)
    seqs = [Sequence(i, p, o) for i, (p, o) in enumerate(reqs)]
    for s in seqs:
        sched.add(s)
    victim_bytes = out = back = 0
    while sched.has_work():
        computed = {s: s.num_computed for s in sched.running}
        plan = sched.schedule()
        # a victim's KV: the blocks of the tokens it had computed when it was preempted
        victim_bytes += sum(sched.blocks_for(computed[v]) for v in plan.preempted) * BLOCK_BYTES
        o, b = sched.take_swapped()
        out, back = out + o, back + b
        sched.update()
    assert sched.num_preemptions > 3 and victim_bytes > 0
    assert out == back == victim_bytes
    assert out + back == 2 * victim_bytes


def test_a_full_swap_space_recomputes_and_outputs_stay_the_same() -> None:
    reqs = _requests(3)
    ample, _, _ = _drive("vllm-v1", 10_000, reqs, None)
    none, sched, moved = _drive("vllm-v1", 30, reqs, 0)  # no CPU block at all
    assert sched.swap is not None and sched.num_preemptions > 0
    assert sched.swap.num_fallbacks == sched.num_preemptions and moved == 0
    assert none == ample
    # room for a few victims only: some swap, the others recompute
    some, sched, moved = _drive("vllm-v1", 30, reqs, 6)
    assert 0 < sched.swap.num_fallbacks < sched.num_preemptions and moved > 0
    assert some == ample


def _scenario(mode: str, **sched: Any) -> dict[str, Any]:
    return {
        "name": f"swap-{mode}",
        "seed": 3,
        "scheduler": {
            "policy": "vllm-v1",
            "num_blocks": 400,
            "max_num_batched_tokens": 2048,
            "max_num_seqs": 64,
            "preemption_mode": mode,
            **sched,
        },
        "cost_model": {"type": "roofline", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "workload": {
            "num_requests": 120,
            "arrival": {"process": "poisson", "rate": 40},
            "prompt_len": {"dist": "uniform", "low": 200, "high": 1200},
            "output_len": {"dist": "uniform", "low": 50, "high": 300},
        },
    }


def test_a_run_prices_its_copies_on_their_steps_and_reports_their_bytes() -> None:
    swap = run(_scenario("swap"))
    rec = run(_scenario("recompute"))
    steps, s = swap.steps, swap.summary
    assert s["num_preemptions"] > 0 and rec.summary["swap_out_bytes"] == 0
    assert s["swap_out_bytes"] == int(steps["swap_out_bytes"].sum()) > 0
    assert s["swap_in_bytes"] == s["swap_out_bytes"]  # every victim came back
    # the scenario resolved its link from the preset: H100 SXM, PCIe Gen5 x16, 63.0 GB/s
    link = swap.scenario.scheduler.host_link_gb_s * 1e9
    assert link == pytest.approx(32e9 * 128 / 130 / 8 * 16)
    per_token = swap.scenario.scheduler.swap_kv_bytes_per_token
    assert per_token == 32 * 8 * 128 * 2 * 2  # Llama 3.1 8B: layers x KV heads x dim x K,V x bf16
    # a step that copies takes its compute plus bytes / link: the same plan without copies
    # (recompute's steps with the same tokens) would take its compute only
    copying = steps[(steps["swap_out_bytes"] + steps["swap_in_bytes"]) > 0]
    assert len(copying) > 0
    assert (
        copying["duration_s"] > (copying["swap_out_bytes"] + copying["swap_in_bytes"]) / link
    ).all()
    assert (swap.requests["output_len"].to_numpy() == rec.requests["output_len"].to_numpy()).all()


def test_the_fast_path_declines_swap_and_results_match_the_plain_path() -> None:
    fast = run(_scenario("swap"), fast_decode=True)
    plain = run(_scenario("swap"), fast_decode=False)
    assert fast.summary["swap_out_bytes"] > 0
    assert fast.steps.equals(plain.steps) and fast.requests.equals(plain.requests)


def test_recompute_is_the_default_and_swap_is_refused_where_not_simulated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _scenario("recompute")
    del cfg["scheduler"]["preemption_mode"]
    assert run(cfg).scenario.scheduler.preemption_mode == "recompute"
    bad = copy.deepcopy(_scenario("swap"))
    bad["scheduler"]["async_scheduling"] = True
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "preemption_mode" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        # a DGX H100 has 256 GB of host memory per GPU: 300 GiB of swap per GPU cannot be
        (["scheduler.swap_space_gb=300"], "scheduler.swap_space_gb"),
        (["scheduler.swap_space_gb=-1"], "swap_space_gb"),
    ],
)
def test_a_swap_space_that_cannot_be_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], field: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_scenario("swap")))
    out = tmp_path / "never"
    args = [a for s in sets for a in ("--set", s)]
    assert main(["run", str(path), "--out", str(out), "--no-plots", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    assert not out.exists()
    # 200 GiB per GPU fits in 256 GB
    path.write_text(yaml.safe_dump(_scenario("swap", swap_space_gb=200)))
    assert main(["validate", str(path)]) == 0


@pytest.mark.parametrize("link_gb_s", [15.75, 63.0])
def test_the_simulated_crossover_is_within_5_percent_of_the_analytic_one(link_gb_s: float) -> None:
    kw = {"model": "llama-3.1-8b", "hardware": "h100-sxm"}
    gain, naive = analytic_gains(link_gb_s, **kw)
    analytic = crossover(gain)
    simulated = crossover(lambda p: simulated_gain(p, link_gb_s, **kw))
    assert analytic is not None and simulated is not None
    assert abs(simulated / analytic - 1) <= 0.05
    # recompute wins below it, swap from it on (the two runs' durations)
    assert simulated_gain(max(16, simulated // 2 // 16 * 16), link_gb_s, **kw) < 0
    assert simulated_gain(simulated * 2, link_gb_s, **kw) > 0
    # the prefill time alone would say swap wins from the shortest prompt
    assert crossover(naive) == 16


def test_on_a_link_slower_than_the_prefill_swapping_never_pays() -> None:
    kw = {"model": "llama-3.1-8b", "hardware": "h100-sxm"}
    assert crossover(lambda p: simulated_gain(p, 8.0, **kw)) is None
    assert crossover(analytic_gains(8.0, **kw)[0]) is None
