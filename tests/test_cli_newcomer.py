"""Issue 36's newcomer messages: a real-run file missing from a fresh clone says which fetch
brings it; ``--jobs 0`` is refused; a read-only output folder says why in the same words
whether it was given (``--out``) or is the default."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path
from typing import Any

import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.results import outdir
from tests.paths import ROOT

REAL = str(ROOT / "scenarios" / "real-rtx4090-llama31-8b.yaml")
QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err.removeprefix("servesim: error: ")


def test_a_real_run_not_fetched_names_the_fetch_that_brings_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a fresh clone's root: no data/ yet
    measured = "data/llmservingsim/runs/RTX4090/Llama-3.1-8B/requests.jsonl"
    assert main(["compare", REAL, measured, "--no-plot"]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"{measured}: file not found (relative to {tmp_path})")
    assert err.endswith("`servesim fetch llmservingsim` downloads it")
    # the scenario itself: its trace is one file of the same selection, which it needs whole
    assert main(["run", REAL, "--out", str(tmp_path / "out")]) == 2
    err = _one_line(capsys)
    assert err.startswith("workload.trace.path: data/llmservingsim/sharegpt-llama-3.1-8b")
    assert err.endswith("`servesim fetch llmservingsim` downloads it")


@pytest.mark.parametrize(
    "command",
    [
        ["sweep", QUICKSTART, "--grid", "workload.num_requests=10,20"],
        ["capacity", QUICKSTART, "--slo", "ttft_p99_ms=300"],
        ["search", QUICKSTART, "--grid", "cost_model.tp=1,2", "--slo", "ttft_p99_ms=300"],
    ],
)
def test_jobs_0_is_refused_in_one_line(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([*command, "--jobs", "0", "--out", str(out)]) == 2
    assert _one_line(capsys) == "--jobs 0: must be >= 1 (leave it out for one per core)"
    assert not out.exists()


def _read_only(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.EROFS, "Read-only file system")


def test_a_read_only_out_says_so_as_the_default_folder_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a read-only mount: os.access only answers no; mkdir says why
    monkeypatch.setattr(outdir.os, "access", lambda path, mode: False)
    monkeypatch.setattr(tempfile, "mkdtemp", _read_only)
    out = tmp_path / "new" / "out"
    with pytest.raises(InputError) as given:
        outdir.check_out_dir(out, overwrite=False)
    assert str(given.value) == f"--out {out}: cannot create (Read-only file system)"
    monkeypatch.setattr(Path, "mkdir", _read_only)
    monkeypatch.chdir(tmp_path)
    default = outdir.default_out_dir("quickstart")
    with pytest.raises(InputError) as by_default:
        outdir.reserve_out_dir(default)
    assert str(by_default.value).startswith(f"{default}: cannot create (Read-only file system)")
    assert str(by_default.value).endswith("pass --out a folder you can write")


def test_a_real_run_s_model_not_fetched_names_the_key_and_the_fetch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.paths import DATA

    monkeypatch.chdir(tmp_path)  # its trace given, its model's config.json not fetched
    trace = DATA / "llmservingsim" / "sharegpt-qwen3-30b-a3b-300-sps10.jsonl"
    moe = str(ROOT / "scenarios" / "real-rtxpro6000-qwen3-30b-a3b.yaml")
    assert main(["validate", moe, "--set", f"workload.trace.path={trace}"]) == 2
    err = _one_line(capsys)
    assert err.startswith("cost_model.model: model file data/llmservingsim/models/")
    assert err.endswith("`servesim fetch llmservingsim` downloads it")
