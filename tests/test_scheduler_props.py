"""Property-based checks of every policy (spec and vllm-v1, prefix caching on and off):
invariants at every step (the spec's and the block manager's), termination, FCFS, outputs
that do not depend on KV pressure, slots or budget (preemption is invisible), deferred decode
steps identical to scheduled ones, and vllm-v1 equal to spec where their rules coincide."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from itertools import islice

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.scheduling import Sequence, SequenceStatus, StepScheduler
from simulator.scheduling.interface import DecodeStretch
from simulator.scheduling.kv_manager import KVManager
from simulator.scheduling.sequence import PromptRuns
from tests.scheduler_helpers import AnyScheduler, step

EOS = -1


@dataclass(frozen=True)
class Req:
    arrive_step: int
    prompt_len: int
    max_tokens: int
    eos_at: int | None  # output position that samples EOS, if any
    priority: int = 0
    runs: PromptRuns | None = None  # token identity (shared prefixes), None = unique


@dataclass(frozen=True)
class Policy:
    """A policy and its switches."""

    name: str = "spec"
    caching: bool = False
    priority: bool = False
    reserve: bool = True
    threshold: int = 0

    @property
    def fcfs(self) -> bool:
        return not self.priority

    def make(
        self,
        num_blocks: int,
        block_size: int,
        max_seqs: int,
        budget: int,
        sample: Callable[[Sequence], int],
        eos: int | None,
        sample_many: Callable[[Sequence, int], list[int]] | None = None,
    ) -> AnyScheduler:
        if self.name == "spec":
            return StepScheduler(
                num_blocks,
                block_size,
                max_seqs,
                budget,
                sample,
                eos,
                sample_many=sample_many,
                enable_prefix_caching=self.caching,
            )
        return StepScheduler.vllm_v1(
            num_blocks,
            block_size,
            max_seqs,
            budget,
            sample,
            eos,
            priority=self.priority,
            reserve_full_isl=self.reserve,
            long_prefill_token_threshold=self.threshold,
            enable_prefix_caching=self.caching,
            sample_many=sample_many,
        )


POLICIES = st.one_of(
    st.builds(Policy, name=st.just("spec"), caching=st.booleans()),
    st.builds(
        Policy,
        name=st.just("vllm-v1"),
        caching=st.booleans(),
        priority=st.booleans(),
        reserve=st.booleans(),
        threshold=st.sampled_from([0, 0, 1, 3, 16]),
    ),
)


def sampler(reqs: dict[Hashable, Req]) -> Callable[[Sequence], int]:
    """A token that depends only on (request, position), like a model with fixed seeds."""

    def sample(seq: Sequence) -> int:
        pos = len(seq.output)
        if reqs[seq.seq_id].eos_at == pos:
            return EOS
        return (hash((seq.seq_id, pos)) & 0xFFFF) + 1

    return sample


def sequence(i: int, r: Req) -> Sequence:
    return Sequence(i, r.prompt_len, r.max_tokens, priority=r.priority, prompt_runs=r.runs)


def run(
    reqs: list[Req],
    num_blocks: int,
    block_size: int,
    budget: int,
    max_seqs: int,
    check: bool,
    policy: Policy = Policy(),
) -> tuple[dict[Hashable, list[int]], list[Hashable], AnyScheduler]:
    """Drive a workload to completion; return outputs, first-admission order and the scheduler."""
    by_id: dict[Hashable, Req] = {i: r for i, r in enumerate(reqs)}
    sched = policy.make(num_blocks, block_size, max_seqs, budget, sampler(by_id), EOS)
    pending = sorted(by_id.items(), key=lambda kv: (kv[1].arrive_step, kv[0]))
    added: list[Sequence] = []
    first_admitted: list[Hashable] = []
    seen: set[Hashable] = set()
    t = 0
    limit = 50 + 4 * sum(r.prompt_len + r.max_tokens for r in reqs) * (1 + len(reqs))
    while pending or sched.has_work():
        while pending and pending[0][1].arrive_step <= t:
            i, r = pending.pop(0)
            seq = sequence(i, r)  # type: ignore[arg-type]
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
    # a few shared prefixes (system prompts), some a whole prompt (repeated prompts)
    prefixes = draw(st.lists(st.integers(1, 40), max_size=3))
    reqs = []
    for i in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, max(1, min(capacity, 96))))
        max_tokens = draw(st.integers(1, max(1, min(capacity - prompt + 1, 24))))
        eos_at = draw(st.none() | st.integers(0, max_tokens - 1))
        runs: PromptRuns | None = None
        k = draw(st.integers(-1, len(prefixes) - 1))
        if k >= 0 and prefixes[k] <= prompt:
            rest = prompt - prefixes[k]
            runs = ((k, prefixes[k]),) + (((100 + i, rest),) if rest else ())
        priority = draw(st.integers(-2, 2))
        reqs.append(Req(draw(st.integers(0, 20)), prompt, max_tokens, eos_at, priority, runs))
    return reqs, num_blocks, block_size, budget, max_seqs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), POLICIES)
def test_invariants_termination_and_invisible_preemption(
    case: tuple[list[Req], int, int, int, int], policy: Policy
) -> None:
    reqs, num_blocks, block_size, budget, max_seqs = case
    outputs, admitted, sched = run(reqs, num_blocks, block_size, budget, max_seqs, True, policy)
    # every sequence finished, and nothing is held
    assert len(sched.finished) == len(reqs)
    assert all(s.status is SequenceStatus.FINISHED for s in sched.finished)
    assert sched.blocks_used == 0 and not sched.running and not len(sched.waiting)
    # each output ends at EOS or max_tokens, exactly
    for i, r in enumerate(reqs):
        want_len = r.max_tokens if r.eos_at is None else r.eos_at + 1
        assert len(outputs[i]) == want_len
    # preemption, slots, budget and the prefix cache never change what is generated
    ample, _, ample_sched = run(reqs, 10**6, block_size, 10**6, 10**3, check=False)
    assert outputs == ample
    assert ample_sched.num_preemptions == 0
    if policy.fcfs:  # first admissions follow arrival order (ties broken by add order)
        arrival_order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrive_step, i))
        assert admitted == arrival_order
    # the per-sequence counters add up to the scheduler's
    assert sum(s.num_preemptions for s in sched.finished) == sched.num_preemptions
    # a first hit is whole blocks and leaves at least the last prompt token to compute
    for s in sched.finished:
        assert s.num_cached_tokens % block_size == 0
        assert 0 <= s.num_cached_tokens <= s.prompt_len - 1
        if not policy.caching:
            assert s.num_cached_tokens == 0


@settings(max_examples=100, deadline=None)
@given(
    num_blocks=st.integers(1, 8),
    block_size=st.integers(1, 8),
    prompt=st.integers(1, 80),
    max_tokens=st.integers(1, 20),
    policy=POLICIES,
)
def test_add_rejects_exactly_the_sequences_that_can_never_fit(
    num_blocks: int, block_size: int, prompt: int, max_tokens: int, policy: Policy
) -> None:
    sched = policy.make(num_blocks, block_size, 4, 64, lambda s: 0, None)
    fits = -(-(prompt + max_tokens - 1) // block_size) <= num_blocks
    try:
        sched.add(Sequence(0, prompt, max_tokens))
    except ValueError as err:
        assert not fits
        assert "can never fit" in str(err)
    else:
        assert fits


def trace_run(
    reqs: list[Req],
    num_blocks: int,
    block_size: int,
    budget: int,
    max_seqs: int,
    fast: bool,
    policy: Policy = Policy(),
    *,
    tokens: bool = True,
    peek_every: int = 0,
) -> tuple[list[tuple[object, ...]], dict[Hashable, tuple[int, list[int]]]]:
    """Every step's (plan, context, blocks used, cached blocks, queue lengths, hits, who
    sampled), preemptions and finished, and the final (token count, output) of each request,
    driven through ``fast_step()`` whenever it accepts the step (``fast``) or never.
    ``tokens``: give the scheduler a sampler (else it only counts tokens). ``peek_every``:
    read the running sequences (which settles deferred steps) every that many steps."""
    by_id: dict[Hashable, Req] = {i: r for i, r in enumerate(reqs)}
    sample = sampler(by_id)

    def sample_many(seq: Sequence, k: int) -> list[int]:
        out = []
        for _ in range(k):  # the tokens sample() would give at the next k positions
            out.append(sample(seq))
            seq.output.append(out[-1])
        del seq.output[-k:]
        return out

    if tokens:
        sched = policy.make(num_blocks, block_size, max_seqs, budget, sample, None, sample_many)
    else:
        sched = policy.make(num_blocks, block_size, max_seqs, budget, None, None)  # type: ignore[arg-type]
    pending = sorted(by_id.items(), key=lambda kv: (kv[1].arrive_step, kv[0]))
    added: list[Sequence] = []
    trace: list[tuple[object, ...]] = []
    t = 0
    limit = 50 + 4 * sum(r.prompt_len + r.max_tokens for r in reqs) * (1 + len(reqs))
    while pending or sched.has_work():
        assert t < limit, "no progress"
        while pending and pending[0][1].arrive_step <= t:
            i, r = pending.pop(0)
            added.append(sequence(i, r))  # type: ignore[arg-type]
            sched.add(added[-1])
        stretch = sched.decode_stretch() if fast else None
        if stretch is not None:  # up to the next arrival or peek, at most 1 to 5 steps
            k = min(1 + t % 5, pending[0][1].arrive_step - t if pending else limit)
            if peek_every:
                k = min(k, peek_every - t % peek_every)
            t += take_stretch(sched, stretch, k, trace)
            if peek_every and t % peek_every == 0:
                trace.append(tuple((s.seq_id, s.num_computed, s.num_blocks) for s in sched.running))
            continue
        # queue lengths as the engine reads them: without settling deferred steps
        num_running, num_waiting = sched.num_running, sched.num_waiting
        fast_plan = sched.fast_step() if fast else None
        group: list[Hashable] = []
        if fast_plan is not None:
            step_plan = fast_plan
            group = sched.decode_batch_ids()
            assert len(group) == step_plan.num_deferred
        else:
            step_plan = sched.schedule()
        plan = [(i, 1) for i in group] + list(step_plan.num_scheduled_tokens.items())
        # the KV tokens they hold before the step
        context = step_plan.deferred_context + sum(step_plan.context_lens)
        used, cached = sched.num_blocks_used, sched.num_cached_blocks
        hits = step_plan.cached_tokens
        trace.append((plan, context, used, cached, num_running, num_waiting, hits))
        trace.append((sched.num_preemptions,))
        done = sched.finish_fast_step() if fast_plan is not None else sched.update()
        sampled = group + [s.seq_id for s in step_plan.sampled]
        trace.append((tuple(s.seq_id for s in done), sched.num_blocks_used, sampled))
        t += 1
        if peek_every and t % peek_every == 0:
            trace.append(tuple((s.seq_id, s.num_computed, s.num_blocks) for s in sched.running))
    return trace, {s.seq_id: (s.num_output, s.output) for s in added}


def take_stretch(
    sched: AnyScheduler, stretch: DecodeStretch, k: int, trace: list[tuple[object, ...]]
) -> int:
    """Take up to ``k`` steps of ``stretch`` at once; add to ``trace`` what stepping one by
    one would have (its steps only say how many decode and finish); return the steps taken."""
    group = sched.decode_batch_ids()
    each_step = (
        (m, context, used, finishing if j == len(contexts) - 1 else 0, kept)
        for m, contexts, used_each, finishing, kept in stretch.segments
        for j, (context, used) in enumerate(zip(contexts, used_each, strict=True))
    )
    steps = list(islice(each_step, k))
    finished = dict(sched.take_decodes(len(steps)))
    for j, (m, context, used, finishing, kept) in enumerate(steps):
        assert m == len(group)
        # a step takes blank blocks first: the cache keeps what is left of the free ones
        cached = min(kept, stretch.num_blocks - used) if stretch.num_blocks else kept
        trace.append(([(i, 1) for i in group], context, used, cached, m, 0, []))
        trace.append((sched.num_preemptions,))
        done = finished.get(j, [])
        assert finishing == len(done)
        freed = sum(sched.blocks_for(s.num_computed) for s in done)
        trace.append((tuple(s.seq_id for s in done), used - freed, list(group)))
        group = [i for i in group if i not in {s.seq_id for s in done}]
    return len(steps)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), POLICIES, st.booleans(), st.sampled_from([0, 0, 1, 3]))
def test_fast_steps_equal_scheduled_ones(
    case: tuple[list[Req], int, int, int, int], policy: Policy, tokens: bool, peek_every: int
) -> None:
    """Step for step, ``fast_step()`` plans what ``schedule()`` does, leaves the same state,
    and samples the same tokens (or, without a sampler, counts them alike), whether or not
    the running sequences are read (settled) along the way."""
    reqs, num_blocks, block_size, budget, max_seqs = case
    reqs = [replace(r, eos_at=None) for r in reqs]  # no EOS
    args = (reqs, num_blocks, block_size, budget, max_seqs)
    slow_trace, slow_out = trace_run(*args, False, policy, peek_every=peek_every)
    fast_trace, fast_out = trace_run(*args, True, policy, tokens=tokens, peek_every=peek_every)
    assert fast_trace == slow_trace
    if tokens:
        assert fast_out == slow_out
    else:
        assert {i: n for i, (n, _) in fast_out.items()} == {i: n for i, (n, _) in slow_out.items()}
        assert all(not out for _, out in fast_out.values())
    for i, r in enumerate(reqs):
        assert slow_out[i][0] == r.max_tokens == len(slow_out[i][1])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.booleans())
def test_vllm_v1_equals_spec_where_their_rules_coincide(
    case: tuple[list[Req], int, int, int, int], caching: bool
) -> None:
    """With KV for everybody (no preemption), no full-prompt reservation, no threshold and
    FCFS, the two policies plan every step alike, prefix cache or not."""
    reqs, _, block_size, budget, max_seqs = case
    ample = sum(-(-(r.prompt_len + r.max_tokens) // block_size) for r in reqs)
    spec = trace_run(reqs, ample, block_size, budget, max_seqs, False, Policy("spec", caching))
    vllm = Policy("vllm-v1", caching, reserve=False)
    assert trace_run(reqs, ample, block_size, budget, max_seqs, False, vllm) == spec


def test_decode_steps_are_deferred_and_settled_exactly() -> None:
    sched = StepScheduler(
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

    def fast() -> tuple[int, int, int]:
        plan = sched.fast_step()
        assert plan is not None
        sched.finish_fast_step()
        return plan.num_deferred, plan.deferred_context, len(plan.seqs)

    assert fast() == (3, 15, 0)  # 3 sequences, 5 tokens each in KV, nobody else
    assert fast() == (3, 18, 0)
    assert seqs[0].num_computed == 5  # deferred: the sequences are not touched yet
    assert sched.blocks_used == 3 * 2  # but blocks are taken at once: 7 tokens need 2 blocks
    # reading the running sequences settles them: public state is never stale
    assert [s.num_computed for s in sched.running] == [7, 7, 7]
    assert sum(s.num_blocks for s in sched.running) == sched.blocks_used
    assert sched.running[0].output == [0, 1, 2]
    assert fast() == (3, 21, 0)  # the group goes on from the settled state
    assert sched.schedule().num_scheduled_tokens == {0: 1, 1: 1, 2: 1}
    assert [s.num_computed for s in sched.running] == [8, 8, 8]
    assert sched.running[0].output == [0, 1, 2, 3]
    sched.update()
    # EOS can only be seen by sampling, so a scheduler with one never defers
    eos = StepScheduler(100, 4, 8, 64, lambda s: 0, 7, sample_many=lambda s, k: [0] * k)
    eos.add(Sequence(0, 5, 10))
    eos.schedule()
    eos.update()
    assert eos.fast_step() is None
    with pytest.raises(ValueError, match="sample_fn"):
        StepScheduler(100, 4, 8, 64, None, 7)


def test_a_fast_step_admits_and_prefills_beside_the_group() -> None:
    """Arrivals are admitted, and prefills go on, in a fast step; a sequence that samples
    joins the group behind it; no tokens are kept without a sampler, only counted."""
    sched = StepScheduler(100, 4, 8, 12)
    for i in range(2):
        sched.add(Sequence(i, 3, 5))
    plan = sched.fast_step()  # nobody runs: both are admitted, prompts whole
    assert plan is not None and plan.num_deferred == 0 and plan.num_admitted == 2
    sched.finish_fast_step()
    assert sched.decode_batch_ids() == [0, 1]
    sched.add(Sequence(2, 20, 5))
    plan = sched.fast_step()  # the group decodes, the new one gets the 10 tokens left
    assert plan is not None and (plan.num_deferred, plan.deferred_context) == (2, 6)
    assert plan.num_scheduled_tokens == {2: 10} and plan.num_admitted == 1
    sched.finish_fast_step()
    assert plan.sampled == [] and sched.decode_batch_ids() == [0, 1]
    plan = sched.fast_step()  # its prefill goes on: 10 more tokens, then it samples
    assert plan is not None and plan.num_scheduled_tokens == {2: 10} and plan.num_admitted == 0
    sched.finish_fast_step()
    assert [s.seq_id for s in plan.sampled] == [2] and sched.decode_batch_ids() == [0, 1, 2]
    assert [(s.num_output, s.output) for s in sched.running] == [(3, []), (3, []), (1, [])]


def test_deferred_steps_cache_the_blocks_they_fill() -> None:
    """With prefix caching, deferred steps hash each block the moment a decode fills it when
    another sequence could hit it (a prompt of shared runs): a waiting one sees them."""
    sched = StepScheduler.vllm_v1(
        100, 4, 8, 64, lambda s: len(s.output), sample_many=lambda s, k: [0] * k
    )
    seq = Sequence(0, 6, 20, prompt_runs=((7, 6),))
    sched.add(seq)
    sched.schedule()
    sched.update()  # 6 prompt tokens computed: block 0 cached, block 1 half full

    def fast() -> tuple[int, int]:
        plan = sched.fast_step()
        assert plan is not None
        sched.finish_fast_step()
        return plan.num_deferred, plan.deferred_context

    assert sched.blocks.caching and sched.blocks.num_cached_blocks(seq) == 1
    assert fast() == (1, 6)  # computes token 7 of 8: nothing new is full
    assert sched.blocks.num_cached_blocks(seq) == 1
    assert fast() == (1, 7)  # token 8 fills block 1: cached at once
    assert sched.blocks.num_cached_blocks(seq) == 2 and sched.blocks.pool.cached[
        seq.block_hashes[1]
    ] in (sched.blocks.block_ids(seq))
    assert fast() == (1, 8)  # token 9 needs block 2: taken at once
    assert seq.num_blocks == 3 and sched.blocks_used == 3


def test_own_blocks_are_hashed_only_when_they_can_be_hit() -> None:
    """A prompt of its own: its full blocks are counted as cached but not hashed while it runs
    (nobody else can name them); preempted, it re-hits them; finished, they stay in the
    eviction queue, in their place, without a hash."""
    kv = KVManager(8, 4, caching=True)
    seq = Sequence(0, 10, 20)
    assert kv.lookup(seq) == [] and kv.grow(seq, 10)
    pool = kv.pool
    assert pool is not None and kv.num_cached_blocks(seq) == 2 and not pool.cached
    assert seq.block_hashes == []
    held = list(kv.block_ids(seq))
    seq.status = SequenceStatus.RUNNING
    kv.free(seq)  # preempted (still running when freed)
    seq.num_preemptions, seq.num_computed, seq.status = 1, 0, SequenceStatus.WAITING
    assert {pool.cached[h] for h in seq.block_hashes} == set(held[:2])
    hits = kv.lookup(seq)
    assert hits == held[:2]  # tail first into the queue, found again from the start
    assert kv.admit(seq, 10, hits) and kv.block_ids(seq)[:2] == held[:2]
    seq.status = SequenceStatus.FINISHED
    kv.free(seq)
    assert list(pool.free_cached()) == [held[1], held[0]]  # cached content, evicted first
    other = Sequence(1, 4 * 8, 1)
    assert kv.grow(other, 4 * 8) and not pool.cached  # evicted all, nothing was left to hit


def test_decode_stretches_with_the_cache_on() -> None:
    """With prefix caching and prompts of their own, pure decode steps come as stretches:
    the same trace as step by step, including steps that evict kept blocks once no blank
    one is left (their cached count falls below what the stretch started with)."""
    reqs = [Req(0, 30, 20, None), Req(0, 17, 24, None), Req(1, 40, 12, None), Req(3, 9, 30, None)]
    args = (reqs, 24, 4, 64, 8)
    policy = Policy("vllm-v1", caching=True, reserve=False)
    offered: list[tuple[int, list[tuple[int, int]]]] = []
    real = StepScheduler.decode_stretch

    def spy(self: StepScheduler) -> DecodeStretch | None:
        stretch = real(self)
        if stretch is not None:
            segments = [(m, c, list(u), f, k) for m, c, u, f, k in stretch.segments]
            offered.append((stretch.num_blocks, [(k, max(u)) for _, _, u, _, k in segments]))
            stretch.segments = iter([(m, c, iter(u), f, k) for m, c, u, f, k in segments])
        return stretch

    slow_trace, slow_out = trace_run(*args, False, policy)
    StepScheduler.decode_stretch = spy  # type: ignore[method-assign]
    try:
        fast_trace, fast_out = trace_run(*args, True, policy)
    finally:
        StepScheduler.decode_stretch = real  # type: ignore[method-assign]
    assert fast_trace == slow_trace and fast_out == slow_out
    assert offered and all(n == 24 for n, _ in offered)
    assert any(k > 0 for _, kept in offered for k, _ in kept)  # finished blocks kept ...
    assert any(k > 24 - used for _, kept in offered for k, used in kept)  # ... and evicted
