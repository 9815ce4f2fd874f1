"""The EP all-to-all cost by hand and against drawn routings."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost.all_to_all import all_to_all_bytes, all_to_all_time
from simulator.errors import InputError


def test_by_hand() -> None:
    # 2 ranks, top-1: half the tokens go to the other rank
    assert all_to_all_bytes(100, 2048, 2, top_k=1) == pytest.approx(100 * 2048 * 2 * 0.5)
    # top-8 over 2 ranks: nearly every token has an expert on the other rank
    assert all_to_all_bytes(100, 2048, 2, top_k=8) == pytest.approx(100 * 2048 * 2 * (1 - 0.5**8))
    # dispatch + combine over 16 GB/s with 20 us each
    t = all_to_all_time(100, 2048, 2, 16e9, 20.0, top_k=1)
    assert t == pytest.approx(2 * (20e-6 + 100 * 2048 * 2 * 0.5 / 16e9))
    assert all_to_all_time(100, 2048, 1, 16e9, 20.0) == 0.0


def test_expected_remote_ranks_by_simulation() -> None:
    # experts spread evenly over the ranks, each token's top-k drawn with replacement of rank
    rng = np.random.default_rng(3)
    ranks, k, tokens = 4, 3, 20_000
    dest = rng.integers(0, ranks, size=(tokens, k))
    remote = sum(len(set(row.tolist()) - {0}) for row in dest)  # rank 0's tokens
    expected = all_to_all_bytes(tokens, 1, ranks, k, 1)
    assert remote == pytest.approx(expected, rel=0.01)


def test_bad_input() -> None:
    with pytest.raises(InputError, match="ranks"):
        all_to_all_bytes(1, 1, 0)
    with pytest.raises(InputError, match="bandwidth"):
        all_to_all_time(1, 1, 2, 0.0)
