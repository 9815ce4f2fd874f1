"""Where and how runs write their results: the output folder's checks, its atomic rename and
permissions, strict JSON, and what the process says when stopped (SIGTERM, a closed pipe, not
enough memory)."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

import simulator.results.outdir as outdir
import simulator.results.writer as writer
import simulator.scenario.runner as runner
from simulator.cli import format_summary, main
from simulator.errors import InputError
from tests.paths import ROOT
from tests.test_cli import SMALL as CLI_SMALL

# test_cli's small scenario, under its own name and shorter
SMALL: dict[str, Any] = {
    **CLI_SMALL,
    "name": "out-test",
    "workload": {**CLI_SMALL["workload"], "num_requests": 40},
}
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of an output folder that must be refused before anything is simulated."""

    def run(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("simulated although the output folder was bad")

    monkeypatch.setattr(runner, "run", run)


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("servesim: error: ")
    return err[0]


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# 1. --out that is the working folder, a parent of it, or /


@pytest.mark.parametrize("out", [".", "..", "/", "link", "sub/.."])
@pytest.mark.parametrize("overwrite", [False, True])
def test_out_never_replaces_the_working_folder_or_its_parents(
    scenario_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_simulation: None,
    out: str,
    overwrite: bool,
) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "mine.txt").write_text("keep")
    (work / "link").symlink_to(work)
    monkeypatch.chdir(work)
    argv = ["run", str(scenario_file), "--out", out, "--no-plots"]
    assert main(argv + (["--overwrite"] if overwrite else [])) == 2
    assert "refusing to replace" in _one_error_line(capsys)
    assert (work / "mine.txt").read_text() == "keep"
    assert not _leftovers(tmp_path)


def test_a_failed_rename_leaves_no_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def busy(src: Any, dst: Any) -> NoReturn:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(dst))

    out = tmp_path / "out"
    monkeypatch.setattr(os, "replace", busy)
    with (
        pytest.raises(InputError, match=r"--out .*out: cannot write results \(Device or"),
        outdir.atomic_dir(out, overwrite=False) as tmp,
    ):
        (tmp / "a.txt").write_text("a")
    assert not out.exists() and not _leftovers(tmp_path)


def test_a_failed_replace_puts_the_previous_results_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    (out / outdir.MARKER).write_text("")  # previous results of servesim's
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if ".tmp-" in Path(src).name and Path(dst) == out and not out.exists():
            raise OSError(errno.EIO, os.strerror(errno.EIO))  # the new results fail to move in
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with (
        pytest.raises(InputError, match="cannot write results"),
        outdir.atomic_dir(out, overwrite=True) as tmp,
    ):
        (tmp / "new.txt").write_text("new")
    assert (out / "old.txt").read_text() == "old"
    assert not _leftovers(tmp_path)


def test_out_filled_during_the_run_is_not_replaced_without_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with (
        pytest.raises(InputError, match="filled during the run"),
        outdir.atomic_dir(out, overwrite=False) as tmp,
    ):
        (tmp / "new.txt").write_text("new")
        out.mkdir()
        (out / "theirs.txt").write_text("theirs")
    assert (out / "theirs.txt").read_text() == "theirs"
    assert not _leftovers(tmp_path)


# 2. default folders of runs started in the same second


