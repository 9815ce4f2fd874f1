"""The worked examples 0-5 of shared/spec/scheduler.md, step by step."""

from __future__ import annotations

import pytest

from simulator.scheduling import Sequence, SequenceStatus, StepScheduler
from tests.scheduler_helpers import base_sampler, step

AMPLE = 10_000


def make(
    specs: list[tuple[str, int, int]],
    *,
    num_blocks: int = AMPLE,
    block_size: int = 4,
    max_num_seqs: int = 256,
    budget: int = AMPLE,
    eos: int | None = None,
    bases: dict[int, int] | None = None,
) -> tuple[StepScheduler, list[Sequence]]:
    """A scheduler with the spec's sampler (bases 100, 200, 300, ...) and sequences added."""
    seqs = [Sequence(name, p, m) for name, p, m in specs]
    bases = bases or {s.seq_id: 100 * (i + 1) for i, s in enumerate(seqs)}
    sched = StepScheduler(num_blocks, block_size, max_num_seqs, budget, base_sampler(bases), eos)
    for s in seqs:
        sched.add(s)
    return sched, seqs


def state(seq: Sequence) -> tuple[int, int, int]:
    return seq.num_computed, seq.num_tokens, seq.num_blocks


def test_example_0_budget_and_chunked_prefill() -> None:
    sched, seqs = make([(0, 10, 10), (1, 10, 10), (2, 10, 10)], budget=16)
    assert step(sched, seqs)[0] == {0: 10, 1: 6}
    plan, _ = step(sched, seqs)
    assert plan == {0: 1, 1: 4, 2: 10}
    assert list(plan) == [0, 1, 2]
    assert step(sched, seqs)[0] == {0: 1, 1: 1, 2: 1}


def test_example_1_token_budget_and_chunked_prefill() -> None:
    sched, seqs = make(
        [(1, 6, 3), (2, 5, 2), (3, 3, 1)],
        num_blocks=100,
        block_size=4,
        max_num_seqs=8,
        budget=8,
    )
    a1, a2, a3 = seqs
    plan, done = step(sched, seqs)
    assert plan == {1: 6, 2: 2}
    assert (state(a1), state(a2)) == ((6, 7, 2), (2, 5, 1))
    assert a2.output == [] and a3.status is SequenceStatus.WAITING
    assert sched.blocks_used == 3 and done == []
    assert list(sched.waiting) == [a3]

    plan, done = step(sched, seqs)
    assert plan == {1: 1, 2: 3, 3: 3}
    assert (state(a1), state(a2)) == ((7, 8, 2), (5, 6, 2))
    assert a2.output == [200] and a3.output == [300]
    assert sched.blocks_used == 4 and done == [a3]

    plan, done = step(sched, seqs)
    assert plan == {1: 1, 2: 1}
    assert a1.output == [100, 101, 102] and a2.output == [200, 201]
    assert sched.blocks_used == 0 and done == [a1, a2]
    assert sched.num_preemptions == 0
    assert not sched.has_work()


def test_example_2_preempting_another_sequence() -> None:
    sched, seqs = make([(1, 2, 3), (2, 3, 2)], num_blocks=3, block_size=2, budget=64)
    a1, a2 = seqs
    plan, _ = step(sched, seqs)
    assert plan == {1: 2, 2: 3}
    assert (a1.num_blocks, a2.num_blocks, sched.blocks_used) == (1, 2, 3)
    assert a1.output == [100] and a2.output == [200]

    plan, _ = step(sched, seqs)
    assert plan == {1: 1}
    assert sched.num_preemptions == 1 and a2.num_preemptions == 1
    assert list(sched.waiting) == [a2] and a2.status is SequenceStatus.WAITING
    assert (a2.num_computed, a2.num_blocks, a2.output) == (0, 0, [200])
    assert a1.output == [100, 101]

    plan, done = step(sched, seqs)
    assert plan == {1: 1} and done == [a1]
    assert sched.blocks_used == 0 and list(sched.waiting) == [a2]

    plan, done = step(sched, seqs)
    assert plan == {2: 4} and done == [a2]
    assert a1.output == [100, 101, 102] and a2.output == [200, 201]
    assert sched.blocks_used == 0 and sched.num_preemptions == 1


