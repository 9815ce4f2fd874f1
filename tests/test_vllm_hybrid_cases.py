"""The hybrid KV-cache cases recorded from vLLM 0.33.0's real scheduler
(tests/data/vllm_v1_scheduler/hybrid_swa.jsonl.gz and hybrid_mamba.jsonl.gz, recorded by
tools/vllm_recorder/hybrid.py; format in tools/vllm_recorder/README.md) parse and are
self-consistent. No vLLM is needed: each case is re-walked from its own records with the rules
the README states (tokens computed per request, when it samples and finishes, how many blocks
each KV-cache group holds), so a record that broke one of them fails here."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

RECORDED = Path(__file__).parent / "data" / "vllm_v1_scheduler"
FILES = {
    "hybrid_swa": RECORDED / "hybrid_swa.jsonl.gz",
    "hybrid_mamba": RECORDED / "hybrid_mamba.jsonl.gz",
}

Case = dict[str, Any]


def read(path: Path) -> list[Case]:
    """Every case of a recorded file, in file order."""
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module", params=sorted(FILES))
def kind_cases(request: pytest.FixtureRequest) -> tuple[str, list[Case]]:
    return request.param, read(FILES[request.param])


def check_groups(case: Case) -> None:
    """The groups follow vLLM's rules: every layer of the pattern in exactly one group (plus
    padding), equal layer counts per group, one page size for all groups, attention groups at
    the block size, Mamba groups at max_model_len ("none") or the block size ("align", iff
    prefix caching), the scheduler block size their lcm."""
    c = case["config"]
    groups = c["kv_groups"]
    ids = sorted(i for g in groups for i in g["layer_ids"])
    assert ids == list(range(len(c["layer_pattern"])))
    assert len({g["page_size_bytes"] for g in groups}) == 1
    kinds = {"F": "FullAttentionSpec", "S": "SlidingWindowSpec", "M": "MambaSpec"}
    # one group size for all (the last group of a type is padded): ceil(layers / size) each
    size = max(g["layers"] for g in groups)
    for letter, typ in kinds.items():
        n = c["layer_pattern"].count(letter)
        assert sum(g["type"] == typ for g in groups) == -(-n // size)
    for g in groups:
        assert {kinds[c["layer_pattern"][i]] for i in g["layer_ids"]} == {g["type"]}
        if g["type"] == "MambaSpec":
            mode = "align" if c["enable_prefix_caching"] else "none"
            assert g["mamba_cache_mode"] == c["mamba_cache_mode"] == mode
            assert g["block_size"] == (c["block_size"] if mode == "align" else c["max_model_len"])
            assert g["state_bytes"] <= g["page_size_bytes"]
        else:
            assert g["block_size"] == c["block_size"]
        if g["type"] == "SlidingWindowSpec":
            assert g["sliding_window"] == c["sliding_window"]
    assert c["scheduler_block_size"] == math.lcm(*(g["block_size"] for g in groups))


def walk(case: Case) -> dict[str, int]:
    """Re-walk a case; assert the invariants; return counts of what it exercised."""
    c = case["config"]
    bs, nb = c["block_size"], c["num_blocks"]
    reqs = {r["id"]: r for r in case["requests"]}
    computed = dict.fromkeys(reqs, 0)
    outputs = dict.fromkeys(reqs, 0)
    done: set[str] = set()
    types = [g["type"] for g in c["kv_groups"]]
    seen = {"shrinks": 0, "preemptions": 0, "hits": 0, "aligned_cuts": 0}
    lpt = c["long_prefill_token_threshold"]
    max_chunk = min(c["max_num_batched_tokens"], lpt) if lpt > 0 else c["max_num_batched_tokens"]
    aligned_split = c.get("mamba_cache_mode") == "align" and bs <= max_chunk
    prev: dict[str, list[int]] = {}
    for t, st in enumerate(case["steps"]):
        assert 0 <= st["free_blocks"] <= nb, (case["case"], t)
        for rid in st["preempted"]:
            computed[rid] = 0
            seen["preemptions"] += 1
        for rid, n in st["cached"].items():
            assert n % bs == 0 and computed[rid] == 0
            computed[rid] = n
            seen["hits"] += 1
        sched = dict(st["scheduled"])
        for rid, n in sched.items():
            assert rid not in done and reqs[rid]["arrival_step"] <= t and n > 0
            if aligned_split:
                # Mamba "align": a prefill chunk that does not end the prefill ends on a block
                # boundary whenever a block fits in one chunk
                prefill_end = reqs[rid]["prompt_len"] + max(0, outputs[rid] - 1)
                if computed[rid] + n < prefill_end:
                    assert (computed[rid] + n) % bs == 0, (case["case"], t, rid)
                    seen["aligned_cuts"] += 1
            computed[rid] += n
        assert sum(sched.values()) <= c["max_num_batched_tokens"]
        assert len(sched) <= c["max_num_seqs"]
        for rid, held in st["blocks"].items():
            assert len(held) == len(types)
            for g, (typ, h) in enumerate(zip(types, held, strict=True)):
                if typ == "FullAttentionSpec":
                    # a full-attention group holds every block up to the computed tokens
                    assert h == -(-computed[rid] // bs), (case["case"], t, rid)
                elif typ == "SlidingWindowSpec":
                    # at most the window behind the chunk plus the chunk, +1 for alignment
                    w = c["sliding_window"]
                    assert h <= -(-(w - 1 + sched.get(rid, 0)) // bs) + 1, (case["case"], t)
                    if rid in prev and h < prev[rid][g]:
                        seen["shrinks"] += 1
                else:
                    # a Mamba group holds one state block ("none"), at most two ("align")
                    assert 1 <= h <= (1 if c["mamba_cache_mode"] == "none" else 2)
        prev = st["blocks"]
        for rid in sched:
            r = reqs[rid]
            if computed[rid] >= r["prompt_len"] + outputs[rid]:  # the chunk reached the end
                outputs[rid] += 1
                if r["eos_at"] == outputs[rid] - 1 or outputs[rid] == r["max_tokens"]:
                    done.add(rid)
                    assert rid in st["finished"], (case["case"], t, rid)
        assert set(st["finished"]) <= done
        if not c["enable_prefix_caching"]:
            # no sharing: the pool's used blocks are exactly the blocks the live requests hold
            used = sum(sum(h) for rid, h in st["blocks"].items() if rid not in st["finished"])
            assert used == nb - st["free_blocks"], (case["case"], t)
    assert done == set(reqs), case["case"]
    assert case["steps"][-1]["free_blocks"] == nb
    return seen


def test_hybrid_cases_are_well_formed(kind_cases: tuple[str, list[Case]]) -> None:
    kind, cases = kind_cases
    assert len(cases) >= 300
    assert len({c["case"] for c in cases}) == len(cases)
    totals = {"shrinks": 0, "preemptions": 0, "hits": 0, "aligned_cuts": 0}
    for case in cases:
        assert case["vllm"] == "0.33.0" and case["kind"] == kind
        check_groups(case)
        for key, n in walk(case).items():
            totals[key] += n
    # the files exercise what they are for: preemption, prefix hits, and (SWA) windows sliding
    assert totals["preemptions"] > 100 and totals["hits"] > 100
    if kind == "hybrid_swa":
        assert totals["shrinks"] > 1000
    else:
        assert totals["aligned_cuts"] > 1000
    pcs = {c["config"]["enable_prefix_caching"] for c in cases}
    assert pcs == {True, False}


def test_a_broken_record_is_caught() -> None:
    """The walk is not vacuous: one block more in a full-attention group fails it."""
    case = next(c for c in read(FILES["hybrid_swa"]) if c["steps"][0]["blocks"])
    walk(case)
    st = case["steps"][0]
    rid = next(iter(st["blocks"]))
    g = next(
        i for i, g in enumerate(case["config"]["kv_groups"]) if g["type"] == "FullAttentionSpec"
    )
    st["blocks"][rid][g] += 1
    with pytest.raises(AssertionError):
        walk(case)
