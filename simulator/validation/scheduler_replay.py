"""Replay recorded scheduler cases through a policy, step by step, and compare with what the
real scheduler did (``servesim check-scheduler``; the run semantics are the recorder's:
tests/data/vllm_v1_scheduler/README.md).

Per step ``k``: add the requests that arrive at ``k`` in list order, ``schedule()``,
``update()`` with a fake model (request ``i`` samples token ``100000 + i``, or EOS at output
index ``eos_at``), and record the scheduled sequences with their tokens, the preempted ones,
the prefix-cache hits of the admitted ones, the finished ones and the free blocks. A case ends
after the first step at or past the last arrival that leaves no work.

Speculative-decoding cases (kind ``spec``) replay the same way, with the case's ``k`` and the
recorded acceptance scripts as the acceptor (tools/vllm_recorder/README.md); async cases
replay the engine loop's calls (``scheduler_calls.py``); multimodal cases (kind ``mm``) with
the case's encoder budget and cache, comparing each step's encoder inputs, evictions and free
encoder-cache room too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from math import gcd, lcm
from pathlib import Path
from typing import Any

from simulator.errors import InputError
from simulator.scheduling.encoder_inputs import EncoderInputs
from simulator.scheduling.interface import Acceptor, ManySampler, Sampler, Scheduler, StepPlan
from simulator.scheduling.kv_group import KVGroup
from simulator.scheduling.sequence import Sequence
from simulator.scheduling.step_scheduler import StepScheduler
from simulator.validation.scheduler_calls import replay_calls
from simulator.validation.scheduler_cases import KV_GROUP_TYPES, Case, check_steps, read_cases

EOS = 50256
OUT_TOKEN0 = 100_000
REPLAY_POLICIES = ("spec", "vllm-v1")
MM_SCHEDULER_KEYS = (
    "max_num_encoder_input_tokens",
    "encoder_cache_size",
    "disable_chunked_mm_input",
)
HYBRID_KINDS = ("hybrid_swa", "hybrid_mamba")


@dataclass(frozen=True)
class Divergence:
    """The first step at which a replay differs from the recording."""

    case: str
    step: int
    expected: dict[str, Any] | None
    """The recorded step (None: the replay ran longer than the recording)."""
    got: dict[str, Any] | None
    """The replayed step (None: the replay ended earlier)."""

    def describe(self) -> str:
        """One line per field that differs."""
        exp, got = self.expected, self.got
        if exp is None or got is None:
            which = "recording ended" if exp is None else "replay ended"
            return f"{self.case}: step {self.step}: {which} (expected {exp}, got {got})"
        diffs = [
            f"  {key}: expected {exp[key]}, got {got[key]}" for key in exp if exp[key] != got[key]
        ]
        return f"{self.case}: first divergent step {self.step}\n" + "\n".join(diffs)


def make_replay_scheduler(
    case: Case,
    policy: str,
    sample: Sampler,
    sample_many: ManySampler | None = None,
    accept: Acceptor | None = None,
) -> Scheduler:
    """The scheduler ``policy`` names, configured as the case's vLLM scheduler was (the
    vLLM-only settings given to ``spec`` too would be refused: it ignores them). With
    ``sample_many`` and no EOS in the case, its fast path is open."""
    if policy not in REPLAY_POLICIES:
        raise ValueError(
            f"unknown policy {policy!r} (expected one of {', '.join(REPLAY_POLICIES)})"
        )
    c = case.config
    # without EOS in the case, none is ever sampled: no EOS token is the same run
    eos = EOS if any(r.eos_at is not None for r in case.requests) else None
    args = (c["num_blocks"], c["block_size"], c["max_num_seqs"], c["max_num_batched_tokens"])
    if policy == "spec":
        if case.kind != "plain":
            raise InputError(f"{case.name}: kind {case.kind!r} replays through vllm-v1 only")
        caching = c["enable_prefix_caching"]
        return StepScheduler(
            *args, sample, eos, sample_many=sample_many, enable_prefix_caching=caching
        )
    return StepScheduler.vllm_v1(
        *args,
        sample,
        eos,
        sample_many=sample_many,
        priority=c["policy"] == "priority",
        reserve_full_isl=c["reserve_full_isl"],
        long_prefill_token_threshold=c["long_prefill_token_threshold"],
        enable_prefix_caching=c["enable_prefix_caching"],
        num_speculative_tokens=c.get("num_speculative_tokens", 0),
        accept=accept,
        async_scheduling=c.get("async_scheduling", False),
        max_model_len=c["max_model_len"],
        encoder=EncoderInputs(*(c[k] for k in MM_SCHEDULER_KEYS)) if case.kind == "mm" else None,
        kv_groups=case_kv_groups(case),
    )


def case_kv_groups(case: Case) -> list[KVGroup] | None:
    """A hybrid case's KV-cache groups, as vLLM built them (None for the other kinds);
    InputError if the block sizes servesim derives from them are not the recorded ones."""
    c = case.config
    if "kv_groups" not in c:
        return None
    groups = [
        KVGroup(
            kind=KV_GROUP_TYPES[g["type"]],  # type: ignore[arg-type]
            block_size=g["block_size"],
            num_layers=g["layers"],
            sliding_window=g.get("sliding_window"),
            mamba_cache_mode=g.get("mamba_cache_mode"),
        )
        for g in c["kv_groups"]
    ]
    sizes = [g.block_size for g in groups]
    derived = {
        "scheduler_block_size": lcm(*sizes),
        "hash_block_size": gcd(*sizes) if c["enable_prefix_caching"] else lcm(*sizes),
    }
    for key, value in derived.items():
        if c[key] != value:
            raise InputError(
                f"{case.path}:{case.line}: field 'config.{key}': {c[key]}, "
                f"but its groups give {value}"
            )
    return groups


def script_acceptor(case: Case) -> Acceptor:
    """The recorded fake model's acceptance: ``min(accept[j], d)`` at output count ``j``."""
    scripts = [r.accept for r in case.requests]

    def accept(seq: Sequence, num_drafts: int) -> int:
        script = scripts[seq.seq_id]
        j = seq.num_output
        return min(script[j] if j < len(script) else 0, num_drafts)

    return accept


