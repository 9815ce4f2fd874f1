"""Every command's files: an ``--out`` that is a folder, sits under a file or in a folder that
cannot be written, a plots folder that cannot be written, a truncated or corrupt parquet file,
a damaged sweep.json and input that is not UTF-8 are each one line and exit 2, with nothing
half-written; files are replaced atomically (a new file renamed into place)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml

import simulator.cost.calibration.calibrate as calibration
from simulator.cli import main
from simulator.errors import InputError
from simulator.output_file import write_file, write_text
from tests.paths import DATA, MISSING

FIT_ARGS = ["--model", "llama-2-7b", "--hardware", "a100-80gb", "--tp", "1", "--folds", "2"]
PRESET = "llama-2-70b_a100-80gb_tp8"


def error_line(code: int, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a failed command printed (and checks it failed with exit code 2)."""
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("servesim: error: "), err
    return err


def files_under(folder: Path) -> list[Path]:
    """Every file below ``folder``, hidden ones (temporary files) included."""
    return sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())


@pytest.fixture
def measurements(tmp_path: Path) -> Path:
    """A small synthetic measurement CSV (prefills and decodes of a linear step time)."""
    rows = ["num_seqs,new_tokens,context_len,step_ms"]
    for b, n, c in itertools.product([1, 2, 4, 8, 16], [1, 128, 512], [0, 256, 1024]):
        rows.append(f"{b},{n},{c},{5 + 0.002 * b * n + 0.0001 * b * c + 0.2 * b:.4f}")
    path = tmp_path / "in" / "meas.csv"
    path.parent.mkdir()
    path.write_text("\n".join(rows) + "\n")
    return path


def splitwise_file(meas: Path) -> Path:
    """A small Splitwise perf_model.csv beside ``meas`` (the columns convert reads)."""
    rows = [
        "model,hardware,tensor_parallel,prompt_size,batch_size,token_size,prompt_time,token_time"
    ]
    for p, b in itertools.product([128, 512], [1, 4]):
        rows.append(f"llama2-70b,a100-80gb,8,{p},{b},128,{20 + 0.05 * p * b},{15 + 0.3 * b}")
    path = meas.with_name("perf_model.csv")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture
def unwritable(tmp_path: Path) -> Path:
    """A folder in which no file can be created: a read-only folder, or for root (whom
    permissions do not stop) sysfs, which takes no new files even from root."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(probe)
    raise AssertionError("found no folder this test cannot write into")


def commands(meas: Path, out: Path) -> dict[str, list[str]]:
    """Each command that writes a file named by ``--out``."""
    return {
        "convert": ["convert", "splitwise", str(splitwise_file(meas)), "--out", str(out)],
        "predict": ["predict", PRESET, str(meas), "--out", str(out)],
        "calibrate": ["calibrate", str(meas), *FIT_ARGS, "--out", str(out)],
    }


@pytest.fixture
def no_fit(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records any call of the fit: a bad --out must be refused before it."""
    calls: list[str] = []

    def fit(*args: object, **kwargs: object) -> None:
        calls.append("fit")
        raise AssertionError("the fit ran before --out was checked")

    monkeypatch.setattr(calibration, "calibrate", fit)
    return calls


