"""From a scenario to a result: resolve presets, check it fits in memory, build, run."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from simulator.cost import CostModel, CostModelConfig, build_cost_model
from simulator.cost.gpus import named_gpus
from simulator.engine.result import SimulationResult
from simulator.engine.serving import StepWithCpu
from simulator.engine.simulation import Simulation
from simulator.engine.step_sink import make_sink
from simulator.engine.watch import StopRule
from simulator.errors import DoesNotFit, InputError, in_field, warn
from simulator.scenario.config import ScenarioConfig, load_scenario, validate
from simulator.scenario.feasibility import (
    check_budgets,
    check_max_model_len,
    check_nodes,
    check_scenario_memory,
)
from simulator.scenario.kv_groups import with_kv_groups
from simulator.scheduling import SchedulerConfig, make_scheduler
from simulator.version import __version__
from simulator.workload import Workload, check_input_files, generate


def scheduler_for(sched: SchedulerConfig, cm: CostModelConfig, prefix: str = "") -> SchedulerConfig:
    """``sched`` with what it leaves out filled in for the GPUs of ``cm``: the budgets as
    ``vllm serve`` sets them (``serve_budgets``), then ``num_blocks`` (``num_blocks_for``);
    ``prefix`` goes before the keys named in errors (a cluster's replica group)."""
    check_nodes(cm, prefix)  # a TP group beyond one node, before its memory is derived
    defaulted = sched.max_num_batched_tokens is None
    if defaulted or sched.max_num_seqs is None:
        from simulator.cost.presets import load_hardware, serve_budgets

        gpus = named_gpus(cm, prefix)
        hw = (
            None
            if gpus is None
            else in_field(f"{gpus.where}hardware", load_hardware, gpus.hardware)
        )
        tokens, seqs = serve_budgets(hw, sched.max_num_batched_tokens, sched.max_num_seqs)
        sched = sched.model_copy(update={"max_num_batched_tokens": tokens, "max_num_seqs": seqs})
    check_budgets(sched, prefix, defaulted)
    sched = with_kv_groups(sched, cm, prefix)  # a hybrid model's groups and their blocks
    if sched.num_blocks is None:
        sched = sched.model_copy(update={"num_blocks": num_blocks_for(sched, cm, prefix)})
    check_max_model_len(sched, prefix)
    return sched


def num_blocks_for(sched: SchedulerConfig, cm: CostModelConfig, prefix: str = "") -> int:
    """``sched.num_blocks``, or derived from the GPU memory of the cost model's presets;
    ``prefix`` goes before the keys named in errors (a cluster's replica group)."""
    if sched.num_blocks is not None:
        return sched.num_blocks
    from simulator.cost.presets import derive_num_blocks, load_hardware, load_model

    gpus = named_gpus(cm, prefix)
    # the cost config's weight/KV dtype keys (roofline, profiled) size weights and KV
    dtypes = (getattr(cm, "weight_dtype", None), getattr(cm, "kv_dtype", None))
    ep = getattr(cm, "expert_parallel", 1)  # each EP rank holds its share of the experts
    if gpus is None:
        raise InputError(
            f"{prefix}scheduler.num_blocks: required with a cost model that names no model "
            "and GPUs, such as a linear one (roofline, fitted and profiled models derive it "
            "from GPU memory)"
        )
    model = in_field(f"{gpus.where}model", lambda m: load_model(m, *dtypes), gpus.model)
    hw = in_field(f"{gpus.where}hardware", load_hardware, gpus.hardware)
    try:
        return derive_num_blocks(
            model,
            hw,
            gpus.tp,
            sched.block_size,
            sched.gpu_memory_utilization,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            max_num_seqs=sched.max_num_seqs,
            ep=ep if ep > 1 else None,
        )
    except DoesNotFit as err:  # derived for a deployment that cannot exist
        raise DoesNotFit(f"{prefix}scheduler.num_blocks: {err}") from None


def resolve(scenario: ScenarioConfig | dict[str, Any] | str | Path) -> ScenarioConfig:
    """Accept a ScenarioConfig, a plain dict, or a YAML path, and return it validated, with
    the scheduler's budgets and ``num_blocks`` filled in (so the saved scenario says what was
    simulated)."""
    if isinstance(scenario, ScenarioConfig):
        cfg = scenario
    elif isinstance(scenario, dict):
        cfg = validate(scenario, "scenario")
    else:
        cfg = load_scenario(scenario)
    check_input_files(cfg.workload)
    if cfg.parallel is not None:
        from simulator.scenario.parallel import with_expert_parallel

        cfg = with_expert_parallel(cfg)
    if cfg.cluster is not None:
        from simulator.scenario.cluster import resolve_cluster

        cfg = cfg.model_copy(update={"cluster": resolve_cluster(cfg, scheduler_for)})
    cfg = cfg.model_copy(update={"scheduler": scheduler_for(cfg.scheduler, cfg.cost_model)})
    if cfg.scheduler.kv_offload is not None or cfg.cluster is not None:
        from simulator.scenario.offload import resolve_offload

        cfg = resolve_offload(cfg)  # KV tiers: their bytes per token, their memory checked
    if cfg.scheduler.preemption_mode == "swap":
        from simulator.scenario.swap import resolve_swap

        cfg = resolve_swap(cfg)  # its KV bytes and host link, its memory checked
    if cfg.workload.multimodal is not None or cfg.workload.trace is not None:
        from simulator.scenario.multimodal import resolve_multimodal

        cfg = resolve_multimodal(cfg)  # its images' tokens, encoder budget and cache
    check_scenario_memory(cfg)  # a given num_blocks may not fit beside the weights
    return cfg


def build(cfg: ScenarioConfig) -> tuple[Workload, CostModel]:
    """The workload (seeded from ``cfg.seed``) and the cost model of a resolved scenario (the
    GPU's model, with the CPU's per-step time when ``serving`` gives one)."""
    streams = np.random.SeedSequence(cfg.seed).spawn(1)
    cost_model = build_cost_model(cfg.cost_model)

    if cfg.serving.changes_steps:
        cost_model = StepWithCpu(cost_model, cfg.serving)
    return generate(cfg.workload, streams[0]), cost_model


def acceptance_rng(cfg: ScenarioConfig) -> np.random.Generator | None:
    """The stream of speculative decoding's acceptance draws: the root's second child (the
    first is the workload's, unchanged by it), or None without speculation."""
    if cfg.speculative is None:
        return None
    return np.random.default_rng(np.random.SeedSequence(cfg.seed).spawn(2)[1])


def speculation_of(cfg: ScenarioConfig) -> dict[str, Any]:
    """The simulation's speculative-decoding arguments (none without ``speculative``)."""
    spec = cfg.speculative
    if spec is None:
        return {}
    return {"num_speculative_tokens": spec.num_speculative_tokens, "draft_cost": spec.draft_cost}


def run(
    scenario: ScenarioConfig | dict[str, Any] | str | Path,
    *,
    progress: bool | None = False,
    fast_decode: bool = True,
    steps: str = "full",
    steps_path: Path | None = None,
    stop: StopRule | None = None,
) -> SimulationResult:
    """Simulate a scenario and return its requests, steps and summary.

    ``progress``: True shows a progress bar on stderr, None shows one only on a terminal.
    ``fast_decode``: False steps plain decodes through the scheduler one by one (same results,
    slower; for checking). ``steps``: ``full`` records every step, ``sampled`` one in 100 plus
    every step that preempted, ``none`` no step row (the summary counts every step either way).
    ``steps_path``: stream the step table to this parquet file as the run goes, a chunk at a
    time, instead of keeping it in memory (``result.steps`` is then None). ``stop``: a rule
    that may end the run early by raising ``StoppedEarly`` (not asked in a closed loop).
    """
    cfg = resolve(scenario)
    check_workload_fits(cfg)
    workload, cost_model = build(cfg)
    assert cfg.scheduler.num_blocks is not None
    slo = cfg.slo.model_dump() if cfg.slo is not None else None
    started = time.perf_counter()
    with _progress_bar(len(workload), cfg.name, progress) as tick:
        if cfg.cluster is not None:
            from simulator.scenario.cluster import build_cluster

            cluster = build_cluster(cfg, workload, slo, tick, fast_decode, steps)
            return _finish(cluster.run(), cfg, workload, started)
        if cfg.parallel is not None and cfg.parallel.is_data_parallel:
            from simulator.scenario.parallel import build_dp_simulation

            kw = {"slo": slo, "step_sink": make_sink(steps, steps_path), "stop": stop}
            dp = build_dp_simulation(cfg, workload, tick, **kw)
            return _finish(dp.run(), cfg, workload, started)
        sim = Simulation(
            workload,
            cost_model,
            # no sampler: tokens only counted (engine/tokens.py)
            make_scheduler(
                cfg.scheduler,
                speculative=cfg.speculative,
                rng=acceptance_rng(cfg),
                gpus=_num_gpus(cfg.cost_model),
            ),
            slo=slo,
            progress=tick,
            fast_decode=fast_decode,
            max_concurrency=cfg.workload.concurrency_caps,
            percentiles=cfg.metrics.percentiles,
            step_sink=make_sink(steps, steps_path),
            serving=cfg.serving,
            stop=stop,
            **speculation_of(cfg),
        )
        _price_images(sim, cfg)
        result = sim.run()
    return _finish(result, cfg, workload, started)


def _price_images(sim: Simulation, cfg: ScenarioConfig) -> None:
    """The vision encoder's time on the steps that encode images (imported only when the
    workload may have some)."""
    if cfg.workload.multimodal is not None or cfg.workload.trace is not None:
        from simulator.scenario.multimodal import encoder_cost

        sim.price_encoder(encoder_cost(cfg))


def _num_gpus(cm: CostModelConfig) -> int:
    """GPUs of the server the cost model names (1 when it names none)."""
    gpus = named_gpus(cm)
    return 1 if gpus is None else gpus.tp


def _finish(
    result: SimulationResult, cfg: ScenarioConfig, workload: Workload, started: float
) -> SimulationResult:
    """Warn about rejections and fixed trace rows; attach the scenario and run metadata."""
    warn_rejections(result)
    for note in workload.notes:  # what a trace reader fixed, said once
        warn(f"workload: {note}")
    result.scenario = cfg
    result.extras = {
        "wall_time_s": time.perf_counter() - started,
        "servesim_version": __version__,
        "workload_notes": list(workload.notes),
    }
    return result


@contextmanager
def _progress_bar(
    total: int, name: str, enabled: bool | None
) -> Iterator[Callable[[int], object] | None]:
    # None: only on a terminal (as tqdm's disable=None, decided before importing it: 15 ms)
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        desc=name,
        unit="req",
        file=sys.stderr,
        disable=False,
        mininterval=0.5,
        leave=False,
    )
    try:
        yield bar.update
    finally:
        bar.close()


