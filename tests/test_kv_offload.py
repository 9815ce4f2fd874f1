"""KV offload tiers below GPU KV (docs/kv-offload.md): the LRU tier as vLLM's
``LRUOffloadingManager`` keeps it, the scheduler's asynchronous load before a request is
scheduled, the bytes moved, the hit rate per tier, and ``multi-turn-offload.yaml``: a CPU
tier beats no offload, the shared tier beats the CPU tier, a zero-size tier changes nothing."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.cluster.router import Request
from simulator.cluster.routers import PrefixAffinity
from simulator.engine.result import SimulationResult
from simulator.scenario.runner import run
from simulator.scheduling import Sequence, StepScheduler
from simulator.scheduling.kv_tier import KVTier
from tests.paths import ROOT
from tests.test_cluster import _replicas

SCENARIO = ROOT / "scenarios" / "multi-turn-offload.yaml"
BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # Llama-3-8B: K and V, 32 layers, 8 KV heads of 128, bf16


def scenario(num_requests: int = 700, **over: Any) -> dict[str, Any]:
    """``multi-turn-offload.yaml`` shortened; ``cpu``/``shared`` None drop a tier."""
    cfg = yaml.safe_load(SCENARIO.read_text())
    cfg["workload"]["num_requests"] = num_requests
    if "cpu" in over:
        cpu = over.pop("cpu")
        if cpu is None:
            del cfg["scheduler"]["kv_offload"]
        else:
            cfg["scheduler"]["kv_offload"]["cpu"].update(cpu)
    if "shared" in over:
        shared = over.pop("shared")
        if shared is None:
            del cfg["cluster"]["shared_kv"]
        else:
            cfg["cluster"]["shared_kv"].update(shared)
    if over.pop("single", False):
        del cfg["cluster"]
    assert not over
    return cfg


# -- the tier ----------------------------------------------------------------------------------


def test_a_tier_hits_the_leading_blocks_and_evicts_the_least_recently_used() -> None:
    tier = KVTier("cpu", 4)
    assert tier.store([1, 2, 3]) == 3
    assert tier.store([2, 3, 4]) == 1  # those it holds are skipped
    assert tier.lookup([1, 2, 9, 4]) == 2  # the first miss ends the hit
    tier.touch([1, 2])  # 1 is now the most recently used, then 2; 3 the least
    assert tier.store([5]) == 1
    assert 3 not in tier and {1, 2, 4, 5} == {h for h in (1, 2, 4, 5) if h in tier}
    assert tier.num_evicted == 1 and len(tier) == 4
    assert tier.store([6, 7, 8, 9, 10]) == 0  # more than it can ever hold: none
    assert KVTier("cpu", 0).store([1]) == 0
    with pytest.raises(ValueError, match="capacity"):
        KVTier("cpu", -1)


def test_a_prefix_evicted_from_gpu_is_loaded_from_the_cpu_tier_before_it_is_scheduled() -> None:
    sched = StepScheduler.vllm_v1(8, 4, 4, 64)  # 8 blocks of 4 tokens
    sched.attach_tier(KVTier("cpu", 100), 1000, 1e6, 0.0)
    runs = ((7, 20),)  # a prompt of 20 tokens another request repeats
    first = Sequence(0, 20, 1, prompt_runs=runs)
    sched.add(first)
    plan = sched.schedule()
    assert plan.loads == () and sched.take_kv_moved() == (5000, 0, 0, 0)  # 5 full blocks
    sched.update()  # it samples its only token and finishes
    evictor = Sequence(1, 31, 1)  # takes all 8 blocks: the cached ones are evicted
    sched.add(evictor)
    sched.schedule()
    sched.update()
    probe = Sequence(9, 21, 1, prompt_runs=((7, 20), (8, 1)))
    assert sched.blocks.lookup(probe) == []  # GPU KV lost the prefix
    again = Sequence(2, 21, 1, prompt_runs=((7, 20), (8, 1)))
    sched.take_kv_moved()
    sched.add(again)
    plan = sched.schedule()
    (load,) = plan.loads
    assert load.seq is again and load.tokens == [20, 0] and load.nbytes == [5000, 0]
    assert plan.seqs == [] and sched.num_loading == 1 and sched.num_waiting == 1
    assert sched.take_kv_moved() == (0, 5000, 0, 0)
    sched.update()
    sched.finish_load(again)
    plan = sched.schedule()
    assert plan.seqs == [again] and plan.context_lens == [20] and plan.num_new_tokens == [1]
    assert again.num_cached_tokens == 20


def test_a_hit_on_blocks_another_load_carries_waits_for_it_then_hits_gpu() -> None:
    sched = StepScheduler.vllm_v1(16, 4, 4, 64)
    sched.attach_tier(KVTier("cpu", 100), 1000, 1e6, 0.0)
    sched.add(Sequence(0, 20, 1, prompt_runs=((7, 20),)))
    sched.schedule()
    sched.update()
    sched.add(Sequence(1, 63, 1))  # evicts the prefix from GPU KV (16 blocks)
    sched.schedule()
    sched.update()
    a = Sequence(2, 21, 1, prompt_runs=((7, 20), (8, 1)))
    b = Sequence(3, 22, 1, prompt_runs=((7, 20), (9, 2)))
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    assert [load.seq for load in plan.loads] == [a]  # b waits: its blocks are on the way
    sched.update()
    sched.take_kv_moved()
    sched.finish_load(a)
    plan = sched.schedule()
    assert plan.seqs == [a, b] and plan.context_lens == [20, 20]  # b hit them in GPU KV
    assert plan.loads == () and sched.take_kv_moved()[1] == 0


def test_tiers_need_prefix_caching() -> None:
    with pytest.raises(ValueError, match="prefix caching"):
        StepScheduler(8, 4, 4, 64).attach_tier(KVTier("cpu", 1), 1, 1.0, 0.0)


# -- runs --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_fleets() -> dict[str, SimulationResult]:
    """No offload, a CPU tier, a CPU tier and the shared tier: the scenario's comparison."""
    return {
        "none": run(scenario(cpu=None, shared=None)),
        "cpu": run(scenario(shared=None)),
        "shared": run(scenario()),
    }


