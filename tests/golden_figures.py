"""The golden figures of the scenario tests: how each is produced (one shortened run per
scenario in scenarios/), and ``python -m tests.regenerate_golden`` to write them anew after an
intended change of behaviour (never from inside a test run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from simulator.cli import main
from tests.paths import DATA, FETCHED_DATA, MISSING, ROOT, SHARED_DATA

GOLDEN = Path(__file__).with_name("golden")
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
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


def _here(data_path: str) -> Path:
    """A scenario's ``data/NAME``, wherever the tests find NAME (../shared/data or data/)."""
    copy = DATA / Path(data_path).relative_to("data").as_posix()
    assert copy.exists(), f"{copy} {MISSING}"
    return copy


def shortened(path: Path) -> list[str]:
    """``--set`` overrides that keep a scenario's shape but cut it to a few hundred requests."""
    data = yaml.safe_load(path.read_text())
    trace = data["workload"].get("trace")
    if trace is None:
        return ["--set", "workload.num_requests=300"]
    sets = [f"workload.trace.path={_here(trace['path'])}"]
    profile = data.get("cost_model", {}).get("profile")
    if profile is not None:  # a real run's operator profile
        sets.append(f"cost_model.profile={_here(profile)}")
    model = data.get("cost_model", {}).get("model", "")
    if model.startswith("data/"):  # a real run's model config.json
        sets.append(f"cost_model.model={_here(model)}")
    if not trace["path"].startswith(LLMSERVINGSIM):  # a real run is 300 requests: kept whole
        sets.append("workload.trace.max_requests=400")
    return [arg for item in sets for arg in ("--set", item)]


def command(path: Path) -> list[str]:
    """The ``servesim`` arguments that produce a scenario's golden figures."""
    return ["run", str(path.relative_to(ROOT)), "--no-plots", *shortened(path)]


def printable(args: list[str]) -> str:
    """The command as a user would type it in the repository, after ``servesim fetch``: a
    data file is ``data/NAME`` wherever the tests found it."""
    text = " ".join(args)
    for place in (SHARED_DATA, FETCHED_DATA):
        text = text.replace(f"{place}/", "data/")
    return f"servesim {text}"


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