def case_sequences(case: Case) -> list[Sequence]:
    """The case's requests as sequences (id = list index), with the token identity their
    block hashes give: block ``j`` is segment ``block_hashes[j]``; the partial last block is
    a segment of the request's own."""
    bs = case.config["block_size"]
    own = 1 + max((h for r in case.requests for h in r.block_hashes), default=-1)
    seqs = []
    for i, r in enumerate(case.requests):
        runs: list[tuple[int, int]] = [(h, bs) for h in r.block_hashes]
        tail = r.prompt_len - len(runs) * bs
        if tail:
            runs.append((own + i, tail))
        seqs.append(
            Sequence(
                i,
                r.prompt_len,
                r.max_tokens,
                priority=r.priority,
                prompt_runs=tuple(runs),
                mm_items=r.mm,
            )
        )
    return seqs


def replay(case: Case, policy: str, fast: bool = False) -> list[dict[str, Any]]:
    """Every step of ``case`` replayed through ``policy``, as recorded steps are written;
    ``fast``: each step the scheduler can take on its fast path (``fast_step()``: a case
    without EOS) is taken so."""
    eos_at = [r.eos_at for r in case.requests]

    def sample(seq: Sequence) -> int:
        i = seq.seq_id
        return EOS if eos_at[i] == len(seq.output) else OUT_TOKEN0 + i

    def sample_many(seq: Sequence, k: int) -> list[int]:
        i = seq.seq_id
        first = len(seq.output)
        return [EOS if eos_at[i] == p else OUT_TOKEN0 + i for p in range(first, first + k)]

    many = sample_many if fast and case.kind in ("plain", "async", "mm", *HYBRID_KINDS) else None
    sched = make_replay_scheduler(case, policy, sample, many, script_acceptor(case))
    seqs = case_sequences(case)
    arrivals: dict[int, list[Sequence]] = {}
    for seq, r in zip(seqs, case.requests, strict=True):
        arrivals.setdefault(r.arrival_step, []).append(seq)
    last = case.requests[-1].arrival_step
    limit = last + 1 + 4 * sum(r.prompt_len + r.max_tokens for r in case.requests) * (1 + len(seqs))
    if case.kind.startswith("async"):
        assert isinstance(sched, StepScheduler)
        return replay_calls(case.name, sched, arrivals, last, limit, fast)
    steps = []
    for k in range(limit):
        for seq in arrivals.get(k, ()):
            sched.add(seq)
        steps.append(_replay_step(sched, fast, case.kind))
        if k >= last and not sched.has_work():
            return steps
    raise RuntimeError(f"{case.name}: no end after {limit} steps (scheduler made no progress)")


