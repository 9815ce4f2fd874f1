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
