"""Every hook a policy of the user's may override (docs/architecture.md, "Adding things";
docs/scheduler.md) gives the same tables with the fast path on and off: the fast path honours
``_victim`` and ``_preempt`` (only a step that preempts calls them, and it takes none) and
declines, visibly (``fast_path_declined``), for a policy overriding any other. Each policy
below changes its run, so a fast path that ignored its override would differ."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import simulator
from simulator.scheduling import StepScheduler, make_scheduler
from simulator.scheduling.config import SchedulerConfig
from simulator.scheduling.fast_step import DECLINED_HOOKS
from tests.test_engine import scenario

POLICIES = '''
from simulator.scheduling.step_scheduler import StepScheduler


class FewestLeftFirst(StepScheduler):
    """Running sequences with the fewest output tokens left are planned first (and preempted
    last)."""

    def _plan_running(self, plan, cap):
        left = lambda s: (s.prompt_len + s.max_tokens - s.num_tokens, s.arrival_order)
        self._running.sort(key=left)
        return super()._plan_running(plan, cap)


class KeepHeadroom(StepScheduler):
    """A sequence that grows leaves 8 blocks free, preempting from the tail for them."""

    def _make_room(self, seq, n, plan):
        fits, refund, dropped = super()._make_room(seq, n, plan)
        while fits and self.blocks.num_free < 8 and self._running[-1] is not seq:
            victim = self._running[-1]
            self._preempt(victim)
            plan.preempted.append(victim)
        return fits, refund, dropped


class EvictLargest(StepScheduler):
    """A preemption takes the sequence holding the most KV."""

    def _victim(self):
        return max(self._running, key=lambda s: (s.num_blocks, s.arrival_order))


class RequeueAtTail(StepScheduler):
    """A preempted sequence waits behind everybody (the spec puts it first)."""

    def _preempt(self, seq):
        super()._preempt(seq)
        self.waiting.remove(seq)
        self.waiting.append(seq)


class SmallChunks(StepScheduler):
    """No sequence computes more than 48 tokens in a step."""

    def _cap(self):
        return 48


class FewAdmissions(StepScheduler):
    """Admissions take at most 96 tokens of a step's budget."""

    def _admit(self, plan, budget, cap):
        super()._admit(plan, min(budget, 96), cap)


def first_tokens_first(running):
    """Sequences that sampled their first token move to the head of the running order."""
    fresh = [s for s in running if s.num_tokens - s.prompt_len == 1]
    running[:] = fresh + [s for s in running if s.num_tokens - s.prompt_len != 1]


class FreshFirst(StepScheduler):
    """``first_tokens_first`` after each step."""

    def update(self):
        done = super().update()
        first_tokens_first(self._running)
        return done


class FreshFirstApplied(StepScheduler):
    """``first_tokens_first`` as a step is applied, before its finished sequences leave."""

    def _apply(self, plan):
        done = super()._apply(plan)
        first_tokens_first(self._running)
        return done


class RotateOnFinish(StepScheduler):
    """Each finish moves the oldest running sequence to the tail of the running order."""

    def _retire(self, seq):
        super()._retire(seq)
        if len(self._running) > 1:
            self._running.append(self._running.pop(0))
'''

HOOKS = {
    "_plan_running": "FewestLeftFirst",
    "_make_room": "KeepHeadroom",
    "_victim": "EvictLargest",
    "_preempt": "RequeueAtTail",
    "_cap": "SmallChunks",
    "_admit": "FewAdmissions",
    "update": "FreshFirst",
    "_apply": "FreshFirstApplied",
    "_retire": "RotateOnFinish",
}
"""Each documented hook and the policy of the user's that overrides it."""

HONOURED = {"_victim", "_preempt"}
"""The hooks the fast path honours: a policy overriding only these takes fast steps."""

TIGHT: dict[str, Any] = {
    "max_num_batched_tokens": 256,
    "max_num_seqs": 32,
    "num_blocks": 120,
    "block_size": 16,
}
"""Little KV and budget: prefills are chunked and sequences are preempted."""


@pytest.fixture
def hookpkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's with one policy per hook; its import path's module part."""
    (tmp_path / "hookpolicies.py").write_text(textwrap.dedent(POLICIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hookpolicies"


def _cfg(policy: str) -> dict[str, Any]:
    cfg = scenario(scheduler={**TIGHT, "policy": policy})
    cfg["workload"]["num_requests"] = 300
    return cfg


def test_every_documented_hook_has_a_policy_here() -> None:
    assert set(DECLINED_HOOKS) - {"schedule"} | HONOURED == set(HOOKS)
    documented = (Path(__file__).parents[1] / "docs" / "scheduler.md").read_text()
    for hook in HOOKS:
        assert f"`{hook}`" in documented


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_hook_gives_the_same_tables_with_the_fast_path_on_and_off(
    hookpkg: str, hook: str
) -> None:
    path = f"{hookpkg}:{HOOKS[hook]}"
    fast = simulator.scenario.runner.run(_cfg(path), fast_decode=True)
    plain = simulator.scenario.runner.run(_cfg(path), fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, plain.steps, check_exact=True)
    assert fast.requests["finish_s"].notna().all()
    # the override changes the run: a fast path that skipped it would not give these tables
    spec = simulator.scenario.runner.run(_cfg("spec"), fast_decode=False)
    assert len(spec.steps) != len(plain.steps) or not spec.requests.equals(plain.requests)


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_the_fast_path_declines_visibly_for_a_hook_it_cannot_honour(
    hookpkg: str, hook: str
) -> None:
    cfg = SchedulerConfig(**TIGHT, policy=f"{hookpkg}:{HOOKS[hook]}")
    sched = make_scheduler(cfg)
    assert isinstance(sched, StepScheduler)
    if hook in HONOURED:
        assert sched.fast_path_declined is None
        return
    assert sched.fast_path_declined == (
        f"{HOOKS[hook]} overrides {hook}, which the fast path cannot honour"
    )
    assert sched.fast_step() is None and sched.decode_stretch() is None


def test_the_built_in_policies_take_fast_steps() -> None:
    for policy in ("spec", "vllm-v1"):
        sched = make_scheduler(SchedulerConfig(**TIGHT, policy=policy))
        assert isinstance(sched, StepScheduler) and sched.fast_path_declined is None


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_hook_gives_the_same_tables_with_the_fast_path_on_and_off_async(
    hookpkg: str, hook: str
) -> None:
    """The same under async scheduling (vLLM's default), where the fast path plans ahead and
    takes decode stretches (``fast_async.py``): its policy's hooks honoured, or declined."""
    cfg = _cfg(f"{hookpkg}:{HOOKS[hook]}")
    cfg["scheduler"]["async_scheduling"] = True
    fast = simulator.scenario.runner.run(cfg, fast_decode=True)
    plain = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, plain.steps, check_exact=True)
    assert fast.requests["finish_s"].notna().all()
