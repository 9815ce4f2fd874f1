"""``servesim fetch``: the registry's checksums, downloads from a local mirror (file:// and a
real HTTP server), failures that leave nothing half-written, and the command line."""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import re
import socket
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli import main
from simulator.errors import InputError
from simulator.workload.datasets import (
    BASE_URL_ENV,
    DATASETS,
    DEFAULT_DEST,
    DataFile,
    fetch,
    file_state,
    groups,
    select,
)
from simulator.workload.traces import read_trace
from tests.fetch_data import build_mirror, fetch_missing, missing
from tests.paths import DATA, MISSING, ROOT, DataFolder

TRACES = ["azure-conv", "azure-code", "mooncake-conv"]


def shared_copy(name: str) -> Path:
    """Our copy of a registry entry (in ../shared/data, else data/), under its one name."""
    path = DATA / DATASETS[name].dest
    assert path.is_file(), f"{path} {MISSING}"
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_mirror(root: Path, names: list[str]) -> Path:
    """A ``<root>/<repo>/<commit>/<path>`` tree holding the named files."""
    return build_mirror(root, [DATASETS[n] for n in names])


def mirrored(root: Path, entry: DataFile) -> Path:
    return root / entry.repo / entry.commit / entry.path


def files_under(folder: Path) -> list[Path]:
    """Every file below ``folder``, hidden ones (temporary downloads) included."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mirror(tmp_path_factory.mktemp("mirror"), list(DATASETS))


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def http_mirror(mirror: Path) -> Iterator[str]:
    """The mirror served by a real HTTP server on 127.0.0.1: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(mirror))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_every_entry_matches_its_copy_byte_for_byte() -> None:
    for name, entry in DATASETS.items():
        copy = shared_copy(name)
        assert entry.name == name
        assert copy.stat().st_size == entry.size, name
        assert sha256(copy) == entry.sha256, name
        assert len(entry.commit) == 40 and len(entry.sha256) == 64


def test_the_trace_scenarios_read_what_fetch_writes() -> None:
    """The trace scenarios read the traces group, the real-* ones LLMServingSim's runs, and
    each says which fetch gets its files."""
    trace_dests = {(DEFAULT_DEST / DATASETS[n].dest).as_posix() for n in TRACES}
    fetched = {(DEFAULT_DEST / e.dest).as_posix(): e.group for e in DATASETS.values()}
    read = set()
    for path in (ROOT / "scenarios").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        trace = data["workload"].get("trace")
        if trace is None:
            continue
        group = fetched.get(trace["path"])
        assert group in ("traces", "llmservingsim"), (path.name, trace["path"])
        assert f"servesim fetch {group}" in path.read_text(), path.name
        if group == "traces":
            read.add(trace["path"])
        else:  # the operator profile is fetched with the run
            profile = data["cost_model"]["profile"]
            assert f"{profile}/meta.yaml" in fetched, path.name
    assert read == trace_dests


def test_selection_by_name_group_and_all() -> None:
    assert [e.name for e in select([])] == TRACES  # the default
    assert [e.name for e in select(["traces"])] == TRACES
    assert [e.name for e in select(["all"])] == list(DATASETS)
    assert [e.name for e in select(["azure-code", "traces", "azure-code"])] == [
        "azure-code",
        "azure-conv",
        "mooncake-conv",
    ]
    assert not set(groups()) & set(DATASETS)  # a group can never shadow a file
    with pytest.raises(InputError, match="unknown dataset 'nope'.*azure-conv.*traces"):
        select(["nope"])
    entry = DATASETS["azure-conv"]
    assert entry.url("https://mirror.example/x/") == (
        "https://mirror.example/x/Azure/AzurePublicDataset/"
        "b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/AzureLLMInferenceTrace_conv.csv"
    )


