"""Hand-checked rules of speculative decoding and async scheduling in the one scheduler
(vLLM 0.33's, as tools/vllm_recorder/README.md states them; the recorded cases check them at
scale in test_spec_async_replay.py)."""

from __future__ import annotations

import pytest

from simulator.scheduling import Sequence, StepScheduler


def always(a: int):  # type: ignore[no-untyped-def]
    return lambda seq, d: min(a, d)


def sched(**flags: object) -> StepScheduler:
    return StepScheduler.vllm_v1(100, 4, 8, 64, enable_prefix_caching=False, **flags)  # type: ignore[arg-type]


def test_a_decode_verifies_k_drafts_and_gains_the_accepted_plus_one() -> None:
    s = sched(num_speculative_tokens=3, accept=always(2))
    seq = Sequence(0, 10, 20)
    s.add(seq)
    first = s.schedule()
    assert first.num_scheduled_tokens == {0: 10} and not first.drafts  # prefill: no drafts
    s.update()
    assert seq.num_output == 1 and seq.spec_drafts == 3
    plan = s.schedule()
    assert plan.num_scheduled_tokens == {0: 4} and plan.drafts == {seq: 3}
    assert seq.num_blocks == 4  # KV slots for 10 + 1 + 3 tokens
    s.update()
    assert plan.accepted == {seq: 2} and plan.num_extra_tokens == 2
    assert seq.num_output == 4 and seq.num_computed == seq.num_tokens - 1
    assert seq.num_blocks == 4  # the rejected slot's block stays


def test_a_request_never_emits_more_than_its_output_length() -> None:
    s = sched(num_speculative_tokens=4, accept=always(4))
    seq = Sequence(0, 3, 7)
    s.add(seq)
    done = []
    while not done:
        s.schedule()
        done = s.update()
    assert seq.num_output == 7  # 1 from the prefill, then 5 of the 4 + 1, then 1 of 5


def test_drafts_are_tokens_of_the_budget_and_a_cut_decode_verifies_fewer() -> None:
    s = StepScheduler.vllm_v1(100, 4, 8, 6, num_speculative_tokens=3, accept=always(0))
    a, b = Sequence(0, 2, 50), Sequence(1, 2, 50)
    s.add(a)
    s.add(b)
    s.schedule()
    s.update()
    plan = s.schedule()  # a takes 1 + 3, b the 2 left: 1 + 1 draft
    assert plan.num_scheduled_tokens == {0: 4, 1: 2} and plan.drafts == {a: 3, b: 1}


def test_async_plans_the_next_step_before_the_last_is_applied() -> None:
    s = sched(async_scheduling=True, num_speculative_tokens=2, accept=always(1))
    seq = Sequence(0, 8, 4)
    s.add(seq)
    first = s.schedule()  # the prefill, sampling: one placeholder
    assert seq.placeholders == 1 and seq.spec_drafts == 2
    second = s.schedule()  # planned as if the prefill's token were known: 1 + 2 tokens
    assert second.num_scheduled_tokens == {0: 3} and second.drafts == {seq: 2}
    assert seq.placeholders == 4 and s.num_in_flight == 2
    assert s.update() == [] and first.sampled == [seq]  # the oldest plan: the prefill
    assert seq.num_output == 1 and seq.placeholders == 3
    assert s.update() == [] and second.accepted == {seq: 1} and seq.num_output == 3
    assert seq.placeholders == 0 and seq.num_computed == seq.num_tokens - 1
    s.schedule()
    assert s.update() == [seq] and seq.num_output == 4  # 1 + 1 accepted, cut at max_tokens
    assert not s.has_work()


def test_async_does_not_plan_a_step_past_a_sure_max_tokens() -> None:
    """vLLM skips a request whose steps in flight reach ``max_tokens`` even if every draft
    is rejected (``num_computed + 2 - placeholders >= prompt + max_tokens``)."""
    s = sched(async_scheduling=True)
    seq = Sequence(0, 8, 1)
    s.add(seq)
    s.schedule()
    assert len(s.schedule()) == 0 and s.has_requests()
    assert s.update() == [seq]
    assert s.has_requests()  # finished, not yet reported: vLLM schedules once more
    s.update()
    assert len(s.schedule()) == 0 and not s.has_requests()
    s.update()
    assert not s.has_work()


def test_update_without_a_plan_is_an_error_in_both_modes() -> None:
    for flags in ({}, {"async_scheduling": True}):
        with pytest.raises(RuntimeError):
            sched(**flags).update()


def test_a_negative_k_is_refused() -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        sched(num_speculative_tokens=-1)


def test_drafts_stop_at_max_model_len_minus_one_as_vllm_caps_them() -> None:
    # vLLM: num_new_tokens <= max_model_len - 1 - num_computed (sched.py:852-856)
    s = sched(num_speculative_tokens=3, accept=always(3), max_model_len=14)
    seq = Sequence(0, 10, 4)  # 14 tokens in all: within the limit
    s.add(seq)
    s.schedule()
    s.update()  # 11 tokens, 10 computed
    plan = s.schedule()
    assert plan.num_scheduled_tokens == {0: 3} and plan.drafts == {seq: 2}  # 13 - 10
    assert s.update() == [seq] and seq.num_output == 4


def run_until_done(s: StepScheduler, limit: int = 20) -> int:
    """Steps until a sequence finishes; fails if none does within ``limit`` steps."""
    for step in range(1, limit + 1):
        s.schedule()
        if s.update():
            return step
    raise AssertionError(f"nothing finished in {limit} steps")


def test_drafts_never_outgrow_the_cache_so_a_request_that_fits_is_served() -> None:
    # 4 blocks of 4: a 16-token request fits, but a last decode with 3 drafts would need 18
    # slots; with no max_model_len the cache is the limit (vLLM's is never above it)
    s = StepScheduler.vllm_v1(4, 4, 8, 64, num_speculative_tokens=3, accept=always(0))
    seq = Sequence(0, 12, 5)
    s.add(seq)
    run_until_done(s)
    assert seq.num_output == 5 and s.num_preemptions == 0


def test_a_hit_whose_padded_admission_cannot_fit_is_admitted_unpadded() -> None:
    # a prefix hit covering all but the last token pads an admission to 1 + k rows: 12 + 5
    # slots, more than the 4-block cache holds; it runs its one token instead
    s = StepScheduler.vllm_v1(4, 4, 8, 64, num_speculative_tokens=4, accept=always(0))
    a = Sequence(0, 13, 1, prompt_runs=((0, 13),))
    b = Sequence(1, 13, 1, prompt_runs=((0, 13),))
    s.add(a)
    run_until_done(s)
    s.add(b)
    plan = s.schedule()
    assert plan.num_scheduled_tokens == {1: 1} and not plan.drafts
    assert s.update() == [b] and b.num_cached_tokens == 12
