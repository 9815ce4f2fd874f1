"""Write configs/error_bands.yaml: each kind of cost model's band of step-time error, from
held-out operator and step measurements only (never a real run's latencies, which the
bands are checked against: docs/fidelity.md, "Model uncertainty").

A held-out group (a GPU, model and TP degree) gives one bias: the median signed error of
its steps (predicted / measured - 1) over ``cost/learn/steps.py``'s grid of serving steps,
"measured" as the sum of the group's profiled operators. The band is ``mean +- z sd`` of
the groups' biases (z of the two-sided level, sd with one degree of freedom taken), and
always holds 0.

- ``physics-fitted-gpu``: the shipped parameters on every group they were fitted on (in
  sample: a GPU in the fit);
- ``physics-unseen-gpu``: each GPU's groups priced by parameters fitted without that GPU
  (leave one GPU out);
- ``roofline``: the roofline at its default efficiencies on every LLMServingSim bundle;
- ``profiled``: each bundle priced from every other profiled point of its operators
  (interpolation held out) against the whole profile;
- ``fitted``: the shipped presets' 5-fold held-out median errors (absolute: a band of
  +- z times their root mean square);
- ``kernels``: the kernels model (NVIDIA's database of measured vLLM kernels) against each
  bundle of a GPU the database measured: two measurements of the same kernels on the same
  GPU by different harnesses (in sample for the launch gaps, learned from those bundles);
- ``profiled``, too: the same comparison the other way (a profile's sums against the
  database's), beside its interpolation held out: a profile is one harness's measurement.

    .venv/bin/python benchmarks/error_bands.py          # write the file (~2-4 min)
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.cost.batch import Batch  # noqa: E402
from simulator.cost.learn.run import learn  # noqa: E402
from simulator.cost.learn.sources import (  # noqa: E402
    Source,
    default_sources_path,
    load_sources,
    source_model,
)
from simulator.cost.learn.steps import group_errors, step_grid  # noqa: E402
from simulator.cost.physics_params import load_params  # noqa: E402
from simulator.cost.presets import load_hardware  # noqa: E402
from simulator.cost.profiled import ProfiledCostConfig, ProfiledCostModel  # noqa: E402
from simulator.cost.profiles import Curve, read_profile  # noqa: E402
from simulator.cost.roofline import RooflineCostConfig, RooflineCostModel  # noqa: E402
from tests.paths import DATA  # noqa: E402

OUT = ROOT / "configs" / "error_bands.yaml"
LEVEL = 0.9
Z = float(statistics.NormalDist().inv_cdf(0.5 + LEVEL / 2))


def band(biases: list[float], source: str) -> dict[str, object]:
    """``mean +- z sd`` of the groups' biases, holding 0, and above -90%."""
    b = np.asarray(biases, dtype=float)
    mean = float(b.mean())
    sd = float(b.std(ddof=1)) if len(b) > 1 else abs(mean)
    low, high = min(mean - Z * sd, -0.001), max(mean + Z * sd, 0.001)
    return {
        "low": round(max(low, -0.9), 4),
        "high": round(high, 4),
        "groups": len(b),
        "source": source,
        "biases": [round(float(x), 4) for x in b],
    }


def bundles(sources: list[Source]) -> list[tuple[Source, int]]:
    """Every (LLMServingSim bundle, TP degree) of the physics sources."""
    out = []
    for s in sources:
        if s.format == "vidur-mlp":
            continue
        for tp in s.tp if isinstance(s.tp, list) else [s.tp]:
            out.append((s, tp))
    return out


def bundle_bias(src: Source, tp: int, data: Path, predict: Callable[..., float]) -> float:
    """The median signed error of ``predict(batch)`` against the bundle's profiled sums."""
    path = str(data / src.path)
    profile = read_profile(path, "llmservingsim", tp)
    model, hw = source_model(src), load_hardware(src.hardware)
    cfg = ProfiledCostConfig(profile=path, model=model.name, hardware=src.hardware, tp=tp)
    measured = ProfiledCostModel(cfg.model_copy(update={"skew": False}), model, hw, profile)
    errs = [predict(src, tp, b) / measured.step_time(b) - 1 for b in step_grid()]
    return float(np.median(errs))


def roofline_predict(data: Path) -> Callable[..., float]:
    """The roofline at its default efficiencies."""

    def predict(src: Source, tp: int, batch: Batch) -> float:
        model, hw = source_model(src), load_hardware(src.hardware)
        cfg = RooflineCostConfig(model=model.name, hardware=src.hardware, tp=tp)
        return RooflineCostModel(cfg, model, hw).step_time(batch)

    return predict


def _thinned(curve: Curve) -> Curve:
    """Every other point of a curve, both ends kept."""
    keep = sorted({*range(0, len(curve.xs), 2), len(curve.xs) - 1})
    return Curve([curve.xs[i] for i in keep], [curve.ys[i] for i in keep])


def profiled_predict(data: Path) -> Callable[..., float]:
    """The profiled model on every other profiled point of each token- and
    sequence-parallel operator."""

    def predict(src: Source, tp: int, batch: Batch) -> float:
        path = str(data / src.path)
        full = read_profile(path, "llmservingsim", tp)
        thin = dataclasses.replace(
            full,
            per_layer={k: (n, _thinned(c)) for k, (n, c) in full.per_layer.items()},
            per_step={k: _thinned(c) for k, c in full.per_step.items()},
            per_sequence={k: _thinned(c) for k, c in full.per_sequence.items()},
        )
        model, hw = source_model(src), load_hardware(src.hardware)
        cfg = ProfiledCostConfig(profile=path, model=model.name, hardware=src.hardware, tp=tp)
        return ProfiledCostModel(cfg.model_copy(update={"skew": False}), model, hw, thin).step_time(
            batch
        )

    return predict