def test_fetch_traces_then_again_is_up_to_date(
    mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "data"
    said: list[str] = []
    # progress=True: off a terminal (as here) tqdm hides itself
    paths = fetch(["traces"], dest, mirror.as_uri(), progress=True, report=said.append)
    assert paths == [dest / DATASETS[n].dest for n in TRACES]
    for name, path in zip(TRACES, paths, strict=True):
        assert sha256(path) == DATASETS[name].sha256
        assert file_state(DATASETS[name], dest) == "verified"
        assert path.stat().st_mode & 0o777 == 0o644
    assert files_under(dest) == sorted(paths)  # no temporary file left
    captured = capsys.readouterr()
    assert captured.err == ""  # no progress bar off a terminal
    assert captured.out == ""  # a library reports through its callback, never on stdout
    assert sum("downloaded and verified" in line for line in said) == 3

    said.clear()
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}
    assert fetch(["traces"], dest, mirror.as_uri(), report=said.append) == paths
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths} == before
    out = "\n".join(said)
    assert out.count("up to date") == 3 and "downloaded" not in out

    # --force downloads again: a new file (new inode) with the same bytes
    fetch(["azure-code"], dest, mirror.as_uri(), force=True, progress=False)
    assert paths[1].stat().st_ino != before[paths[1]][0]
    assert sha256(paths[1]) == DATASETS["azure-code"].sha256


def test_fetched_azure_code_trace_is_readable(mirror: Path, tmp_path: Path) -> None:
    (path,) = fetch(["azure-code"], tmp_path, mirror.as_uri(), progress=False)
    workload = read_trace(path, "azure")
    assert len(workload.arrival_s) == 8819
    assert workload.arrival_s[0] == 0.0


