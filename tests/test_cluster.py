"""Clusters: one replica is today's single server; routers against queueing theory; every
request served once, on one replica; exactness of deferred decode steps behind a router;
determinism; bad input."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simulator
import simulator.scenario.runner
from simulator.cli import main
from simulator.cluster.replica import Replica
from simulator.cluster.router import Request, Router
from simulator.cluster.routers import ROUTERS, PrefixAffinity
from tests.test_engine import scenario

ROUTER_NAMES = list(ROUTERS)


def clustered(cluster: dict[str, Any], **over: Any) -> dict[str, Any]:
    """``tests.test_engine.scenario`` behind a cluster."""
    cfg = scenario(**over)
    cfg["cluster"] = cluster
    return cfg


def md1(num_replicas: int, router: str, per_replica: int, rho: float, seed: int = 0) -> Any:
    """Deterministic 10 ms service, one request at a time per replica, Poisson arrivals at
    ``rho`` per replica: an M/D/1 queue per replica under random routing."""
    service_s = 0.010
    return simulator.run(
        clustered(
            {"replicas": num_replicas, "router": router},
            seed=seed,
            scheduler={
                "max_num_batched_tokens": 512,
                "max_num_seqs": 1,
                "num_blocks": 64,
                "block_size": 16,
            },
            cost_model={"type": "linear", "base_ms": service_s * 1e3},
            workload={
                "num_requests": num_replicas * per_replica,
                "arrival": {"process": "poisson", "rate": num_replicas * rho / service_s},
                "prompt_len": {"dist": "fixed", "value": 100},
                "output_len": {"dist": "fixed", "value": 1},
            },
        )
    )


# -- one replica is a single server ----------------------------------------------------------------

SINGLE_CASES = [
    {},
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
    {  # vLLM v1's policy with its prefix cache
        "scheduler": {
            "policy": "vllm-v1",
            "max_num_batched_tokens": 256,
            "max_num_seqs": 32,
            "num_blocks": 200,
            "block_size": 16,
        }
    },
    {  # some requests can never fit
        "scheduler": {
            "max_num_batched_tokens": 256,
            "max_num_seqs": 32,
            "num_blocks": 40,
            "block_size": 16,
        }
    },
    {  # a vLLM stack's serving overheads around the steps
        "serving": {
            "frontend_delay_ms": 3,
            "step_cpu_ms": 4,
            "step_cpu_per_seq_us": 60,
            "response_delay_ms": 2,
        }
    },
]


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
@pytest.mark.parametrize(
    "over",
    SINGLE_CASES,
    ids=["linear", "roofline", "fitted", "ties", "vllm-v1", "rejects", "serving"],
)
def test_one_replica_gives_the_single_server_tables_bit_for_bit(
    over: dict[str, Any], router: str
) -> None:
    single = simulator.run(scenario(**over))
    one = simulator.run(clustered({"replicas": 1, "router": router}, **over))
    assert (one.requests["replica"][one.requests["status"] == "finished"] == 0).all()
    assert (one.steps["replica"] == 0).all()
    cols = list(single.requests.columns)
    pd.testing.assert_frame_equal(single.requests, one.requests[cols], check_exact=True)
    pd.testing.assert_frame_equal(
        single.steps, one.steps[list(single.steps.columns)], check_exact=True
    )
    pd.testing.assert_frame_equal(single.rejected, one.rejected, check_exact=True)
    np.testing.assert_array_equal(single.checksums, one.checksums)
    for key, value in single.summary.items():
        assert one.summary[key] == value or (
            value != value and one.summary[key] != one.summary[key]
        )
    assert one.summary["num_replicas"] == 1 and one.summary["load_imbalance"] == 1.0


# -- queueing theory -------------------------------------------------------------------------------


def test_random_routing_gives_each_replica_the_pollaczek_khinchine_mean_ttft() -> None:
    # Random routing thins Poisson arrivals: each replica is an M/D/1 queue at lambda / N.
    # Over 8 seeds at this size the per-replica mean TTFT scatters by sigma = 0.8% around the
    # formula (bias 0.05%, largest miss 1.4%): 4% is about 5 sigma.
    rho, service_s = 0.6, 0.010
    result = md1(2, "random", 40_000, rho)
    wait = rho * service_s / (2 * (1 - rho))  # Pollaczek-Khinchine, deterministic service
    per_replica = result.requests.groupby("replica")["ttft_s"].mean()
    assert len(per_replica) == 2
    for ttft in per_replica:
        assert ttft == pytest.approx(wait + service_s, rel=0.04)
    assert result.replicas["ttft_mean_s"].to_numpy() == pytest.approx(per_replica.to_numpy())
    # thinning: each replica got about half the requests
    assert result.replicas["num_requests"].to_numpy() == pytest.approx([40_000] * 2, rel=0.02)


def test_round_robin_waits_less_than_random() -> None:
    # Round robin spaces a replica's arrivals (Erlang-4 gaps, cv^2 = 1/4): Kingman's
    # approximation puts its wait at a quarter of random routing's M/D/1 wait.
    rr = md1(4, "round_robin", 3000, 0.6).requests["queue_delay_s"].mean()
    rand = md1(4, "random", 3000, 0.6).requests["queue_delay_s"].mean()
    assert rr < 0.5 * rand


def test_least_outstanding_beats_round_robin_p99_on_heavy_tails() -> None:
    # One request at a time per replica and lognormal outputs (sigma 1.5): behind round robin
    # a short request waits out the long ones queued before it; least outstanding avoids them.
    def run(router: str) -> float:
        result = simulator.run(
            clustered(
                {"replicas": 4, "router": router},
                scheduler={
                    "max_num_batched_tokens": 512,
                    "max_num_seqs": 1,
                    "num_blocks": 4000,
                    "block_size": 16,
                },
                cost_model={"type": "linear", "base_ms": 1},
                workload={  # mean output 23 tokens: 60% load per replica
                    "num_requests": 2000,
                    "arrival": {"process": "poisson", "rate": 100},
                    "prompt_len": {"dist": "fixed", "value": 64},
                    "output_len": {"dist": "lognormal", "mu": 2.0, "sigma": 1.5, "max": 4000},
                },
            )
        )
        return float(result.summary["ttft_p99_s"])

    # seeds 0-3 give ratios 0.27, 0.27, 0.38 and 0.08
    assert run("least_outstanding") < 0.5 * run("round_robin")


# -- every request once, on one replica ------------------------------------------------------------


@pytest.mark.parametrize("router", ROUTER_NAMES)
def test_every_request_is_served_once_on_one_replica(router: str) -> None:
    cfg = clustered(
        {"replicas": 3, "router": router},
        scheduler={
            "max_num_batched_tokens": 256,
            "max_num_seqs": 32,
            "num_blocks": 40,
            "block_size": 16,
        },
    )
    cfg["workload"]["arrival"]["rate"] = 20
    result = simulator.run(cfg)
    req, table = result.requests, result.replicas
    assert table is not None
    finished = req["status"] == "finished"
    assert finished.sum() + (req["status"] == "rejected").sum() == len(req)
    assert (req.loc[finished, "replica"].between(0, 2)).all()
    assert (req.loc[~finished, "replica"] == -1).all()
    assert len(result.rejected) == (~finished).sum() > 0  # the scenario has requests too big
    assert table["num_finished"].sum() == finished.sum()
    assert table["num_requests"].sum() == finished.sum()
    # every output token was sampled on the request's replica, once
    tokens = table["output_token_throughput"] * result.summary["duration_s"]
    assert tokens.sum() == pytest.approx(req.loc[finished, "output_len"].sum())
    per_replica = req[finished].groupby("replica")["output_len"].sum()
    assert tokens.to_numpy() == pytest.approx(
        per_replica.reindex(range(3), fill_value=0).to_numpy()
    )
    steps = result.steps
    assert (np.diff(steps["start_s"].to_numpy()) >= 0).all()
    for _, own in steps.groupby("replica"):  # a replica's steps never overlap
        ends = (own["start_s"] + own["duration_s"]).to_numpy()
        assert (own["start_s"].to_numpy()[1:] >= ends[:-1]).all()


# -- deferred decode steps stay exact behind a router ----------------------------------------------


@pytest.mark.parametrize("router", ROUTER_NAMES)
def test_deferred_decode_steps_change_nothing_in_a_cluster(router: str) -> None:
    cfg = clustered({"replicas": 3, "router": router, "routing_delay_ms": 2.5})
    cfg["workload"]["arrival"]["rate"] = 20
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    np.testing.assert_array_equal(fast.checksums, slow.checksums)
    decodes_only = (fast.steps["num_decode_seqs"] == fast.steps["num_seqs"]).mean()
    assert decodes_only > 0.3  # the fast path had work to do


def test_routing_delay_delays_every_first_step() -> None:
    result = simulator.run(clustered({"replicas": 2, "routing_delay_ms": 40}))
    delay = result.requests["queue_delay_s"]
    assert delay.min() >= 0.040 - 1e-12


# -- determinism -----------------------------------------------------------------------------------


def test_same_seed_gives_identical_tables_serial_or_in_a_sweep(tmp_path: Path) -> None:
    cfg = clustered({"replicas": 3, "router": "power_of_two"})
    cfg["workload"]["num_requests"] = 200
    direct = {
        r: simulator.run(dict(cfg, cluster={**cfg["cluster"], "router": r}))
        for r in ("random", "power_of_two")
    }
    again = simulator.run(dict(cfg, cluster={**cfg["cluster"], "router": "random"}))
    pd.testing.assert_frame_equal(direct["random"].requests, again.requests, check_exact=True)
    other = simulator.run(dict(cfg, seed=8, cluster={**cfg["cluster"], "router": "random"}))
    assert not direct["random"].requests["replica"].equals(other.requests["replica"])
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for jobs in ("1", "2"):
        out = tmp_path / f"sweep{jobs}"
        argv = ["sweep", str(path), "--grid", "cluster.router=random,power_of_two"]
        assert main([*argv, "--out", str(out), "--no-plots", "--jobs", jobs]) == 0
        for i, router in enumerate(("random", "power_of_two")):
            folder = next((out / "runs").glob(f"{i:03d}_*"))
            got = pd.read_parquet(folder / "requests.parquet")
            want = direct[router].requests
            pd.testing.assert_frame_equal(got, want, check_exact=True, check_categorical=False)
            steps = pd.read_parquet(folder / "steps.parquet")
            pd.testing.assert_frame_equal(steps, direct[router].steps, check_exact=True)


# -- heterogeneous fleets and bad input ------------------------------------------------------------


def test_a_request_goes_only_where_it_fits_and_one_that_fits_nowhere_is_rejected() -> None:
    small = {"max_num_batched_tokens": 256, "max_num_seqs": 32, "num_blocks": 30, "block_size": 16}
    big = dict(small, num_blocks=60)
    cfg = clustered(
        {
            "replicas": [
                {"count": 2, "scheduler": small, "name": "small"},
                {"count": 1, "scheduler": big},
            ]
        }
    )
    result = simulator.run(cfg)
    req = result.requests
    kv_tokens = req["prompt_len"] + req["output_len"] - 1
    assert (req.loc[kv_tokens > 30 * 16, "replica"].isin([2, -1])).all()
    assert (req.loc[kv_tokens <= 30 * 16, "replica"].isin([0, 1, 2])).all()
    assert ((kv_tokens > 60 * 16) == (req["status"] == "rejected")).all()
    assert (req["status"] == "rejected").sum() > 0
    assert result.rejected["reason"].str.startswith("fits no replica: needs").all()
    assert result.replicas is not None
    assert result.replicas["group"].tolist() == ["small", "small", "group1"]
    assert result.replicas["num_blocks"].tolist() == [30, 30, 60]


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"replicas": 0}, "cluster.replicas: a cluster needs at least one replica"),
        ({"replicas": []}, "cluster.replicas: a cluster needs at least one replica"),
        ({"router": "random"}, "cluster: no replica"),
        (
            {"replicas": 2, "router": "fastest"},
            "cluster.router: unknown router 'fastest'",
        ),
    ],
)
def test_a_cluster_with_no_replica_or_an_unknown_router_is_one_line(
    cluster: dict[str, Any], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(clustered(cluster)))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err
    assert not (tmp_path / "out").exists()


# -- routers ---------------------------------------------------------------------------------------


def _replicas(n: int) -> list[Replica]:
    """``n`` idle replicas of 100 blocks, for a router to choose from."""
    import simpy

    from simulator.cost.linear import LinearCostConfig, LinearCostModel
    from simulator.engine.recorder import Recorder
    from simulator.engine.server import Server
    from simulator.engine.step_sink import MemorySink
    from simulator.scheduling import make_scheduler
    from simulator.scheduling.config import SchedulerConfig

    def server() -> Server:
        cfg = SchedulerConfig(
            num_blocks=100, block_size=16, max_num_seqs=8, max_num_batched_tokens=64
        )
        rec = Recorder(1, 100, MemorySink())
        cost = LinearCostModel(LinearCostConfig(base_ms=1))
        env = simpy.Environment()
        return Server(env, make_scheduler(cfg), cost, rec, next_arrival=lambda: math.inf)

    return [Replica(k, "g", "colocated", server()) for k in range(n)]


def test_prefix_affinity_follows_the_prefix_within_the_load_margin() -> None:
    router = PrefixAffinity(np.random.default_rng(0), affinity_margin=2)
    reps = _replicas(3)
    first = router.choose(Request(0, 0.0, 64, 8, prefix=("a", "ab")), reps)
    assert first.index == 0  # nobody holds it: least loaded, lowest index
    reps[0].num_incoming = 2  # two more in flight than the others: within the margin
    assert router.choose(Request(1, 0.0, 64, 8, prefix=("a", "ab", "abc")), reps) is reps[0]
    reps[0].num_incoming = 3  # beyond it: the least loaded instead
    assert router.choose(Request(2, 0.0, 64, 8, prefix=("a", "ab")), reps) is reps[1]
    # the prefix now lives on replica 1; a different prefix goes to the least loaded
    reps[0].num_incoming = 0
    assert router.choose(Request(3, 0.0, 64, 8, prefix=("a",)), reps) is reps[1]
    assert router.choose(Request(4, 0.0, 64, 8, prefix=("z",)), reps) is reps[0]


def test_a_router_is_a_few_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    class FewestWaiting(Router):
        def choose(self, request: Request, replicas: Any) -> Replica:
            return min(replicas, key=lambda r: (r.num_waiting, r.index))

    monkeypatch.setitem(ROUTERS, "fewest_waiting", FewestWaiting)
    result = simulator.run(clustered({"replicas": 2, "router": "fewest_waiting"}))
    assert set(result.requests["replica"]) == {0, 1}


def test_round_robin_takes_turns_and_random_draws_from_its_own_stream() -> None:
    req = Request(0, 0.0, 1, 1)
    reps = _replicas(3)
    rr = ROUTERS["round_robin"](np.random.default_rng(0))
    assert [rr.choose(req, reps).index for _ in range(5)] == [0, 1, 2, 0, 1]
    assert rr.choose(req, [reps[0], reps[2]]).index == 2  # skips replicas it does not fit
    draws = [ROUTERS["random"](np.random.default_rng(5)).choose(req, reps).index for _ in range(3)]
    assert len(set(draws)) == 1


def test_a_bad_preset_in_a_replica_group_names_the_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    group = {
        "count": 2,
        "cost_model": {"type": "roofline", "model": "llama-9", "hardware": "h100-sxm"},
    }
    cfg = clustered({"replicas": [{"count": 1}, group]})
    cfg["cost_model"] = {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for argv in (["validate", str(path)], ["run", str(path), "--out", str(tmp_path / "out")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "cluster.replicas.1.cost_model.model: unknown model preset 'llama-9'" in err


def test_a_closed_loop_in_a_cluster_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    cfg = clustered({"replicas": 2})
    cfg["workload"]["max_concurrency"] = 4
    path = tmp_path / "closed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "workload.max_concurrency: a closed loop is not simulated in a cluster yet" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
def test_a_front_end_and_response_delay_shift_every_request_by_their_sum(router: str) -> None:
    # a constant delay before each request reaches its engine moves the whole run by it (the
    # same routing, steps and tokens, later); the response delay then adds to TTFT and E2E
    plain = simulator.run(clustered({"replicas": 3, "router": router}))
    serving = {"frontend_delay_ms": 7, "response_delay_ms": 2}
    late = simulator.run(clustered({"replicas": 3, "router": router}, serving=serving))
    a, b = plain.requests, late.requests
    assert (a["replica"] == b["replica"]).all()
    assert b["queued_s"].to_numpy() == pytest.approx(b["arrival_s"].to_numpy() + 0.007)
    assert (b["ttft_s"] - a["ttft_s"]).to_numpy() == pytest.approx(np.full(len(a), 0.009))
    assert (b["e2e_s"] - a["e2e_s"]).to_numpy() == pytest.approx(np.full(len(a), 0.009))
    assert b["tpot_s"].to_numpy() == pytest.approx(a["tpot_s"].to_numpy(), nan_ok=True)
    steps = (late.steps["start_s"] - plain.steps["start_s"]).to_numpy()
    assert steps == pytest.approx(np.full(len(steps), 0.007))


@pytest.mark.parametrize("overlap", [True, False])
def test_each_replicas_steps_carry_the_cpus_share(overlap: bool) -> None:
    # GPU 5 ms a step; the CPU's 8 ms overlap it under async scheduling (max), else add
    serving = {"step_cpu_ms": 8, "async_scheduling": overlap}
    cfg = clustered({"replicas": 2, "router": "least_outstanding"}, serving=serving)
    cfg["cost_model"] = {"type": "linear", "base_ms": 5}
    steps = simulator.run(cfg).steps
    assert set(steps["replica"]) == {0, 1}
    want = 0.008 if overlap else 0.013
    assert steps["duration_s"].to_numpy() == pytest.approx(np.full(len(steps), want))


def test_prefix_keys_follow_token_identity() -> None:
    from simulator.cluster.router import prefix_keys

    a = prefix_keys((("sys", 40), ("q1", 30)), 16)  # 70 tokens: 4 full blocks
    b = prefix_keys((("sys", 40), ("q2", 30)), 16)
    assert len(a) == len(b) == 4
    assert a[:2] == b[:2] and a[2] != b[2]  # the third block holds the first question tokens
    assert prefix_keys(None, 16) == ()


def test_prefix_affinity_keeps_a_system_prompt_on_one_replica() -> None:
    cfg = clustered({"replicas": 4, "router": "prefix_affinity", "affinity_margin": 1000})
    cfg["workload"]["shared_prefix"] = {"num_prefixes": 3, "prefix_len": 256}
    result = simulator.run(cfg)
    assert result.requests.groupby("replica").size().size <= 3  # one replica per prompt


def _offload_scenario() -> dict[str, Any]:
    """``multi-turn-offload.yaml`` shortened: a CPU tier per replica and a shared one."""
    import yaml

    path = Path(__file__).resolve().parents[1] / "scenarios" / "multi-turn-offload.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["workload"]["num_requests"] = 300
    return cfg


@pytest.mark.parametrize("case", ["colocated", "disaggregated", "offload"])
def test_the_outstanding_counter_is_running_plus_waiting_plus_incoming(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Replica.num_outstanding`` is a counter the cluster keeps; at every routing instant
    it equals what the scheduler holds (running, waiting, loading KV) plus the requests on
    the link, on plain, disaggregated and KV-offloading replicas."""
    from tests.test_disaggregation import disaggregated

    seen: list[tuple[int, int]] = []

    class Checked(Router):
        def choose(self, request: Request, replicas: Any) -> Replica:
            for r in replicas:
                s = r.server
                seen.append((r.num_outstanding, s.num_running + s.num_waiting + r.num_incoming))
            return min(replicas, key=lambda r: (r.num_outstanding, r.index))

    monkeypatch.setitem(ROUTERS, "checked", Checked)
    if case == "colocated":
        cfg = clustered({"replicas": 3, "router": "checked"})
    elif case == "disaggregated":
        cfg = disaggregated(prefill=2, decode=2, router="checked")
    else:
        cfg = _offload_scenario()
        cfg["cluster"]["router"] = "checked"
    simulator.run(cfg)
    counters, truth = np.array(seen).T
    assert len(seen) > 500 and truth.max() > 2  # routed under load
    assert (counters == truth).all()