# Peak memory (max RSS) of a whole run per request, measured with quickstart.yaml's
# ShareGPT-like lengths at a stable rate (benchmarks/README.md, speed_bench.py): 0.29 GB at
# 1e5 requests and 0.85 GB at 1e6, of which ~0.27 GB is the interpreter and its libraries,
# i.e. ~0.6 KB per request, held per request (the workload's arrays, the recorder's lists, the
# requests table); step rows and inter-token gaps are streamed, so lengths hardly matter. The
# typical figure rounds that up to 1 KB with the start-up included; the floor, used to refuse a
# workload that can never fit, is half the measured per-request figure.
TYPICAL_BYTES_PER_REQUEST = 1024
MIN_BYTES_PER_REQUEST = 300
# The cap on workload.num_requests when the machine's memory cannot be read.
MAX_REQUESTS_UNKNOWN_MEMORY = 10**8


def estimate_memory_bytes(num_requests: int) -> tuple[int, int]:
    """(floor, typical) peak memory of simulating ``num_requests`` requests, in bytes
    (see ``TYPICAL_BYTES_PER_REQUEST`` for where the figures come from)."""
    return num_requests * MIN_BYTES_PER_REQUEST, num_requests * TYPICAL_BYTES_PER_REQUEST


# Memory limits of a container (cgroup v2, then v1): sysconf reports the host's memory, and a
# run past the container's limit is killed without a word.
CGROUP_LIMIT_FILES = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def physical_memory_bytes() -> int | None:
    """The memory this process may use: the machine's physical memory, or a container's lower
    limit; None where the OS does not say."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    total = pages * page_size if pages > 0 and page_size > 0 else None
    for path in CGROUP_LIMIT_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0 and (total is None or int(text) < total):
            total = int(text)  # "max" (v2) or a huge number (v1) mean no limit
        break
    return total


def _gb(n: float) -> str:
    return f"{n / 1e9:,.0f} GB" if n >= 1e10 else f"{n / 1e9:.1f} GB"


def check_workload_fits(cfg: ScenarioConfig) -> None:
    """Refuse, before anything is sampled, a synthetic workload too big to ever fit in memory
    (rather than dying with an out-of-memory error); warn when it may not fit."""
    n = cfg.workload.num_requests
    if n is None:  # a trace: as big as its file
        return
    floor, typical = estimate_memory_bytes(n)
    memory = physical_memory_bytes()
    if memory is None:
        if n > MAX_REQUESTS_UNKNOWN_MEMORY:
            raise InputError(
                f"workload.num_requests: {n:,} requests is more than servesim simulates in one "
                f"run ({MAX_REQUESTS_UNKNOWN_MEMORY:,}; ~1 KB of memory each)"
            )
        return
    if floor > memory:
        raise InputError(
            f"workload.num_requests: {n:,} requests need at least {_gb(floor)} of memory "
            f"(~{_gb(typical)} with typical lengths), more than this machine's {_gb(memory)}"
        )
    if typical > memory:
        warn(
            f"workload.num_requests: {n:,} requests may need ~{_gb(typical)} of memory "
            f"(this machine has {_gb(memory)})"
        )


def warn_rejections(result: SimulationResult) -> None:
    """Say once on stderr how many requests could never be served, with the first reason."""
    table = result.rejected_table
    if len(table):
        first, reason = table["request_id"][0], table["reason"][0]
        warn(
            f"{len(table)} request(s) rejected: they can never be served "
            f"(e.g. request {first}: {reason})"
        )
