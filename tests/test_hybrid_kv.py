"""Hybrid KV-cache groups in the KV manager (issue 37): every case recorded from vLLM 0.33's
real scheduler with sliding-window and Mamba groups (tests/data/vllm_v1_scheduler/hybrid_*.jsonl.gz,
tools/vllm_recorder/README.md) replays step for step through vllm-v1, each group's blocks
included, on the plain path and with the fast path asked for (which declines hybrid groups);
and the window and Mamba rules one by one."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.scheduling.block_pool import BlockPool
from simulator.scheduling.group_tables import NULL
from simulator.scheduling.hybrid_kv import HybridKV, kv_manager_for
from simulator.scheduling.kv_group import KVGroup
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.kv_tier import KVTier
from simulator.scheduling.mamba_group import MambaGroup, aligned_chunk
from simulator.scheduling.sequence import Sequence
from simulator.scheduling.step_scheduler import StepScheduler
from simulator.scheduling.window_group import WindowGroup
from simulator.validation.scheduler_cases import Case, read_cases
from simulator.validation.scheduler_replay import check_cases, first_divergence, replay

RECORDED = Path(__file__).parent / "data" / "vllm_v1_scheduler"
FILES = ("hybrid_swa", "hybrid_mamba")


@functools.cache
def load(kind: str) -> list[Case]:
    """The recorded cases of ``kind``, read once per test run."""
    return read_cases(RECORDED / f"{kind}.jsonl.gz")


@pytest.fixture(params=FILES)
def cases(request: pytest.FixtureRequest) -> list[Case]:
    return load(request.param)


def test_every_hybrid_case_replays_on_both_paths(
    cases: list[Case], monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = {"fast": 0}
    fast_step = StepScheduler.fast_step

    def counted(self: StepScheduler) -> object:
        assert self.fast_path_declined == (
            "the fast path is not simulated with hybrid KV-cache groups"
        )
        plan = fast_step(self)
        taken["fast"] += plan is not None
        return plan

    assert len(cases) == 300 and all("blocks" in s for c in cases for s in c.steps)
    plain = check_cases(cases, "vllm-v1")
    assert [d.describe() for d in plain.divergences] == []
    monkeypatch.setattr(StepScheduler, "fast_step", counted)
    fast = check_cases(cases, "vllm-v1", fast=True)
    assert fast.num_matching == 300
    assert taken["fast"] == 0  # declined explicitly: every step planned by schedule()


def window_case(cases: list[Case]) -> Case:
    """The first window case in which some request's window group gives blocks back."""
    for case in cases:
        if case.kind == "hybrid_swa" and any(
            len({n for n in held}) > 1 for s in case.steps for held in s["blocks"].values()
        ):
            return case
    raise AssertionError("no case with a sliding window in it")


def test_a_wider_window_diverges_in_the_blocks() -> None:
    case = window_case(load("hybrid_swa"))
    c = dict(case.config)
    c["kv_groups"] = [
        {**g, "sliding_window": g["sliding_window"] + 64} if "sliding_window" in g else g
        for g in c["kv_groups"]
    ]
    wider = dataclasses.replace(case, config=c)
    divergence = first_divergence(wider, replay(wider, "vllm-v1"))
    assert divergence is not None and divergence.expected is not None
    assert divergence.got is not None and divergence.expected["blocks"] != divergence.got["blocks"]


def test_groups_that_disagree_with_the_recorded_block_sizes_are_refused(cases: list[Case]) -> None:
    case = cases[0]
    c = {**case.config, "scheduler_block_size": case.config["scheduler_block_size"] * 2}
    with pytest.raises(InputError, match="config.scheduler_block_size"):
        replay(dataclasses.replace(case, config=c), "vllm-v1")


# -- the rules, one by one ----------------------------------------------------------------------

SWA = [
    KVGroup(kind="sliding_window", block_size=16, sliding_window=32),
    KVGroup(kind="full", block_size=16),
]


def sched(groups: list[KVGroup], caching: bool = False, **kw: object) -> StepScheduler:
    return StepScheduler.vllm_v1(
        200,
        16,
        8,
        256,
        lambda s: 7,
        enable_prefix_caching=caching,
        kv_groups=groups,
        max_model_len=2048,
        **kw,  # type: ignore[arg-type]
    )


def held(s: StepScheduler, seq: Sequence) -> list[int]:
    return s.blocks.held().get(seq, [])


