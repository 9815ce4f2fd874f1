"""Property-based checks of the scheduler: invariants at every step, termination, FCFS, and
outputs that do not depend on KV pressure, slots or budget (preemption is invisible)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.scheduling.spec import Sequence, SequenceStatus, SpecScheduler
from tests.scheduler_helpers import step

EOS = -1


@dataclass(frozen=True)
class Req:
    arrive_step: int
    prompt_len: int
    max_tokens: int
    eos_at: int | None  # output position that samples EOS, if any


def sampler(reqs: dict[Hashable, Req]):  # type: ignore[no-untyped-def]
    """A token that depends only on (request, position), like a model with fixed seeds."""

    def sample(seq: Sequence) -> int:
        pos = len(seq.output)
        if reqs[seq.seq_id].eos_at == pos:
            return EOS
        return (hash((seq.seq_id, pos)) & 0xFFFF) + 1

    return sample


def run(
    reqs: list[Req], num_blocks: int, block_size: int, budget: int, max_seqs: int, check: bool
) -> tuple[dict[Hashable, list[int]], list[Hashable], SpecScheduler]:
    """Drive a workload to completion; return outputs, first-admission order and the scheduler."""
    by_id: dict[Hashable, Req] = {i: r for i, r in enumerate(reqs)}
    sched = SpecScheduler(num_blocks, block_size, max_seqs, budget, sampler(by_id), EOS)
    pending = sorted(by_id.items(), key=lambda kv: (kv[1].arrive_step, kv[0]))
    added: list[Sequence] = []
    first_admitted: list[Hashable] = []
    seen: set[Hashable] = set()
    t = 0
    limit = 50 + 4 * sum(r.prompt_len + r.max_tokens for r in reqs) * (1 + len(reqs))
    while pending or sched.has_work():
        while pending and pending[0][1].arrive_step <= t:
            i, r = pending.pop(0)
            seq = Sequence(i, r.prompt_len, r.max_tokens)
            sched.add(seq)
            added.append(seq)
        if check:
            plan, _ = step(sched, added)
        else:
            plan = sched.schedule().num_scheduled_tokens
            sched.update()
        for sid in plan:
            if sid not in seen:
                seen.add(sid)
                first_admitted.append(sid)
        t += 1
        assert t < limit, "scheduler made no progress"
    return {s.seq_id: s.output for s in added}, first_admitted, sched


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[Req], int, int, int, int]:
    num_blocks = draw(st.integers(2, 64))
    block_size = draw(st.integers(1, 16))
    budget = draw(st.integers(1, 128))
    max_seqs = draw(st.integers(1, 16))
    capacity = num_blocks * block_size  # tokens of KV the cache can hold
    reqs = []
    for _ in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, max(1, min(capacity, 96))))
        max_tokens = draw(st.integers(1, max(1, min(capacity - prompt + 1, 24))))
        eos_at = draw(st.none() | st.integers(0, max_tokens - 1))
        reqs.append(Req(draw(st.integers(0, 20)), prompt, max_tokens, eos_at))
    return reqs, num_blocks, block_size, budget, max_seqs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_invariants_termination_and_invisible_preemption(
    case: tuple[list[Req], int, int, int, int],
) -> None:
    reqs, num_blocks, block_size, budget, max_seqs = case
    outputs, admitted, sched = run(reqs, num_blocks, block_size, budget, max_seqs, check=True)
    # every sequence finished, and nothing is held
    assert len(sched.finished) == len(reqs)
    assert all(s.status is SequenceStatus.FINISHED for s in sched.finished)
    assert sched.blocks_used == 0 and not sched.running and not sched.waiting
    # each output ends at EOS or max_tokens, exactly
    for i, r in enumerate(reqs):
        want_len = r.max_tokens if r.eos_at is None else r.eos_at + 1
        assert len(outputs[i]) == want_len
    # preemption, slots and budget never change what is generated
    ample, _, ample_sched = run(reqs, 10**6, block_size, 10**6, 10**3, check=False)
    assert outputs == ample
    assert ample_sched.num_preemptions == 0
    # first admissions follow arrival order (ties broken by add order)
    arrival_order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrive_step, i))
    assert admitted == arrival_order
    # the per-sequence counters add up to the scheduler's
    assert sum(s.num_preemptions for s in sched.finished) == sched.num_preemptions


@settings(max_examples=100, deadline=None)
@given(
    num_blocks=st.integers(1, 8),
    block_size=st.integers(1, 8),
    prompt=st.integers(1, 80),
    max_tokens=st.integers(1, 20),
)
def test_add_rejects_exactly_the_sequences_that_can_never_fit(
    num_blocks: int, block_size: int, prompt: int, max_tokens: int
) -> None:
    sched = SpecScheduler(num_blocks, block_size, 4, 64, sample_fn=lambda s: 0)
    fits = -(-(prompt + max_tokens - 1) // block_size) <= num_blocks
    try:
        sched.add(Sequence("s", prompt, max_tokens))
    except ValueError as err:
        assert not fits
        assert "can never fit" in str(err)
    else:
        assert fits


def trace_run(
    reqs: list[Req], num_blocks: int, block_size: int, budget: int, max_seqs: int, fast: bool
) -> tuple[list[tuple[object, ...]], dict[Hashable, list[int]]]:
    """Every step's (plan, blocks used, queue lengths, preemptions) and the final outputs,
    driven through ``decode_step()`` whenever it accepts the step (``fast``) or never."""
    by_id: dict[Hashable, Req] = {i: r for i, r in enumerate(reqs)}
    sample = sampler(by_id)

    def sample_many(seq: Sequence, k: int) -> list[int]:
        out = []
        for _ in range(k):  # the tokens sample() would give at the next k positions
            out.append(sample(seq))
            seq.output.append(out[-1])
        del seq.output[-k:]
        return out

    sched = SpecScheduler(
        num_blocks, block_size, max_seqs, budget, sample, None, sample_many=sample_many
    )
    pending = sorted(by_id.items(), key=lambda kv: (kv[1].arrive_step, kv[0]))
    added: list[Sequence] = []
    trace: list[tuple[object, ...]] = []
    t = 0
    limit = 50 + 4 * sum(r.prompt_len + r.max_tokens for r in reqs) * (1 + len(reqs))
    while pending or sched.has_work():
        assert t < limit, "no progress"
        while pending and pending[0][1].arrive_step <= t:
            i, r = pending.pop(0)
            added.append(Sequence(i, r.prompt_len, r.max_tokens))
            sched.add(added[-1])
        # queue lengths as the engine reads them: without settling deferred steps
        num_running, num_waiting = sched.num_running, sched.num_waiting
        num_seqs, context = sched.decode_step() if fast else (0, 0)
        if num_seqs:
            plan = dict.fromkeys(sched.decode_batch_ids(), 1)
        else:
            step_plan = sched.schedule()
            plan = step_plan.num_scheduled_tokens
            context = sum(step_plan.context_lens)  # the KV tokens they hold before the step
        trace.append((plan, context, sched.blocks_used, num_running, num_waiting))
        trace.append((sched.num_preemptions,))
        done = sched.finish_decode_step() if num_seqs else sched.update()
        trace.append(tuple(s.seq_id for s in done))
        t += 1
    return trace, {s.seq_id: s.output for s in added}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_deferred_decode_steps_equal_scheduled_ones(
    case: tuple[list[Req], int, int, int, int],
) -> None:
    reqs, num_blocks, block_size, budget, max_seqs = case
    reqs = [Req(r.arrive_step, r.prompt_len, r.max_tokens, None) for r in reqs]  # no EOS
    slow = trace_run(reqs, num_blocks, block_size, budget, max_seqs, fast=False)
    fast = trace_run(reqs, num_blocks, block_size, budget, max_seqs, fast=True)
    assert fast == slow


def test_decode_steps_are_deferred_and_settled_exactly() -> None:
    sched = SpecScheduler(
        100,
        4,
        8,
        64,
        lambda s: len(s.output),
        None,
        sample_many=lambda s, k: list(range(len(s.output), len(s.output) + k)),
    )
    for i in range(3):
        sched.add(Sequence(i, 5, 10))
    sched.schedule()
    sched.update()
    seqs = list(sched.running)
    assert sched.decode_step() == (3, 15)  # 3 sequences, 5 tokens each in KV
    assert sched.decode_step() == (3, 18)
    assert seqs[0].num_computed == 5  # deferred: the sequences are not touched yet
    assert sched.blocks_used == 3 * 2  # but blocks are taken at once: 7 tokens need 2 blocks
    # reading the running sequences settles them: public state is never stale
    assert [s.num_computed for s in sched.running] == [7, 7, 7]
    assert sum(s.num_blocks for s in sched.running) == sched.blocks_used
    assert sched.running[0].output == [0, 1, 2]
    assert sched.decode_step() == (3, 21)  # a new deferred run starts from the settled state
    assert sched.schedule().num_scheduled_tokens == {0: 1, 1: 1, 2: 1}
    assert [s.num_computed for s in sched.running] == [8, 8, 8]
    assert sched.running[0].output == [0, 1, 2, 3]
    sched.update()
    # EOS can only be seen by sampling, so a scheduler with one never defers
    eos = SpecScheduler(100, 4, 8, 64, lambda s: 0, 7, sample_many=lambda s, k: [0] * k)
    eos.add(Sequence("x", 5, 10))
    eos.schedule()
    eos.update()
    assert eos.decode_step() == (0, 0)
