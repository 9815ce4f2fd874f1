"""The ``physics`` cost model: its one core function of a step's sums (fast path exact), its
scalar attention against the vectorised term the fit uses, a GPU priced from its spec sheet
alone, bad input (one line, exit 2), the shipped parameters' provenance and recorded errors,
and ``servesim learn``'s determinism."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import TypeAdapter

from simulator.cli import main
from simulator.cost import CostModelConfig, PhysicsCostModel, build_cost_model
from simulator.cost.batch import Batch, StepSums
from simulator.cost.learn.run import learn
from simulator.cost.learn.sources import Source, Sources, default_sources_path, load_sources, sha256
from simulator.cost.learn.steps import group_errors
from simulator.cost.physics_params import load_params
from simulator.cost.physics_terms import GPU_CURVES, attention_time, chunk_wave, decode_seq_time
from simulator.errors import InputError
from tests.paths import DATA, ROOT

CONFIG = TypeAdapter(CostModelConfig)


def physics(**kw: object) -> PhysicsCostModel:
    fields: dict[str, object] = {"type": "physics", "model": "llama-3.1-8b", "hardware": "rtx-4090"}
    fields.update(kw)
    model = build_cost_model(CONFIG.validate_python(fields))
    assert isinstance(model, PhysicsCostModel)
    return model


def random_batches(seed: int, count: int) -> list[Batch]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        nd = rng.randint(0, 200)
        chunks = [rng.randint(2, 1500) for _ in range(rng.randint(0 if nd else 1, 3))]
        new = chunks + [1] * nd
        ctx = [rng.randint(0, 6000) for _ in new]
        out.append(Batch(new, ctx))
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_fast_path_is_exactly_step_time(tp: int) -> None:
    model = physics(tp=tp, hardware="rtx-pro-6000")
    for batch in random_batches(tp, 300):
        assert model.time_sums(StepSums.of(batch)) == model.step_time(batch)
    for n, c in [(1, 0), (7, 900), (256, 300_000)]:
        decode = Batch.uniform(n, 1, c // n)
        assert model.time_sums(StepSums.decode(n, n * (c // n))) == model.step_time(decode)


def test_scalar_attention_matches_the_fitted_term() -> None:
    """The model's per-step attention is the term ``servesim learn`` fits, summed over the
    layers (one prefill chunk: the term's triangle is then exact)."""
    model = physics()
    p, _, _ = load_params(None).for_gpu("rtx-4090")
    fit = load_params(None).gpus["rtx-4090"]
    flops, bw = 165.2e12 * fit.compute_scale, 1.008e12 * fit.memory_scale
    for pc, kvp, nd, kvd in [
        (0, 0, 5, 700),
        (300, 1000, 0, 0),
        (64, 3000, 40, 900),
        (1500, 0, 1, 9),
    ]:
        batch = Batch(((pc,) if pc else ()) + (1,) * nd, ((kvp,) if pc else ()) + (kvd,) * nd)
        s = StepSums.of(batch)
        rest = model.step_time(batch) - model._tokens(s.num_tokens) - model._sequences(s.num_seqs)
        pairs = pc * kvp + pc * (pc + 1) / 2
        term = attention_time(
            np.array([pc]),
            np.array([kvp]),
            np.array([pairs]),
            np.array([nd]),
            np.array([nd * kvd]),
            model.shape,
            flops,
            bw,
            p,
        )[0]
        assert rest == pytest.approx(model.shape.layers * term, rel=1e-12)


def test_steps_grow_with_work() -> None:
    model = physics()
    decode = model.time_sums
    assert decode(StepSums.decode(64, 64 * 1000)) < decode(StepSums.decode(64, 64 * 2000))
    assert decode(StepSums.decode(32, 32 * 1000)) < decode(StepSums.decode(64, 64 * 1000))
    assert model.step_time(Batch((512,), (0,))) < model.step_time(Batch((1024,), (0,)))
    assert model.step_time(Batch((512,), (0,))) < model.step_time(Batch((512,), (4096,)))


def test_a_gpu_nobody_measured_is_priced_from_its_spec_sheet() -> None:
    params = load_params(None)
    assert "h200" not in params.gpus
    _, c, m = params.for_gpu("h200")
    assert (c, m) == (1.0, 1.0)
    # the same GPU with its fitted scales ignored: a different, spec-sheet-only price
    fitted, spec = physics(), physics(gpu_fit=False)
    batch = Batch.uniform(32, 1, 1000)
    assert fitted.step_time(batch) != spec.step_time(batch)
    # a faster memory system decodes faster: H200 against H100 (same FLOPs, 4.8 vs 3.35 TB/s)
    h100 = physics(hardware="h100-sxm", gpu_fit=False)
    h200 = physics(hardware="h200")
    assert h200.step_time(batch) < h100.step_time(batch)


def test_tp_without_a_link_names_the_missing_spec(tmp_path: Path) -> None:
    preset = yaml.safe_load((ROOT / "configs" / "hardware" / "rtx-4090.yaml").read_text())
    del preset["interconnect_bandwidth"]
    path = tmp_path / "no-link.yaml"
    path.write_text(yaml.safe_dump(preset))
    with pytest.raises(InputError, match="has no interconnect_bandwidth.*tp=2"):
        physics(hardware=str(path), tp=2)
    physics(hardware=str(path), tp=1)  # one GPU needs no link


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = yaml.safe_load((ROOT / "configs" / "hardware" / "rtx-4090.yaml").read_text())
    del preset["interconnect_bandwidth"]
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(preset))
    scenario = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    scenario["workload"]["num_requests"] = 20
    scenario["cost_model"] = {
        "type": "physics",
        "model": "llama-3-8b",
        "hardware": str(tmp_path / "hw.yaml"),
        "tp": 2,
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interconnect_bandwidth" in err[0]
    assert not (tmp_path / "out").exists()
    # a parameters file missing a parameter names it
    params = yaml.safe_load((ROOT / "configs" / "physics" / "params.yaml").read_text())
    del params["shared"]["gemm_compute"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(InputError, match="shared.*gemm_compute"):
        physics(params=str(tmp_path / "p.yaml"))


def test_a_scenario_runs_with_physics(tmp_path: Path) -> None:
    scenario = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    scenario["workload"]["num_requests"] = 200
    scenario["cost_model"] = {"type": "physics", "model": "llama-3-8b", "hardware": "h100-sxm"}
    del scenario["scheduler"]["num_blocks"]  # derived from the GPU's memory, as for roofline
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    assert (
        main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    )
    assert (tmp_path / "out" / "summary.json").is_file()


def test_shipped_parameters_say_what_they_were_fitted_on() -> None:
    params = load_params(None)
    assert params.fitted_on and params.excluded and params.command.startswith("servesim learn")
    for line in params.fitted_on:
        rel, digest = line.split(" sha256:")
        path = DATA / rel.split("/")[0]
        assert sha256(path.parent / rel) == digest, rel


def test_recorded_errors_are_reproduced() -> None:
    """The shipped file's per-group step-time errors are what its parameters give now."""
    params = load_params(None)
    sources = {s.name: s for s in load_sources(default_sources_path()).sources}
    name = "rtx-4090/llama-3.1-8b/tp1"
    errs = group_errors(sources[name], Path(str(DATA / "llmservingsim")).parent, params)
    assert errs is not None
    recorded = params.errors[name]
    assert round(float(np.median(np.abs(errs)) * 100), 2) == recorded.median_pct
    assert recorded.median_pct < 10


def test_learn_is_deterministic_and_the_cli_writes_a_valid_file(tmp_path: Path) -> None:
    small = Sources(
        stack="test",
        sources=[
            Source(
                name="a100/llama-3-8b",
                format="vidur-mlp",
                path="vidur_a100_llama3-8b_mlp.csv",
                tp=1,
                model="llama-3-8b",
                hardware="a100-80gb",
            )
        ],
    )
    data = DATA / "vidur_a100_llama3-8b_mlp.csv"
    first, second = learn(small, data.parent, "x"), learn(small, data.parent, "x")
    assert first.shared == second.shared and first.gpus == second.gpus
    assert first.errors["a100/llama-3-8b"].median_pct < 10
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump(small.model_dump(mode="json")))
    out = tmp_path / "params.yaml"
    args = ["learn", "--sources", str(tmp_path / "sources.yaml"), "--data", str(data.parent)]
    assert main([*args, "--out", str(out)]) == 0
    assert load_params(str(out)).shared == first.shared
    assert main([*args, "--out", str(tmp_path / "x.yaml"), "--exclude", "h200"]) == 2


def test_a_dense_config_json_is_priced_like_its_preset() -> None:
    path = DATA / "llmservingsim" / "models" / "Llama-3.1-8B.json"
    batch = Batch((300, 1, 1), (0, 700, 900))
    assert physics(model=str(path)).step_time(batch) == physics().step_time(batch)


def test_a_measured_gpu_prices_with_its_own_curves() -> None:
    """A GPU measured on the stack priced gets its own value of each curve in ``GPU_CURVES``
    (its scale times the stack's); another stack's GPU (Vidur's), an unmeasured one, or
    ``gpu_fit: false`` get the stack's curves."""
    params = load_params(None)
    own = params.gpus["rtx-4090"]
    assert own.own_stack and set(GPU_CURVES) <= set(type(own).model_fields)
    p, _, _ = params.for_gpu("rtx-4090")
    for scale, name in GPU_CURVES.items():
        assert p[name] == pytest.approx(params.shared[name] * getattr(own, scale), rel=1e-12)
    assert any(getattr(own, scale) != 1.0 for scale in GPU_CURVES)
    assert not params.gpus["a100-80gb"].own_stack
    for name, fitted in (("a100-80gb", True), ("h200", True), ("rtx-4090", False)):
        p, _, _ = params.for_gpu(name, fitted)
        assert p == params.shared
    # what the fit saw of another stack's GPU: its curve scales too
    seen, _, m = params.as_fitted("a100-80gb")
    assert m == params.gpus["a100-80gb"].memory_scale
    assert seen["gemm_tiled_memory"] == pytest.approx(
        params.shared["gemm_tiled_memory"] * params.gpus["a100-80gb"].tiled_scale
    )


def test_a_prefill_chunk_is_priced_in_whole_passes_of_the_kernel() -> None:
    """Over a long cached context, a chunk of up to ``Q_ROWS`` query rows (tokens x query
    heads) costs one pass, as LLMServingSim's profiles measure (16 to 256 tokens with 32
    heads: the same time); past it, a step per pass."""
    model = physics()
    wave = chunk_wave(model.shape.q_heads)
    assert wave == 256  # Llama-3.1-8B on one GPU: 32 query heads

    def attention(pc: int) -> float:
        s = StepSums.of(Batch((pc,), (16384,)))
        return model.time_sums(s) - model._tokens(pc) - model._sequences(1)

    short, full, over = attention(16), attention(256), attention(257)
    assert full == pytest.approx(short, rel=0.05)
    assert over > 1.5 * full
    assert attention(512) == pytest.approx(over, rel=0.05)


def test_decodes_per_sequence_work_levels_off() -> None:
    """In a decode-only step the decodes' per-sequence work grows ~linearly while few and
    levels off past ``decode_units`` work units."""
    p = load_params(None).shared
    one = decode_seq_time(np.array([1.0]), 8, p)[0]
    assert one == pytest.approx(p["decode_seq_us"] * 1e-6 / (1 + 8 / p["decode_units"]))
    many = decode_seq_time(np.array([1e7]), 8, p)[0]
    assert many == pytest.approx(p["decode_seq_us"] * 1e-6 * p["decode_units"] / 8, rel=1e-4)
    assert decode_seq_time(np.array([64.0]), 8, p)[0] < 64 * one


def test_a_decode_only_step_pays_the_decode_kernels_fixed_cost() -> None:
    """``decode_step_us`` is in a decode-only step's attention, not in a mixed one's."""
    model = physics()
    p, _, _ = load_params(None).for_gpu("rtx-4090")
    fit = load_params(None).gpus["rtx-4090"]
    flops, bw = 165.2e12 * fit.compute_scale, 1.008e12 * fit.memory_scale
    args = (np.array([0.0]), np.array([0.0]), np.array([0.0]), np.array([8.0]))
    alone = attention_time(*args, np.array([8000.0]), model.shape, flops, bw, p)[0]
    p0 = {**p, "decode_step_us": p["decode_step_us"] * 2}
    twice = attention_time(*args, np.array([8000.0]), model.shape, flops, bw, p0)[0]
    assert twice - alone == pytest.approx(p["decode_step_us"] * 1e-6, rel=1e-9)
    mixed = (np.array([64.0]), np.array([0.0]), np.array([64.0 * 65 / 2]), np.array([8.0]))
    a = attention_time(*mixed, np.array([8000.0]), model.shape, flops, bw, p)[0]
    b = attention_time(*mixed, np.array([8000.0]), model.shape, flops, bw, p0)[0]
    assert a == b