def test_a_corrupted_mirror_file_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    entry = DATASETS["azure-code"]
    root = make_mirror(tmp_path / "mirror", ["azure-code"])
    blob = bytearray(mirrored(root, entry).read_bytes())
    blob[1000] ^= 1  # same size, one bit off
    mirrored(root, entry).write_bytes(bytes(blob))
    dest = tmp_path / "data"
    with pytest.raises(InputError) as err:
        fetch(["azure-code"], dest, root.as_uri(), progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("azure-code: file://")
    assert f"sha256 mismatch: got {hashlib.sha256(blob).hexdigest()}, expected {entry.sha256}" in (
        message
    )
    assert not (dest / entry.dest).exists()
    assert files_under(dest) == []  # no temporary file either

    mirrored(root, entry).write_bytes(bytes(blob[:5000]))
    with pytest.raises(InputError, match=r"got only 5000 bytes, expected 320117"):
        fetch(["azure-code"], dest, root.as_uri(), progress=False)
    mirrored(root, entry).write_bytes(bytes(blob) + b"trailing junk")
    with pytest.raises(InputError, match=r"got more than 320117 bytes, expected 320117"):
        fetch(["azure-code"], dest, root.as_uri(), progress=False)
    assert files_under(dest) == []


def test_downloads_over_http(http_mirror: str, tmp_path: Path) -> None:
    (path,) = fetch(["splitwise-perf"], tmp_path, http_mirror, progress=False)
    assert path == tmp_path / "splitwise_perf_model.csv"
    assert sha256(path) == DATASETS["splitwise-perf"].sha256


def test_http_404_is_one_line_naming_file_and_url(http_mirror: str, tmp_path: Path) -> None:
    base = f"{http_mirror}/no-such-mirror"
    with pytest.raises(InputError) as err:
        fetch(["azure-conv"], tmp_path, base, progress=False)
    message = str(err.value)
    assert message == f"azure-conv: {DATASETS['azure-conv'].url(base)}: HTTP 404 File not found"
    assert files_under(tmp_path) == []


def test_a_wrong_existing_file_is_replaced(
    mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = DATASETS["azure-code"]
    path = tmp_path / entry.dest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nnot the trace\n")
    assert file_state(entry, tmp_path) == "mismatch"
    said: list[str] = []
    fetch(["azure-code"], tmp_path, mirror.as_uri(), progress=False, report=said.append)
    assert sha256(path) == entry.sha256
    assert "does not match its sha256, downloading it again" in said[0]


def test_a_failed_download_keeps_the_existing_file(http_mirror: str, tmp_path: Path) -> None:
    entry = DATASETS["azure-code"]
    path = tmp_path / entry.dest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("an older local edit\n")
    with pytest.raises(InputError, match="HTTP 404"):
        fetch(["azure-code"], tmp_path, f"{http_mirror}/gone", progress=False)
    assert path.read_text() == "an older local edit\n"
    assert files_under(tmp_path) == [path]


def test_a_silent_server_times_out(tmp_path: Path) -> None:
    # a listening socket nobody accepts on: the connection opens, no answer ever comes
    with socket.create_server(("127.0.0.1", 0)) as silent:
        base = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(InputError, match=r"^azure-code: http://.*: timed out after 0.2 s$"):
            fetch(["azure-code"], tmp_path, base, progress=False, timeout=0.2)
    assert files_under(tmp_path) == []


def test_cli_list_shows_every_file_and_its_state(
    mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fetch", "--list", "--dest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for entry in DATASETS.values():
        assert entry.name in out and str(tmp_path / entry.dest) in out
        assert f"{entry.repo}@{entry.commit[:7]} {entry.path}" in out
        assert entry.license in out
    assert out.count("missing") == len(DATASETS)

    fetch(["azure-code"], tmp_path, mirror.as_uri(), progress=False)
    capsys.readouterr()
    assert main(["fetch", "--list", "azure-code", "--dest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("azure")]
    assert rows == [
        [
            "azure-code",
            "0.32",
            "MB",
            "CC-BY-4.0",
            "verified",
            str(tmp_path / "azure2023_code.csv"),
        ]
    ]


def test_cli_unknown_name_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fetch", "nope", "--dest", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err
    assert err.startswith("servesim: error: unknown dataset 'nope'")
    assert all(name in err for name in DATASETS)
    assert not tmp_path.exists() or files_under(tmp_path) == []


def test_cli_fetch_defaults_to_traces_and_reads_the_mirror_from_the_environment(
    mirror: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BASE_URL_ENV, mirror.as_uri())
    monkeypatch.chdir(tmp_path)
    assert main(["fetch", "--no-progress"]) == 0
    assert files_under(tmp_path) == sorted(tmp_path / "data" / DATASETS[n].dest for n in TRACES)
    assert "3 file(s) verified under data" in capsys.readouterr().out

    # --base-url wins over the environment
    monkeypatch.setenv(BASE_URL_ENV, "http://127.0.0.1:9/unreachable")
    args = ["fetch", "sharegpt-lengths", "--dest", "d", "--base-url", mirror.as_uri()]
    assert main(args) == 0
    assert sha256(tmp_path / "d" / DATASETS["sharegpt-lengths"].dest) == (
        DATASETS["sharegpt-lengths"].sha256
    )
    assert os.listdir(tmp_path / "d") == ["sharegpt_8k_filtered_stats_llama2_tokenizer.csv"]


# ---- one set of names: the tests read what fetch saves, and make test fetches what is missing


def _joined_onto_data(node: ast.AST) -> list[str] | None:
    """``DATA / "a" / "b"`` -> ``["a", "b"]``; None for anything else."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
        return None
    if isinstance(node.left, ast.Name) and node.left.id == "DATA":
        base: list[str] | None = []
    else:
        base = _joined_onto_data(node.left)
    right = node.right
    if base is None or not (isinstance(right, ast.Constant) and isinstance(right.value, str)):
        return None
    return [*base, right.value]


def data_names_the_tests_read() -> set[str]:
    """Every constant path a test module joins onto ``DATA`` (a file, or a folder of them)."""
    names = set()
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            parts = _joined_onto_data(node)
            if parts:
                names.add("/".join(parts))
    return names


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def scenario_data_paths() -> set[str]:
    """Every ``data/...`` path (a file, or a folder of them) a scenario in scenarios/ reads."""
    return {
        text
        for path in (ROOT / "scenarios").glob("*.yaml")
        for text in _strings(yaml.safe_load(path.read_text()))
        if text.startswith("data/")
    }


def test_a_mirror_of_the_data_gives_every_file_the_tests_and_scenarios_read(
    mirror: Path, tmp_path: Path
) -> None:
    """The mirror (BASE/OWNER/REPO/COMMIT/PATH, built from our copies) is what
    ``SERVESIM_DATA_URL=file://...`` points ``make test`` at on a clone with no ../shared:
    fetching everything from it gives each file under the name the tests and scenarios use."""
    dest = tmp_path / "data"
    paths = fetch(["all"], dest, mirror.as_uri(), progress=False)
    assert files_under(dest) == sorted(paths)  # every file, nothing else, nothing temporary
    for entry in DATASETS.values():
        assert file_state(entry, dest) == "verified", entry.name
    fetched = {p.relative_to(dest).as_posix() for p in paths}
    folders = {str(Path(f).parents[i]) for f in fetched for i in range(len(Path(f).parts) - 1)}
    read = data_names_the_tests_read()
    assert {"splitwise_perf_model.csv", "azure2023_conv.csv"} <= read  # the scan sees them
    unknown = sorted(n for n in read if n not in fetched and n not in folders)
    assert unknown == [], f"tests read data files no fetch provides: {unknown}"
    scenario_paths = scenario_data_paths()
    assert "data/azure2023_code.csv" in scenario_paths
    unknown = sorted(p for p in scenario_paths if p[len("data/") :] not in fetched | folders)
    assert unknown == [], f"scenarios read data files no fetch provides: {unknown}"


def test_the_data_folder_prefers_shared_then_fetched(tmp_path: Path) -> None:
    shared, fetched = tmp_path / "shared", tmp_path / "fetched"
    for folder, names in ((shared, ["both.csv", "shared.csv"]), (fetched, ["both.csv", "f.csv"])):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(name)
    data = DataFolder()
    data.places = (shared, fetched)
    assert data / "both.csv" == shared / "both.csv"
    assert data / "shared.csv" == shared / "shared.csv"
    assert data / "f.csv" == fetched / "f.csv"
    assert data / "nowhere.csv" == fetched / "nowhere.csv"  # the test then fails naming it


def test_make_test_fetches_what_is_missing_then_is_silent_and_offline(
    mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    no_shared, fetched = tmp_path / "no-shared", tmp_path / "data"
    assert missing(no_shared, fetched) == list(DATASETS.values())
    assert fetch_missing(no_shared, fetched, mirror.as_uri()) == 0
    assert missing(no_shared, fetched) == []
    captured = capsys.readouterr()
    assert captured.err.startswith(f"fetching {len(DATASETS)} data file(s)")
    assert captured.out.count("downloaded and verified") == len(DATASETS)

    offline = "http://127.0.0.1:9/no-network"
    assert fetch_missing(no_shared, fetched, offline) == 0  # all verified in data/
    # a full ../shared/data and no network: nothing fetched, nothing said, data/ not made
    assert fetch_missing(fetched, tmp_path / "unused", offline) == 0
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "unused").exists()

    gone = DATASETS["azure-code"]
    (fetched / gone.dest).unlink()
    assert fetch_missing(fetched, tmp_path / "second", offline) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("fetching 1 data file(s)")
    assert err[1].startswith(f"fetch_data: error: azure-code: {offline}/")
    assert f"set {BASE_URL_ENV} to a mirror" in err[1]
    assert files_under(tmp_path / "second") == []


def test_make_test_runs_the_data_step_before_the_tests() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: lint test-data( native)?$", makefile, re.M)
    assert re.search(r"^test-data: .*\n\t\$\(BIN\)/python -m tests\.fetch_data$", makefile, re.M)


def test_only_the_top_data_folder_is_ignored_by_git() -> None:
    """data/ (what fetch saves) is git-ignored; tests/data (our recorded scheduler cases, read
    by tests/test_vllm_v1.py) is part of the repository: an unanchored ``data/`` pattern kept
    it out of every clone. ``/data`` without the slash: also a symlink to ../shared/data."""
    patterns = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    assert "/data" in patterns
    assert not [p for p in patterns if p.rstrip("/").endswith("data") and not p.startswith("/")]
    cases = ROOT / "tests" / "data" / "vllm_v1_scheduler" / "cases.jsonl"
    assert sha256(cases) == "1e21857a1931c443c7894a471d6886f642156803cc5fecceedfba766a8d58730"


def test_fetch_llmservingsim_gives_the_whole_folder_of_runs_and_profiles() -> None:
    """Every file of our llmservingsim/ folder (runs, profiles, the workload, the format
    notes) is registered, under the same path, pinned to LLMServingSim's commit."""
    folder = DATA / "llmservingsim"
    assert folder.is_dir(), f"{folder} {MISSING}"
    present = {p.relative_to(folder.parent).as_posix() for p in folder.rglob("*") if p.is_file()}
    registered = {e.dest: e for e in DATASETS.values() if e.group == "llmservingsim"}
    assert present == set(registered)
    assert {e.repo for e in registered.values()} == {"casys-kaist/LLMServingSim"}
    assert {e.license for e in registered.values()} == {"MIT"}
    runs = {d for d in registered if d.startswith("llmservingsim/runs/")}
    for gpu in ("RTX4090", "RTXPRO6000"):
        for name in ("meta.json", "requests.jsonl", "timeseries.csv", "llmservingsim_summary.txt"):
            assert f"llmservingsim/runs/{gpu}/Llama-3.1-8B/{name}" in runs


def test_a_dest_under_a_file_is_one_line_naming_it(mirror: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    with pytest.raises(InputError) as err:
        fetch(["azure-code"], blocker / "data", mirror.as_uri(), progress=False)
    assert str(err.value) == (
        f"azure-code: cannot write into {blocker / 'data'}: {blocker} is not a folder"
    )


def test_the_registry_is_a_data_file_pinned_per_entry() -> None:
    """The registry is configs/datasets.csv (one row per file), not code."""
    from simulator.workload.datasets import REGISTRY, load_registry

    assert REGISTRY == ROOT / "configs" / "datasets.csv"
    assert load_registry() == DATASETS
    assert "llmservingsim:runs/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/meta.json" in DATASETS
    assert "llmservingsim:profiles/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/tp1/moe.csv" in DATASETS
    assert "llmservingsim:models/Qwen3-30B-A3B-Instruct-2507.json" in DATASETS
    source = (ROOT / "simulator" / "workload" / "datasets.py").read_text()
    assert not re.search(r"[0-9a-f]{64}", source)  # no checksum lives in the code


def test_cli_a_failed_fetch_leaves_no_empty_data_folder(
    http_mirror: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["fetch", "azure-code", "--no-progress", "--base-url", f"{http_mirror}/gone"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("HTTP 404 File not found")
    assert os.listdir(tmp_path) == []  # no data/, no temporary file
    # nor an empty llmservingsim/ tree under an existing data/
    (tmp_path / "data").mkdir()
    name = "llmservingsim:profiles/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/tp1/moe.csv"
    assert main(["fetch", name, "--no-progress", "--base-url", f"{http_mirror}/gone"]) == 2
    assert os.listdir(tmp_path / "data") == []


class _FlakyHandler(_QuietHandler):
    """Answers 503 to the first request of each path, then serves the file."""

    seen: set[str]

    def do_GET(self) -> None:
        if self.path not in self.seen:
            self.seen.add(self.path)
            self.send_error(503, "Busy")
            return
        super().do_GET()


def test_a_passing_server_error_is_retried(mirror: Path, tmp_path: Path) -> None:
    handler = type("Flaky", (_FlakyHandler,), {"seen": set()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=mirror))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        (path,) = fetch(["azure-code"], tmp_path, base, progress=False)
        assert sha256(path) == DATASETS["azure-code"].sha256
        with pytest.raises(InputError, match=r"HTTP 503 Busy$"):
            fetch(["azure-conv"], tmp_path / "again", base, progress=False, retries=0)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert not (tmp_path / "again").exists()
