"""The golden figures of the scenario tests: how each is produced (one shortened run per
scenario in scenarios/), and ``python -m tests.regenerate_golden`` to write them anew after an
intended change of behaviour (never from inside a test run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


LLMSERVINGSIM = "data/llmservingsim/"
"""Where ``servesim fetch llmservingsim`` saves the real runs; ../shared/data/llmservingsim/
holds the same files in the same layout."""


def shortened(path: Path) -> list[str]:
    """``--set`` overrides that keep a scenario's shape but cut it to a few hundred requests."""
    data = yaml.safe_load(path.read_text())
    trace = data["workload"].get("trace")
    if trace is None:
        return ["--set", "workload.num_requests=300"]
    if trace["path"].startswith(LLMSERVINGSIM):  # a real run (300 requests) and its profile
        here = DATA / "llmservingsim"
        profile = data["cost_model"]["profile"].removeprefix(LLMSERVINGSIM)
        return [
            "--set",
            f"workload.trace.path={here / trace['path'].removeprefix(LLMSERVINGSIM)}",
            "--set",
            f"cost_model.profile={here / profile}",
        ]
    name = Path(trace["path"]).name
    assert name in TRACE_COPIES, f"{path.name}: add its trace {name} to TRACE_COPIES"
    copy = DATA / TRACE_COPIES[name]
    assert copy.exists(), f"{copy} is missing: ../shared/data must sit beside the checkout"
    return ["--set", f"workload.trace.path={copy}", "--set", "workload.trace.max_requests=400"]


def command(path: Path) -> list[str]:
    """The ``servesim`` arguments that produce a scenario's golden figures."""
    return ["run", str(path.relative_to(ROOT)), "--no-plots", *shortened(path)]


def printable(args: list[str]) -> str:
    """The command as a user would type it (data paths relative to the repository)."""
    return "servesim " + " ".join(a.replace(str(DATA.parent.parent), "..") for a in args)


def figures(path: Path, out: Path) -> dict[str, Any]:
    """Run a scenario's golden command into ``out``; its summary's golden figures."""
    code = main([*command(path), "--out", str(out)])
    assert code == 0, f"{printable(command(path))} failed"
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] + summary["num_rejected"] == summary["num_requests"] > 0
    return {k: summary[k] for k in GOLDEN_KEYS}


def golden_path(path: Path) -> Path:
    """Where a scenario's golden figures are kept."""
    return GOLDEN / f"{path.stem}.json"
