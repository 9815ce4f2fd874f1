"""The KV blocks vLLM 0.33.0 derives for the shared models' config.json files
(tests/data/vllm_v1_scheduler/kv_blocks.json, written by tools/vllm_recorder/kvblocks.py on CPU;
README "KV blocks of real models") are complete and obey vLLM's pool rule, so issue 37's
comparison has a well-formed reference: one page size for every group, num_blocks = memory //
(largest group's layers x page), the scheduler block size the lcm of the groups', Mamba groups
in mode "align" exactly when prefix caching is on."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

KV_BLOCKS = Path(__file__).parent / "data" / "vllm_v1_scheduler" / "kv_blocks.json"
MODELS = Path(__file__).parents[2] / "shared" / "data" / "models"


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    with KV_BLOCKS.open() as fh:
        out: dict[str, Any] = json.load(fh)
    return out


def test_every_model_and_tp_is_recorded(data: dict[str, Any]) -> None:
    names = {r["model"] for r in data["cases"]}
    assert len(names) == 8
    if MODELS.is_dir():  # the shared models folder beside the clone
        assert names == {p.stem for p in MODELS.glob("*.json")}
    for name in names:
        rows = [r for r in data["cases"] if r["model"] == name]
        assert {(r["tp"], r["enable_prefix_caching"]) for r in rows} == {
            (tp, pc) for tp in data["tps"] for pc in (True, False)
        }
    # the one model vLLM 0.33 cannot build on CPU says why
    ds = [r for r in data["cases"] if r["model"] == "DeepSeek-V3.2"]
    assert all("Sparse Attention is not supported on CPU" in r["error"] for r in ds)
    assert sum("error" not in r for r in data["cases"]) == 7 * len(data["tps"]) * 2


def test_pool_rule(data: dict[str, Any]) -> None:
    checked = 0
    for r in data["cases"]:
        if "error" in r:
            continue
        for m in r["by_memory"]:
            if "error" in m:
                assert m["error"].startswith("ValueError")  # too little memory for one request
                continue
            groups = m["groups"]
            pages = {g["page_size_bytes"] for g in groups}
            assert len(pages) == 1, (r["model"], r["tp"])
            per_block = max(g["layers"] for g in groups) * pages.pop()
            assert m["num_blocks"] == m["kv_memory_bytes"] // per_block, (r["model"], r["tp"])
            assert m["scheduler_block_size"] == math.lcm(*(g["block_size"] for g in groups))
            for g in groups:
                if g["type"] == "MambaSpec":
                    mode = "align" if r["enable_prefix_caching"] else "none"
                    assert g["mamba_cache_mode"] == mode
                    assert g["block_size"] == (
                        r["cache_block_size"] if mode == "align" else r["max_model_len"]
                    )
                    assert g["real_page_size_bytes"] <= g["page_size_bytes"]
            checked += 1
    assert checked > 100


def test_kv_scales_with_tp(data: dict[str, Any]) -> None:
    """Splitting KV over more ranks never enlarges a rank's page, nor lowers its block count."""
    by = {
        (r["model"], r["tp"], r["enable_prefix_caching"]): r
        for r in data["cases"]
        if "error" not in r
    }
    for (model, tp, pc), r in by.items():
        nxt = by.get((model, tp * 2, pc))
        if nxt is None:
            continue
        for a, b in zip(r["by_memory"], nxt["by_memory"], strict=True):
            if "num_blocks" in a and "num_blocks" in b:
                page_a = a["groups"][0]["page_size_bytes"]
                page_b = b["groups"][0]["page_size_bytes"]
                assert page_b <= page_a and b["num_blocks"] >= a["num_blocks"], (model, tp)
