"""From a scenario to a result: resolve presets, build the workload, run, and save atomically."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from simulator import __version__
from simulator.config import ScenarioConfig, dump_scenario, load_scenario, validate
from simulator.cost_model import CostModel, RooflineCostConfig, build_cost_model
from simulator.engine import Simulation, SimulationResult, warn
from simulator.errors import InputError
from simulator.fitted import FittedCostConfig, load_preset
from simulator.workload import Workload, generate


def resolve_num_blocks(cfg: ScenarioConfig) -> int:
    """``scheduler.num_blocks``, or derived from GPU memory for a roofline cost model."""
    if cfg.scheduler.num_blocks is not None:
        return cfg.scheduler.num_blocks
    from simulator.presets import derive_num_blocks, load_hardware, load_model

    cm = cfg.cost_model
    if isinstance(cm, RooflineCostConfig):
        model, hardware, tp = cm.model, cm.hardware, cm.tp
    elif isinstance(cm, FittedCostConfig):
        preset = load_preset(cm.path)  # a fitted preset names the model and GPUs it was fitted on
        model, hardware, tp = preset.model, preset.hardware, preset.tp
    else:
        raise InputError(
            "scheduler.num_blocks: required with a linear cost model (roofline and fitted "
            "models derive it from GPU memory)"
        )
    return derive_num_blocks(
        load_model(model),
        load_hardware(hardware),
        tp,
        cfg.scheduler.block_size,
        cfg.scheduler.gpu_memory_utilization,
    )


def resolve(scenario: ScenarioConfig | dict[str, Any] | str | Path) -> ScenarioConfig:
    """Accept a ScenarioConfig, a plain dict, or a YAML path, and return it validated, with
    ``scheduler.num_blocks`` filled in (so the saved scenario says what was simulated)."""
    if isinstance(scenario, ScenarioConfig):
        cfg = scenario
    elif isinstance(scenario, dict):
        cfg = validate(scenario, "scenario")
    else:
        cfg = load_scenario(scenario)
    if cfg.scheduler.num_blocks is None:
        blocks = resolve_num_blocks(cfg)
        cfg = cfg.model_copy(
            update={"scheduler": cfg.scheduler.model_copy(update={"num_blocks": blocks})}
        )
    return cfg


def build(cfg: ScenarioConfig) -> tuple[Workload, CostModel]:
    """The workload (seeded from ``cfg.seed``) and the cost model of a resolved scenario."""
    streams = np.random.SeedSequence(cfg.seed).spawn(1)
    return generate(cfg.workload, streams[0]), build_cost_model(cfg.cost_model)


def run(
    scenario: ScenarioConfig | dict[str, Any] | str | Path,
    *,
    progress: bool | None = False,
    fast_decode: bool = True,
) -> SimulationResult:
    """Simulate a scenario and return its requests, steps and summary.

    ``progress``: True shows a progress bar on stderr, None shows one only on a terminal.
    ``fast_decode``: False steps plain decodes through the scheduler one by one (same results,
    slower; for checking).
    """
    cfg = resolve(scenario)
    workload, cost_model = build(cfg)
    assert cfg.scheduler.num_blocks is not None
    slo = cfg.slo.model_dump() if cfg.slo is not None else None
    started = time.perf_counter()
    with _progress_bar(len(workload), cfg.name, progress) as tick:
        sim = Simulation(
            workload,
            cost_model,
            num_blocks=cfg.scheduler.num_blocks,
            block_size=cfg.scheduler.block_size,
            max_num_seqs=cfg.scheduler.max_num_seqs,
            max_num_batched_tokens=cfg.scheduler.max_num_batched_tokens,
            slo=slo,
            progress=tick,
            fast_decode=fast_decode,
        )
        result = sim.run()
    warn_rejections(result)
    result.scenario = cfg
    result.extras = {
        "wall_time_s": time.perf_counter() - started,
        "servesim_version": __version__,
        "workload_notes": list(getattr(workload, "notes", ()) or ()),
    }
    return result


@contextmanager
def _progress_bar(
    total: int, name: str, enabled: bool | None
) -> Iterator[Callable[[int], object] | None]:
    if enabled is False:
        yield None
        return
    from tqdm import tqdm

    # tqdm disables itself off a terminal when asked with disable=None
    bar = tqdm(
        total=total,
        desc=name,
        unit="req",
        file=sys.stderr,
        disable=None if enabled is None else False,
        mininterval=0.5,
        leave=False,
    )
    try:
        yield bar.update
    finally:
        bar.close()


def default_out_dir(cfg: ScenarioConfig) -> Path:
    """``results/<name>/<timestamp>/``."""
    return Path("results") / cfg.name / time.strftime("%Y%m%d-%H%M%S")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse a non-empty output folder unless ``overwrite``; refuse a file."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InputError(f"--out {out}: folder is not empty (use --overwrite to replace it)")


@contextmanager
def atomic_dir(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary folder beside ``out``; rename it to ``out`` only if the body succeeds,
    so a failed run never leaves half-written results."""
    check_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        trash = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, trash)
        os.replace(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_result(
    result: SimulationResult, folder: Path, plots: bool = True, fmt: str = "png"
) -> None:
    """Write both tables, summary.json, the resolved scenario and plots into ``folder``."""
    result.requests.to_parquet(folder / "requests.parquet", index=False)
    result.steps.to_parquet(folder / "steps.parquet", index=False)
    if len(result.rejected):
        result.rejected.to_csv(folder / "rejected.csv", index=False)
    summary = dict(result.summary)
    summary["wall_time_s"] = result.extras.get("wall_time_s")
    summary["servesim_version"] = result.extras.get("servesim_version")
    (folder / "summary.json").write_text(
        json.dumps(summary, indent=2, default=_json_default, allow_nan=True) + "\n"
    )
    if result.scenario is not None:
        (folder / "scenario.yaml").write_text(dump_scenario(result.scenario))
    if plots:
        from simulator.plots import save_run_plots

        save_run_plots(result.requests, result.steps, folder / "plots", fmt=fmt)


def warn_rejections(result: SimulationResult) -> None:
    """Say once on stderr how many requests could never fit, with the first reason."""
    if len(result.rejected):
        first = result.rejected.iloc[0]
        warn(
            f"{len(result.rejected)} request(s) rejected: they can never fit in the KV cache "
            f"(e.g. request {first['request_id']}: {first['reason']})"
        )
