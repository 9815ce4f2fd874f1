"""The multimodal cases recorded from vLLM 0.33.0's real scheduler
(tests/data/vllm_v1_scheduler/mm.jsonl.gz, recorded by tools/vllm_recorder/mm.py; format in
tools/vllm_recorder/README.md) parse and are self-consistent. No vLLM is needed: each case is
re-walked from its own records (tokens computed per request, when it samples and finishes, which
encoder inputs a step may schedule), so a record that broke one of those rules fails here."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

MM = Path(__file__).parent / "data" / "vllm_v1_scheduler" / "mm.jsonl.gz"

Case = dict[str, Any]


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    with gzip.open(MM, "rt") as fh:
        return [json.loads(line) for line in fh]


def walk(case: Case) -> dict[str, int]:
    """Re-walk a case; assert the invariants; return counts of what it exercised."""
    c = case["config"]
    reqs = {r["id"]: r for r in case["requests"]}
    computed = dict.fromkeys(reqs, 0)
    outputs = dict.fromkeys(reqs, 0)
    done: set[str] = set()
    hashes = {m["hash"] for r in reqs.values() for m in r["mm"]}
    seen = {"encoded": 0, "cut_before_item": 0, "repeats_not_encoded": 0}
    for t, st in enumerate(case["steps"]):
        assert 0 <= st["free_blocks"] <= c["num_blocks"]
        assert 0 <= st["encoder_free_slots"] <= c["encoder_cache_size"]
        assert set(st["encoder_freed"]) <= hashes
        for rid in st["preempted"]:
            computed[rid] = 0
        for rid, n in st["cached"].items():
            computed[rid] = n
        sched = dict(st["scheduled"])
        enc_tokens = 0
        for rid, idxs in st["encoder"].items():
            start, end = computed[rid], computed[rid] + sched[rid]
            for i in idxs:
                m = reqs[rid]["mm"][i]
                # an item is encoded only when the step's chunk reaches into its placeholders
                assert m["offset"] < end and start < m["offset"] + m["length"], (case["case"], t)
                enc_tokens += m["length"]
                seen["encoded"] += 1
        assert enc_tokens <= c["max_num_encoder_input_tokens"], (case["case"], t)
        for rid, n in sched.items():
            assert rid not in done and n > 0
            start, end = computed[rid], computed[rid] + n
            for m in reqs[rid]["mm"]:
                if end == m["offset"] and end < reqs[rid]["prompt_len"]:
                    seen["cut_before_item"] += 1
                if c["disable_chunked_mm_input"]:
                    # no chunk starts at or before an item and ends inside it
                    assert not (start <= m["offset"] < end < m["offset"] + m["length"])
            computed[rid] = end
        for rid in sched:
            r = reqs[rid]
            if computed[rid] >= r["prompt_len"] + outputs[rid]:
                outputs[rid] += 1
                if r["eos_at"] == outputs[rid] - 1 or outputs[rid] == r["max_tokens"]:
                    done.add(rid)
                    assert rid in st["finished"], (case["case"], t, rid)
        assert set(st["finished"]) <= done
    assert done == set(reqs), case["case"]
    assert case["steps"][-1]["free_blocks"] == c["num_blocks"]
    items = sum(len(r["mm"]) for r in reqs.values())
    seen["repeats_not_encoded"] = max(0, items - seen["encoded"])
    return seen


def test_mm_cases_are_well_formed(cases: list[Case]) -> None:
    assert len(cases) >= 300
    totals = {"encoded": 0, "cut_before_item": 0, "repeats_not_encoded": 0}
    for case in cases:
        assert case["vllm"] == "0.33.0" and case["kind"] == "mm"
        c = case["config"]
        biggest = max((m["length"] for r in case["requests"] for m in r["mm"]), default=0)
        # vLLM's MultiModalBudget never makes either figure smaller than the largest item
        assert c["max_num_encoder_input_tokens"] >= biggest
        assert c["encoder_cache_size"] >= biggest
        for key, n in walk(case).items():
            totals[key] += n
    # the file exercises what it is for: encoding, chunks cut before an item, cache reuse
    assert totals["encoded"] > 1000
    assert totals["cut_before_item"] > 50
    assert totals["repeats_not_encoded"] > 500


def test_a_broken_record_is_caught(cases: list[Case]) -> None:
    """The walk is not vacuous: an encoder input moved to a step whose chunk misses it fails."""
    case = json.loads(json.dumps(next(c for c in cases if any(s["encoder"] for s in c["steps"]))))
    walk(case)
    t = next(i for i, s in enumerate(case["steps"]) if s["encoder"])
    moved = case["steps"][t]["encoder"]
    case["steps"][t]["encoder"] = {}
    case["steps"][-1]["encoder"] = moved
    with pytest.raises((AssertionError, KeyError)):
        walk(case)
