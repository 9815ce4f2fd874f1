"""Issue 23's messages, through the command line: each bad input is one line that says what
is wrong and how to fix it (a folder for a file, a CSV read as JSON lines, a misspelt key,
every failing key, NaN), and the docs name the file ``fetch`` saves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.cli import main
from tests.paths import DATA, MISSING, ROOT

QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")
AZURE = str(ROOT / "scenarios" / "azure-conv-replay.yaml")


def error_of(args: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> str:
    """Run ``args`` (writing into ``out``): it must exit 2 with one line and write nothing."""
    assert main([*args, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("servesim: error: ")
    assert not out.exists()
    return err[len("servesim: error: ") :]


def test_a_folder_as_trace_path_says_it_is_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", AZURE, "--set", f"workload.trace.path={tmp_path}"]
    err = error_of(args, capsys, tmp_path / "out")
    assert err == f"workload.trace.path: {tmp_path}: is a folder, not a file"


def test_the_upstream_name_of_a_trace_is_pointed_at_what_fetch_saves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = "data/traces/AzureLLMInferenceTrace_conv.csv"
    err = error_of(["run", AZURE, "--set", f"workload.trace.path={path}"], capsys, tmp_path / "o")
    assert err.startswith(f"workload.trace.path: {path}: file not found")
    assert err.endswith(
        "`servesim fetch azure-conv` saves it as data/azure2023_conv.csv: "
        "set workload.trace.path to that"
    )
    err = error_of(["run", AZURE, "--set", "workload.trace.path=mine.csv"], capsys, tmp_path / "o")
    assert "`servesim fetch traces` downloads the public traces as data/azure2023_conv.csv" in err


def test_docs_and_makefile_name_the_file_fetch_saves() -> None:
    for doc in ("docs/scenarios.md", "Makefile"):
        text = (ROOT / doc).read_text()
        assert "data/traces/" not in text, doc
        assert "data/azure2023_conv.csv" in text, doc


def test_a_csv_read_as_mooncake_hints_at_the_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = DATA / "azure2023_conv.csv"
    assert trace.is_file(), f"{trace} {MISSING}"
    args = ["run", AZURE, "--set", f"workload.trace.path={trace}"]
    err = error_of([*args, "--set", "workload.trace.format=mooncake"], capsys, tmp_path / "o")
    assert err.startswith(f"{trace}:1: invalid JSON")
    assert "looks like CSV" in err and err.endswith("set workload.trace.format to azure")


def test_every_failing_key_is_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = ["scheduler.max_num_seqs=-3", "scheduler.block_size=-1", "workload.arrival.rate=-1"]
    args = ["run", QUICKSTART, *(a for s in sets for a in ("--set", s))]
    err = error_of(args, capsys, tmp_path / "o")
    assert "more)" not in err
    for key in ("scheduler.max_num_seqs", "scheduler.block_size", "workload.arrival.rate"):
        assert f"{key}: Input should be greater than" in err, key
    assert err.count(";") == 2


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("scheduler.max_num_seq=3", "scheduler.max_num_seq: .* \\(did you mean max_num_seqs\\?\\)"),
        ("schedular.max_num_seqs=3", "schedular: .* \\(did you mean scheduler\\?\\)"),
        ("workload.arival.rate=3", "workload.arival: .* \\(did you mean arrival\\?\\)"),
        ("cost_model.modle=llama-3-8b", "cost_model.modle: .* \\(did you mean model\\?\\)"),
    ],
)
def test_set_typos_get_did_you_mean(
    typo: str, meant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = error_of(["run", QUICKSTART, "--set", typo], capsys, tmp_path / "o")
    assert re.search(meant, err), err


@pytest.mark.parametrize("value", ["nan", ".nan", "NaN"])
def test_nan_is_not_a_number(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", QUICKSTART, "--set", f"workload.arrival.rate={value}"]
    err = error_of(args, capsys, tmp_path / "o")
    assert re.fullmatch(
        r".*quickstart\.yaml: workload\.arrival\.rate: '?\w+'? is not a number", err
    )
    assert "greater than" not in err


def test_presets_show_sources_prices_pcap_and_the_stack_of_fitted_presets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import yaml

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    flat = " ".join(out.split())
    for kind in ("models", "hardware"):
        for path in sorted((ROOT / "configs" / kind).glob("*.yaml")):
            preset = yaml.safe_load(path.read_text())
            assert " ".join(preset["source"].split()) in flat, path.name
            if preset.get("cost_source"):
                assert " ".join(preset["cost_source"].split()) in flat, path.name
    assert "-pcap: Splitwise's runs of the H100 with its power capped" in flat
    fitted = sorted((ROOT / "configs" / "fitted").glob("*.yaml"))
    assert fitted
    for path in fitted:
        stack = yaml.safe_load(path.read_text())["stack"]
        assert "2023 stack" in stack or "2024 stack" in stack, path.name
        assert " ".join(stack.split()) in flat, path.name


def test_a_run_with_a_fitted_preset_warns_once_of_the_stack_it_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = DATA / "azure2023_code.csv"
    assert trace.is_file(), f"{trace} {MISSING}"
    scenario = str(ROOT / "scenarios" / "azure-code-replay.yaml")
    sets = [f"workload.trace.path={trace}", "workload.trace.max_requests=20"]
    args = ["run", scenario, "--out", str(tmp_path / "o"), "--no-plots"]
    assert main([*args, *(a for s in sets for a in ("--set", s))]) == 0
    warnings = [w for w in capsys.readouterr().err.splitlines() if "times the stack" in w]
    assert len(warnings) == 1
    assert warnings[0].startswith("servesim: warning: cost_model: fitted preset ")
    assert "a 2023 stack; today's vLLM is far faster" in warnings[0]


def test_the_readme_claim_on_fitted_presets_matches_docs_fidelity() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "held-out median error 0.3–6.5% per group" not in readme
    assert "2023/24 stack" in readme
    fidelity = (ROOT / "docs" / "fidelity.md").read_text()
    # the figures the README quotes are fidelity.md's: 5-fold medians and random thirds
    assert "| 0.3 / 6.0 |" in fidelity and "6.5 / 6.6" in fidelity
    assert "7.1 / 14.4 / 45.1" in fidelity
    for figure in ("0.3–6.5%", "45%", "2–3x"):
        assert figure in readme, figure


def test_not_modeled_page_is_linked_and_names_what_is_missing() -> None:
    """docs/not-modeled.md, linked from the README, stays true: what it says is missing has
    no key in the scenario schema, and what it says is refused is refused."""
    from simulator.field_errors import fields_at
    from simulator.scenario.config import ScenarioConfig

    page = (ROOT / "docs" / "not-modeled.md").read_text()
    assert "](docs/not-modeled.md)" in (ROOT / "README.md").read_text()
    for topic in ("Mixture-of-experts", "Speculative decoding", "KV offload", "Autoscaling"):
        assert topic in page, topic
    keys = set()
    for loc in [(), ("scheduler",), ("serving",), ("cluster",), ("workload",), ("cost_model",)]:
        keys |= fields_at(ScenarioConfig, loc, {})
    for absent in ("num_experts", "data_parallel", "pipeline_parallel",
                   "kv_cache_dtype", "lora"):  # fmt: skip
        assert absent not in keys, f"{absent} exists now: update docs/not-modeled.md"
    assert {"async_scheduling", "speculative"} <= keys  # in part, as the page says
    assert "multimodal" in keys and "Multimodal inputs: in part" in page
    assert "autoscaler" in keys  # identical replicas only, as the page says
    assert {"kv_offload", "shared_kv"} <= keys  # CPU and shared tiers, no disk, as it says
    source = (ROOT / "simulator" / "cost" / "profiles" / "llmservingsim.py").read_text()
    assert 'moe.csv").exists()' in source  # MoE bundles are refused, as the page says
