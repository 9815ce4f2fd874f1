"""Cost models: linear arithmetic, the roofline worked example of docs/cost_models.md by hand,
regimes, monotonicity, tensor parallelism, validation, and a physical bound on measured data."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from simulator.cost import (
    CostModelConfig,
    LinearCostConfig,
    LinearCostModel,
    RooflineCostConfig,
    RooflineCostModel,
    build_cost_model,
)
from simulator.cost.batch import Batch, StepSums
from simulator.cost.fitted import FittedCostConfig
from simulator.errors import InputError
from tests.paths import DATA, MISSING

CONFIG = TypeAdapter(CostModelConfig)


def roofline(**kw: object) -> RooflineCostModel:
    """Roofline for llama-2-7b on one A100 unless overridden."""
    fields: dict[str, object] = {"type": "roofline", "model": "llama-2-7b", "hardware": "a100-80gb"}
    fields.update(kw)
    model = build_cost_model(CONFIG.validate_python(fields))
    assert isinstance(model, RooflineCostModel)
    return model


# ---- linear ------------------------------------------------------------------------------


def test_linear_exact_arithmetic() -> None:
    cfg = LinearCostConfig(base_ms=5, per_token_ms=0.1, per_seq_ms=0.5, per_context_token_ms=0.001)
    batch = Batch(new_tokens=(3, 1, 1), context_lens=(0, 100, 200))
    # 5 + 0.1 * 5 tokens + 0.5 * 3 seqs + 0.001 * 300 context = 7.3 ms
    assert LinearCostModel(cfg).step_time(batch) == pytest.approx(7.3e-3, rel=1e-12)


def test_linear_built_from_tagged_dict() -> None:
    cost = build_cost_model(CONFIG.validate_python({"type": "linear", "base_ms": 10}))
    assert isinstance(cost, LinearCostModel)
    assert cost.step_time(Batch.uniform(64, 1, 4000)) == pytest.approx(0.010)


@pytest.mark.parametrize(
    "fields",
    [
        {"per_token_ms": -0.1, "base_ms": 1},
        {},
        {"base_ms": 0, "per_token_ms": 0, "per_seq_ms": 0, "per_context_token_ms": 0},
        {"per_context_token_ms": 0.01},  # would time a fresh prefill at 0 s
        {"base_ms": 1, "slope": 2},
    ],
)
def test_linear_rejects_bad_coefficients(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        LinearCostConfig.model_validate(fields)


def test_union_dispatches_fitted_to_its_loader(tmp_path: Path) -> None:
    cfg = CONFIG.validate_python({"type": "fitted", "path": str(tmp_path / "absent.yaml")})
    assert isinstance(cfg, FittedCostConfig)
    with pytest.raises(InputError, match="absent.yaml"):
        build_cost_model(cfg)


def test_union_rejects_unknown_type() -> None:
    with pytest.raises(ValidationError):
        CONFIG.validate_python({"type": "quadratic", "base_ms": 1})


# ---- roofline: the worked example of docs/cost_models.md, by hand ------------------------

# Llama-2-7B: 32 layers, hidden 4096, 32 heads x 128 (no GQA), MLP 11008 (gated), vocab 32000.
L, D, H, HD, FF, V = 32, 4096, 32, 128, 11008, 32000
LAYER_PARAMS = 4 * D * D + 3 * D * FF  # q, k, v, o + gate, up, down = 202_375_168
MATMUL_PARAMS = L * LAYER_PARAMS + V * D  # layers + LM head = 6_607_077_376
WEIGHT_BYTES = 2 * (L * LAYER_PARAMS + 2 * V * D)  # + embedding, bf16 = 13_476_298_752
KV_PER_TOKEN = 2 * L * H * HD * 2  # K and V, all layers, bf16 = 524_288
ATTN_PER_PAIR = 2 * 2 * L * H * HD  # QK^T and AV = 524_288
COMPUTE = 312e12 * 0.6  # A100 bf16 dense x default efficiency, FLOP/s
MEMORY = 2.039e12 * 0.8  # A100 HBM x default efficiency, B/s


def test_worked_example_decode_is_memory_bound() -> None:
    # 8 decodes, each with 1024 tokens of context.
    flops = 8 * 2 * MATMUL_PARAMS + ATTN_PER_PAIR * 8 * (1024 + 1)
    nbytes = WEIGHT_BYTES + KV_PER_TOKEN * 8 * 1025
    assert flops == 110_012_399_616 and nbytes == 17_775_460_352
    parts = roofline().breakdown(Batch.uniform(8, 1, 1024))
    assert parts["t_compute"] == pytest.approx(flops / COMPUTE)  # 0.588 ms
    assert parts["t_memory"] == pytest.approx(nbytes / MEMORY)  # 10.897 ms
    assert parts["t_memory"] > 10 * parts["t_compute"]
    assert parts["t"] == pytest.approx(nbytes / MEMORY + 2e-3)
    assert parts["t"] == pytest.approx(12.897e-3, abs=1e-6)


def test_worked_example_prefill_is_compute_bound() -> None:
    # One 2048-token prompt, empty cache: causal attention over 2048 * 2049 / 2 pairs.
    flops = 2048 * 2 * MATMUL_PARAMS + ATTN_PER_PAIR * 2048 * 2049 // 2
    nbytes = WEIGHT_BYTES + KV_PER_TOKEN * 2048
    assert flops == 28_162_637_430_784
    cost = roofline()
    parts = cost.breakdown(Batch((2048,), (0,)))
    assert parts["flops_attn"] == pytest.approx(1_100_048_498_688)
    assert parts["t_memory"] == pytest.approx(nbytes / MEMORY)  # 8.92 ms
    assert parts["t_compute"] > 10 * parts["t_memory"]
    assert cost.step_time(Batch((2048,), (0,))) == pytest.approx(flops / COMPUTE + 2e-3)
    assert cost.step_time(Batch((2048,), (0,))) == pytest.approx(152.441e-3, abs=1e-6)


def test_chunked_prefill_sees_cached_context() -> None:
    # A 512-token chunk after 1536 cached tokens: 512 * 1536 + 512 * 513 / 2 query-key pairs.
    parts = roofline().breakdown(Batch((512,), (1536,)))
    assert parts["flops_attn"] == pytest.approx(ATTN_PER_PAIR * (512 * 1536 + 512 * 513 // 2))
    assert parts["bytes_kv"] == pytest.approx(KV_PER_TOKEN * 2048)


def test_breakdown_agrees_with_step_time() -> None:
    cost = roofline(tp=2, interconnect_bandwidth=300e9, allreduce_latency_us=8)
    batch = Batch((1, 1, 300, 1), (17, 900, 0, 4000))
    assert cost.breakdown(batch)["t"] == pytest.approx(cost.step_time(batch), rel=1e-12)


batches = st.lists(
    st.tuples(st.integers(1, 600), st.integers(0, 5000)), min_size=1, max_size=40
).map(lambda seqs: Batch(tuple(n for n, _ in seqs), tuple(c for _, c in seqs)))


@settings(max_examples=60, deadline=None)
@given(batch=batches, which=st.integers(0, 39), grow_tokens=st.booleans())
def test_roofline_strictly_increasing_in_tokens_and_context(
    batch: Batch, which: int, grow_tokens: bool
) -> None:
    i = which % batch.num_seqs
    new, ctx = list(batch.new_tokens), list(batch.context_lens)
    if grow_tokens:
        new[i] += 1
    else:
        ctx[i] += 1
    bigger = Batch(tuple(new), tuple(ctx))
    for cost in (roofline(), roofline(model="llama-3-70b", hardware="h100-sxm", tp=4)):
        assert cost.step_time(bigger) > cost.step_time(batch) > 0


def test_tp_halves_compute_and_memory_terms() -> None:
    batch = Batch((2048, 1, 1), (0, 500, 3000))
    one, two = roofline().breakdown(batch), roofline(tp=2).breakdown(batch)
    assert two["t_compute"] == pytest.approx(one["t_compute"] / 2)
    assert two["t_memory"] == pytest.approx(one["t_memory"] / 2)
    assert two["t_comm"] == 0.0  # no interconnect configured


def test_tp_allreduce_cost_by_hand() -> None:
    # 2 all-reduces per layer x 32 layers; ring at tp=2 sends 2 * 1 / 2 of 4096 bf16 per token.
    cost = roofline(tp=2, interconnect_bandwidth=300e9, allreduce_latency_us=10)
    parts = cost.breakdown(Batch((100,), (0,)))
    per_token = 64 * 1.0 * 4096 * 2 / 300e9
    assert parts["t_comm"] == pytest.approx(64 * 10e-6 + 100 * per_token)
    assert roofline(interconnect_bandwidth=300e9).breakdown(Batch((100,), (0,)))["t_comm"] == 0


def test_tp_must_divide_heads() -> None:
    with pytest.raises(InputError, match="num_heads=28"):
        roofline(model="qwen-2.5-7b", tp=8)


@pytest.mark.parametrize(
    "fields",
    [
        {"compute_efficiency": 0.0},
        {"memory_efficiency": 1.5},
        {"tp": 0},
        {"overhead_ms": -1},
        {"interconnect_bandwidth": 0},
        {"flops": 1},
    ],
)
def test_roofline_config_validation(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        RooflineCostConfig.model_validate({"model": "llama-2-7b", "hardware": "h200", **fields})


@pytest.mark.parametrize(
    ("model", "hardware", "message"),
    [
        ("llama-9-1t", "a100-80gb", "cost_model.model: unknown model preset 'llama-9-1t'"),
        ("llama-2-7b", "tpu", "cost_model.hardware: unknown hardware preset 'tpu'"),
    ],
)
def test_unknown_presets_are_input_errors_naming_the_field(
    model: str, hardware: str, message: str
) -> None:
    cfg = RooflineCostConfig(model=model, hardware=hardware)
    with pytest.raises(InputError) as err:
        build_cost_model(cfg)
    assert str(err.value).startswith(message)


# ---- a physical bound on real measurements ------------------------------------------------


def test_peak_roofline_is_a_lower_bound_of_splitwise_measurements() -> None:
    """At 100% efficiency and no overhead the roofline is the physical minimum of a step, so
    every measured prefill/decode time must be at least that; only a physically impossible
    block of the data (TP=2, batch 64) may fall below it."""
    path = DATA / "splitwise_perf_model.csv"
    assert path.is_file(), f"{path} {MISSING}"
    df = pd.read_csv(path)
    models = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}
    gpus = {"a100-80gb": "a100-80gb", "h100-80gb": "h100-sxm", "h100-80gb-pcap": "h100-sxm"}
    costs: dict[tuple[str, str, int], RooflineCostModel] = {}
    below = set()
    cols = ["model", "hardware", "tensor_parallel", "batch_size", "prompt_size"]
    times = zip(df["prompt_time"].tolist(), df["token_time"].tolist(), strict=True)
    for (name, gpu, tp, bs, prompt), (prompt_ms, token_ms) in zip(
        df[cols].itertuples(index=False, name=None), times, strict=True
    ):
        key = (name, gpu, tp)
        if key not in costs:
            costs[key] = roofline(
                model=models[name],
                hardware=gpus[gpu],
                tp=tp,
                compute_efficiency=1.0,
                memory_efficiency=1.0,
                overhead_ms=0.0,
            )
        prefill = costs[key].step_time(Batch.uniform(bs, prompt, 0)) * 1e3
        decode = costs[key].step_time(Batch.uniform(bs, 1, prompt)) * 1e3
        assert token_ms >= decode
        if prompt_ms < prefill:
            below.add((tp, bs))
    assert below <= {(2, 64)}


# ---- timing from sums (the engine's fast path) -------------------------------------------

SUMS_MODELS = {
    "linear": {
        "type": "linear",
        "base_ms": 3,
        "per_token_ms": 0.013,
        "per_seq_ms": 0.07,
        "per_context_token_ms": 0.0003,
    },
    "linear-flat": {"type": "linear", "base_ms": 40, "per_token_ms": 0.02, "per_seq_ms": 0.5},
    "roofline": {"type": "roofline", "model": "llama-3-8b", "hardware": "h100-sxm"},
    "roofline-tp": {
        "type": "roofline",
        "model": "llama-2-70b",
        "hardware": "a100-80gb",
        "tp": 4,
        "interconnect_bandwidth": 1.5e11,
        "allreduce_latency_us": 8,
    },
    "fitted": {"type": "fitted", "path": "llama-2-70b_h100-sxm_tp8"},
    "fitted-knee": {"type": "fitted", "path": "bloom-176b_a100-80gb_tp8"},
    "physics": {"type": "physics", "model": "llama-3-8b", "hardware": "h100-sxm"},
    "physics-tp": {"type": "physics", "model": "llama-3.1-8b", "hardware": "rtx-pro-6000", "tp": 2},
}


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(SUMS_MODELS)),
    st.lists(
        st.tuples(st.sampled_from([1, 1, 1, 2, 17, 512, 4096]), st.integers(0, 40_000)),
        min_size=1,
        max_size=40,
    ),
)
def test_time_from_sums_is_step_time_to_the_last_bit(
    name: str, rows: list[tuple[int, int]]
) -> None:
    """A step timed from its sums (``StepSums``) takes exactly what ``step_time`` of its batch
    says, bit for bit: the engine's fast path times steps so, the plain path from batches."""
    model = build_cost_model(CONFIG.validate_python(SUMS_MODELS[name]))
    assert model.times_from_sums
    batch = Batch([n for n, _ in rows], [c for _, c in rows])
    sums = StepSums.of(batch)
    assert model.time_sums(sums) == model.step_time(batch)
    decodes = Batch([1] * len(rows), [c for _, c in rows])
    assert model.time_sums(StepSums.decode(len(rows), sum(c for _, c in rows))) == model.step_time(
        decodes
    )


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(SUMS_MODELS)),
    st.integers(1, 3000),
    st.integers(0, 2_000_000),
    st.integers(0, 40),
)
def test_time_decodes_is_time_sums_step_by_step(
    name: str, num_seqs: int, context: int, num_steps: int
) -> None:
    """A stretch of decode steps timed at once (``time_decodes``, which the roofline writes
    out, taking the memory time alone where it clearly wins) takes exactly what ``time_sums``
    says of each step, bit for bit; the batch sizes reach past the roofline's ridge, where
    a stretch goes from memory- to compute-bound."""
    model = build_cost_model(CONFIG.validate_python(SUMS_MODELS[name]))
    contexts = range(context, context + num_seqs * num_steps, num_seqs)
    want = [model.time_sums(StepSums.decode(num_seqs, c)) for c in contexts]
    assert model.time_decodes(num_seqs, contexts) == want
    assert len(want) == num_steps


def test_time_decodes_across_the_ridge() -> None:
    """A stretch whose steps go from compute- to memory-bound as the context grows (a
    decode's attention reads more than it computes, so only this way) takes, step by step,
    what ``time_sums`` says: the roofline takes the memory time alone only where it clearly
    wins at both ends."""
    model = build_cost_model(CONFIG.validate_python(SUMS_MODELS["roofline"]))
    assert isinstance(model, RooflineCostModel)
    steps = 8192  # each of ``m`` sequences goes from 0 to 8191 tokens of context
    crossing = []
    for m in range(1, 4000, 3):
        terms = [model.breakdown(Batch.uniform(m, 1, c)) for c in (0, steps - 1)]
        bound = [t["t_memory"] > t["t_compute"] for t in terms]
        if bound[0] != bound[1]:
            crossing.append(m)
    assert crossing  # the ridge lies inside these stretches
    for m in crossing[:3]:
        contexts = range(0, m * steps, m)
        want = [model.time_sums(StepSums.decode(m, c)) for c in contexts]
        assert model.time_decodes(m, contexts) == want