def kernels_predict(data: Path) -> Callable[..., float]:
    """The kernels model on the bundle's GPU (uniform steps: no skew to correct)."""
    from simulator.cost import build_cost_model
    from simulator.cost.kernels import KernelsCostConfig

    def predict(src: Source, tp: int, batch: Batch) -> float:
        model = source_model(src)
        cfg = KernelsCostConfig(model=model.name, hardware=src.hardware, tp=tp, skew=False)
        return build_cost_model(cfg).step_time(batch)

    return predict


def measured_by_kernels(groups: list[tuple[Source, int]]) -> list[tuple[Source, int]]:
    """The bundles of GPUs the kernel database measured."""
    from simulator.cost.kernel_db import measured_gpus

    measured = set(measured_gpus())
    return [(s, tp) for s, tp in groups if load_hardware(s.hardware).kernels_gpu in measured]


def physics_bands(data: Path) -> dict[str, dict[str, object]]:
    """In sample and leave one GPU out, per group of the physics sources."""
    sources = load_sources(default_sources_path())
    shipped = load_params(None)
    inside = [
        float(np.median(e))
        for s in sources.sources
        if (e := group_errors(s, data, shipped)) is not None
    ]
    unseen = []
    for gpu in sorted({s.hardware for s in sources.sources}):
        params = learn(
            sources, data, f"--exclude {gpu}", [gpu], [data, ROOT / "data"], shipped.allreduce
        )
        for s in sources.sources:
            if s.hardware == gpu and (e := group_errors(s, data, params)) is not None:
                unseen.append(float(np.median(e)))
    return {
        "physics-fitted-gpu": band(
            inside,
            "configs/physics/sources.yaml's groups, priced by the shipped "
            "configs/physics/params.yaml (in sample)",
        ),
        "physics-unseen-gpu": band(
            unseen,
            "configs/physics/sources.yaml's groups, each priced by parameters fitted without "
            "its GPU (servesim learn --exclude GPU)",
        ),
    }


def fitted_band() -> dict[str, object]:
    """The shipped fitted presets' 5-fold held-out median absolute errors."""
    medians = []
    for path in sorted((ROOT / "configs" / "fitted").glob("*.yaml")):
        held = yaml.safe_load(path.read_text()).get("heldout", {}).get("all_points", {})
        medians += [v["median_ape_pct"] / 100 for v in held.values()]
    rms = float(np.sqrt(np.mean(np.square(medians))))
    return {
        "low": round(-Z * rms, 4),
        "high": round(Z * rms, 4),
        "groups": len(medians),
        "source": "configs/fitted/*.yaml heldout.all_points: 5-fold held-out median "
        "absolute error of each preset's prefills and decodes",
    }


def main() -> int:
    data = Path(str(DATA / "llmservingsim")).parent
    groups = bundles(load_sources(default_sources_path()).sources)
    bands = physics_bands(data)
    for kind, predict, source in (
        (
            "roofline",
            roofline_predict(data),
            "the roofline at its default efficiencies against each LLMServingSim bundle's "
            "profiled step sums (configs/physics/sources.yaml's bundles)",
        ),
        (
            "profiled",
            profiled_predict(data),
            "each LLMServingSim bundle priced from every other profiled point of its "
            "operators, against the whole profile (interpolation held out)",
        ),
    ):
        bands[kind] = band([bundle_bias(s, tp, data, predict) for s, tp in groups], source)
    bands["fitted"] = fitted_band()
    both = measured_by_kernels(groups)
    kernels = [bundle_bias(s, tp, data, kernels_predict(data)) for s, tp in both]
    bands["kernels"] = band(
        kernels,
        "the kernels model against each LLMServingSim bundle of a GPU the database measured "
        "(rtx-pro-6000; its launch gaps were learned from these bundles: in sample)",
    )
    interpolation = bands["profiled"]["biases"]
    cross = [1 / (1 + b) - 1 for b in kernels]  # the bundle's sums against the database's
    bands["profiled"] = band(
        [*interpolation, *cross],
        "each LLMServingSim bundle priced from every other profiled point of its operators "
        "against the whole profile (interpolation held out), and each bundle of a GPU the "
        "kernel database measured against the database's kernels (another harness)",
    )
    doc = {
        "level": LEVEL,
        "method": f"per kind, mean +- {Z:.3f} sd of the held-out groups' median signed "
        "step-time errors (predicted / measured - 1), holding 0 (benchmarks/error_bands.py)",
        "written_by": f"benchmarks/error_bands.py on {datetime.date.today().isoformat()}",
        "bands": bands,
    }
    with tempfile.NamedTemporaryFile("w", dir=OUT.parent, delete=False) as tmp:
        tmp.write("# Written by benchmarks/error_bands.py: do not edit by hand.\n")
        yaml.safe_dump(doc, tmp, sort_keys=False, width=100)
    Path(tmp.name).replace(OUT)
    print(OUT.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
