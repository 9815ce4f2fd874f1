"""``scheduler.max_model_len`` (vLLM's ``--max-model-len``): a request asking for more tokens,
prompt plus output, is rejected with its reason as vLLM's server refuses it; a KV cache that
cannot hold one request of that length is a deployment vLLM will not start."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from simulator.errors import DoesNotFit
from simulator.scenario.runner import resolve, run


def _scenario(max_model_len: int | None, **extra: Any) -> dict[str, Any]:
    return {
        "name": "mml",
        "seed": 2,
        "scheduler": {
            "max_num_batched_tokens": 512,
            "max_num_seqs": 16,
            "num_blocks": 400,
            "max_model_len": max_model_len,
        },
        "cost_model": {"type": "linear", "base_ms": 4, "per_token_ms": 0.02},
        "workload": {
            "num_requests": 200,
            "arrival": {"process": "poisson", "rate": 5},
            "prompt_len": {"dist": "uniform", "low": 50, "high": 700},
            "output_len": {"dist": "uniform", "low": 1, "high": 300},
        },
        **extra,
    }


def test_a_request_past_max_model_len_is_rejected_with_its_reason() -> None:
    free = run(_scenario(None))
    capped = run(_scenario(600))
    asked = (free.requests["prompt_len"] + free.requests["output_len"]).to_numpy()
    rejected = capped.requests["status"].to_numpy() == "rejected"
    assert rejected.any() and (~rejected).any()
    np.testing.assert_array_equal(rejected, asked > 600)  # 600 itself is served
    assert (free.requests["status"] == "finished").all()
    reasons = capped.rejected.set_index("request_id")["reason"]
    i = int(np.flatnonzero(rejected)[0])
    p, o = free.requests.loc[i, ["prompt_len", "output_len"]]
    assert reasons[i] == (
        f"asks for {p + o} tokens (prompt {p} + output {o}), more than max_model_len 600"
    )
    assert capped.summary["num_rejected"] == rejected.sum()


def test_a_cluster_rejects_it_too() -> None:
    result = run(_scenario(600, cluster={"replicas": 2, "router": "least_outstanding"}))
    asked = (result.requests["prompt_len"] + result.requests["output_len"]).to_numpy()
    rejected = result.requests["status"].to_numpy() == "rejected"
    np.testing.assert_array_equal(rejected, asked > 600)
    assert (result.requests.loc[rejected, "replica"] == -1).all()


def test_a_cache_that_cannot_hold_one_such_request_does_not_fit() -> None:
    assert resolve(_scenario(400 * 16)).scheduler.max_model_len == 6400  # exactly the cache
    with pytest.raises(DoesNotFit) as err:
        resolve(_scenario(400 * 16 + 1))
    assert str(err.value) == (
        "scheduler.max_model_len: one request of 6,401 tokens needs 401 KV blocks, more than "
        "the 400 of the cache, so vLLM would not start; the longest that fits is 6,400 tokens"
    )