@pytest.mark.parametrize("command", ["convert", "predict", "calibrate"])
def test_out_that_is_a_folder_is_one_line(
    command: str,
    measurements: Path,
    tmp_path: Path,
    no_fit: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "a-folder"
    out.mkdir()
    err = error_line(main(commands(measurements, out)[command]), capsys)
    assert err == f"servesim: error: --out {out}: is a folder; give a file name"
    assert files_under(out) == [] and no_fit == []


@pytest.mark.parametrize("command", ["convert", "predict", "calibrate"])
def test_out_under_a_file_is_one_line(
    command: str,
    measurements: Path,
    tmp_path: Path,
    no_fit: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    out = blocker / "sub" / "out.csv"
    err = error_line(main(commands(measurements, out)[command]), capsys)
    assert err == f"servesim: error: --out {out}: cannot create ({blocker} is not a folder)"
    assert blocker.read_text() == "not a folder\n" and no_fit == []


@pytest.mark.parametrize("command", ["convert", "predict", "calibrate"])
def test_out_in_an_unwritable_folder_is_one_line(
    command: str,
    measurements: Path,
    unwritable: Path,
    no_fit: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = unwritable / "servesim-test-out.csv"
    err = error_line(main(commands(measurements, out)[command]), capsys)
    assert err.startswith(f"servesim: error: --out {out}: cannot create (")
    assert not out.exists() and no_fit == []


@pytest.mark.parametrize("command", ["convert", "predict", "calibrate"])
def test_out_is_replaced_by_a_new_file_not_rewritten_in_place(
    command: str, measurements: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reader holding the old file keeps reading the old bytes: the new file is written
    beside it and renamed over it (a new inode), leaving no temporary file."""
    out = tmp_path / "out" / "result"
    out.parent.mkdir()
    out.write_text("the previous result\n")
    before = out.stat().st_ino
    with out.open() as held:
        assert main(commands(measurements, out)[command]) == 0
        assert held.read() == "the previous result\n"
    assert out.stat().st_ino != before
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert files_under(out.parent) == [out]
    capsys.readouterr()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_interrupted_write_keeps_the_old_file_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "preset.yaml"
    out.write_text("old: true\n")

    def half_then_interrupt(tmp: Path) -> None:
        tmp.write_text("new: tru")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_file(out, half_then_interrupt)
    assert out.read_text() == "old: true\n"
    assert files_under(tmp_path) == [out]
    write_text(out, "new: true\n")
    assert yaml.safe_load(out.read_text()) == {"new": True}
    assert files_under(tmp_path) == [out]


def test_a_failing_rename_is_one_line_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(InputError, match=r"^--out .*x\.csv: cannot write \(No space left"):
        write_text(tmp_path / "x.csv", "a\n")
    assert files_under(tmp_path) == []


# ---- plot: the folder it writes into, and the files it reads back


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small run folder (no plots), copied by each test that damages it."""
    out = tmp_path_factory.mktemp("run") / "run"
    args = ["run", "scenarios/quickstart.yaml", "--no-plots", "--out", str(out)]
    assert main([*args, "--set", "workload.num_requests=40"]) == 0
    return out


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    args = ["sweep", "scenarios/quickstart.yaml", "--grid", "scheduler.max_num_seqs=4,8"]
    assert main([*args, "--no-plots", "--out", str(out), "--set", "workload.num_requests=20"]) == 0
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def zero_first_half(path: Path) -> None:
    """Damage the data pages but keep the footer: the file opens, its rows do not decode."""
    raw = bytearray(path.read_bytes())
    raw[4 : len(raw) // 2] = bytes(len(raw) // 2 - 4)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("requests.parquet", truncate),
        ("steps.parquet", truncate),
        ("steps.parquet", zero_first_half),
        ("requests.parquet", lambda p: p.write_bytes(b"")),
    ],
    ids=["requests-truncated", "steps-truncated", "steps-rows-damaged", "requests-empty"],
)
def test_plot_of_a_damaged_run_table_is_one_line(
    name: str,
    damage: Callable[[Path], None],
    run_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = copy_of(run_folder, tmp_path)
    damage(folder / name)
    err = error_line(main(["plot", str(folder)]), capsys)
    assert err.startswith(f"servesim: error: {folder / name}: not a readable parquet file (")
    assert err.count(str(folder / name)) == 1  # pyarrow's own copy of the path is dropped
    assert not list((folder / "plots").glob("*.png"))


def test_plot_of_a_damaged_sweep_is_one_line(
    sweep_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(sweep_folder, tmp_path)
    truncate(folder / "sweep.parquet")
    err = error_line(main(["plot", str(folder)]), capsys)
    assert err.startswith(f"servesim: error: {folder / 'sweep.parquet'}: not a readable parquet")

    shutil.copyfile(sweep_folder / "sweep.parquet", folder / "sweep.parquet")
    for text in ('{"keys": ["scheduler.max', "\xff", '{"grid": {}}', '{"keys": 3}'):
        (folder / "sweep.json").write_text(text, encoding="latin-1")
        err = error_line(main(["plot", str(folder)]), capsys)
        assert err.startswith(f"servesim: error: {folder / 'sweep.json'}: "), text
    assert main(["plot", str(sweep_folder)]) == 0  # the undamaged sweep draws


def test_plot_into_a_plots_path_that_is_a_file_is_one_line(
    run_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(run_folder, tmp_path)
    (folder / "plots").write_text("not a folder\n")
    err = error_line(main(["plot", str(folder)]), capsys)
    assert err == f"servesim: error: {folder / 'plots'}: exists and is not a folder"


def test_plot_into_an_unwritable_folder_is_one_line(
    run_folder: Path, unwritable: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(run_folder, tmp_path)
    (folder / "plots").symlink_to(unwritable, target_is_directory=True)
    err = error_line(main(["plot", str(folder)]), capsys)
    assert err.startswith(f"servesim: error: {folder / 'plots'}: cannot create (")


# ---- input that is not UTF-8, wherever a text file is read


def not_utf8(path: Path, text: str) -> Path:
    """``text`` with a Latin-1 byte (0xe9) put in its last line."""
    path.write_bytes(text.encode() + "caf\xe9\n".encode("latin-1"))
    return path


def test_a_measurement_csv_that_is_not_utf8_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = "num_seqs,new_tokens,context_len,step_ms\n"
    meas = not_utf8(tmp_path / "m.csv", header + "1,1,0,3.0\n" * 3 + "1,1,0,")
    for args in (
        ["calibrate", str(meas), *FIT_ARGS, "--out", str(tmp_path / "p.yaml")],
        ["predict", PRESET, str(meas), "--out", str(tmp_path / "p.csv")],
        ["convert", "splitwise", str(meas), "--out", str(tmp_path / "c.csv")],
        ["convert", "vidur-mlp", str(meas), "--model", "llama-2-7b", "--out", str(tmp_path / "c")],
    ):
        err = error_line(main(args), capsys)
        assert f"{meas}: line 5: not UTF-8 text (byte 0xe9)" in err, args
    assert files_under(tmp_path) == [meas]


@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        (["workload.trace.format=azure"], "TIMESTAMP,ContextTokens,GeneratedTokens\n"),
        (["workload.trace.format=csv"], "arrival_s,prompt_len,output_len\n0,5,5\n"),
        (
            ["workload.trace.format=mooncake"],
            '{"timestamp": 0, "input_length": 5, "output_length": 5}\n',
        ),
        (
            ["workload.trace.format=llmservingsim"],
            '{"arrival_time_ns": 0, "input_toks": 3, "output_toks": 2}\n',
        ),
    ],
    ids=["azure", "csv", "mooncake", "llmservingsim"],
)
def test_a_trace_that_is_not_utf8_is_one_line(
    overrides: list[str], text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = not_utf8(tmp_path / "trace", text)
    sets = [f"workload.trace.path={trace}", *overrides]
    args = ["run", "scenarios/azure-conv-replay.yaml", "--out", str(tmp_path / "out")]
    err = error_line(main([*args, *itertools.chain(*(["--set", s] for s in sets))]), capsys)
    assert err.startswith(f"servesim: error: {trace}") and "UTF-8" in err
    assert not (tmp_path / "out").exists()


def test_a_length_table_and_a_fitted_preset_that_are_not_utf8_are_one_line(
    measurements: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = not_utf8(tmp_path / "lengths.csv", "num_prefill_tokens\n5\n")
    sets = [
        "workload.prompt_len.dist=empirical",
        f"workload.prompt_len.path={table}",
        "workload.prompt_len.column=num_prefill_tokens",
    ]
    args = ["run", "scenarios/quickstart.yaml", "--out", str(tmp_path / "out")]
    err = error_line(main([*args, *itertools.chain(*(["--set", s] for s in sets))]), capsys)
    assert err.startswith(f"servesim: error: workload.prompt_len: {table}") or err.startswith(
        f"servesim: error: {table}"
    )
    assert "UTF-8" in err

    preset = not_utf8(tmp_path / "fitted.yaml", "name: x\n")
    err = error_line(
        main(["predict", str(preset), str(measurements), "--out", str(tmp_path / "p")]), capsys
    )
    assert f"{preset}:2: not UTF-8 text (byte 0xe9)" in err


def test_a_measurement_csv_that_is_a_folder_or_empty_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty.csv").write_bytes(b"")
    for source in (tmp_path, tmp_path / "empty.csv"):
        out = tmp_path / "x.csv"
        err = error_line(main(["convert", "splitwise", str(source), "--out", str(out)]), capsys)
        assert str(source) in err
    assert files_under(tmp_path) == [tmp_path / "empty.csv"]


def test_the_fitted_preset_calibrate_writes_reads_back(
    measurements: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fit" / "preset.yaml"
    assert main(["calibrate", str(measurements), *FIT_ARGS, "--out", str(out)]) == 0
    pred = tmp_path / "pred.csv"
    assert main(["predict", str(out), str(measurements), "--out", str(pred)]) == 0
    assert len(pd.read_csv(pred)) == 45
    assert files_under(tmp_path) == sorted([measurements, out, pred])
    capsys.readouterr()


def test_scheduler_cases_that_are_not_utf8_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = not_utf8(tmp_path / "cases.jsonl", '{"case": "x"}\n')
    err = error_line(main(["check-scheduler", str(cases)]), capsys)
    assert err.startswith(f"servesim: error: {cases}: ") and "utf-8" in err.lower()


# ---- compare: its outputs checked before any work, the run folder it reads back


def measured_csv(run: Path, path: Path) -> Path:
    """A run's own requests in compare's CSV format (a measurement it matches exactly)."""
    req = pd.read_parquet(run / "requests.parquet")
    frame = pd.DataFrame(
        {"request_id": req["request_id"], "ttft_s": req["ttft_s"], "tpot_s": req["tpot_s"]}
    )
    frame["e2e_s"] = req["e2e_s"]
    frame.to_csv(path, index=False)
    return path


@pytest.fixture
def no_compare(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records any reading of the measurement: a bad output must be refused before it. The
    name is patched where compare looks it up (patching ``measured`` instead, before compare
    was first imported, left compare bound to this stub for the rest of the session)."""
    import simulator.validation.compare as measured

    calls: list[str] = []

    def read(*args: object, **kwargs: object) -> None:
        calls.append("read")
        raise AssertionError("compare read its input before checking its outputs")

    monkeypatch.setattr(measured, "read_measured", read)
    return calls


def test_compare_outputs_that_cannot_be_written_are_refused_before_any_work(
    run_folder: Path, tmp_path: Path, no_compare: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(run_folder, tmp_path)
    measured = measured_csv(folder, tmp_path / "m.csv")
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("x\n")
    for flag, target, reason in (
        ("--json", tmp_path / "a-folder", "is a folder; give a file name"),
        ("--plot", tmp_path / "a-folder", "is a folder; give a file name"),
        ("--json", tmp_path / "a-file" / "x.json", "does not exist"),
    ):
        err = error_line(main(["compare", str(folder), str(measured), flag, str(target)]), capsys)
        assert err.startswith(f"servesim: error: {flag} {target}: ") and reason in err
    (folder / "compare.png").mkdir()  # where the figure goes by default
    err = error_line(main(["compare", str(folder), str(measured)]), capsys)
    assert err == f"servesim: error: {folder / 'compare.png'}: is a folder; give a file name"
    assert no_compare == []


def test_compare_writes_its_json_atomically(
    run_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(run_folder, tmp_path)
    measured = measured_csv(folder, tmp_path / "m.csv")
    out = tmp_path / "out" / "cmp.json"
    out.parent.mkdir()
    out.write_text("{}\n")
    before = out.stat().st_ino
    assert main(["compare", str(folder), str(measured), "--json", str(out), "--no-plot"]) == 0
    assert out.stat().st_ino != before and "metrics" in json.loads(out.read_text())
    assert files_under(out.parent) == [out]
    capsys.readouterr()


def test_compare_of_a_damaged_run_folder_is_one_line(
    run_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_of(run_folder, tmp_path)
    measured = measured_csv(folder, tmp_path / "m.csv")
    (folder / "summary.json").write_bytes(b'{"num_requests": 4')
    err = error_line(main(["compare", str(folder), str(measured), "--no-plot"]), capsys)
    assert err.startswith(f"servesim: error: {folder / 'summary.json'}: not a summary.json")
    shutil.copyfile(run_folder / "summary.json", folder / "summary.json")
    truncate(folder / "requests.parquet")
    err = error_line(main(["compare", str(folder), str(measured), "--no-plot"]), capsys)
    assert err.startswith(f"servesim: error: {folder / 'requests.parquet'}: not a readable")


def test_a_profile_bundle_whose_meta_yaml_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = DATA / "llmservingsim" / "profiles" / "RTX4090" / "Llama-3.1-8B"
    assert bundle.is_dir(), f"{bundle} {MISSING}"
    copy = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    meta = copy / "meta.yaml"
    meta.write_bytes(meta.read_bytes() + "# caf\xe9\n".encode("latin-1"))
    lines = meta.read_bytes().count(b"\n")
    args = ["validate", "scenarios/real-rtx4090-llama31-8b.yaml"]
    trace = DATA / "llmservingsim" / "runs" / "RTX4090" / "Llama-3.1-8B" / "requests.jsonl"
    sets = [f"cost_model.profile={copy}", f"workload.trace.path={trace}"]
    err = error_line(main([*args, *itertools.chain(*(["--set", s] for s in sets))]), capsys)
    assert f"{meta}:{lines}: not UTF-8 text (byte 0xe9)" in err


@pytest.mark.parametrize(
    ("files", "damaged", "reason"),
    [
        ({"capacity.json": b'{"capacity": 3.5, "pro'}, "capacity.json", "not a capacity.json"),
        ({"capacity.json": b'{"capacity": 3.5}'}, "capacity.json", "(no 'slo')"),
        ({"capacity.json": b"[1, 2]"}, "capacity.json", "(not an object)"),
        ({"search.parquet": b"", "search.json": b'{"keys": ['}, "search.json", "not a search"),
        ({"search.parquet": b"PAR1", "search.json": b'{"keys": ["a"]}'}, "search.parquet", "not a"),
    ],
    ids=["capacity-truncated", "capacity-no-keys", "capacity-list", "search-json", "search-table"],
)
def test_plot_of_a_damaged_capacity_or_search_folder_is_one_line(
    files: dict[str, bytes],
    damaged: str,
    reason: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    err = error_line(main(["plot", str(tmp_path)]), capsys)
    assert err.startswith(f"servesim: error: {tmp_path / damaged}: ") and reason in err
    assert not (tmp_path / "plots").exists() or files_under(tmp_path / "plots") == []
