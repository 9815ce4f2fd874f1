"""Token identity in workloads: Mooncake hash_ids, CSV priority/hash_ids columns, token-id
JSONL traces and the synthetic shared_prefix workload, as prompt runs; malformed ids are
FILE:LINE errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.errors import InputError
from simulator.workload import WorkloadConfig, generate
from simulator.workload.config import TraceConfig
from simulator.workload.prompt_runs import PromptRuns, output_segment
from simulator.workload.replay import replay
from simulator.workload.traces import read_csv_trace, read_mooncake, read_trace
from simulator.workload.workload import Workload
from tests.paths import DATA


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def runs(w: Workload) -> list[tuple[tuple[int, int], ...]]:
    assert w.prompt_runs is not None
    return [w.prompt_runs.runs(i) for i in range(len(w))]


def test_mooncake_hash_ids_cover_512_tokens_each_and_the_rest_is_own(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "m.jsonl",
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [3, 4]}\n'
        '{"timestamp": 1, "input_length": 1100, "output_length": 5, "hash_ids": [3, 4]}\n'
        '{"timestamp": 2, "input_length": 7, "output_length": 5}\n',
    )
    w = read_mooncake(path)
    # ids 3, 4 (512 + 88 tokens); the same two ids then 76 tokens of its own; no ids at all
    assert runs(w) == [((3, 512), (4, 88)), ((3, 512), (4, 512), (5, 76)), ((6, 7),)]
    w = read_trace(path, "mooncake", hash_block_tokens=100)
    assert runs(w)[0] == ((3, 100), (4, 100), (5, 400))


@pytest.mark.parametrize(
    ("ids", "fragment"),
    [
        ("[1, 2, 3]", "3 hash ids for a 600-token prompt (at most 2 of 512 tokens each)"),
        ('"1 2"', "'1 2' is not a hash id"),
        ("[1, true]", "True is not a hash id"),
        ("[1, -2]", "-2 is not a hash id"),
        ("[1.5]", "1.5 is not a hash id"),
    ],
)
def test_mooncake_malformed_hash_ids_name_file_and_line(
    tmp_path: Path, ids: str, fragment: str
) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}\n'
    bad = f'{{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": {ids}}}\n'
    path = write(tmp_path, "m.jsonl", good + good + bad)
    with pytest.raises(InputError) as err:
        read_mooncake(path)
    assert str(err.value).startswith(f"{path}:3: field 'hash_ids': ")
    assert fragment in str(err.value)


def test_csv_priority_and_hash_ids_columns_follow_their_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.csv",
        "arrival_s,prompt_len,output_len,priority,hash_ids\n"
        '2.0,20,3,-1,"[7, 8]"\n'
        "1.0,25,3,2,7 9\n"
        "3.0,5,3,0,\n",
    )
    w = read_trace(path, "csv", hash_block_tokens=10)
    assert w.priority is not None and w.priority.tolist() == [2, -1, 0]  # sorted by arrival
    assert runs(w) == [((7, 10), (9, 10), (10, 5)), ((7, 10), (8, 10)), ((11, 5),)]
    plain = read_csv_trace(write(tmp_path, "p.csv", "arrival_s,prompt_len,output_len\n0,1,1\n"))
    assert plain.priority is None and plain.prompt_runs is None


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("1,20,3,0,7 x", "column hash_ids: 'x' is not a hash id"),
        ("1,20,3,0,1 2 3 4", "column hash_ids: 4 hash ids for a 20-token prompt"),
        ("1,20,3,0.5,7", "column priority: 0.5 is not an integer"),
        ("1,20,3,,7", "column priority: missing value is not a number"),
    ],
)
def test_csv_malformed_priority_and_hash_ids_name_file_and_line(
    tmp_path: Path, row: str, fragment: str
) -> None:
    text = "arrival_s,prompt_len,output_len,priority,hash_ids\n0,5,5,0,1\n" + row + "\n"
    with pytest.raises(InputError) as err:
        read_trace(write(tmp_path, "t.csv", text), "csv", hash_block_tokens=10)
    assert ":3: " in str(err.value) and fragment in str(err.value)


def test_token_id_runs_agree_exactly_as_far_as_tokens_do() -> None:
    path = DATA / "llmservingsim" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"
    w = read_trace(path, "llmservingsim")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    tokens = [r["input_tok_ids"] for r in rows]
    assert len(w) == 300 and w.prompt_len.tolist() == [len(t) for t in tokens]
    assert w.arrival_s[1] == pytest.approx(
        (rows[1]["arrival_time_ns"] - rows[0]["arrival_time_ns"]) / 1e9
    )
    prompts = runs(w)

    def common(a: list, b: list) -> int:  # type: ignore[type-arg]
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        return k

    def expand(r: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
        return [(s, k) for s, n in r for k in range(n)]

    shared = 0
    for i in range(0, 300, 3):
        for j in range(i + 1, 300, 7):
            k = common(tokens[i], tokens[j])
            assert common(expand(prompts[i]), expand(prompts[j])) == k
            shared += k > 0
    assert shared > 10  # the file does repeat prefixes


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        (
            {"input_toks": 2, "output_toks": 1, "arrival_time_ns": 0, "input_tok_ids": [1]},
            "1 token ids, but input_toks is 2",
        ),
        (
            {"input_toks": 1, "output_toks": 1, "arrival_time_ns": 0, "input_tok_ids": ["a"]},
            "'a' is not a token id",
        ),
        (
            {"input_toks": 1, "output_toks": 1, "arrival_time_ns": 0, "input_tok_ids": 5},
            "expected a list",
        ),
        ({"input_toks": 1, "arrival_time_ns": 0}, "missing field 'output_toks'"),
        ({"input_toks": -1, "output_toks": 1, "arrival_time_ns": 0}, "'input_toks': -1 is not"),
    ],
)
def test_token_id_trace_errors_name_file_and_line(
    tmp_path: Path, record: dict, fragment: str
) -> None:  # type: ignore[type-arg]
    good = {"input_toks": 1, "output_toks": 1, "arrival_time_ns": 0, "input_tok_ids": [4]}
    path = write(tmp_path, "t.jsonl", json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(InputError) as err:
        read_trace(path, "llmservingsim")
    assert str(err.value).startswith(f"{path}:2: ") and fragment in str(err.value)


def synthetic(**extra: object) -> WorkloadConfig:
    return WorkloadConfig.model_validate(
        {
            "num_requests": 400,
            "arrival": {"process": "poisson", "rate": 5},
            "prompt_len": {"dist": "uniform", "low": 5, "high": 50},
            "output_len": {"dist": "uniform", "low": 1, "high": 30},
            **extra,
        }
    )


def test_shared_prefix_prompts_share_system_prompts_and_extend_conversations() -> None:
    seed = np.random.SeedSequence(3)
    plain = generate(synthetic(), seed)
    cfg = {"num_prefixes": 3, "prefix_len": 100, "users_per_prefix": 4}
    shared = generate(synthetic(shared_prefix=cfg), seed)
    # other streams are untouched: same arrivals and outputs, prompts = prefix + question
    np.testing.assert_array_equal(shared.arrival_s, plain.arrival_s)
    np.testing.assert_array_equal(shared.output_len, plain.output_len)
    np.testing.assert_array_equal(shared.prompt_len, plain.prompt_len + 100)
    prompts = runs(shared)
    assert {r[0] for r in prompts} == {(0, 100), (1, 100), (2, 100)}
    assert all(r[1] == (3 + i, plain.prompt_len[i]) for i, r in enumerate(prompts))
    chats = generate(synthetic(shared_prefix={**cfg, "multi_turn": True}), seed)
    turns = runs(chats)
    nexts = 0
    for r in turns:
        if len(r) > 2:  # a later turn: its previous turn's prompt, that turn's output, a question
            j = -r[-2][0] - 2
            assert r[-2] == (output_segment(j), chats.output_len[j]) and r[:-2] == turns[j]
            nexts += 1
    assert nexts == 400 - 12  # 12 users: everybody else is a later turn
    assert (
        generate(synthetic(shared_prefix={**cfg, "multi_turn": True}), seed).prompt_runs is not None
    )
    again = runs(generate(synthetic(shared_prefix={**cfg, "multi_turn": True}), seed))
    assert again == turns


def test_synthetic_priorities_follow_the_weights() -> None:
    w = generate(
        synthetic(priority={"values": [0, 5], "weights": [3, 1]}), np.random.SeedSequence(1)
    )
    assert w.priority is not None and set(w.priority.tolist()) == {0, 5}
    assert 0.65 < (w.priority == 0).mean() < 0.85
    with pytest.raises(ValueError, match="weights"):
        synthetic(priority={"values": [0, 5], "weights": [1]})


def test_trace_windows_keep_each_rows_runs(tmp_path: Path) -> None:
    lines = [
        json.dumps(
            {"timestamp": 1000 * i, "input_length": 600, "output_length": 2, "hash_ids": [i, 9]}
        )
        for i in range(5)
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(lines) + "\n")
    w = replay(TraceConfig(path=str(path), format="mooncake", start_s=2, max_requests=2))
    assert runs(w) == [((2, 512), (9, 88)), ((3, 512), (9, 88))]


def test_inconsistent_prompt_runs_are_refused() -> None:
    with pytest.raises(ValueError, match="hold 5 tokens, prompt_len 6"):
        Workload([0.0], [6], [1], prompt_runs=PromptRuns.from_lists([[(1, 5)]]))
    with pytest.raises(ValueError, match="earlier request's output"):
        Workload([0.0], [6], [1], prompt_runs=PromptRuns.from_lists([[(output_segment(0), 6)]]))
    with pytest.raises(ValueError, match="longer than that output"):
        Workload(
            [0.0, 1.0],
            [1, 6],
            [3, 1],
            prompt_runs=PromptRuns.from_lists([[(1, 1)], [(output_segment(0), 6)]]),
        )


def test_the_workload_names_outputs_as_the_scheduler_does() -> None:
    from simulator.scheduling import block_hash

    assert all(output_segment(j) == block_hash.output_segment(j) for j in range(1000))
