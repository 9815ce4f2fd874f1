"""Where the fast path does not go, it declines, and the tables are still the plain path's:
random whole scenarios (``test_fast_path_props``) with speculative decoding, data-parallel
ranks or a KV tier below the GPU's, async scheduling on or off (a tier: off), give the
requests and step tables of ``fast_decode=False`` bit for bit; a speculative scheduler offers
no fast step and no decode stretch at any step, and a scheduler with a KV tier says it moves
KV (the server then takes no fast window: ``Server``), so neither is skipped but checked."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import simulator.scenario.runner
from simulator.scheduling import Sequence, StepScheduler, make_scheduler
from tests import test_fast_path_props as props


@st.composite
def declined_scenario(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A one-server scenario of ``test_fast_path_props`` under ``vllm-v1`` with speculation,
    data-parallel ranks or a CPU tier of KV, async scheduling on or off."""
    cfg = draw(props.whole_scenario())
    assume("cluster" not in cfg and "max_concurrency_schedule" not in cfg["workload"])
    sched = cfg["scheduler"]
    sched.update(policy="vllm-v1", async_scheduling=draw(st.booleans()))
    kind = draw(st.sampled_from(["speculation", "dp", "kv_tier"]))
    if kind == "speculation":
        rate = draw(st.sampled_from([0.0, 0.6, 1.0]))
        k = draw(st.integers(1, 3))
        cfg["speculative"] = {"num_speculative_tokens": k, "acceptance": {"rate": rate}}
    elif kind == "dp":
        cfg["parallel"] = {"data_parallel_size": draw(st.integers(2, 3))}
    else:  # (not with async scheduling yet: the scenario refuses it)
        sched.update(enable_prefix_caching=True, async_scheduling=False)
        sched["kv_offload"] = {
            "cpu": {"size_gb": 0.01, "bandwidth_gb_s": 50, "host_memory_gb": 1},
            "kv_bytes_per_token": 4096,
        }
    return kind, cfg


def _declines(cfg: dict[str, Any], kind: str) -> None:
    """The scheduler of ``cfg`` offers no fast step or stretch (speculation) at any step of a
    few requests run through ``schedule()`` and ``update()``, or moves KV (a tier)."""
    resolved = simulator.scenario.runner.resolve(cfg)
    sched = make_scheduler(
        resolved.scheduler,
        speculative=resolved.speculative,
        rng=simulator.scenario.runner.acceptance_rng(resolved),
    )
    assert isinstance(sched, StepScheduler)
    if kind == "kv_tier":
        assert sched.moves_kv
        return
    for i in range(4):
        sched.add(Sequence(i, 5 + 7 * i, 6))
    steps = 0
    while sched.has_work() and steps < 200:
        assert sched.fast_step() is None and sched.decode_stretch() is None
        sched.schedule()
        sched.update()
        steps += 1
    assert steps > 2 and not sched.has_work()  # a prefill, then decodes that verify drafts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(declined_scenario())
def test_speculation_dp_ranks_and_kv_tiers_decline_the_fast_path_and_match_it(
    case: tuple[str, dict[str, Any]],
) -> None:
    kind, cfg = case
    props.test_the_fast_path_is_the_plain_path.hypothesis.inner_test(cfg)  # type: ignore[attr-defined]
    if kind != "dp":  # a lockstep rank steps through schedule() and update() (lockstep.py)
        _declines(cfg, kind)
