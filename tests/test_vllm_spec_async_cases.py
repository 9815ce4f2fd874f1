"""The speculative-decoding and async-scheduling cases recorded from vLLM 0.33.0's real scheduler
(tests/data/vllm_v1_scheduler/spec_decode.jsonl.gz and async.jsonl.gz, recorded by
tools/vllm_recorder/record.py; format in tools/vllm_recorder/README.md) parse and are
self-consistent. No vLLM is needed: each case is re-walked from its own records with the
rules the README states (what a step schedules, what the fake model samples and accepts, when a
request finishes), so a record that broke one of those rules fails here."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

RECORDED = Path(__file__).parent / "data" / "vllm_v1_scheduler"
SPEC = RECORDED / "spec_decode.jsonl.gz"
ASYNC = RECORDED / "async.jsonl.gz"

Case = dict[str, Any]


def read(path: Path) -> list[Case]:
    """Every case of a recorded file, in file order."""
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def spec_cases() -> list[Case]:
    return read(SPEC)


@pytest.fixture(scope="module")
def async_cases() -> list[Case]:
    return read(ASYNC)


@dataclass
class Req:
    """What the records say about one request so far."""

    prompt_len: int
    max_tokens: int
    eos_at: int | None
    accept: list[int]
    arrival: int
    outputs: int = 0
    running: bool = False
    finished: bool = False

    def gain(self, accepted: int) -> tuple[int, bool]:
        """Tokens a sampling step appends (accepted drafts + the bonus, cut at EOS or
        max_tokens) and whether the request then stops."""
        n = accepted + 1
        if self.eos_at is not None and self.outputs <= self.eos_at < self.outputs + n:
            return self.eos_at - self.outputs + 1, True
        if self.outputs + n >= self.max_tokens:
            return self.max_tokens - self.outputs, True
        return n, False

    def expected_accept(self, drafts: int, admitted: bool) -> int:
        """The fake model's acceptance: none of a fresh admission's padding, else the script."""
        if drafts == 0 or admitted:
            return 0
        return min(self.accept[self.outputs], drafts)


def requests_of(case: Case) -> dict[str, Req]:
    k = case["config"]["num_speculative_tokens"]
    out = {}
    for i, r in enumerate(case["requests"]):
        assert r["id"] == str(i)
        assert len(r["accept"]) == (r["max_tokens"] if k else 0)
        assert all(0 <= a <= k for a in r["accept"])
        out[r["id"]] = Req(
            r["prompt_len"], r["max_tokens"], r["eos_at"], r["accept"], r["arrival_step"]
        )
    return out


def check_config(case: Case, kind: str) -> int:
    c = case["config"]
    assert case["vllm"] == "0.33.0" and case["kind"] == kind
    k = c["num_speculative_tokens"]
    assert (1 <= k <= 4) if kind != "async" else k == 0
    assert c["async_scheduling"] == (kind != "spec")
    assert c["speculative_method"] == ("ngram" if k else None)
    return int(k)


def check_batch(case: Case, rec: dict[str, Any], reqs: dict[str, Req], t: int) -> None:
    """Budgets of one scheduled batch: tokens, sequences, draft tokens within 1 + k."""
    c = case["config"]
    k = c["num_speculative_tokens"]
    ids = [rid for rid, _ in rec["scheduled"]]
    assert len(ids) == len(set(ids)) <= c["max_num_seqs"]
    assert sum(n for _, n in rec["scheduled"]) <= c["max_num_batched_tokens"]
    n_of = dict(rec["scheduled"])
    for rid, d in rec["spec"].items():
        assert 0 < d <= k and d < n_of[rid], (case["case"], t, rid)
    for rid in ids:
        assert reqs[rid].arrival <= t and not reqs[rid].finished, (case["case"], t, rid)
    assert set(rec["cached"]) <= set(ids)
    assert all(v % c["block_size"] == 0 and v > 0 for v in rec["cached"].values())


def walk_spec(case: Case) -> int:
    """Re-walk a synchronous spec-decode case; returns the draft tokens it verified."""
    c = case["config"]
    k = check_config(case, "spec")
    reqs = requests_of(case)
    computed: dict[str, int] = {}
    drafts: dict[str, bool] = {}
    verified = 0
    for t, st in enumerate(case["steps"]):
        check_batch(case, st, reqs, t)
        for rid in st["preempted"]:
            assert reqs[rid].running
            reqs[rid].running, computed[rid], drafts[rid] = False, 0, False
        finished, accepted = set(), {}
        for rid, n in st["scheduled"]:
            q = reqs[rid]
            admitted = not q.running
            if admitted:
                q.running, computed[rid] = True, st["cached"].get(rid, 0)
            else:
                assert rid not in st["cached"]
            known = q.prompt_len + q.outputs
            d = st["spec"].get(rid, 0)
            if admitted:
                # a fresh admission has no drafts; vLLM pads a one-token one to 1 + k
                assert d in (0, k) and (d == 0 or n == 1 + k), (case["case"], t, rid)
            else:
                expect = max(0, min(k, n + computed[rid] - known)) if drafts.get(rid) else 0
                assert d == expect, (case["case"], t, rid, d, expect)
            computed[rid] += n
            drafts[rid] = False
            if computed[rid] < known:
                continue
            a = q.expected_accept(d, admitted)
            if d:
                accepted[rid] = a
                verified += d
            gained, stop = q.gain(a)
            q.outputs += gained
            computed[rid] = q.prompt_len + q.outputs - 1
            if stop:
                finished.add(rid)
                q.running, q.finished = False, True
            else:
                drafts[rid] = True
        assert st["accepted"] == accepted, (case["case"], t)
        assert st["finished"] == sorted(finished, key=int), (case["case"], t)
        assert 0 <= st["free_blocks"] <= c["num_blocks"]
    assert all(q.finished for q in reqs.values()), case["case"]
    assert case["steps"][-1]["free_blocks"] == c["num_blocks"]
    return verified


def walk_async(case: Case) -> int:
    """Re-walk an async case (two batches in flight at most, FIFO updates); returns the
    draft tokens it verified."""
    c = case["config"]
    kind = "async" if c["num_speculative_tokens"] == 0 else "async_spec"
    k = check_config(case, kind)
    reqs = requests_of(case)
    in_flight: list[tuple[int, dict[str, Any], set[str]]] = []
    nbatch = 0
    verified = 0
    for t, call in enumerate(case["calls"]):
        sched, upd = call["schedule"], call["update"]
        if sched is not None:
            assert sched["batch"] == nbatch
            nbatch += 1
            check_batch(case, sched, reqs, t)
            for rid in sched["preempted"]:
                assert reqs[rid].running
                reqs[rid].running = False
            admitted = set()
            for rid, _ in sched["scheduled"]:
                if not reqs[rid].running:
                    admitted.add(rid)
                    reqs[rid].running = True
            for rid, d in sched["spec"].items():
                # async drafts are placeholders of the last k; a fresh admission's are padding
                assert d <= k and (rid not in admitted or d == k)
            in_flight.append((sched["batch"], sched, admitted))
            # the engine pops a batch only once two are queued, or when it cannot schedule
            assert len(in_flight) <= 2
            if upd is None:
                assert len(in_flight) < 2
        if upd is None:
            continue
        b, batch, admitted = in_flight.pop(0)
        assert upd["batch"] == b, (case["case"], t)
        n_of = dict(batch["scheduled"])
        assert set(upd["sampled"]) <= set(n_of) and set(upd["stale"]) <= set(n_of)
        assert set(upd["accepted"]) <= set(upd["sampled"])
        finished = set()
        for rid in upd["sampled"]:
            q = reqs[rid]
            assert not q.finished, (case["case"], t, rid)
            d = batch["spec"].get(rid, 0)
            a = q.expected_accept(d, rid in admitted)
            assert upd["accepted"].get(rid, 0) == a and (rid in upd["accepted"]) == (d > 0)
            verified += d
            gained, stop = q.gain(a)
            q.outputs += gained
            if stop:
                finished.add(rid)
                q.running, q.finished = False, True
        assert upd["finished"] == sorted(finished, key=int), (case["case"], t)
        assert 0 <= upd["free_blocks"] <= c["num_blocks"]
    assert not in_flight and all(q.finished for q in reqs.values()), case["case"]
    last = [call["update"] for call in case["calls"] if call["update"] is not None][-1]
    assert last["free_blocks"] == c["num_blocks"]
    return verified


def test_spec_decode_cases_are_self_consistent(spec_cases: list[Case]) -> None:
    assert len(spec_cases) == 300
    assert len({c["case"] for c in spec_cases}) == len(spec_cases)
    verified = [walk_spec(c) for c in spec_cases]
    # the set exercises what it is for: drafts verified, each k, some preemption, some hits
    assert sum(v > 0 for v in verified) > 0.9 * len(spec_cases)
    assert {c["config"]["num_speculative_tokens"] for c in spec_cases} == {1, 2, 3, 4}
    assert any(s["preempted"] for c in spec_cases for s in c["steps"])
    assert any(s["cached"] for c in spec_cases for s in c["steps"])


def test_async_cases_are_self_consistent(async_cases: list[Case]) -> None:
    assert len(async_cases) == 600
    assert len({c["case"] for c in async_cases}) == len(async_cases)
    verified = [walk_async(c) for c in async_cases]
    kinds = [c["kind"] for c in async_cases]
    assert kinds == ["async"] * 300 + ["async_spec"] * 300
    assert sum(verified[:300]) == 0 and sum(v > 0 for v in verified[300:]) > 0.8 * 300
    # in-flight preemption (stale output) and a full queue both occur
    assert any(u["stale"] for c in async_cases for u in updates(c))
    assert any(
        call["schedule"] is not None and call["update"] is not None
        for c in async_cases
        for call in c["calls"]
    )


def updates(case: Case) -> list[dict[str, Any]]:
    return [call["update"] for call in case["calls"] if call["update"] is not None]


def test_walker_rejects_a_wrong_record(spec_cases: list[Case]) -> None:
    """The walk is not vacuous: one accepted count off by one in a recorded step fails it."""
    case = json.loads(
        json.dumps(next(c for c in spec_cases if any(s["accepted"] for s in c["steps"])))
    )
    step = next(s for s in case["steps"] if s["accepted"])
    rid = next(iter(step["accepted"]))
    step["accepted"][rid] += 1
    with pytest.raises(AssertionError):
        walk_spec(case)
