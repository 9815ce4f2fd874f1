"""Fast steps under async scheduling (``scheduling/fast_async.py``) are the plain steps: on
random workloads, both policies, prefix caching on and off, every plan (who, how many tokens,
on how much KV), every application (who sampled, who finished), the KV blocks used and cached
and the queue lengths are the same call for call, whether each step is taken by
``fast_step()`` whenever it can or always by ``schedule()``, driven as the engine drives an
async scheduler (step ``n + 1`` planned before step ``n`` is applied) and as vLLM's engine
loop with its queue of two batches (``validation/scheduler_calls.py``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import simulator.scenario.runner
from simulator.scheduling import Sequence, StepScheduler
from simulator.scheduling.interface import StepPlan
from tests import test_fast_path_props as props
from tests.test_engine import scenario
from tests.test_policy_hooks import TIGHT
from tests.test_scheduler_props import POLICIES, Policy, Req, sequence
from tests.test_scheduler_props import scenario as workload

Trace = list[tuple[object, ...]]


def _make(policy: Policy, size: tuple[int, int, int, int], tokens: bool) -> StepScheduler:
    num_blocks, block_size, budget, max_seqs = size

    def sample(seq: Sequence) -> int:
        return (hash((seq.seq_id, len(seq.output))) & 0xFFFF) + 1

    def sample_many(seq: Sequence, k: int) -> list[int]:
        n = len(seq.output)
        return [(hash((seq.seq_id, n + j)) & 0xFFFF) + 1 for j in range(k)]

    flags: dict[str, Any] = {"enable_prefix_caching": policy.caching, "async_scheduling": True}
    if policy.name == "vllm-v1":
        flags.update(
            admit_after_preemption=False,
            priority=policy.priority,
            reserve_full_isl=policy.reserve,
            long_prefill_token_threshold=policy.threshold,
        )
    many = sample_many if tokens else None
    return StepScheduler(
        num_blocks,
        block_size,
        max_seqs,
        budget,
        sample if tokens else None,
        sample_many=many,
        **flags,
    )


class Driver:
    """One scheduler driven call by call, tracing what each call did."""

    def __init__(self, sched: StepScheduler, fast: bool) -> None:
        self.sched, self.fast, self.trace = sched, fast, []  # type: Trace
        self.num_fast = 0
        self._was_fast = False

    def plan(self) -> tuple[StepPlan, list[Hashable], bool]:
        sched = self.sched
        running, waiting = sched.num_running, sched.num_waiting
        plan = sched.fast_step() if self.fast else None
        members: list[Hashable] = []
        self._was_fast = plan is not None
        if plan is not None:
            members = sched.decode_batch_ids()
            assert len(members) == plan.num_deferred
            self.num_fast += 1
        else:
            plan = sched.schedule()
        scheduled = [(i, 1) for i in members] + list(plan.num_scheduled_tokens.items())
        context = plan.deferred_context + sum(plan.context_lens)
        self.trace.append(
            (
                "plan",
                scheduled,
                context,
                plan.cached_tokens,
                [s.seq_id for s in plan.preempted],
                sched.num_blocks_used,
                sched.num_cached_blocks,
                running,
                waiting,
            )
        )
        return plan, members, bool(members) or plan.num_deferred > 0 or self._was_fast

    def apply(self, planned: tuple[StepPlan, list[Hashable], bool]) -> None:
        sched = self.sched
        plan, members, fast = planned
        done = sched.finish_fast_step() if fast else sched.update()
        sampled = (members if plan.num_deferred else []) + [s.seq_id for s in plan.sampled]
        self.trace.append(
            (
                "apply",
                sorted(s.seq_id for s in done),  # type: ignore[type-var]
                sampled,
                sched.num_blocks_used,
                sched.num_cached_blocks,
            )
        )


def drive(reqs: list[Req], sched: StepScheduler, fast: bool, vllm_loop: bool) -> Driver:
    """Every call until all requests finish."""
    driver = Driver(sched, fast)
    pending = sorted(enumerate(reqs), key=lambda kv: (kv[1].arrive_step, kv[0]))
    added: list[Sequence] = []
    queue: deque[tuple[StepPlan, list[Hashable], bool]] = deque()
    limit = 50 + 4 * sum(r.prompt_len + r.max_tokens for r in reqs) * (1 + len(reqs))
    t = 0
    while pending or sched.has_work():
        assert t < limit, "no progress"
        while pending and pending[0][1].arrive_step <= t:
            i, r = pending.pop(0)
            added.append(sequence(i, r))
            sched.add(added[-1])
        t += 1
        if vllm_loop:  # EngineCore.step_with_batch_queue
            if sched.has_requests():
                queue.append(driver.plan())
                if len(queue) < 2 and (queue[-1][0] or sched.has_requests()):
                    continue
            elif not queue:
                continue
            driver.apply(queue.popleft())
        else:  # the timed engine: the next step is planned as the current one starts
            current = queue.popleft() if queue else driver.plan()
            if sched.has_requests():
                queue.append(driver.plan())
            driver.apply(current)
    driver.trace.append(tuple((s.seq_id, s.num_output, tuple(s.output)) for s in added))
    return driver


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload(), POLICIES, st.booleans(), st.booleans())
def test_async_fast_steps_equal_scheduled_ones(
    case: tuple[list[Req], int, int, int, int], policy: Policy, tokens: bool, vllm_loop: bool
) -> None:
    reqs, *size = case
    reqs = [Req(r.arrive_step, r.prompt_len, r.max_tokens, None, r.priority, r.runs) for r in reqs]
    shape = (size[0], size[1], size[2], size[3])
    plain = drive(reqs, _make(policy, shape, tokens), False, vllm_loop)
    fast = drive(reqs, _make(policy, shape, tokens), True, vllm_loop)
    assert fast.trace == plain.trace


def test_most_async_steps_are_fast_and_the_group_spans_both_plans_in_flight() -> None:
    # 12 requests decoding side by side: after their prefills nearly every step is fast
    reqs = [Req(i // 4, 20 + i, 30, None) for i in range(12)]
    for caching in (False, True):
        for vllm_loop in (False, True):
            plain = drive(
                reqs, _make(Policy("vllm-v1", caching), (200, 4, 64, 16), True), False, vllm_loop
            )
            fast = drive(
                reqs, _make(Policy("vllm-v1", caching), (200, 4, 64, 16), True), True, vllm_loop
            )
            assert fast.trace == plain.trace
            plans = sum(1 for x in fast.trace if x[0] == "plan")
            assert fast.num_fast > 0.8 * plans


def test_a_plain_step_writes_the_group_into_the_fast_plan_in_flight() -> None:
    sched = _make(Policy("vllm-v1", False), (100, 4, 64, 8), True)
    a, b = Sequence(0, 4, 10), Sequence(1, 4, 10)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()  # both prefill; nothing in flight before it
    second = sched.fast_step()  # both decode their placeholder, as a group
    assert second is not None and second.num_deferred == 2 and not second.seqs
    sched.update()  # the first step applied
    third = sched.schedule()  # a plain plan: the group is written into the second
    assert second.num_deferred == 0 and second.seqs == [a, b] and second.num_new_tokens == [1, 1]
    assert second.context_lens == [4, 4] and second.sampling == {a, b}
    assert [s.seq_id for s in third.seqs] == [0, 1] and third.context_lens == [5, 5]
    assert sched.finish_fast_step() == []  # applies the second, now a plain plan
    assert second.sampled == [a, b] and a.num_output == 2
    assert first.sampled == [a, b]


@pytest.mark.parametrize(
    "variant", ["cache", "no-cache", "shared-prefix", "closed-loop", "serving", "block-of-1"]
)
def test_an_async_run_gives_the_tables_of_the_plain_path(variant: str) -> None:
    cfg = scenario(scheduler={**TIGHT, "policy": "vllm-v1", "async_scheduling": True})
    cfg["workload"]["num_requests"] = 300
    sched, workload = cfg["scheduler"], cfg["workload"]
    if variant == "no-cache":
        sched["enable_prefix_caching"] = False
    elif variant == "shared-prefix":
        workload["shared_prefix"] = {"num_prefixes": 3, "prefix_len": 64, "users_per_prefix": 4}
    elif variant == "closed-loop":
        workload["max_concurrency"] = 12
    elif variant == "serving":
        cfg["serving"] = {"step_cpu_ms": 2.5, "step_cpu_per_seq_us": 40.0}
    elif variant == "block-of-1":
        sched.update(block_size=1, num_blocks=4000)
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    plain = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, plain.steps, check_exact=True)
    assert fast.requests["finish_s"].notna().all()


@st.composite
def async_scenario(draw: st.DrawFn) -> dict[str, Any]:
    """A random whole scenario of ``test_fast_path_props`` on one server, async."""
    cfg = draw(props.whole_scenario())
    assume("cluster" not in cfg)
    cfg["scheduler"].update(policy="vllm-v1", async_scheduling=True)
    return cfg


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(async_scenario())
def test_async_runs_give_the_tables_of_the_plain_path(cfg: dict[str, Any]) -> None:
    """Whole runs (open and closed loops, serving overheads, prefix caching on and off with
    shared prompts): async steps taken back to back under one timeout where no arrival comes
    give the tables, checksums and summary of one timeout per step, bit for bit."""
    props.test_the_fast_path_is_the_plain_path.hypothesis.inner_test(cfg)  # type: ignore[attr-defined]
