"""The compiled hot path (simulator/native.py, built by ``make``): in use, and giving the tables
its sources give, bit for bit, on each kind of run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest

from simulator import native
from tests.paths import ROOT

SMALL = ["--set", "workload.num_requests=400"]
RUNS = {
    "spec": ["scenarios/quickstart.yaml"],
    "vllm-v1": ["scenarios/quickstart.yaml", "--set", "scheduler.policy=vllm-v1"],
    "preemption": ["scenarios/tight-kv-preemption.yaml"],
    "budgets": ["scenarios/chunked-prefill-budgets.yaml"],
    "least_kv": [
        "scenarios/quickstart.yaml",
        *("--set", "cluster.replicas=4", "--set", "cluster.router=least_kv"),
    ],
    "dp2": ["scenarios/quickstart.yaml", "--set", "parallel.data_parallel_size=2"],
    "speculative": [
        *("scenarios/quickstart.yaml", "--set", "scheduler.policy=vllm-v1"),
        *("--set", "speculative.num_speculative_tokens=2"),
        *("--set", "speculative.acceptance.rate=0.7"),
    ],
}


def servesim(args: list[str], out: Path, pure: bool) -> Path:
    """``servesim run`` of ``args`` into ``out``, compiled or (``pure``) from source."""
    env = {**os.environ, "SERVESIM_PURE": "1" if pure else "0"}
    cmd = [sys.executable, "-m", "simulator", "run", *args, *SMALL, "--no-plots", "--out", out]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out


def test_make_compiled_the_hot_path() -> None:
    """``make test`` compiles first: wherever a C compiler is, a failed or stale build would
    otherwise run half as fast without a word. Where none is, the sources run."""
    from simulator.scheduling import step_scheduler

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        assert not native.compiled_in_use() and step_scheduler.__file__.endswith(".py")
        return
    assert native.compiled_in_use(), (
        f"not compiled or stale: run `make native` (see {ROOT / 'build' / 'native.log'})"
    )
    for module in native.COMPILED:
        assert sys.modules.get(module) is None or sys.modules[module].__file__.endswith(".so")
    assert step_scheduler.__file__ is not None and step_scheduler.__file__.endswith(".so")


@pytest.mark.parametrize("run", sorted(RUNS))
def test_compiled_and_source_give_the_same_tables(run: str, tmp_path: Path) -> None:
    compiled = servesim(RUNS[run], tmp_path / "compiled", pure=False)
    source = servesim(RUNS[run], tmp_path / "source", pure=True)
    tables = sorted(p.name for p in compiled.glob("*.parquet"))
    assert "steps.parquet" in tables and tables == sorted(p.name for p in source.glob("*.parquet"))
    for name in tables:
        a, b = pd.read_parquet(compiled / name), pd.read_parquet(source / name)
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=name)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (compiled, source))
    assert a.pop("wall_time_s") >= 0 and b.pop("wall_time_s") >= 0
    assert a == b


def test_a_changed_source_is_imported_from_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = {"python": sys.implementation.cache_tag, "modules": native.source_hashes()}
    manifest = tmp_path / "_native.json"
    monkeypatch.setattr(native, "MANIFEST", manifest)
    manifest.write_text(json.dumps(record))
    assert native.compiled_in_use()
    record["modules"]["simulator.engine.server"] = "0" * 64  # compiled from another source
    manifest.write_text(json.dumps(record))
    assert not native.compiled_in_use()
    manifest.unlink()
    assert not native.compiled_in_use()


def test_servesim_pure_imports_every_compiled_module_from_source() -> None:
    code = (
        "import importlib, sys; print(*(importlib.import_module(m).__file__ for m in sys.argv[1:]))"
    )
    env = {**os.environ, "SERVESIM_PURE": "1"}
    cmd = [sys.executable, "-c", code, *native.COMPILED]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    files = done.stdout.split()
    assert len(files) == len(native.COMPILED) and all(f.endswith(".py") for f in files)


def test_only_the_current_compiled_modules_skip_their_source() -> None:
    """An extension left beside a module by an older build (another branch's list) is never
    imported: every other module of the package comes from its source."""
    finder = native._SourceFirst(frozenset({"simulator.engine.server"}))
    assert finder.find_spec("simulator.engine.server", None) is None
    spec = finder.find_spec("simulator.cluster.cluster", None)
    assert spec is not None and spec.origin == str(ROOT / "simulator" / "cluster" / "cluster.py")
    assert finder.find_spec("numpy", None) is None
    assert finder.find_spec("simulator.cluster", None) is None  # a package: its __init__


def test_no_exception_outlives_a_cluster_run() -> None:
    """A hold cut by an interrupt is caught inside the server's loop; compiled code that
    yielded inside that ``except`` left the interrupt as the exception being handled, and
    every later error chained onto it."""
    import simulator

    cfg = {
        "name": "cuts",
        "seed": 0,
        "scheduler": {"max_num_batched_tokens": 2048, "max_num_seqs": 64, "num_blocks": 4000},
        "cost_model": {"type": "linear", "base_ms": 5, "per_token_ms": 0.01},
        "workload": {
            "num_requests": 500,
            "arrival": {"process": "poisson", "rate": 20},
            "prompt_len": {"dist": "fixed", "value": 200},
            "output_len": {"dist": "fixed", "value": 100},
        },
        "cluster": {"replicas": 4, "router": "least_outstanding"},
    }
    assert len(simulator.run(cfg).requests) == 500
    assert sys.exc_info() == (None, None, None)