def test_a_window_group_gives_back_the_blocks_before_the_window() -> None:
    s = sched(SWA)
    seq = Sequence(0, 109, 29)
    s.add(seq)
    s.schedule()
    assert held(s, seq) == [7, 7]  # the prompt's 109 tokens: nothing freed before computing
    s.update()
    s.schedule()  # 109 computed: tokens before 109 - 31 = 78 are out of every window
    assert held(s, seq) == [7 - 78 // 16, 7]
    s.update()
    assert s.num_blocks_used == 3 + 7


def test_a_window_admission_reserves_at_most_its_cap() -> None:
    group = WindowGroup(0, 16, BlockPool(10), 16, 32, 256, 2048)
    assert group.cap == -(-(31 + 256) // 16) + 1
    assert group.blocks_for(2000) == group.cap < -(-2000 // 16)
    s = sched(SWA)
    assert s.blocks.blocks_for(2000) == group.cap + 125  # full attention keeps every block


def test_a_window_hit_needs_only_the_blocks_before_its_end() -> None:
    s = sched(SWA, caching=True)
    prompt = ((("doc", 0), 100),)
    first, second = Sequence(0, 100, 2, prompt_runs=prompt), Sequence(1, 100, 2, prompt_runs=prompt)
    s.add(first)
    while s.has_work():
        s.schedule()
        s.update()
    s.add(second)
    plan = s.schedule()
    # 96 tokens: 6 full blocks; the window group cached only the 2 (ceil(31 / 16)) before 96
    assert plan.cached_tokens == [96]
    group = s.blocks.groups[0]  # type: ignore[attr-defined]
    assert [b == NULL for b in group.tables[second]] == [True] * 4 + [False] * 3


def test_a_mamba_group_in_mode_none_holds_one_block() -> None:
    groups = [KVGroup(kind="mamba", block_size=2048, mamba_cache_mode="none"), SWA[1]]
    s = sched(groups)
    seq = Sequence(0, 300, 40)
    s.add(seq)
    seen = set()
    while s.has_work():
        s.schedule()
        if seq.status.value == "running":
            seen.add(held(s, seq)[0])
        s.update()
    assert seen == {1} and s.num_blocks_used == 0


def test_a_mamba_group_in_mode_align_keeps_two_states_and_cuts_chunks() -> None:
    groups = [KVGroup(kind="mamba", block_size=16, mamba_cache_mode="align"), SWA[1]]
    s = StepScheduler.vllm_v1(200, 16, 8, 35, lambda s: 7, kv_groups=groups, max_model_len=2048)
    seq = Sequence(0, 51, 3)
    s.add(seq)
    chunks, states = [], []
    while s.has_work():
        plan = s.schedule()
        chunks.append(plan.num_new_tokens[0])
        states.append(held(s, seq)[0])
        s.update()
    # chunks end on block boundaries (32, 48) until the last one; the states are the
    # boundary's and the running one: at most 2 (the recorded case mamba-000004 does this)
    assert chunks[:3] == [32, 16, 3] and max(states) == 2 and states[0] == 1


def test_aligned_chunks() -> None:
    seq = Sequence(0, 100, 5)
    assert aligned_chunk(seq, 0, 35, 16, 64, 0) == 32  # floored to a block boundary
    assert aligned_chunk(seq, 20, 40, 16, 64, 0) == 12  # from inside a block: to its end
    assert aligned_chunk(seq, 64, 36, 16, 64, 0) == 32  # not past the last boundary, 96
    assert aligned_chunk(seq, 0, 10, 16, 64, 0) == 0  # a block fits a chunk: wait for it
    assert aligned_chunk(seq, 0, 10, 16, 8, 0) == 10  # a block wider than any chunk
    assert aligned_chunk(seq, 0, 64, 16, 64, 40) == 32  # a shared prefix ends at 40


def test_a_mamba_state_cached_in_this_step_is_no_hit_yet() -> None:
    pool = BlockPool(8)
    group = MambaGroup(0, 16, pool, 16, "align")
    seq = Sequence(0, 40, 2)
    group.allocate(seq, 32)
    group.cache(seq, 32, [11, 12], (39, 0))  # the state after the prompt's last full block
    block = group.tables[seq][1]
    assert pool.cached == {group.key(12): block}
    assert group.num_to_allocate(Sequence(1, 40, 2), 40, [NULL, block], 32, False) > 8
    group.new_step()
    assert group.num_to_allocate(Sequence(1, 40, 2), 40, [NULL, block], 32, False) == 1


def test_one_full_group_is_the_plain_kv_manager() -> None:
    full = [KVGroup(kind="full", block_size=32)]
    for groups in (None, full):
        kv = kv_manager_for(10, 32, True, groups, 0, 64, 0)
        assert type(kv) is KVManager and kv.block_size == 32
    assert type(kv_manager_for(10, 16, False, SWA, 0, 64, 0)) is HybridKV


def test_what_hybrid_groups_refuse() -> None:
    mamba_none = [KVGroup(kind="mamba", block_size=2048, mamba_cache_mode="none"), SWA[1]]
    with pytest.raises(ValueError, match="mode 'none' takes no prefix caching"):
        sched(mamba_none, caching=True)
    with pytest.raises(ValueError, match="no speculative decoding"):
        sched(SWA, num_speculative_tokens=2)
    with pytest.raises(ValueError, match="KV tiers is not simulated with hybrid"):
        sched(SWA, caching=True).attach_tier(KVTier("cpu", 10), 100, 1e9, 0.0)
    with pytest.raises(ValueError, match="swap preemption is not simulated with hybrid"):
        sched(SWA).enable_swap(10, 100, 1e9)


def test_a_scenario_giving_groups_prefix_caching_cannot_run_is_refused_by_its_config() -> None:
    """``scheduler.kv_groups`` given by hand: refused when validated (one line naming the key),
    not when the scheduler is built (a traceback)."""
    from pydantic import ValidationError

    from simulator.scheduling.config import SchedulerConfig

    mixed = [
        {"kind": "full", "block_size": 32},
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 128},
    ]
    with pytest.raises(ValidationError, match=r"kv_groups: .*different block sizes \[16, 32\]"):
        SchedulerConfig(policy="vllm-v1", kv_groups=mixed)
    off = SchedulerConfig(policy="vllm-v1", kv_groups=mixed, enable_prefix_caching=False)
    assert off.kv_groups is not None and len(off.kv_groups) == 2
