"""Leave-one-GPU-out of the `physics` cost model over the GPUs of NVIDIA's measured-kernel
database (configs/physics/sources-kernels.yaml: today's operator profiles plus every database
GPU's GEMMs and attention). Per held-out GPU, `physics` is fitted without it, so the GPU is
priced from its spec sheet alone, and compared with what the database measured there:
(a) its kernels, the same rows the fit reads of the other GPUs (GEMMs and attention, median
and p90 absolute error); (b) whole steps, `physics` against the `kernels` cost model on that
GPU over cost/learn/steps.py's step grid (decodes, prefill chunks, mixed steps), for
Llama-3.1-8B and Llama-3-70B at TP 1 (one GPU: no all-reduce, which neither fit covers here);
beside it the same steps priced with the shipped configs/physics/params.yaml (today's fit).
Writes docs/fidelity.md between the PHYSICS-KERNELS markers. Deterministic.

    .venv/bin/python benchmarks/physics_kernels_logo.py            # write the table
    .venv/bin/python benchmarks/physics_kernels_logo.py --check    # exit 1 if stale
    .venv/bin/python benchmarks/physics_kernels_logo.py --gpu l40s # one GPU, print only
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.cost.kernels import KernelsCostConfig, KernelsCostModel  # noqa: E402
from simulator.cost.learn.kernel_source import kernel_sets, load_gpu  # noqa: E402
from simulator.cost.learn.run import learn  # noqa: E402
from simulator.cost.learn.sources import Sources, load_sources  # noqa: E402
from simulator.cost.learn.steps import step_grid  # noqa: E402
from simulator.cost.physics import PhysicsCostConfig, PhysicsCostModel  # noqa: E402
from simulator.cost.physics_params import PhysicsParams, load_params  # noqa: E402
from simulator.cost.presets import load_model  # noqa: E402
from tests.paths import DATA  # noqa: E402

DOC = ROOT / "docs" / "fidelity.md"
SOURCES = ROOT / "configs" / "physics" / "sources-kernels.yaml"
BEGIN, END = "<!-- BEGIN PHYSICS-KERNELS -->", "<!-- END PHYSICS-KERNELS -->"
STEP_MODELS = ("llama-3.1-8b", "llama-3-70b")
"""Models whose steps are compared (TP 1)."""


def kernel_errors(sources: Sources, gpu: str, params: PhysicsParams) -> dict[str, np.ndarray]:
    """Signed relative errors of ``params`` on ``gpu``'s database rows, by ``gemm`` and
    ``attention``."""
    assert sources.kernels is not None
    hw = load_gpu(gpu)
    p, c, m = params.for_gpu(hw.name)
    out: dict[str, list[np.ndarray]] = {"gemm": [], "attention": []}
    for op, measured, predict, _ in kernel_sets(sources.kernels, hw):
        pred = predict(p, hw.peak_flops * c, hw.hbm_bandwidth * m)
        out[op.split(":")[0]].append(pred / measured - 1)
    return {k: np.concatenate(v) for k, v in out.items()}


def step_errors(gpu: str, params: PhysicsParams, models: Sequence[str] = STEP_MODELS) -> np.ndarray:
    """Signed relative errors of `physics` (``params``) against `kernels` over the step
    grid, for each of ``models`` at TP 1 on ``gpu``."""
    hw = load_gpu(gpu)
    errs = []
    for name in models:
        model = load_model(name)
        kernels = KernelsCostModel(KernelsCostConfig(model=name, hardware=gpu), model, hw)
        physics = PhysicsCostModel(PhysicsCostConfig(model=name, hardware=gpu), model, hw, params)
        errs += [physics.step_time(b) / kernels.step_time(b) - 1 for b in step_grid()]
    return np.asarray(errs)


def _stats(errs: np.ndarray) -> tuple[float, float]:
    a = np.abs(errs) * 100
    return float(np.median(a)), float(np.percentile(a, 90))


def fit_without(sources: Sources, data: Path, gpu: str) -> PhysicsParams:
    """The parameters fitted on ``sources`` less every source of hardware preset ``gpu``."""
    shipped = load_params(None).allreduce
    return learn(sources, data, f"--exclude {gpu}", [gpu], [data, ROOT / "data"], shipped)


def row(sources: Sources, data: Path, gpu: str) -> tuple[str, dict[str, float]]:
    """One held-out GPU's table row, and its figures."""
    params = fit_without(sources, data, gpu)
    kern = kernel_errors(sources, gpu, params)
    steps = step_errors(gpu, params)
    today = step_errors(gpu, load_params(None))
    g, a, s, t = (_stats(x) for x in (kern["gemm"], kern["attention"], steps, today))
    figures = {"step_median": s[0], "step_p90": s[1], "today_median": t[0]}
    line = (
        f"| {gpu} | {len(kern['gemm'])} | {g[0]:.1f}% | {g[1]:.1f}% | {len(kern['attention'])} "
        f"| {a[0]:.1f}% | {a[1]:.1f}% | {len(steps)} | {s[0]:.1f}% | {s[1]:.1f}% "
        f"| {t[0]:.1f}% | {t[1]:.1f}% |"
    )
    return line, figures


def table(sources: Sources, data: Path, gpus: Sequence[str]) -> str:
    """The leave-one-GPU-out table of ``gpus``."""
    lines = [
        "| held-out GPU | GEMMs | median | p90 | attention rows | median | p90 | steps "
        "| step median | step p90 | today's fit: step median | p90 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    worst = ("", 0.0)
    for gpu in gpus:
        started = time.monotonic()
        line, figures = row(sources, data, gpu)
        print(line, f"({time.monotonic() - started:.0f} s)", flush=True)
        lines.append(line)
        if figures["step_median"] >= worst[1]:
            worst = (gpu, figures["step_median"])
    lines += ["", f"Worst held-out whole-step median: {worst[0]}, {worst[1]:.1f}%."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check docs/fidelity.md")
    parser.add_argument("--gpu", action="append", help="only these GPUs (print, write nothing)")
    args = parser.parse_args()
    sources = load_sources(SOURCES)
    assert sources.kernels is not None
    data = Path(str(DATA / "llmservingsim")).parent
    body = table(sources, data, args.gpu or sources.kernels.gpus)
    if args.gpu:
        print(body)
        return 0
    text = DOC.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    new = pattern.sub(lambda _: f"{BEGIN}\n{body}\n{END}", text)
    if args.check:
        print("docs/fidelity.md is current" if new == text else "docs/fidelity.md is stale")
        return int(new != text)
    DOC.write_text(new)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
