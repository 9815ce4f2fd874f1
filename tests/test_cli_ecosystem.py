"""Issue 23's ecosystem, through the command line: guidellm's ``benchmarks.json`` read by
``compare`` (one comparison per benchmark), and ``run --vllm-bench-json`` writing what
``vllm bench serve --save-result --save-detailed`` writes, read back by ``compare``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator.cli import main

SMALL: dict[str, Any] = {
    "name": "eco-test",
    "seed": 5,
    "scheduler": {"max_num_batched_tokens": 256, "max_num_seqs": 16, "num_blocks": 200},
    "cost_model": {"type": "linear", "base_ms": 4, "per_token_ms": 0.03, "per_seq_ms": 0.05},
    "workload": {
        "num_requests": 120,
        "arrival": {"process": "poisson", "rate": 5},
        "prompt_len": {"dist": "uniform", "low": 20, "high": 300},
        "output_len": {"dist": "uniform", "low": 1, "high": 60},
    },
}

# what vLLM's vllm/benchmarks/serve.py puts in --save-result --save-detailed JSON
VLLM_KEYS = {
    "date", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "start_times",
    "generated_texts", "errors", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
    "median_itl_ms", "p99_itl_ms",
}  # fmt: skip


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small run and its --vllm-bench-json file."""
    root = tmp_path_factory.mktemp("eco")
    scenario = root / "s.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    out, bench = root / "run", root / "bench.json"
    args = ["run", str(scenario), "--out", str(out), "--no-plots", "--vllm-bench-json", str(bench)]
    assert main(args) == 0
    return out, bench


def guidellm_request(i: int, row: pd.Series, scale: float) -> dict[str, Any]:
    """One request as guidellm serializes a ``GenerativeRequestStats``: its timings and
    usage, and the computed fields (times ``scale``d, as if measured slower)."""
    start = float(row["arrival_s"])
    ttft, e2e, out = float(row["ttft_s"]) * scale, float(row["e2e_s"]) * scale, row["output_len"]
    first, last = start + ttft, start + e2e
    itl_ms = 1000 * (last - first) / (out - 1) if out > 1 else None
    return {
        "type_": "generative_request_stats",
        "request_id": f"req-{i}",
        "request_type": "text_completions",
        "output": "",
        "info": {
            "timings": {
                "request_start": start,
                "first_token_iteration": first,
                "last_token_iteration": last,
                "request_end": last,
                "token_iterations": int(out),
            }
        },
        "input_metrics": {"total_tokens": int(row["prompt_len"])},
        "output_metrics": {"total_tokens": int(out)},
        "request_start_time": start,
        "request_end_time": last,
        "request_latency": e2e,
        "prompt_tokens": int(row["prompt_len"]),
        "output_tokens": int(out),
        "total_tokens": int(row["prompt_len"] + out),
        "time_to_first_token_ms": 1000 * ttft,
        "time_per_output_token_ms": 1000 * e2e / out,
        "inter_token_latency_ms": itl_ms,
    }


def guidellm_file(path: Path, requests: pd.DataFrame, scales: list[float]) -> Path:
    """A ``benchmarks.json`` with one constant-rate benchmark per scale."""
    done = requests[requests["status"] == "finished"]
    benchmarks = [
        {
            "type_": "generative_benchmark",
            "config": {"strategy": {"type_": "constant", "rate": 5.0 + k}},
            "requests": {
                "successful": [
                    guidellm_request(i, r, s) for i, (_, r) in enumerate(done.iterrows())
                ],
                "incomplete": [],
                "errored": [],
            },
        }
        for k, s in enumerate(scales)
    ]
    path.write_text(json.dumps({"benchmarks": benchmarks}))
    return path