def test_example_3_fcfs_head_of_line_blocking() -> None:
    sched, seqs = make([(1, 9, 1), (2, 9, 1), (3, 1, 1)], num_blocks=5, block_size=4, budget=100)
    plan = sched.schedule()
    assert plan.num_scheduled_tokens == {1: 9}
    assert sched.blocks_used == 3
    assert [s.seq_id for s in sched.waiting] == [2, 3]


def test_example_4_preempting_itself() -> None:
    sched, seqs = make([(1, 2, 3), (2, 2, 3)], num_blocks=3, block_size=2, budget=64)
    a1, a2 = seqs
    expected = [
        ({1: 2, 2: 2}, 2, [200]),
        ({1: 1}, 2, [200]),
        ({1: 1}, 0, [200]),
        ({2: 3}, 2, [200, 201]),
        ({2: 1}, 0, [200, 201, 202]),
    ]
    for i, (want_plan, want_blocks, want_out) in enumerate(expected, start=1):
        plan, _ = step(sched, seqs)
        assert plan == want_plan, f"step {i}"
        assert sched.blocks_used == want_blocks, f"step {i}"
        assert a2.output == want_out, f"step {i}"
        if i == 2:
            assert list(sched.waiting) == [a2] and sched.running == [a1]
    assert sched.num_preemptions == 1 and a2.num_preemptions == 1
    assert a1.output == [100, 101, 102]


def test_example_5_eos_ends_early_and_frees_blocks() -> None:
    # a1's sampler hits EOS (102) at its third token, long before max_tokens 10
    sched, seqs = make([(1, 4, 10), (2, 4, 10)], block_size=2, eos=102)
    a1, a2 = seqs
    step(sched, seqs)
    step(sched, seqs)
    assert (a1.num_blocks, sched.blocks_used) == (3, 6)
    _, done = step(sched, seqs)
    assert done == [a1]
    assert a1.output == [100, 101, 102] and a1.status is SequenceStatus.FINISHED
    assert a1.num_blocks == 0
    assert sched.blocks_used == a2.num_blocks == 3
    assert a2.status is SequenceStatus.RUNNING and len(a2.output) == 3


def test_schedule_returns_a_copy() -> None:
    sched, _ = make([(0, 3, 2)])
    plan = sched.schedule().num_scheduled_tokens
    plan[0] = 99
    sched.update()
    assert sched.running[0].num_computed == 3


def test_decode_and_prefill_share_the_token_budget() -> None:
    # running first: decodes take their 1 token before any admission gets the rest
    sched, seqs = make([(0, 4, 5), (1, 20, 1)], budget=5)
    assert step(sched, seqs)[0] == {0: 4, 1: 1}
    assert step(sched, seqs)[0] == {0: 1, 1: 4}


def test_max_num_seqs_limits_admission_only() -> None:
    sched, seqs = make([(0, 2, 3), (1, 2, 3), (2, 2, 3)], max_num_seqs=2)
    assert step(sched, seqs)[0] == {0: 2, 1: 2}
    assert [s.seq_id for s in sched.waiting] == [2]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"block_size": -1}, "block_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ],
)
def test_constructor_rejects_non_positive_sizes(kwargs: dict[str, int], name: str) -> None:
    args = {"num_blocks": 4, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 4}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        StepScheduler(**args, sample_fn=lambda s: 0)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "name"), [(0, 1, "prompt_len"), (1, 0, "max_tokens")]
)
def test_sequence_rejects_non_positive_lengths(prompt: int, max_tokens: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Sequence(0, prompt, max_tokens)


def test_never_fitting_sequence_is_rejected_with_numbers() -> None:
    sched = StepScheduler(2, 4, 4, 64, sample_fn=lambda s: 0)
    sched.add(Sequence(0, 4, 5))  # 4 + 5 - 1 = 8 tokens = 2 blocks: fits exactly
    with pytest.raises(
        ValueError, match=r"sequence 1 .*3 KV blocks for 9 tokens \(prompt 4 \+ output 6 - 1\)"
    ):
        sched.add(Sequence(1, 4, 6))
    assert [s.seq_id for s in sched.waiting] == [0]


def test_adding_the_same_sequence_twice_is_an_error() -> None:
    sched = StepScheduler(8, 4, 4, 64, sample_fn=lambda s: 0)
    sched.add(Sequence(1, 4, 2))
    with pytest.raises(ValueError, match="already added"):
        sched.add(Sequence(1, 3, 2))
