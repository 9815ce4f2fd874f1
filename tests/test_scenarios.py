"""Every scenario in scenarios/ runs as it stands (shortened), and matches its golden summary."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli import main
from tests.paths import DATA, ROOT

GOLDEN = Path(__file__).with_name("golden")
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
# The public originals' file names (as the scenarios' comments say to save them) -> our copies.
TRACE_COPIES = {
    "AzureLLMInferenceTrace_conv.csv": "azure2023_conv.csv",
    "AzureLLMInferenceTrace_code.csv": "azure2023_code.csv",
    "mooncake_conversation_trace.jsonl": "mooncake_fast25_conversation_trace.jsonl",
}
GOLDEN_KEYS = [
    "num_requests",
    "num_finished",
    "num_rejected",
    "num_preemptions",
    "num_steps",
    "duration_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "e2e_p90_s",
    "kv_utilization_mean",
]


def shortened(path: Path) -> list[str]:
    """``--set`` overrides that keep a scenario's shape but cut it to a few hundred requests."""
    data = yaml.safe_load(path.read_text())
    trace = data["workload"].get("trace")
    if trace is None:
        return ["--set", "workload.num_requests=300"]
    name = Path(trace["path"]).name
    assert name in TRACE_COPIES, f"{path.name}: add its trace {name} to TRACE_COPIES"
    copy = DATA / TRACE_COPIES[name]
    assert copy.exists(), f"{copy} is missing: ../shared/data must sit beside the checkout"
    return ["--set", f"workload.trace.path={copy}", "--set", "workload.trace.max_requests=400"]


def test_there_are_the_documented_scenarios() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {
        "quickstart",
        "chunked-prefill-budgets",
        "tight-kv-preemption",
        "load-sweep",
        "azure-conv-replay",
        "azure-code-replay",
        "mooncake-replay",
    } <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_runs_and_matches_golden(path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(["run", str(path), "--out", str(out), "--no-plots", *shortened(path)])
    assert code == 0
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] + summary["num_rejected"] == summary["num_requests"] > 0
    got = {k: summary[k] for k in GOLDEN_KEYS}
    golden = GOLDEN / f"{path.stem}.json"
    if os.environ.get("SERVESIM_UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(got, indent=2) + "\n")
    assert golden.exists(), f"no golden file: run SERVESIM_UPDATE_GOLDEN=1 pytest {__file__}"
    want = json.loads(golden.read_text())
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