def test_each_tier_raises_the_hit_rate_and_lowers_mean_ttft(
    three_fleets: dict[str, SimulationResult],
) -> None:
    s = {k: r.summary for k, r in three_fleets.items()}
    assert all(v["num_finished"] == v["num_requests"] == 700 for v in s.values())
    hit = {k: v["prefix_cache_hit_rate"] for k, v in s.items()}
    ttft = {k: v["ttft_mean_s"] for k, v in s.items()}
    assert hit["none"] < hit["cpu"] < hit["shared"]
    assert ttft["none"] > ttft["cpu"] > ttft["shared"]
    assert s["none"]["cpu_hit_rate"] == 0 == s["cpu"]["shared_hit_rate"]
    assert s["cpu"]["cpu_hit_rate"] > 0 and s["shared"]["shared_hit_rate"] > 0
    for v in s.values():  # the per-tier rates add up to the prefix-cache hit rate
        parts = v["gpu_hit_rate"] + v["cpu_hit_rate"] + v["shared_hit_rate"]
        assert parts == pytest.approx(v["prefix_cache_hit_rate"], rel=1e-12)


def test_bytes_loaded_are_the_tokens_each_tier_served(
    three_fleets: dict[str, SimulationResult],
) -> None:
    for r in three_fleets.values():
        assert r.summary["num_preemptions"] == 0  # else a reload after one adds bytes
        done = r.requests[r.requests["status"] == "finished"]
        prompt = int(done["prompt_len"].sum())
        for tier in ("cpu", "shared"):
            loaded = int(r.steps[f"{tier}_load_bytes"].sum())
            served = r.summary[f"{tier}_hit_rate"] * prompt
            assert loaded == pytest.approx(served * BYTES_PER_TOKEN, rel=1e-9)
    steps = three_fleets["shared"].steps
    # every replica writes to the shared tier, never more than it computed
    per_replica = steps.groupby("replica")["shared_store_bytes"].sum()
    assert (per_replica > 0).all()
    computed = steps.groupby("replica")["num_tokens"].sum() * BYTES_PER_TOKEN
    assert (per_replica <= computed).all()