def test_runs_started_in_the_same_second_get_folders_of_their_own(
    scenario_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(outdir.time, "strftime", lambda fmt, *a: "20250101-120000")
    for _ in range(3):
        assert main(["run", str(scenario_file), "--no-plots"]) == 0
    base = Path("results") / "out-test"
    names = sorted(p.name for p in base.iterdir())
    assert names == ["20250101-120000", "20250101-120000-2", "20250101-120000-3"]
    assert all((base / n / "summary.json").exists() for n in names)
    assert f"results in {base / '20250101-120000-3'}" in capsys.readouterr().out
    assert not _leftovers(tmp_path)


def test_a_failed_run_removes_its_default_folder(
    scenario_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)

    def run(*args: Any, **kwargs: Any) -> NoReturn:
        raise InputError("boom")

    monkeypatch.setattr(runner, "run", run)
    assert main(["run", str(scenario_file), "--no-plots"]) == 2
    assert _one_error_line(capsys) == "servesim: error: boom"
    assert list((tmp_path / "results" / "out-test").iterdir()) == []


def test_reserve_out_dir_takes_the_first_free_name(tmp_path: Path) -> None:
    base = tmp_path / "results" / "x" / "stamp"
    assert outdir.reserve_out_dir(base) == base
    (tmp_path / "results" / "x" / "stamp-2").mkdir()
    assert outdir.reserve_out_dir(base) == base.with_name("stamp-3")
    assert all(p.is_dir() for p in (base, base.with_name("stamp-3")))


def test_a_default_folder_is_never_told_to_use_overwrite(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(InputError) as given:
        outdir.check_out_dir(tmp_path, overwrite=False)
    assert "--overwrite" in str(given.value)
    with pytest.raises(InputError) as default:
        outdir.check_out_dir(tmp_path, overwrite=False, given=False)
    assert "not empty" in str(default.value) and "--overwrite" not in str(default.value)


# 3. an output folder that cannot be created: one line, before simulating


@pytest.mark.parametrize("out", ["afile/sub", "afile/sub/deeper", "/proc/servesim-test"])
def test_an_uncreatable_out_is_one_line_before_simulating(
    scenario_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_simulation: None,
    out: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file")
    assert main(["run", str(scenario_file), "--out", out, "--no-plots"]) == 2
    assert _one_error_line(capsys).startswith(f"servesim: error: --out {out}: cannot create (")
    assert not _leftovers(tmp_path)


def test_an_unwritable_out_is_refused_by_check_out_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def access(path: Any, mode: int) -> bool:
        return False  # as a read-only folder looks to a non-root user

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(InputError, match=r"cannot create \(Permission denied\)"):
        outdir.check_out_dir(tmp_path / "new" / "out", overwrite=False)
    assert not (tmp_path / "new").exists()


def test_an_error_while_writing_is_one_line_and_leaves_nothing(
    scenario_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def write_result(result: Any, folder: Path, **kwargs: Any) -> NoReturn:
        (folder / "requests.parquet").write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "steps.parquet"))

    monkeypatch.setattr(writer, "write_result", write_result)
    out = tmp_path / "out"
    assert main(["run", str(scenario_file), "--out", str(out), "--no-plots"]) == 2
    line = _one_error_line(capsys)
    assert line == f"servesim: error: --out {out}: cannot write results (No space left on device)"
    assert not out.exists() and not _leftovers(tmp_path)


# 4. permissions


def test_results_get_the_permissions_of_a_normal_folder(
    scenario_file: Path, tmp_path: Path
) -> None:
    want = 0o777 & ~_umask()
    out = tmp_path / "out"
    assert main(["run", str(scenario_file), "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == want
    assert stat.S_IMODE((out / "plots").stat().st_mode) == want
    sweep = tmp_path / "sweep"
    argv = ["sweep", str(scenario_file), "--grid", "seed=1,2", "--jobs", "1", "--no-plots"]
    assert main([*argv, "--out", str(sweep)]) == 0
    assert stat.S_IMODE(sweep.stat().st_mode) == want


# 5. SIGTERM


def test_sigterm_while_simulating_exits_143_and_leaves_nothing(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simulator",
            "run",
            str(QUICKSTART),
            "--set",
            "workload.num_requests=200000",
            "--out",
            str(tmp_path / "o"),
            "--no-plots",
            "--progress",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    started = threading.Event()
    chunks: list[bytes] = []

    def read() -> None:  # the progress bar's first draw: the simulation has started
        assert proc.stderr is not None
        while chunk := proc.stderr.read1(4096):
            chunks.append(chunk)
            started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started.wait(timeout=10)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    finally:
        proc.kill()
    reader.join(timeout=5)
    stderr = b"".join(chunks).decode()
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert stderr.rstrip().endswith("servesim: terminated")
    assert list(tmp_path.iterdir()) == []  # neither o nor .o.tmp-*


SIGTERM_WHILE_WRITING = """
import os, signal, sys, time
import simulator.results.writer as writer

def write_result(result, folder, **kwargs):
    (folder / "requests.parquet").write_text("half-written")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    raise AssertionError("SIGTERM did not stop the run")

writer.write_result = write_result
from simulator.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_writing_removes_the_temporary_folder(
    scenario_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o"
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_WHILE_WRITING, "run", str(scenario_file), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.strip() == "servesim: terminated"
    assert not out.exists() and not _leftovers(tmp_path)


def test_main_restores_the_previous_sigterm_handler(capsys: pytest.CaptureFixture[str]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert main(["presets"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before


# 6. memory


def test_a_workload_too_big_for_memory_is_refused_upfront(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    argv = ["run", str(scenario_file), "--out", str(out), "--no-plots"]
    started = time.perf_counter()
    assert main([*argv, "--set", "workload.num_requests=1000000000000"]) == 2
    assert time.perf_counter() - started < 10
    line = _one_error_line(capsys)
    assert "workload.num_requests" in line and "memory" in line
    assert not out.exists() and not _leftovers(tmp_path)


def test_without_the_machines_memory_a_documented_cap_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "physical_memory_bytes", lambda: None)
    big = runner.resolve({**SMALL, "workload": {**SMALL["workload"], "num_requests": 10**8 + 1}})
    with pytest.raises(InputError, match="workload.num_requests"):
        runner.check_workload_fits(big)
    runner.check_workload_fits(runner.resolve(SMALL))


def test_out_of_memory_is_one_line(
    scenario_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(*args: Any, **kwargs: Any) -> NoReturn:
        raise MemoryError("Unable to allocate 7.28 TiB for an array with shape (10**12,)")

    monkeypatch.setattr(runner, "run", run)
    out = tmp_path / "o"
    assert main(["run", str(scenario_file), "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("servesim: error: out of memory (Unable to allocate 7.28 TiB")
    assert not out.exists()


# 7 and 9. undefined metrics are null in summary.json; no step, no duration


def _strict_json(text: str) -> Any:
    def reject(name: str) -> NoReturn:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=reject)


def test_every_request_rejected_gives_strict_json_and_zero_duration(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    argv = ["run", str(scenario_file), "--out", str(out), "--set", "scheduler.num_blocks=1"]
    # no request finished: the results are written, and the exit code says it is no success
    assert main([*argv, "--set", "slo={ttft_ms: 1000}"]) == 1
    summary = _strict_json((out / "summary.json").read_text())
    assert summary["num_rejected"] == summary["num_requests"] == 40
    assert summary["num_steps"] == 0 and summary["duration_s"] == 0
    assert summary["ttft_p50_s"] is None and summary["request_throughput"] is None
    assert summary["goodput"] is None
    printed = capsys.readouterr().out
    assert "duration   0.00 s simulated, 0 steps" in printed
    assert "throughput - req/s" in printed
    assert "throughput - req/s" in format_summary(summary)  # as read back from summary.json


def test_one_token_outputs_have_a_null_tpot(tmp_path: Path) -> None:
    cfg = {**SMALL, "workload": {**SMALL["workload"], "output_len": {"dist": "fixed", "value": 1}}}
    result = runner.run(cfg)
    writer.write_result(result, tmp_path, plots=False)
    summary = _strict_json((tmp_path / "summary.json").read_text())
    assert summary["num_finished"] == 40 and summary["duration_s"] > 0
    assert summary["tpot_p50_s"] is None and summary["ttft_p50_s"] > 0


def test_json_safe_turns_every_non_finite_number_into_null() -> None:
    import numpy as np

    value = {"a": float("nan"), "b": [np.float32("inf"), 1.5], "c": np.int64(3), "d": "x"}
    assert writer.json_safe(value) == {"a": None, "b": [None, 1.5], "c": 3, "d": "x"}


# 8. a closed pipe on stdout


def test_a_closed_stdout_pipe_is_quiet() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails: deterministic
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "simulator", "presets"],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


def test_presets_piped_into_head() -> None:
    first = subprocess.Popen(
        [sys.executable, "-m", "simulator", "presets"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.Popen(["head", "-1"], stdin=first.stdout, stdout=subprocess.PIPE)
    assert first.stdout is not None and first.stderr is not None
    first.stdout.close()  # head alone reads the pipe, and closes it after one line
    out, _ = head.communicate(timeout=60)
    stderr = first.stderr.read().decode()
    first.wait(timeout=60)
    assert out.decode() == "models:\n"
    assert first.returncode in (0, 141)  # 0 if all was written before head exited
    assert stderr == ""


def test_a_container_memory_limit_lowers_the_memory_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = runner.physical_memory_bytes()
    assert host is not None and host > 2**20
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(runner, "CGROUP_LIMIT_FILES", (limit,))
    limit.write_text("max\n")  # cgroup v2 without a limit
    assert runner.physical_memory_bytes() == host
    limit.write_text(f"{2**20}\n")
    assert runner.physical_memory_bytes() == 2**20


def test_overwrite_refuses_a_folder_servesim_did_not_write(tmp_path: Path) -> None:
    """A folder holding a git repository and sources is never deleted by --overwrite."""
    out = tmp_path / "project"
    (out / ".git").mkdir(parents=True)
    (out / "main.py").write_text("print('mine')")
    with pytest.raises(
        InputError, match=r"not a servesim output folder \(it has no \.servesim-output"
    ):
        outdir.check_out_dir(out, overwrite=True)
    with (
        pytest.raises(InputError, match="not a servesim output folder"),
        outdir.atomic_dir(tmp_path / "fresh", overwrite=True) as tmp,
    ):
        (tmp / "x").write_text("")
        (tmp_path / "fresh").mkdir()  # filled by someone else during the run
        (tmp_path / "fresh" / "theirs.txt").write_text("")
    assert (out / "main.py").exists() and (tmp_path / "fresh" / "theirs.txt").exists()
    with outdir.atomic_dir(tmp_path / "new", overwrite=False) as tmp:
        (tmp / "x").write_text("")
    assert (tmp_path / "new" / outdir.MARKER).is_file()
    with outdir.atomic_dir(tmp_path / "new", overwrite=True) as tmp:  # ours: replaced
        (tmp / "y").write_text("")
    assert (tmp_path / "new" / "y").exists() and not (tmp_path / "new" / "x").exists()
    assert not _leftovers(tmp_path)
