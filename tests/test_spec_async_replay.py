"""Speculative decoding and async scheduling against the real vLLM 0.33 scheduler: every case
recorded by tools/vllm_recorder/record.py (300 spec-decode, 300 async, 300 async with spec
decode; the walk of test_vllm_spec_async_cases.py checks the files themselves) replays step
for step, or call for call, through the vllm-v1 policy with the recorded acceptances; and a
replay that gets one acceptance wrong does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.validation.scheduler_cases import Case, read_cases
from simulator.validation.scheduler_replay import check_cases, first_divergence, replay

RECORDED = Path(__file__).parent / "data" / "vllm_v1_scheduler"
SPEC = RECORDED / "spec_decode.jsonl.gz"
ASYNC = RECORDED / "async.jsonl.gz"


@pytest.fixture(scope="module")
def spec_cases() -> list[Case]:
    return read_cases(SPEC)


@pytest.fixture(scope="module")
def async_cases() -> list[Case]:
    return read_cases(ASYNC)


def test_every_spec_decode_case_replays_step_for_step(spec_cases: list[Case]) -> None:
    report = check_cases(spec_cases, "vllm-v1")
    assert report.num_cases == 300 and {c.kind for c in spec_cases} == {"spec"}
    assert [d.describe() for d in report.divergences] == []


def test_every_async_case_replays_call_for_call(async_cases: list[Case]) -> None:
    report = check_cases(async_cases, "vllm-v1")
    assert report.num_cases == 600
    assert [c.kind for c in async_cases] == ["async"] * 300 + ["async_spec"] * 300
    assert [d.describe() for d in report.divergences] == []


def _accept_shifted(case: Case) -> Case:
    """The case with every acceptance script one higher (capped at k)."""
    k = case.config["num_speculative_tokens"]
    reqs = tuple(
        dataclasses.replace(r, accept=tuple(min(a + 1, k) for a in r.accept)) for r in case.requests
    )
    return dataclasses.replace(case, requests=reqs)


def test_a_wrong_acceptance_diverges(spec_cases: list[Case], async_cases: list[Case]) -> None:
    """The replay is not vacuous: accepting more than the scripts say, drafts off, or
    planning synchronously shows up as a divergence in most cases."""
    spec, asyn = spec_cases[:40], async_cases[300:340]
    assert (
        sum(
            first_divergence(c, replay(_accept_shifted(c), "vllm-v1")) is not None
            for c in spec + asyn
        )
        > 0.6 * len(spec + asyn)  # 58 of 80: a script already at k cannot move
    )
    no_drafts = [
        dataclasses.replace(c, config={**c.config, "num_speculative_tokens": 0}) for c in spec
    ]
    assert all(first_divergence(c, replay(c, "vllm-v1")) is not None for c in no_drafts)
    case = async_cases[0]
    steps = replay(dataclasses.replace(case, kind="plain"), "vllm-v1")
    assert first_divergence(case, steps) is not None  # a sync replay is not the async one


def test_recorded_semantics_show_up(spec_cases: list[Case], async_cases: list[Case]) -> None:
    """What the files exercise, as the replay sees it: drafts verified and accepted, padded
    admissions (a fresh admission verifying k drafts), stale outputs, a full batch queue."""
    case = next(c for c in spec_cases if c.config["acceptance_rate"] == 0.8)
    steps = replay(case, "vllm-v1")
    assert any(s["spec"] for s in steps) and any(any(s["accepted"].values()) for s in steps)
    padded = 0
    for c in spec_cases[:100]:
        seen: set[str] = set()
        for s in replay(c, "vllm-v1"):
            padded += sum(1 for rid in s["spec"] if rid not in seen)
            seen.update(rid for rid, _ in s["scheduled"])
    assert padded > 0
    calls = [call for c in async_cases[:100] for call in replay(c, "vllm-v1")]
    assert any(call["update"] and call["update"]["stale"] for call in calls)
    assert any(call["schedule"] and call["update"] for call in calls)


def test_check_scheduler_cli_reads_the_gzipped_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["check-scheduler", str(SPEC)]) == 0
    assert "300 of 300 cases match" in capsys.readouterr().out
    assert main(["check-scheduler", str(SPEC), "--policy", "spec"]) == 2
    assert "replays through vllm-v1 only" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip")
    assert main(["check-scheduler", str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(broken) in err and len(err.splitlines()) == 1