def _replay_step(sched: Scheduler, fast: bool, kind: str = "plain") -> dict[str, Any]:
    """One step, planned and applied, as a recorded step is written (ids: list indices)."""
    plan = sched.fast_step() if fast else None
    held = None
    if plan is None:
        plan = sched.schedule()
        members: list[Any] = []
        if kind in HYBRID_KINDS:  # each group's blocks after schedule(), as recorded
            assert isinstance(sched, StepScheduler)
            held = {s.seq_id: n for s, n in sched.blocks.held().items()}
        done = sched.update()
    else:  # the deferred decode group first (the head of the running order), one token each
        members = sched.decode_batch_ids()
        done = sched.finish_fast_step()
    ids = [str(i) for i in members] + [str(s.seq_id) for s in plan.seqs]
    tokens = [1] * len(members) + plan.num_new_tokens
    cached = {}
    if plan.num_admitted:
        hits = plan.cached_tokens
        cached = {i: n for i, n in zip(ids[len(ids) - len(hits) :], hits, strict=True) if n}
    step = {
        "scheduled": [[i, n] for i, n in zip(ids, tokens, strict=True)],
        "preempted": [str(i) for i in sorted(s.seq_id for s in plan.preempted)],
        "cached": cached,
        "finished": [str(i) for i in sorted(s.seq_id for s in done)],
        "free_blocks": sched.num_blocks - sched.num_blocks_used,
    }
    if kind == "mm":
        _encoder_fields(sched, plan, step)
    elif kind == "spec":
        step["spec"] = {str(s.seq_id): d for s, d in plan.drafts.items()}
        step["accepted"] = {str(s.seq_id): a for s, a in plan.accepted.items()}
    if held is not None:
        step["blocks"] = {str(i): held[i] for i in sorted(held)}
    return step


def _encoder_fields(sched: Scheduler, plan: StepPlan, step: dict[str, Any]) -> None:
    """A multimodal step's encoder inputs, evictions and free encoder-cache room."""
    assert isinstance(sched, StepScheduler) and sched.encoder is not None
    step["encoder"] = {str(s.seq_id): items for s, items in (plan.encoder or {}).items()}
    step["encoder_freed"] = sorted(str(h) for h in plan.encoder_freed or ())
    step["encoder_free_slots"] = sched.encoder.cache.num_free_slots


def first_divergence(case: Case, got: list[dict[str, Any]]) -> Divergence | None:
    """Where the replay first differs from the recording, or None if it never does."""
    expected = case.steps
    for k in range(max(len(expected), len(got))):
        exp = expected[k] if k < len(expected) else None
        mine = got[k] if k < len(got) else None
        if exp != mine:
            return Divergence(case.name, k, exp, mine)
    return None


@dataclass(frozen=True)
class CheckReport:
    """The outcome of replaying a file of cases."""

    num_cases: int
    divergences: list[Divergence]

    @property
    def num_matching(self) -> int:
        """Cases replayed identically, step for step."""
        return self.num_cases - len(self.divergences)


def check_cases(
    cases: Seq[Case], policy: str, progress: bool | None = False, fast: bool = False
) -> CheckReport:
    """Replay every case through ``policy`` (``fast``: on its fast path where it can); collect
    the first divergence of each that differs. ``progress``: True shows a bar on stderr,
    None only on a terminal."""
    if policy not in REPLAY_POLICIES:
        raise InputError(f"--policy: {policy!r} is not one of {', '.join(REPLAY_POLICIES)}")
    from tqdm import tqdm

    bad = []
    bar = tqdm(
        total=len(cases),
        unit="case",
        file=sys.stderr,
        disable=None if progress is None else not progress,
        mininterval=0.5,
        leave=False,
    )
    with bar:
        for case in cases:
            divergence = first_divergence(case, replay(case, policy, fast))
            if divergence is not None:
                check_steps(case)  # a step not in the format is an input error, not a divergence
                bad.append(divergence)
            bar.update(1)
    return CheckReport(len(cases), bad)


def check_file(
    path: str | Path, policy: str, progress: bool | None = False, fast: bool = False
) -> CheckReport:
    """Read a cases file (InputError if it is not in the format) and replay it."""
    return check_cases(read_cases(path), policy, progress, fast)
