"""``servesim compare``: each measured format read and held against a simulation (a run folder
or a scenario), the table, the JSON schema, the figure, and bad or mismatched input in one
line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.validation.compare import STATS

SCENARIO: dict[str, Any] = {
    "name": "cmp",
    "seed": 3,
    "scheduler": {"max_num_batched_tokens": 256, "max_num_seqs": 8, "num_blocks": 300},
    "cost_model": {"type": "linear", "base_ms": 5, "per_token_ms": 0.05},
    "workload": {
        "num_requests": 40,
        "arrival": {"process": "poisson", "rate": 20},
        "prompt_len": {"dist": "uniform", "low": 10, "high": 300},
        "output_len": {"dist": "uniform", "low": 1, "high": 4},
    },
    "serving": {"frontend_delay_ms": 4, "response_delay_ms": 1},
}


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cmp")
    scenario = root / "cmp.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    assert main(["run", str(scenario), "--out", str(root / "run"), "--no-plots"]) == 0
    return root / "run"


def requests(sim_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(sim_dir / "requests.parquet")


def as_llmservingsim(req: pd.DataFrame, path: Path, scale: float = 1.0) -> Path:
    """The simulation's own requests as LLMServingSim records them (monotonic clock from the
    engine queue, wall clock for the arrival), engine-side times stretched by ``scale``."""
    lines = []
    for r in req.itertuples():
        queued = 1000.0 + r.queued_s
        lines.append(
            {
                "request_id": f"bench-{r.request_id}",
                "input_toks": int(r.prompt_len),
                "output_toks": int(r.output_len),
                "arrival_time": 1.7e9 + r.arrival_s,
                "queued_ts": queued,
                "scheduled_ts": 1000.0 + r.first_scheduled_s,
                "first_token_ts": queued + (r.first_token_s - r.queued_s) * scale,
                "last_token_ts": queued + (r.finish_s - r.queued_s) * scale,
            }
        )
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def compare_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_llmservingsim_format_measures_from_the_engine_queue(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = as_llmservingsim(requests(sim_dir), tmp_path / "requests.jsonl")
    out_json = tmp_path / "cmp.json"
    code, out, _ = compare_json(capsys, str(sim_dir), str(measured), "--json", str(out_json))
    assert code == 0 and "from the engine queue" in out
    metrics = json.loads(out_json.read_text())["metrics"]
    assert list(json.loads(out_json.read_text())) == ["metrics"]
    assert list(metrics) == ["ttft", "tpot", "e2e"]  # no ITL in this format
    for by_stat in metrics.values():
        assert list(by_stat) == list(STATS)
        for row in by_stat.values():
            assert set(row) == {"measured", "simulated", "error_pct"}
            # the same requests: identical up to the clocks' float rounding
            assert row["error_pct"] == pytest.approx(0.0, abs=1e-6)
    assert (sim_dir / "compare.png").stat().st_size > 10_000


def test_error_is_signed_percent_of_the_measurement(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the measured engine took 25% longer on every request: the simulation is -20% off
    measured = as_llmservingsim(requests(sim_dir), tmp_path / "slow.jsonl", scale=1.25)
    out_json = tmp_path / "slow.json"
    code, out, _ = compare_json(
        capsys, str(sim_dir), str(measured), "--json", str(out_json), "--no-plot"
    )
    assert code == 0
    metrics = json.loads(out_json.read_text())["metrics"]
    for metric in ("ttft", "e2e"):
        for row in metrics[metric].values():
            assert row["simulated"] == pytest.approx(row["measured"] / 1.25, rel=1e-9)
            assert row["error_pct"] == pytest.approx(-20.0, abs=1e-6)
    assert "ttft    mean" in out and "-20.0%" in out


def test_vllm_bench_json_client_side_with_itl(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    req = requests(sim_dir)
    # per-request token gaps consistent with the simulation's TTFT, TPOT and E2E
    itls = [
        [float(r.tpot_s)] * (int(r.output_len) - 1) if r.output_len > 1 else []
        for r in req.itertuples()
    ]
    bench = {
        "input_lens": req["prompt_len"].tolist(),
        "output_lens": req["output_len"].tolist(),
        "ttfts": req["ttft_s"].tolist(),
        "itls": itls,
        "errors": [""] * len(req),
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    out_json = tmp_path / "v.json"
    code, out, _ = compare_json(
        capsys, str(sim_dir), str(path), "--json", str(out_json), "--no-plot"
    )
    assert code == 0 and "from arrival" in out
    metrics = json.loads(out_json.read_text())["metrics"]
    assert list(metrics) == ["ttft", "tpot", "itl", "e2e"]
    for metric in ("ttft", "tpot", "e2e"):
        for row in metrics[metric].values():
            assert row["error_pct"] == pytest.approx(0.0, abs=1e-6), metric


def test_csv_format_and_one_token_outputs(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    req = requests(sim_dir)
    assert (req["output_len"] == 1).any(), "the fixture should hold one-token outputs"
    frame = req[["request_id", "ttft_s", "tpot_s", "e2e_s"]]
    path = tmp_path / "m.csv"
    frame.to_csv(path, index=False, na_rep="")
    code, out, _ = compare_json(capsys, str(sim_dir), str(path), "--no-plot")
    assert code == 0
    errors = [line.split()[-1] for line in out.splitlines()[2:]]
    assert len(errors) == 12 and all(e in ("+0.0%", "-0.0%") for e in errors)


def test_scenario_as_sim_is_simulated_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    run_dir = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(run_dir), "--no-plots"]) == 0
    capsys.readouterr()
    measured = as_llmservingsim(requests(run_dir), tmp_path / "r.jsonl")
    plot = tmp_path / "fig.png"
    code, out, _ = compare_json(capsys, str(scenario), str(measured), "--plot", str(plot))
    assert code == 0 and plot.is_file()
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, nothing left behind
    assert all(line.endswith(("+0.0%", "-0.0%")) for line in out.splitlines()[2:-1])


# ---- bad or mismatched input: one line, exit 2 ---------------------------------------------


def _bad(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servesim: error: "), err
    return lines[0]


def test_different_request_counts(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = as_llmservingsim(requests(sim_dir).iloc[:-1], tmp_path / "short.jsonl")
    msg = _bad(capsys, str(sim_dir), str(measured))
    assert "39 requests measured, 40 finished in the simulation" in msg


def test_different_request_lengths(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    req = requests(sim_dir).copy()
    req.loc[0, "prompt_len"] += 1000
    msg = _bad(capsys, str(sim_dir), str(as_llmservingsim(req, tmp_path / "other.jsonl")))
    assert "prompt lengths differ" in msg and "not the same requests" in msg


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("m.jsonl", '{"input_toks": 1}\n', r"m\.jsonl:1: missing field 'output_toks'"),
        ("m.jsonl", "{\n", r"m\.jsonl:1: invalid JSON"),
        ("m.csv", "request_id,ttft_s,e2e_s\n1,0.1,0.2\n", r"m\.csv:1: missing column 'tpot_s'"),
        ("m.csv", "request_id,ttft_s,tpot_s,e2e_s\n1,x,,1\n", r"m\.csv:2: column ttft_s: 'x'"),
        ("m.json", '{"ttfts": []}', r"missing list 'input_lens'"),
        ("m.txt", "", r"cannot tell the format from the name; pass --format"),
    ],
)
def test_malformed_measurements(
    sim_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    text: str,
    match: str,
) -> None:
    path = tmp_path / name
    path.write_text(text)
    import re

    assert re.search(match, _bad(capsys, str(sim_dir), str(path)))


def test_failed_requests_in_a_vllm_bench_file(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "b.json"
    bench = {"input_lens": [1, 2], "output_lens": [1, 2], "ttfts": [0.1, 0.2], "itls": [[], [0.1]]}
    path.write_text(json.dumps({**bench, "errors": ["", "Timeout\ntraceback"]}))
    assert "1 request(s) failed in the measurement (e.g. #1: Timeout)" in _bad(
        capsys, str(sim_dir), str(path)
    )


def test_missing_inputs(sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    measured = as_llmservingsim(requests(sim_dir), tmp_path / "ok.jsonl")
    assert "no such run folder or scenario file" in _bad(
        capsys, str(tmp_path / "nope"), str(measured)
    )
    (tmp_path / "empty").mkdir()
    assert "not a servesim run folder" in _bad(capsys, str(tmp_path / "empty"), str(measured))
    assert "file not found" in _bad(capsys, str(sim_dir), str(tmp_path / "none.jsonl"))
    msg = _bad(capsys, str(sim_dir), str(measured), "--json", str(tmp_path / "no" / "x.json"))
    assert "does not exist" in msg


def test_stats_are_numpy_linear_percentiles() -> None:
    from simulator.validation.compare import stats

    values = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    got = stats(values)
    assert got["mean"] == 2.5 and got["p50"] == 2.5
    assert got["p90"] == pytest.approx(3.7) and got["p99"] == pytest.approx(3.97)


# ---- the same requests, by id; rows that cannot be (issue 36) --------------------------------


def test_measured_ids_must_be_the_simulated_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two requests each side, so the count agrees; the ids do not ({0, 5} against {0, 1})
    scenario = tmp_path / "two.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    path = tmp_path / "m.csv"
    path.write_text("request_id,ttft_s,tpot_s,e2e_s\n0,0.1,,0.2\n5,0.1,,0.2\n")
    msg = _bad(capsys, str(scenario), str(path), "--set", "workload.num_requests=2")
    assert msg.endswith(
        f"{path}: request ids differ from the simulation {scenario}: measured only {{5}}, "
        "simulated only {1}: not the same requests"
    )


def test_lengths_are_matched_request_by_request_where_named(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two requests' prompts swapped: the same lengths sorted, not the same requests
    req = requests(sim_dir).copy()
    a, b = req.index[req["prompt_len"] != req.loc[0, "prompt_len"]][0], 0
    req.loc[[a, b], "prompt_len"] = req.loc[[b, a], "prompt_len"].to_numpy()
    msg = _bad(capsys, str(sim_dir), str(as_llmservingsim(req, tmp_path / "swap.jsonl")))
    assert "prompt lengths differ" in msg and "(request 0: measured" in msg


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "request_id,ttft_s,tpot_s,e2e_s\n0,0.1,,0.2\n1,0.1,,0.05\n",
            r"m\.csv:3: E2E 0\.05 s is shorter than its TTFT 0\.1 s",
        ),
        (
            "request_id,ttft_s,tpot_s,e2e_s\nbench-0,0.1,,0.2\nbench-0,0.1,,0.2\n",
            r"m\.csv:3: .*twice",
        ),
        ("request_id,ttft_s,tpot_s,e2e_s\nabc,0.1,,0.2\n", r"m\.csv:2: request_id 'abc' names no"),
    ],
)
def test_rows_that_cannot_be_are_named(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, match: str
) -> None:
    import re

    path = tmp_path / "m.csv"
    path.write_text(text)
    assert re.search(match, _bad(capsys, str(sim_dir), str(path)))


def test_negative_times_in_a_vllm_bench_file_are_named(
    sim_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "b.json"
    bench = {"input_lens": [1, 2], "output_lens": [1, 2], "ttfts": [0.1, -0.2], "itls": [[], [0.1]]}
    path.write_text(json.dumps(bench))
    assert "request #1 (ttfts[1]): TTFT -0.2 s is negative" in _bad(capsys, str(sim_dir), str(path))
