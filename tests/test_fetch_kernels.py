"""``servesim fetch kernels``: the registry of NVIDIA's kernel database pinned to a commit of
github.com/ai-dynamo/aiconfigurator, a download of one GPU's vLLM version from a local
file:// mirror (the machine that runs the tests is offline: the mirror holds the installed
package's files, which are the pinned commit's byte for byte for that selection), the reader
on the fetched files when the package is absent, and unknown GPUs or versions as one line."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.cost import KernelsCostConfig, build_cost_model, kernel_db
from simulator.cost.batch import Batch
from simulator.cost.kernels import KernelsCostModel
from simulator.errors import InputError
from simulator.workload.datasets import fetch_files, sha256_of
from simulator.workload.kernel_files import PREFIX, kernel_files, measured, select_kernels

GPU, VERSION = "rtx_pro_6000_server", "0.24.0"
BATCH = Batch([1] * 32 + [700], [900] * 32 + [0])


def test_the_registry_pins_one_commit_and_every_measured_gpu() -> None:
    files = kernel_files()
    assert {e.commit for e in files.values()} == {"095f58a51c4ca8e61b66ec108d86f223f8d559ce"}
    for entry in files.values():
        assert entry.repo == "ai-dynamo/aiconfigurator" and len(entry.sha256) == 64
        assert entry.dest.startswith(PREFIX) and entry.path.endswith(entry.dest[len(PREFIX) :])
    gpus = measured()
    for gpu in ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "l40s", GPU):
        assert gpu in gpus
    assert gpus[GPU][-1] == VERSION and gpus["a100_sxm"] == ["0.14.0"]


def test_a_version_selects_its_tables_and_the_fallbacks_the_reader_takes() -> None:
    chosen = select_kernels([GPU, "0.24"])  # 0.24 is 0.24.0
    dests = {e.dest for e in chosen}
    assert f"{PREFIX}{GPU}/gemm/vllm/{VERSION}/gemm_perf.parquet" in dests
    assert any("/comm/nccl/" in d for d in dests)
    assert not any("/vllm/0.19.0/gemm_perf" in d for d in dests)  # an older version's GEMMs
    assert len(select_kernels([GPU])) > len(chosen)
    # what the package installed here ships at these paths is these very bytes
    root = kernel_db.data_root()
    for entry in chosen:
        assert sha256_of(root / entry.dest[len(PREFIX) :]) == entry.sha256, entry.name


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["kernels", "mi300x"], ["'mi300x'", "h100_sxm", "physics"]),
        (["kernels", GPU, "0.9"], ["0.9", "0.19.0, 0.24.0", "physics"]),
    ],
)
def test_a_gpu_or_version_the_database_lacks_is_one_line(
    args: list[str], words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fetch", *args, "--dest", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    for word in words:
        assert word in err
    assert not any(tmp_path.iterdir())


def _mirror(root: Path) -> str:
    """A file:// mirror (``OWNER/REPO/COMMIT/PATH``) of the selection, from the package."""
    package = kernel_db.data_root()
    for entry in select_kernels([GPU, VERSION]):
        target = root / entry.repo / entry.commit / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package / entry.dest[len(PREFIX) :], target)
    return root.resolve().as_uri()


def test_the_reader_uses_the_fetched_files_without_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = KernelsCostConfig(model="llama-3.1-8b", hardware="rtx-pro-6000")
    installed = build_cost_model(cfg)
    assert isinstance(installed, KernelsCostModel)
    base = _mirror(tmp_path / "mirror")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["fetch", "kernels", GPU, VERSION, "--base-url", base, "--no-progress"]) == 0
    assert re.search(r"15 file\(s\) verified under data", capsys.readouterr().out)
    monkeypatch.setattr(kernel_db, "PACKAGE", "no_such_package_here")
    kernel_db.measured_versions.cache_clear()
    try:
        assert kernel_db.data_root() == Path("data") / "kernels"
        assert kernel_db.measured_gpus() == [GPU]
        fetched = build_cost_model(cfg)
        assert isinstance(fetched, KernelsCostModel) and fetched.db.version == VERSION
        assert fetched.step_time(BATCH) == installed.step_time(BATCH)
        # fetched again: verified in place, nothing downloaded
        again = fetch_files(select_kernels([GPU, VERSION]), "data", base, progress=False)
        assert len(again) == 15
        shutil.rmtree("data")
        with pytest.raises(InputError, match="servesim fetch kernels"):
            kernel_db.data_root()
    finally:
        kernel_db.measured_versions.cache_clear()


def test_a_hardware_preset_name_selects_its_gpu_and_the_listing_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["fetch", "kernels", "rtx-pro-6000", VERSION, "--list", "--dest", str(tmp_path)]) == 0
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("kernels:")]
    assert len(rows) == len(select_kernels([GPU, VERSION])) == 15
    assert all("missing" in row for row in rows) and "groups:" not in out
    assert "ai-dynamo/aiconfigurator@095f58a" in out
