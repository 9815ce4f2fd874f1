"""Prefill/decode disaggregation: a prefilled sequence in the scheduler, the KV link's exact
timing, every request prefilled once and decoded once, and exactness of the fast path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simulator
import simulator.scenario.runner
from simulator.cli import main
from simulator.cluster.kv_link import KVLink
from simulator.engine.tokens import sample, sample_many, token_for
from simulator.scheduling import StepScheduler
from simulator.scheduling.sequence import Sequence
from tests.test_engine import scenario

BYTES_PER_TOKEN = 131_072  # Llama-3-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes


def disaggregated(
    prefill: int = 1, decode: int = 3, router: str = "round_robin", **kv: Any
) -> dict[str, Any]:
    """``tests.test_engine.scenario`` with prefill and decode apart."""
    cfg = scenario()
    cfg["workload"]["arrival"]["rate"] = 16
    link = {"bandwidth_gbps": 100, "latency_ms": 1.5, "kv_bytes_per_token": BYTES_PER_TOKEN}
    cfg["cluster"] = {
        "router": router,
        "disaggregation": {
            "prefill": {"count": prefill},
            "decode": {"count": decode},
            "kv_transfer": {**link, **kv},
        },
    }
    return cfg


# -- the scheduler side ----------------------------------------------------------------------------


def test_a_prefilled_sequence_needs_blocks_for_its_kv_and_then_decodes() -> None:
    sched = StepScheduler(8, 16, 4, 64, sample, sample_many=sample_many)
    hog = Sequence(1, 60, 3)  # 4 blocks once it holds 61 tokens
    sched.add(hog)
    sched.schedule()
    sched.update()
    first = token_for(0, 0)
    seq = Sequence(0, 70, 4, output=[first])  # prompt computed elsewhere: 70 tokens of KV
    sched.add_prefilled(seq)
    assert seq.num_computed == 70 and seq.num_blocks == 0
    plan = sched.schedule()  # 5 blocks needed, 4 free: it waits, the hog decodes
    assert [s.seq_id for s in plan.seqs] == [1]
    sched.update()
    sched.schedule()
    sched.update()  # the hog finishes and frees its blocks
    plan = sched.schedule()
    assert plan.num_scheduled_tokens == {0: 1} and plan.context_lens == [70]
    assert seq.num_blocks == 5  # ceil(71 / 16)
    sched.update()
    assert seq.output == [first, token_for(0, 1)]  # sampling goes on at position 1


def test_only_prefilled_sequences_go_through_add_prefilled() -> None:
    sched = StepScheduler(8, 16, 4, 64, sample)
    with pytest.raises(ValueError, match="not prefilled"):
        sched.add_prefilled(Sequence(0, 10, 4))
    with pytest.raises(ValueError, match="not new"):
        sched.add(Sequence(1, 10, 4, output=[5]))
    with pytest.raises(ValueError, match="leaves none"):
        Sequence(2, 10, 1, output=[5])


# -- the link --------------------------------------------------------------------------------------


def test_the_link_serves_transfers_one_at_a_time_in_order() -> None:
    link = KVLink(bandwidth_bytes_per_s=1000.0, latency_s=0.5)
    assert link.book(0.0, 1000) == (0.0, 1.5)
    assert link.book(1.0, 500) == (1.5, 2.5)  # waits 0.5 s for the first
    assert link.book(4.0, 0) == (4.0, 4.5)  # an idle link starts at once


def test_each_kv_transfer_takes_bytes_over_bandwidth_plus_latency_plus_its_wait() -> None:
    # a slow link (2 Gb/s) so that transfers queue behind each other
    result = simulator.run(disaggregated(bandwidth_gbps=2, latency_ms=3))
    req = result.requests
    moved = req[req["decode_replica"] >= 0].copy()
    assert len(moved) == (req["output_len"] > 1).sum()
    moved["ready"] = moved["first_token_s"]
    moved["end"] = moved["ready"] + moved["kv_transfer_s"]
    moved = moved.sort_values(["ready", "end"], kind="stable")
    free, waited = 0.0, 0
    for ready, end, prompt in moved[["ready", "end", "prompt_len"]].itertuples(index=False):
        start = max(ready, free)
        waited += start > ready
        want = start + prompt * BYTES_PER_TOKEN / (2e9 / 8) + 0.003
        assert end == pytest.approx(want, rel=1e-12, abs=1e-12)
        free = end
    assert waited > 50  # the link was busy: the waits were checked too
    assert result.summary["num_kv_transfers"] == len(moved)


# -- every request prefilled once and decoded once -------------------------------------------------


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv"])
def test_every_request_prefills_once_and_decodes_once(router: str) -> None:
    cfg = disaggregated(prefill=2, decode=2, router=router)
    cfg["workload"]["output_len"] = {"dist": "uniform", "low": 1, "high": 60}
    result = simulator.run(cfg)
    req, table = result.requests, result.replicas
    assert table is not None
    assert (req["status"] == "finished").all()
    assert req["prefill_replica"].isin([0, 1]).all()
    one = req["output_len"] == 1
    assert one.sum() > 0  # some finish with their first token, on the prefill replica
    assert (req.loc[one, "decode_replica"] == -1).all()
    assert (req.loc[one, "replica"] == req.loc[one, "prefill_replica"]).all()
    assert req.loc[one, "kv_transfer_s"].isna().all()
    assert req.loc[~one, "decode_replica"].isin([2, 3]).all()
    assert (req.loc[~one, "replica"] == req.loc[~one, "decode_replica"]).all()
    # TTFT ends on the prefill replica; the request decodes after its KV landed
    assert (
        req.loc[~one, "finish_s"] > req.loc[~one, "first_token_s"] + req.loc[~one, "kv_transfer_s"]
    ).all()
    # tokens: one per request on its prefill replica, the rest on its decode replica
    tokens = (table["output_token_throughput"] * result.summary["duration_s"]).to_numpy()
    per_prefill = req.groupby("prefill_replica").size().reindex([0, 1]).to_numpy()
    assert tokens[:2] == pytest.approx(per_prefill)
    rest = (req.loc[~one, "output_len"] - 1).groupby(req.loc[~one, "decode_replica"]).sum()
    assert tokens[2:] == pytest.approx(rest.reindex([2, 3]).to_numpy())
    assert table["role"].tolist() == ["prefill", "prefill", "decode", "decode"]
    assert table["num_requests"].tolist()[:2] == per_prefill.tolist()
    # a prefill replica's finished requests are those it prefilled; a decode one's, those
    # it decoded (a 1-token output needs no decode)
    assert table["num_finished"].tolist()[:2] == per_prefill.tolist()
    assert table["num_finished"].iloc[2:].sum() == (~one).sum()
    # outputs are those of a colocated run: the same tokens, whatever the split
    colocated = simulator.run(dict(cfg, cluster={"replicas": 4}))
    np.testing.assert_array_equal(result.checksums, colocated.checksums)


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_tokens"])
def test_deferred_decode_steps_change_nothing_when_disaggregated(router: str) -> None:
    cfg = disaggregated(prefill=1, decode=2, router=router, latency_ms=0)
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    decode = fast.steps[fast.steps["replica"] >= 1]
    assert (decode["num_decode_seqs"] == decode["num_seqs"]).mean() > 0.5


def test_a_request_no_decode_replica_can_hold_is_rejected_before_its_prefill() -> None:
    cfg = disaggregated()
    cfg["cluster"]["disaggregation"]["decode"]["scheduler"] = dict(cfg["scheduler"], num_blocks=30)
    result = simulator.run(cfg)
    req = result.requests
    too_big = req["prompt_len"] + req["output_len"] - 1 > 30 * 16
    assert too_big.sum() > 0
    assert ((req["status"] == "rejected") == too_big).all()
    assert result.rejected["reason"].str.startswith("decode replicas: needs").all()
    assert (req.loc[too_big, "prefill_replica"] == -1).all()  # never prefilled


def test_kv_bytes_come_from_the_model_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.scenario.runner import resolve

    cfg = disaggregated()
    cfg["cost_model"] = {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"}
    del cfg["cluster"]["disaggregation"]["kv_transfer"]["kv_bytes_per_token"]
    resolved = resolve(cfg)
    assert resolved.cluster is not None and resolved.cluster.disaggregation is not None
    assert resolved.cluster.disaggregation.kv_transfer.kv_bytes_per_token == BYTES_PER_TOKEN
    import yaml

    linear = disaggregated()
    del linear["cluster"]["disaggregation"]["kv_transfer"]["kv_bytes_per_token"]
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(linear))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cluster.disaggregation.kv_transfer.kv_bytes_per_token: required" in err


def test_decode_replicas_under_vllm_v1_or_prefix_caching_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    cfg = disaggregated()
    cfg["scheduler"]["policy"] = "vllm-v1"
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "scheduler: decode replicas take KV computed elsewhere" in err
    with pytest.raises(ValueError, match="prefix caching off"):
        StepScheduler(8, 16, 4, 64, sample, enable_prefix_caching=True).add_prefilled(
            Sequence(0, 10, 4, output=[5])
        )