def test_guidellm_benchmarks_json_gives_one_comparison_per_benchmark(
    run_folder: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run_folder
    requests = pd.read_parquet(out / "requests.parquet")
    measured = guidellm_file(tmp_path / "benchmarks.json", requests, [1.0, 1.25])
    report = tmp_path / "cmp.json"
    args = ["compare", str(out), str(measured), "--json", str(report), "--no-plot"]
    assert main(args) == 0  # the format is told from the file: a 'benchmarks' list
    printed = capsys.readouterr().out
    assert printed.count("(guidellm; 120 requests; TTFT and E2E from arrival)") == 2
    assert "benchmark 0 (constant 5)" in printed and "benchmark 1 (constant 6)" in printed
    doc = json.loads(report.read_text())
    first, second = (b["metrics"] for b in doc["benchmarks"])
    assert "itl" not in first  # guidellm keeps no per-gap ITL
    for metric in ("ttft", "tpot", "e2e"):
        for stat in ("mean", "p50", "p90", "p99"):
            assert abs(first[metric][stat]["error_pct"]) < 1e-6, (metric, stat)
            # measured 1.25x slower: the simulation is 20% faster
            assert second[metric][stat]["error_pct"] == pytest.approx(-20.0, abs=1e-6)


def test_a_guidellm_file_without_requests_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run_folder: tuple[Path, Path]
) -> None:
    bad = tmp_path / "benchmarks.json"
    bad.write_text(
        json.dumps({"benchmarks": [{"requests": {"successful": [{"prompt_tokens": 3}]}}]})
    )
    assert main(["compare", str(run_folder[0]), str(bad), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"servesim: error: {bad}: benchmarks[0].requests.successful[0]: "
        "field 'time_to_first_token_ms': None is not a finite number"
    )


def test_run_writes_vllm_bench_json_that_compare_reads_back(
    run_folder: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out, bench = run_folder
    data = json.loads(bench.read_text())
    assert set(data) >= VLLM_KEYS
    requests = pd.read_parquet(out / "requests.parquet")
    n = len(requests)
    assert data["num_prompts"] == n and data["completed"] + data["failed"] == n
    assert data["completed"] == int((requests["status"] == "finished").sum())
    for key in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors"):
        assert len(data[key]) == n, key
    done = requests["status"] == "finished"
    assert data["ttfts"] == pytest.approx(requests["ttft_s"][done].tolist())
    # a request's gaps sum to its decode time, so its end-to-end latency is exact
    e2e = [t + sum(g) for t, g in zip(data["ttfts"], data["itls"], strict=True)]
    assert e2e == pytest.approx(requests["e2e_s"][done].tolist())
    assert data["mean_ttft_ms"] == pytest.approx(1000 * requests["ttft_s"][done].mean())

    capsys.readouterr()
    assert main(["compare", str(out), str(bench), "--format", "vllm-bench", "--no-plot"]) == 0
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines()[2:]]
    assert {r[0] for r in rows} == {"ttft", "tpot", "e2e"}  # servesim's itls are no gaps
    assert all(r[-1] in ("+0.0%", "-0.0%") for r in rows), table


def test_a_run_with_rejections_lists_them_as_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.yaml"
    # 8 blocks of 16 tokens: prompts over 128 tokens can never be served
    tight = {**SMALL, "scheduler": {**SMALL["scheduler"], "num_blocks": 8}}
    scenario.write_text(yaml.safe_dump(tight))
    bench = tmp_path / "b.json"
    args = ["run", str(scenario), "--out", str(tmp_path / "o"), "--no-plots"]
    main([*args, "--vllm-bench-json", str(bench)])
    data = json.loads(bench.read_text())
    failed = [e for e in data["errors"] if e]
    assert data["failed"] == len(failed) > 0
    assert all(e == "servesim: request rejected" for e in failed)
    assert all(
        t == 0.0 and o == 0 and g == []
        for t, o, g, e in zip(
            data["ttfts"], data["output_lens"], data["itls"], data["errors"], strict=True
        )
        if e
    )


def test_a_bad_vllm_bench_json_target_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    target = tmp_path / "no-such-folder" / "sub" / "b.json"
    (tmp_path / "no-such-folder").write_text("a file")
    args = ["run", str(scenario), "--out", str(tmp_path / "o"), "--vllm-bench-json", str(target)]
    assert main(args) == 2
    assert "--vllm-bench-json" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
