"""Data-parallel ranks in lockstep (``parallel:``): vLLM's DP balancer, each step as long as the
slowest rank's, dummy steps on idle ranks, KV per rank under expert parallelism, every request
served once, and ``data_parallel_size: 1`` identical to no ``parallel`` at all."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from simulator.cost.batch import Batch
from simulator.cost.presets import derive_num_blocks, load_hardware, load_model
from simulator.engine.dp_balancer import DPBalancer
from simulator.engine.lockstep import DUMMY_BATCH, LockstepServer
from simulator.errors import InputError
from simulator.scenario.runner import resolve, run
from simulator.scheduling.sequence import Sequence
from tests.paths import DATA

QWEN = str(DATA / "llmservingsim" / "models" / "Qwen3-30B-A3B-Instruct-2507.json")


class _Rank:
    def __init__(self, waiting: int, running: int, used: int = 0, blocks: int = 100) -> None:
        self.num_waiting, self.num_running = waiting, running
        self.num_blocks_used, self.num_blocks = used, blocks


def test_balancer_round_robins_ties_and_counts_in_flight() -> None:
    b = DPBalancer(2)
    idle = [_Rank(0, 0), _Rank(0, 0)]
    # nothing seen yet: its own in-flight counts spread a burst round robin
    assert [b.choose(idle) for _ in range(4)] == [0, 1, 0, 1]
    assert b.in_flight == [2, 2]
    b.finished(1, 2)
    assert b.choose(idle) == 1  # the rank with fewer in flight


def test_balancer_prefers_the_less_loaded_and_penalizes_a_kv_bound_queue() -> None:
    b = DPBalancer(2)
    assert b.choose([_Rank(0, 5), _Rank(0, 3)]) == 1
    b = DPBalancer(2)
    # equal waiting + running (4), but rank 0's queue sits on a 90%-full cache: 4 + 3*6*0.4
    assert b.choose([_Rank(3, 1, used=90), _Rank(0, 4)]) == 1
    b = DPBalancer(2)
    # at <= 50% KV usage the penalty is off: the tie goes to the scan's start
    assert b.choose([_Rank(3, 1, used=50), _Rank(0, 4)]) == 0


def _scenario(dp: int | None, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "dp",
        "seed": 3,
        "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 16, "num_blocks": 400},
        "cost_model": {"type": "linear", "base_ms": 2.0, "per_token_ms": 0.05, "per_seq_ms": 0.1},
        "workload": {
            "num_requests": 200,
            "arrival": {"process": "poisson", "rate": 40},
            "prompt_len": {"dist": "uniform", "low": 10, "high": 600},
            "output_len": {"dist": "uniform", "low": 1, "high": 80},
        },
        **extra,
    }
    if dp is not None:
        data["parallel"] = {"data_parallel_size": dp}
    return data


def _lockstep_run(dp: int) -> tuple[Any, Any]:
    from simulator.scenario.parallel import build_dp_simulation
    from simulator.scenario.runner import build

    cfg = resolve(_scenario(dp))
    workload, _ = build(cfg)
    sim = build_dp_simulation(cfg, workload, None)
    return sim, sim.run()


def test_each_step_lasts_as_long_as_the_slowest_rank_and_idle_ranks_run_dummy_steps() -> None:
    sim, result = _lockstep_run(2)
    server = sim.server
    steps = result.steps
    assert len(server.rank_durations) == len(steps)
    dummy = server.cost_models[0].step_time(DUMMY_BATCH)
    assert dummy > 0
    assert steps["duration_s"].tolist() == pytest.approx([max(t) for t in server.rank_durations])
    # some steps found one rank idle: it ran a dummy step, and the step took the other's time
    with_dummy = [t for t in server.rank_durations if dummy in t]
    assert with_dummy and any(max(t) > dummy for t in with_dummy)
    # ranks differ: a step's time is the max, more than some rank's own
    assert sum(1 for t in server.rank_durations if t[0] != t[1]) > len(steps) / 2


def test_the_ranks_in_lockstep_read_as_one_server_does() -> None:
    """DP ranks are a ``ServerShape`` as a single server is: what a cluster or a simulation
    reads of them is their sum, refusals and finishes go through the same records."""
    sim, result = _lockstep_run(2)
    server = sim.server
    assert isinstance(server, LockstepServer)  # built once: no single Server thrown away
    ranks = server.ranks
    assert server.num_blocks == sum(r.num_blocks for r in ranks)
    assert server.block_size == ranks[0].block_size
    assert not server.has_work() and server.num_running == server.num_waiting == 0
    assert server.num_blocks_used == sum(r.num_blocks_used for r in ranks)
    assert server.num_sampled == int(result.requests["output_len"].sum())
    steps = result.steps
    assert server.busy_until == pytest.approx((steps["start_s"] + steps["duration_s"]).max())
    assert server.balancer.in_flight == [0, 0]  # every finish told the balancer
    huge = Sequence(10_000, server.num_blocks * server.block_size, 5)
    assert server.rejection_reason(huge) is not None
    assert server.submit(huge) is False
    assert sim.recorder.rejected[-1][0] == 10_000


def test_every_request_is_served_once_by_one_rank() -> None:
    sim, result = _lockstep_run(2)
    req = result.requests
    assert len(req) == 200 and req["finish_s"].notna().all()
    assert sorted(sim.server.rank_of) == list(range(200))
    per_rank = pd.Series(sim.server.rank_of).value_counts()
    assert set(per_rank.index) == {0, 1} and abs(per_rank[0] - per_rank[1]) < 40
    assert sim.server.balancer.in_flight == [0, 0]
    assert int(req["output_len"].sum()) == sim.recorder.num_tokens


def test_two_ranks_serve_faster_than_one_and_runs_repeat_exactly() -> None:
    one = run(_scenario(None))
    two = run(_scenario(2))
    assert two.summary["e2e_p90_s"] < one.summary["e2e_p90_s"]
    again = run(_scenario(2))
    pd.testing.assert_frame_equal(two.requests, again.requests)
    pd.testing.assert_frame_equal(two.steps, again.steps)


def test_data_parallel_size_one_is_bit_identical_to_no_parallel() -> None:
    plain = run(_scenario(None))
    one = run(_scenario(1))
    pd.testing.assert_frame_equal(plain.requests, one.requests)
    pd.testing.assert_frame_equal(plain.steps, one.steps)


def test_kv_per_rank_grows_with_the_experts_split_over_ep() -> None:
    model, hw = load_model(QWEN), load_hardware("rtx-pro-6000")
    whole = derive_num_blocks(model, hw, 1, 16, 0.9, max_num_batched_tokens=2048, max_num_seqs=128)
    half = derive_num_blocks(
        model, hw, 1, 16, 0.9, max_num_batched_tokens=2048, max_num_seqs=128, ep=2
    )
    routed = model.num_moe_layers * (model.num_experts or 0) * model.expert_bytes
    block = model.kv_bytes_per_token_per_gpu(1) * 16
    # half the routed experts' bytes more room: that many more blocks (within rounding)
    assert half - whole == pytest.approx(routed / 2 / block, abs=1)


def _qwen(**parallel: Any) -> dict[str, Any]:
    lss = DATA / "llmservingsim"
    return {
        "name": "q",
        "parallel": {"data_parallel_size": 2, **parallel},
        "scheduler": {"max_num_batched_tokens": 2048, "max_num_seqs": 128, "block_size": 16},
        "cost_model": {
            "type": "profiled",
            "profile": str(lss / "profiles" / "RTXPRO6000" / "Qwen3-30B-A3B-Instruct-2507"),
            "model": QWEN,
            "hardware": "rtx-pro-6000",
        },
        "workload": {
            "num_requests": 2,
            "arrival": {"process": "poisson", "rate": 1},
            "prompt_len": {"dist": "fixed", "value": 100},
            "output_len": {"dist": "fixed", "value": 2},
        },
    }


def test_expert_parallel_sets_the_cost_models_degree_and_the_ranks_kv() -> None:
    from simulator.cost import build_cost_model

    ep = resolve(_qwen(enable_expert_parallel=True))
    no_ep = resolve(_qwen())
    assert ep.cost_model.expert_parallel == 2 and no_ep.cost_model.expert_parallel == 1  # type: ignore[union-attr]
    assert ep.scheduler.num_blocks > no_ep.scheduler.num_blocks  # type: ignore[operator]
    # a decode step of 64 sequences: EP halves the experts each rank reads but adds the
    # all-to-all; both show in the time
    batch = Batch((1,) * 64, (500,) * 64)
    t_ep = build_cost_model(ep.cost_model).step_time(batch)
    t_no = build_cost_model(no_ep.cost_model).step_time(batch)
    assert t_ep != t_no


def test_an_ep_degree_that_does_not_divide_the_experts_is_one_line() -> None:
    bad = _qwen(enable_expert_parallel=True)
    bad["parallel"]["data_parallel_size"] = 3  # 128 experts over 3 GPUs
    with pytest.raises(InputError, match=r"parallel.enable_expert_parallel: .*does not divide"):
        resolve(bad)


def test_expert_parallel_needs_a_model_that_prices_experts() -> None:
    data = _scenario(2)
    data["parallel"]["enable_expert_parallel"] = True  # a linear cost model
    with pytest.raises(InputError, match="profiled, roofline, physics and kernels cost models"):
        resolve(data)


def test_each_moe_layer_adds_the_all_gather_and_reduce_scatter_over_the_presets_link() -> None:
    from simulator.cost import build_cost_model

    cm = resolve(_qwen(enable_expert_parallel=True)).cost_model
    ideal = cm.model_copy(update={"interconnect_bandwidth": 1e30, "allreduce_latency_us": 0.0})
    batch = Batch((1,) * 64, (500,) * 64)
    real, free = build_cost_model(cm), build_cost_model(ideal)
    # rtx-pro-6000: 16 GB/s and 20 us (the preset's link). Two ranks of 64 tokens: the
    # all-gather sends 64 hidden vectors (2,048 bf16) and their 8 top-k (fp32 weight, int32 id)
    # one way, the reduce-scatter 64 hidden vectors back; 20 us each; 48 MoE layers
    dispatch = 64 * (2048 * 2 + 8 * 8) / 16e9
    combine = 64 * 2048 * 2 / 16e9
    want = 48 * (dispatch + combine + 2 * 20e-6)
    assert real.step_time(batch) - free.step_time(batch) == pytest.approx(want, rel=1e-9)


def test_vllms_cuda_graph_padding_of_the_ranks() -> None:
    from simulator.engine.dp_padding import DPPadding, capture_sizes

    # max_num_seqs 128: graphs up to 256 tokens; 1, 2, 4, every 8 below 256, then 256
    sizes = capture_sizes(128, 2048)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-2:] == [248, 256] and len(sizes) == 35
    assert capture_sizes(8, 12) == [1, 2, 4, 8, 12]  # the token budget itself when below
    pad = DPPadding(sizes)
    # all ranks in graphs: each to the largest rank's graph (an idle rank's dummy too)
    assert pad.tokens_across_dp([100, 1]) == [104, 104]
    # a rank beyond the largest graph runs eagerly: no DP padding, the others' own graphs
    assert pad.tokens_across_dp([600, 100]) == [600, 104]
    assert DPPadding(None).tokens_across_dp([100, 1]) == [100, 1]  # enforce_eager


def test_the_all_gather_and_reduce_scatter_by_hand() -> None:
    from simulator.cost.all_to_all import allgather_reducescatter_time

    # two ranks of 600 and 104 tokens, hidden 2,048 bf16, top-8: each ring step is as long
    # as the larger chunk's; 10 GB/s and 5 us per collective
    t = allgather_reducescatter_time([600, 104], 2048, 10e9, 5.0, top_k=8)
    assert t == pytest.approx(2 * 5e-6 + 600 * (4096 + 64) / 10e9 + 600 * 4096 / 10e9)
    # four equal ranks: three ring steps each way
    t4 = allgather_reducescatter_time([50] * 4, 2048, 10e9, 0.0, top_k=8)
    assert t4 == pytest.approx(3 * 50 * (4096 + 64 + 4096) / 10e9)
    assert allgather_reducescatter_time([500], 2048, 10e9, 5.0) == 0.0


def test_a_ranks_moe_layers_follow_every_ranks_tokens() -> None:
    from simulator.cost import build_cost_model

    cost = build_cost_model(resolve(_qwen(enable_expert_parallel=True)).cost_model)
    decode = Batch((1,) * 64, (500,) * 64)
    # balanced ranks: the data-parallel price is the plain one
    assert cost.step_time_in_dp(decode, [64, 64], 0) == pytest.approx(cost.step_time(decode))  # type: ignore[attr-defined]
    # the other rank prefills 600 tokens: this rank's experts see them too (and the
    # all-gather carries them), so its decode step costs more than alone...
    busy = cost.step_time_in_dp(decode, [64, 600], 0)  # type: ignore[attr-defined]
    assert busy > cost.step_time(decode) + 1e-3
    # ...but the prefilling rank's MoE is cheaper than if both ranks had 600 tokens
    chunk = Batch((600,), (0,))
    assert cost.step_time_in_dp(chunk, [64, 600], 1) < cost.step_time(chunk)  # type: ignore[attr-defined]
    experts = cost._experts  # type: ignore[attr-defined]
    m = cost.model  # type: ignore[attr-defined]
    # the MoE part by hand: moe.csv at the local slots (664 / 2 tokens' worth) over the
    # local experts 664 tokens touch, plus the remote slots' traffic, plus the exchange
    local = experts.table.at(664 / 2, m.expected_distinct_experts(664, 2))
    remote = 664 * 8 * 0.5 * experts.slot_seconds
    assert experts.slot_seconds == pytest.approx(2 * (5 * 768 + 2 * 2048) / (1.597e12 * 0.8))
    assert experts.across_dp([64, 600], 0) == pytest.approx(
        48 * (local + remote + experts._exchange([64, 600]))
    )


def _arrivals_and_steps(async_scheduling: bool) -> tuple[pd.DataFrame, list[float], list[float]]:
    data = _scenario(2)
    data["serving"] = {"async_scheduling": async_scheduling}
    result = run(data)
    steps = result.steps
    return result.requests, steps["start_s"].tolist(), steps["duration_s"].tolist()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_async_scheduling_plans_a_step_while_the_one_before_runs(async_scheduling: bool) -> None:
    import bisect

    req, starts, durations = _arrivals_and_steps(async_scheduling)
    lag = 2 if async_scheduling else 1
    exact = 0
    rows = zip(req["arrival_s"], req["queued_s"], req["first_scheduled_s"], strict=True)
    for arrival, queued, first in rows:
        n = bisect.bisect_right(starts, arrival) - 1
        running = n >= 0 and starts[n] < arrival < starts[n] + durations[n]
        # vLLM's QUEUED stamp: the engine loop takes a request in between steps, so one
        # arriving during step N is queued as N ends (at once if the engine is idle)
        assert queued == pytest.approx(starts[n] + durations[n] if running else arrival)
        if not running or n + lag >= len(starts):
            continue  # idle at its arrival: scheduled at once in both modes
        # never sooner than the step planned after it arrived: N + 1 sync, N + 2 async
        assert first >= starts[n + lag] - 1e-12, (arrival, first)
        exact += first == pytest.approx(starts[n + lag])
    assert exact > 50  # most go in then (the budgets are ample)


def _roofline_ep(ep: int, tp: int = 1, **extra: Any) -> Any:
    from simulator.cost import build_cost_model
    from simulator.cost.roofline import RooflineCostConfig

    cfg = RooflineCostConfig(
        model="qwen3-30b-a3b", hardware="h100-sxm", tp=tp, expert_parallel=ep, **extra
    )
    return build_cost_model(cfg)


def test_roofline_expert_parallelism_by_hand() -> None:
    from simulator.cost.batch import StepSums

    plain, ep4 = _roofline_ep(1), _roofline_ep(4, allreduce_latency_us=5.0)
    m, hw = ep4.model, ep4.hw
    decode = Batch((1,) * 64, (1000,) * 64)
    # four ranks of 64 decodes: this GPU reads the 32 of its experts 256 tokens touch and
    # computes the 256 x 8 / 4 top-k slots routed to it; the rest as one GPU's
    slot_flops = 2 * 48 * m.expert_params
    flops = (m.flops_per_token_matmul - 8 * slot_flops) * 64 + slot_flops * 256 * 8 / 4
    flops += m.attention_flops_per_pair * decode.attention_pairs()
    nbytes = m.weight_bytes - m.routed_expert_bytes + m.kv_bytes_per_token_per_gpu(1) * 64 * 1001
    nbytes += 48 * m.expected_distinct_experts(256) / 4 * m.expert_bytes
    roof = max(flops / (hw.peak_flops * 0.6), nbytes / (hw.hbm_bandwidth * 0.8))
    # NVLink one way 450 GB/s; three ring steps of 64 tokens each way, 5 us each
    exchange = 2 * 5e-6 + 3 * 64 * (2048 * 2 + 64 + 2048 * 2) / 450e9
    want = roof + 48 * exchange + 2e-3
    assert ep4.step_time(decode) == pytest.approx(want, rel=1e-9)
    assert ep4.step_time_in_dp(decode, [64] * 4, 2) == pytest.approx(want, rel=1e-12)
    assert ep4.time_sums(StepSums.of(decode)) == ep4.step_time(decode)
    # a decode step reads a quarter of the experts: faster than one GPU with all of them
    assert ep4.step_time(decode) < plain.step_time(decode)
    # another rank's prefill lands on this GPU's experts and on the link
    assert ep4.step_time_in_dp(decode, [64, 64, 64, 2048], 0) > ep4.step_time(decode)
    # no expert parallelism: the ranks are independent
    assert plain.step_time_in_dp(decode, [64, 2048], 0) == plain.step_time(decode)


def test_the_moe_deployment_scenario_runs_dp_and_ep_on_the_roofline() -> None:
    from simulator.scenario.config import load_scenario
    from simulator.scenario.parallel import build_dp_simulation
    from simulator.scenario.runner import build
    from tests.paths import ROOT

    path = ROOT / "scenarios" / "moe-deployment.yaml"
    cfg = resolve(load_scenario(path, {"workload.num_requests": 150}))
    assert cfg.parallel is not None and cfg.parallel.data_parallel_size == 4
    assert cfg.cost_model.type == "roofline" and cfg.cost_model.expert_parallel == 4  # type: ignore[union-attr]
    # each rank's KV holds what a quarter of the experts leaves free
    tp4 = resolve(
        load_scenario(
            path,
            {"parallel.data_parallel_size": 1, "parallel.enable_expert_parallel": False},
        )
    )
    assert cfg.scheduler.num_blocks > tp4.scheduler.num_blocks  # type: ignore[operator]
    workload, _ = build(cfg)
    sim = build_dp_simulation(cfg, workload, None)
    result = sim.run()
    assert result.requests["finish_s"].notna().all()
    assert set(sim.server.rank_of.values()) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("parallel.data_parallel_size=3", "parallel.enable_expert_parallel"),  # 128 over 3
        ("parallel.data_parallel_size=0", "parallel.data_parallel_size"),
        ("cost_model.model=llama-3-8b", "parallel.enable_expert_parallel"),  # dense: no experts
    ],
)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_parallel_input_is_one_line_exit_2(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], override: str, field: str, command: str
) -> None:
    from simulator.cli import main
    from tests.paths import ROOT

    out = tmp_path / "never"
    args = [command, str(ROOT / "scenarios" / "moe-deployment.yaml"), "--set", override]
    assert main(args + (["--out", str(out)] if command == "run" else [])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servesim: error:") and field in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_data_parallel_ranks_inside_a_cluster_are_refused_in_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from simulator.cli import main

    path = tmp_path / "dp-cluster.yaml"
    path.write_text(yaml.safe_dump({**_scenario(2), "cluster": {"replicas": 2}}))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "parallel.data_parallel_size" in err and "cluster" in err
    assert len(err.splitlines()) == 1


def _admissions_at_a_finish(exact_async: bool) -> tuple[int, int]:
    """(waiting requests first scheduled in the step that starts as a request of their rank
    finishes, waiting requests in all) of a run whose ranks' slots are always full."""
    from simulator.scenario.parallel import build_dp_simulation
    from simulator.scenario.runner import build

    data = _scenario(2, serving={"async_scheduling": True})
    data["scheduler"].update(policy="vllm-v1", max_num_seqs=2, async_scheduling=exact_async)
    data["workload"]["arrival"]["rate"] = 400
    cfg = resolve(data)
    workload, _ = build(cfg)
    sim = build_dp_simulation(cfg, workload, None)
    req = sim.run().requests
    rank = sim.server.rank_of  # type: ignore[attr-defined]
    finishes: dict[int, set[float]] = {0: set(), 1: set()}
    for i, end in zip(req["request_id"], req["finish_s"], strict=True):
        finishes[rank[i]].add(end)
    waited = req[req["first_scheduled_s"] > req["queued_s"]]
    at_once = sum(
        first in finishes[rank[i]]
        for i, first in zip(waited["request_id"], waited["first_scheduled_s"], strict=True)
    )
    return at_once, len(waited)


def test_async_scheduling_reuses_a_freed_slot_one_step_late() -> None:
    # vLLM plans step N + 1 before step N's tokens are applied: a request finishing in step N
    # still holds its slot when N + 1 is planned, so the waiting head goes in at N + 2 (it
    # may still start as another request of its rank finishes: 9 of 197 here)
    at_once, waited = _admissions_at_a_finish(exact_async=True)
    assert waited > 100 and at_once < waited // 10
    # planned after the update, the head takes the slot in the very next step (196 of 199)
    at_once, waited = _admissions_at_a_finish(exact_async=False)
    assert waited > 100 and at_once > waited * 9 // 10