def test_a_load_delays_its_request_by_the_link_time_not_the_batch() -> None:
    slow = run(scenario(cpu={"bandwidth_gb_s": 0.5}, shared=None))
    fast = run(scenario(shared=None))
    # a hundredfold slower link: requests wait longer for their loads ...
    assert slow.summary["ttft_mean_s"] > fast.summary["ttft_mean_s"]
    # ... while no step is longer for it (a load is not part of any step's time)
    assert slow.steps["duration_s"].max() <= fast.steps["duration_s"].max() * 1.5


@pytest.mark.parametrize("single", [True, False], ids=["one server", "cluster"])
def test_a_zero_size_tier_gives_every_table_of_no_offload(single: bool) -> None:
    kw: dict[str, Any] = {"single": True} if single else {"shared": {"size_gb": 0}}
    zero = run(scenario(400, cpu={"size_gb": 0}, **kw))
    none_kw: dict[str, Any] = {"single": True} if single else {"shared": None}
    none = run(scenario(400, cpu=None, **none_kw))
    pd.testing.assert_frame_equal(zero.requests, none.requests)
    pd.testing.assert_frame_equal(zero.steps, none.steps)
    pd.testing.assert_frame_equal(zero.rejected, none.rejected)
    assert zero.summary == none.summary
    if not single:
        pd.testing.assert_frame_equal(zero.replicas, none.replicas)


def test_same_seed_same_tables_with_tiers() -> None:
    a, b = run(scenario(300)), run(scenario(300))
    pd.testing.assert_frame_equal(a.steps, b.steps)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert np.isclose(a.summary["shared_hit_rate"], b.summary["shared_hit_rate"])


# -- the router --------------------------------------------------------------------------------