@pytest.mark.parametrize("router", ["round_robin", "random"])
def test_replicas_run_apart_give_the_interleaved_tables(
    router: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a router that reads no state the replicas run one after the other, each on its
    own clock (``apart.py``); the tables and summary are those of the interleaved run, with
    gaps passed to the ITL distribution in small chunks so that their order counts."""
    import simulator.cluster.cluster as cluster_module
    import simulator.engine.recorder as recorder

    monkeypatch.setattr(recorder, "CHUNK_GAPS", 40)
    cfg = clustered({"replicas": 4, "router": router})
    calls: list[bool] = []
    real = cluster_module.run_apart

    def counted(*args: Any) -> Any:
        result = real(*args)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(cluster_module, "run_apart", counted)
    apart = simulator.run(cfg)
    assert calls == [True]  # run apart, and no two replicas' chunks met at an instant
    monkeypatch.setattr(cluster_module, "run_apart", lambda *args: None)  # interleaved
    together = simulator.run(cfg)
    for name in ("requests", "steps", "replicas"):
        pd.testing.assert_frame_equal(getattr(apart, name), getattr(together, name))
    assert apart.summary == together.summary


def test_chunks_of_gaps_replay_in_time_order_unless_two_replicas_meet() -> None:
    from simulator.cluster.apart import replay
    from simulator.metrics import Distribution

    one, two = np.array([1.0, 2.0]), np.array([1e-17, 3.0])
    itl = Distribution()
    assert replay([(0.5, 1, 0, one, None), (0.25, 0, 1, two, None)], itl)
    assert itl.count == 4 and itl.total == (1e-17 + 3.0) + 3.0  # two's chunk first
    tied = Distribution()
    assert not replay([(0.5, 1, 0, one, None), (0.5, 0, 1, two, None)], tied)
    assert tied.count == 0