def test_prefix_affinity_takes_its_shared_margin_when_the_shared_tier_holds_the_prefix() -> None:
    replicas = _replicas(3)
    router = PrefixAffinity(np.random.default_rng(0), affinity_margin=4)
    router.shared_margin = 0
    first = router.choose(Request(0, 0.0, 64, 1, ("a", "b")), replicas)
    first.num_incoming = 2
    # the holder is two requests busier: within the margin of 4, it keeps the prefix ...
    assert router.choose(Request(1, 0.0, 64, 1, ("a", "b")), replicas) is first
    # ... unless the shared tier holds it as deep: then the least loaded takes it
    other = router.choose(Request(2, 0.0, 64, 1, ("a", "b"), shared_blocks=2), replicas)
    assert other is not first


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["scheduler.kv_offload.cpu.size_gb=300"], "scheduler.kv_offload.cpu.size_gb"),
        (["scheduler.kv_offload.cpu.size_gb=-1"], "scheduler.kv_offload.cpu.size_gb"),
        (["scheduler.kv_offload.cpu.bandwidth_gb_s=-5"], "scheduler.kv_offload.cpu.bandwidth_gb_s"),
        (["cluster.shared_kv.size_gb=5000"], "cluster.shared_kv.size_gb"),
        (["cluster.shared_kv.bandwidth_gb_s=0"], "cluster.shared_kv.bandwidth_gb_s"),
        (["cluster.shared_kv.latency_s=-1"], "cluster.shared_kv.latency_s"),
        (["scheduler.enable_prefix_caching=false"], "kv_offload needs enable_prefix_caching"),
        (
            ["scheduler.kv_offload.cpu.size_gb=20", "scheduler.kv_offload.cpu.host_memory_gb=16"],
            "scheduler.kv_offload.cpu.size_gb",
        ),
    ],
)
def test_a_tier_that_cannot_be_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], field: str
) -> None:
    out = tmp_path / "never"
    args = [a for s in sets for a in ("--set", s)]
    assert main(["run", str(SCENARIO), "--out", str(out), "--no-plots", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    assert not out.exists()


def test_a_gpu_without_a_known_machine_needs_its_host_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = copy.deepcopy(scenario(50, single=True))
    cfg["cost_model"]["hardware"] = "l4"
    cfg["scheduler"]["num_blocks"] = 300
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "scheduler.kv_offload.cpu.host_memory_gb" in err and len(err.splitlines()) == 1
    path.write_text(
        yaml.safe_dump(
            cfg
            | {
                "scheduler": cfg["scheduler"]
                | {
                    "kv_offload": {
                        "cpu": {"size_gb": 10, "bandwidth_gb_s": 25, "host_memory_gb": 64}
                    }
                }
            }
        )
    )
    assert main(["validate", str(path)]) == 0


@pytest.mark.parametrize(
    "extra",
    [
        {"speculative": {"num_speculative_tokens": 2, "acceptance": {"rate": 0.5}}},
        {"scheduler": {"async_scheduling": True}},
    ],
)
def test_a_tier_with_speculation_or_async_scheduling_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: dict[str, Any]
) -> None:
    cfg = copy.deepcopy(scenario(50, single=True))
    cfg["scheduler"]["kv_offload"] = {
        "cpu": {"size_gb": 10, "bandwidth_gb_s": 25, "host_memory_gb": 64}
    }
    for key, value in extra.items():
        cfg[key] = cfg.get(key, {}) | value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "scheduler.kv_offload: not supported with" in err and len(err.splitlines()) == 1, err


def test_a_cpu_hit_is_scheduled_when_its_load_over_the_link_ends() -> None:
    from simulator.cost.linear import LinearCostConfig, LinearCostModel
    from simulator.engine.simulation import Simulation
    from simulator.workload.prompt_runs import PromptRuns
    from simulator.workload.workload import Workload

    # request 0 computes a 64-token prefix, request 1 (its own 120 tokens) evicts it from
    # GPU KV, request 2 repeats it and finds its 4 blocks in the CPU tier, idle server
    runs = PromptRuns.from_lists([[(0, 64)], [(1, 120)], [(0, 64), (2, 8)]])
    work = Workload(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        prompt_len=np.array([64, 120, 72]),
        output_len=np.array([1, 1, 1]),
        prompt_runs=runs,
    )
    sched = StepScheduler.vllm_v1(8, 16, 4, 256)
    bandwidth, latency, block_bytes = 1e6, 0.25, 50_000
    sched.attach_tier(KVTier("cpu", 100), block_bytes, bandwidth, latency)
    cost = LinearCostModel(LinearCostConfig(base_ms=10, per_token_ms=0.1))
    result = Simulation(work, cost, sched).run()
    req = result.requests.set_index("request_id")
    load_s = 4 * block_bytes / bandwidth + latency  # 0.45 s
    assert req.loc[2, "first_scheduled_s"] == pytest.approx(2.0 + load_s, abs=1e-12)
    assert req.loc[2, "num_cached_tokens"] == 64
    assert result.summary["cpu_hit_rate"] == pytest.approx(64 / (64 + 120 + 72))
    steps = result.steps
    assert int(steps["cpu_load_bytes"].sum()) == 4 * block_bytes


@pytest.mark.parametrize("seed", range(6))
def test_blocks_stay_accounted_for_while_loads_come_and_go(seed: int) -> None:
    from tests.scheduler_helpers import check_block_invariants

    rng = np.random.default_rng(seed)
    sched = StepScheduler.vllm_v1(24, 4, 4, 32)
    sched.attach_tier(KVTier("cpu", int(rng.integers(24, 60))), 100, 1.0, 0.0)
    # conversations: each turn repeats its conversation's previous prompt and a new piece
    turns: list[Sequence] = []
    prompts: dict[int, list[tuple[int, int]]] = {}
    for i in range(40):
        conv = int(rng.integers(0, 4))
        before = prompts.get(conv, [])
        if sum(n for _, n in before) > 60:  # a new conversation: prompts stay within the cache
            before = []
        runs = [*(before or [(100 + conv, 8)]), (i, int(rng.integers(1, 12)))]
        prompts[conv] = runs
        turns.append(
            Sequence(i, sum(n for _, n in runs), int(rng.integers(1, 6)), prompt_runs=tuple(runs))
        )
    pending = list(turns)
    loading: dict[Sequence, int] = {}  # the sequences loading, and when their load ends
    num_loads = 0
    for t in range(5000):
        while pending and rng.random() < 0.3:
            sched.add(pending.pop(0))
        for seq in [s for s, end in loading.items() if end <= t]:
            del loading[seq]
            sched.finish_load(seq)
        if not sched.has_work():
            if not pending and not loading:
                break
            continue
        plan = sched.schedule()
        for load in plan.loads:
            loading[load.seq] = t + int(rng.integers(0, 4))
            num_loads += 1
        assert sched.num_loading == len(loading)
        # blocks are held by the running and the loading only (a waiting one holds none)
        assert all(not s.num_blocks and not s.num_computed for s in sched.waiting)
        check_block_invariants(sched.blocks, sched.running + list(loading))
        sched.update()
        check_block_invariants(sched.blocks, sched.running + list(loading))
        assert sched.blocks.num_used <= sched.num_blocks
    assert not pending and not loading and not sched.has_work()
    assert all(s.num_output == s.max_tokens for s in turns)
    assert sched.num_blocks_used == 0
    off = sched.blocks.offload
    assert off is not None and not off.stored and not off.loading
    assert num_loads > 0  # the tier served some prefixes


def test_a_resumed_prompt_of_its_own_loads_from_the_cpu_tier_and_gives_its_blocks_back() -> None:
    # found by random scenarios: a preempted request with a prompt of its own, resumed with
    # some blocks still in GPU KV and the rest loaded from the CPU tier, gave its hit blocks
    # back without dropping their references; the pool then counted them free and held at
    # once, blocks_used went negative and two such requests evicted each other's loads
    # forever. Every request now finishes, with the blocks counted within the cache.
    import signal

    cfg = {
        "name": "own-prompts-offload",
        "seed": 496850,
        "scheduler": {
            "policy": "vllm-v1", "max_num_batched_tokens": 64, "max_num_seqs": 16,
            "num_blocks": 400, "block_size": 1,
            "kv_offload": {"cpu": {"size_gb": 1.0, "bandwidth_gb_s": 10.0,
                                   "host_memory_gb": 100}, "kv_bytes_per_token": 131072},
        },
        "cost_model": {"type": "linear", "base_ms": 5.0, "per_token_ms": 0.1,
                       "per_seq_ms": 0.1, "per_context_token_ms": 0.001},
        "workload": {
            "num_requests": 234,
            "arrival": {"process": "poisson", "rate": "inf"},
            "prompt_len": {"dist": "lognormal", "mu": 4.0, "sigma": 1.0, "min": 1, "max": 2000},
            "output_len": {"dist": "uniform", "low": 1, "high": 100},
        },
    }  # fmt: skip

    def stuck(signum: int, frame: object) -> None:
        raise TimeoutError("the run did not end in 60 s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        result = run(cfg)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    status = result.requests["status"]
    assert (status == "finished").sum() == 230 and (status == "rejected").sum() == 4
    used = result.steps["blocks_used"]
    assert used.min() >= 0 and used.max() <= 400
    assert result.summary["num_steps"] < 10_000
