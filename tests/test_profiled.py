"""The ``profiled`` cost model: operator times read from LLMServingSim bundles and Vidur MLP
files (../shared/data), summed for a step's exact batch by hand, interpolated and extrapolated
(with one warning), TP communication, the skew correction, and readers' errors."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from simulator.cost import CostModelConfig, ProfiledCostModel, build_cost_model
from simulator.cost.batch import Batch, StepSums
from simulator.cost.profiles import read_profile
from simulator.errors import InputError
from tests.paths import DATA

BUNDLES = DATA / "llmservingsim" / "profiles"
RTX4090 = BUNDLES / "RTX4090" / "Llama-3.1-8B"
PRO6000 = BUNDLES / "RTXPRO6000" / "Llama-3.1-8B"
VIDUR = DATA / "vidur_a100_llama3-8b_mlp.csv"
CONFIG = TypeAdapter(CostModelConfig)


def profiled(bundle: Path = RTX4090, **kw: object) -> ProfiledCostModel:
    fields: dict[str, object] = {
        "type": "profiled",
        "profile": str(bundle),
        "model": "llama-3.1-8b",
        "hardware": "rtx-4090",
    }
    fields.update(kw)
    model = build_cost_model(CONFIG.validate_python(fields))
    assert isinstance(model, ProfiledCostModel)
    return model


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def us(table: list[dict[str, str]], **key: object) -> float:
    """The time_us of the one row matching ``key`` (values compared as text)."""
    hits = [r for r in table if all(r[k] == str(v) for k, v in key.items())]
    assert len(hits) == 1, key
    return float(hits[0]["time_us"])


# ---- the step, by hand from the CSV rows ---------------------------------------------------


def test_decode_step_at_profiled_points_is_the_sum_of_its_operators() -> None:
    dense = rows(RTX4090 / "tp1" / "dense.csv")
    seq = rows(RTX4090 / "tp1" / "per_sequence.csv")
    attn = rows(RTX4090 / "tp1" / "attention.csv")
    n, kv = 128, 1024  # profiled: 128 tokens, 128 sequences, 128 decodes at 1024 context
    calls = {"layernorm": 2, "qkv_proj": 1, "rotary_emb": 1, "o_proj": 1}
    calls.update({"gate_up_proj": 1, "act_fn": 1, "down_proj": 1})
    layer = sum(c * us(dense, layer=op, tokens=n) for op, c in calls.items())
    layer += us(attn, prefill_chunk=0, kv_prefill=0, n_decode=n, kv_decode=kv)
    once = us(dense, layer="embedding", tokens=n) + us(dense, layer="final_layernorm", tokens=n)
    once += us(seq, layer="lm_head", sequences=n) + us(seq, layer="sampler", sequences=n)
    want = (32 * layer + once) * 1e-6
    model = profiled()
    assert model.step_time(Batch.uniform(n, 1, kv)) == pytest.approx(want, rel=1e-12)
    assert model.time_sums(StepSums.decode(n, n * kv)) == model.step_time(Batch.uniform(n, 1, kv))


def test_mixed_step_sums_prefill_chunks_and_mean_decode_context() -> None:
    """Attention is looked up by (prefill tokens, their context, decodes, mean decode
    context): two prefill chunks count as one of their summed size and context."""
    model = profiled()
    attn = rows(RTX4090 / "tp1" / "attention.csv")
    # 2 chunks of 256 (contexts 0 and 512) + 16 decodes at contexts averaging 1024
    batch = Batch([256, 256] + [1] * 16, [0, 512] + [512, 1536] * 8)
    per_layer = us(attn, prefill_chunk=512, kv_prefill=512, n_decode=16, kv_decode=1024) * 1e-6
    assert model._attention(512, 512, 16, 1024.0, batch) == pytest.approx(32 * per_layer)
    tokens = model._token_time(528)
    seqs = model._sequence_time(18)
    assert model.step_time(batch) == pytest.approx(tokens + 32 * per_layer + seqs, rel=1e-12)


def test_between_profiled_points_is_linear() -> None:
    model = profiled()
    lo, hi = model.step_time(Batch.uniform(64, 1, 512)), model.step_time(Batch.uniform(64, 1, 1024))
    mid = model.step_time(Batch.uniform(64, 1, 768))  # decode context halfway: attention halfway
    assert mid == pytest.approx((lo + hi) / 2, rel=1e-12)
    one, two = model._token_time(1040), model._token_time(1056)  # dense rows 16 tokens apart
    assert model._token_time(1048) == pytest.approx((one + two) / 2, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 20_000), min_size=1, max_size=300),
)
def test_decode_time_equals_step_time_of_any_decode_batch(contexts: list[int]) -> None:
    model = MODEL_4090
    batch = Batch([1] * len(contexts), contexts)
    assert model.time_sums(StepSums.decode(len(contexts), sum(contexts))) == model.step_time(batch)


MODEL_4090 = profiled()
MODEL_VIDUR = profiled(VIDUR, format="vidur-mlp", model="llama-3-8b", hardware="a100-80gb")
MODEL_PRO6000 = profiled(PRO6000, hardware="rtx-pro-6000", skew=False)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["4090", "vidur", "pro6000"]),
    st.lists(
        st.tuples(st.sampled_from([1, 1, 1, 3, 200, 2048]), st.integers(0, 12_000)),
        min_size=1,
        max_size=60,
    ),
)
def test_time_from_sums_equals_step_time_of_any_batch(
    name: str, steps: list[tuple[int, int]]
) -> None:
    """The engine's fast path times a step from its sums: bit for bit ``step_time``, with
    profiled attention and with the roofline's (Vidur's MLP profile has none)."""
    model = {"4090": MODEL_4090, "vidur": MODEL_VIDUR, "pro6000": MODEL_PRO6000}[name]
    batch = Batch([n for n, _ in steps], [c for _, c in steps])
    assert model.times_from_sums
    assert model.time_sums(StepSums.of(batch)) == model.step_time(batch)


# ---- extrapolation -------------------------------------------------------------------------


def test_extrapolation_is_linear_and_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    model = profiled()
    capsys.readouterr()
    inside = model.step_time(Batch([2048], [0]))
    assert capsys.readouterr().err == ""
    t1, t2 = model._token_time(2032), model._token_time(2048)
    beyond = model._token_time(2064)  # 16 tokens past the last row: the last slope again
    assert beyond == pytest.approx(t2 + (t2 - t1), rel=1e-9)
    model.step_time(Batch([4096], [0]))
    model.step_time(Batch.uniform(300, 1, 40_000))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "extrapolating" in err[0] and "2064 tokens" in err[0]
    assert inside > 0


# ---- TP, skew, Vidur -----------------------------------------------------------------------


def test_tp_adds_two_ring_allreduces_per_layer() -> None:
    tp1 = profiled(PRO6000, hardware="rtx-pro-6000", skew=False)
    tp2 = profiled(PRO6000, hardware="rtx-pro-6000", tp=2, skew=False)
    # the tp2 tables are the shard's own; the all-reduces come on top
    bw, lat = tp2.hw.interconnect_bandwidth, tp2.hw.allreduce_latency_us
    assert bw is not None and lat is not None
    for tokens in (1, 512):
        comm = 64 * (lat * 1e-6 + tokens * 4096 * 2 / bw)  # 2 x 32 layers, ring factor 1 at tp 2
        shard = tp2._tokens.at(tokens)
        assert tp2._token_time(tokens) == pytest.approx(shard + comm, rel=1e-9)
    assert tp1._comm == (0.0, 0.0)


def test_tp_without_a_link_leaves_the_allreduces_out_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hw = tmp_path / "gpu.yaml"
    hw.write_text(
        "name: gpu\nsource: test\npeak_flops: 1e14\nhbm_bandwidth: 1e12\n"
        "memory_bytes: 90000000000\n"
    )
    capsys.readouterr()
    model = profiled(PRO6000, hardware=str(hw), tp=2)
    assert model._comm == (0.0, 0.0)
    err = capsys.readouterr().err
    assert "tp=2" in err and "all-reduces are left out" in err and len(err.splitlines()) == 1


def test_a_bundle_without_attention_prices_it_by_the_roofline(bundle: Path) -> None:
    (bundle / "tp1" / "attention.csv").unlink()
    model = profiled(bundle)
    assert model._attn is None and model.times_from_sums
    short, long_ = (
        model.step_time(Batch.uniform(8, 1, 100)),
        model.step_time(Batch.uniform(8, 1, 9000)),
    )
    assert long_ > short > 0
    assert model.time_sums(StepSums.decode(8, 800)) == model.step_time(Batch.uniform(8, 1, 100))


def test_skew_correction_slows_mixed_contexts_and_turns_off_the_fast_path() -> None:
    on, off = (
        profiled(PRO6000, hardware="rtx-pro-6000"),
        profiled(PRO6000, hardware="rtx-pro-6000", skew=False),
    )
    assert not on.times_from_sums and off.times_from_sums
    uniform = Batch.uniform(64, 1, 2000)
    assert on.step_time(uniform) == off.step_time(uniform)  # nothing to correct
    skewed = Batch([1] * 64, [500] * 48 + [6500] * 16)  # same mean context, 2000
    gap = on.step_time(skewed) - off.step_time(skewed)
    assert off.step_time(skewed) == off.step_time(uniform)
    alpha = on._skew.alpha(0, 64, 0.25, 6500, 0) if on._skew else 0.0
    row = on._decode_rows[64]  # all layers' decode attention of 64 decodes, by mean context
    assert row is not None
    full = row.at(6500) - row.at(2000)
    assert gap == pytest.approx(alpha * full, rel=1e-9) and gap > 0


def test_rtx4090_bundle_has_no_skew_table() -> None:
    assert read_profile(RTX4090, "llmservingsim", 1).skew is None
    assert MODEL_4090.times_from_sums


def test_vidur_mlp_profile_with_roofline_attention_and_head() -> None:
    model = profiled(VIDUR, format="vidur-mlp", model="llama-3-8b", hardware="a100-80gb")
    rows_ = [
        r
        for r in rows(VIDUR)
        if r["num_tensor_parallel_workers"] == "1" and r["num_tokens"] == "512"
    ]
    ops = ["input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj"]
    ops += ["post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]
    ms = [float(r[f"time_stats.{op}.median"]) for r in rows_ for op in ops]
    emb = [float(r["time_stats.emb.median"]) for r in rows_]
    # the public file repeats some token counts: their median (here, the mean of two)
    per_copy = len(rows_)
    want = (32 * sum(ms) / per_copy + sum(emb) / per_copy) * 1e-3
    assert model._token_time(512) == pytest.approx(want, rel=1e-9)
    short, long_ = (
        model.step_time(Batch.uniform(32, 1, 100)),
        model.step_time(Batch.uniform(32, 1, 8000)),
    )
    assert long_ > short  # attention from the roofline grows with the context read


def test_vidur_profile_of_another_model_is_refused() -> None:
    with pytest.raises(InputError, match="n_head 32 does not match model llama-2-70b"):
        profiled(VIDUR, format="vidur-mlp", model="llama-2-70b", hardware="a100-80gb", tp=8)


# ---- readers' errors: one line, FILE:LINE ---------------------------------------------------


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A writable copy of the RTX 4090 bundle."""
    dest = tmp_path / "bundle"
    shutil.copytree(RTX4090, dest)
    for f in dest.rglob("*"):
        f.chmod(0o644 if f.is_file() else 0o755)
    return dest


def _edit(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("file", "line", "text", "match"),
    [
        (
            "dense.csv",
            5,
            "qkv_proj,4,fast",
            r"dense\.csv:5: column time_us: 'fast' is not a number",
        ),
        ("dense.csv", 7, "act_fn,7", r"dense\.csv:7: malformed row \(3 fields expected, 2 found\)"),
        ("dense.csv", 9, "mystery_op,9,1.0", r"dense\.csv:9: unknown layer 'mystery_op'"),
        ("dense.csv", 3, "act_fn,1,3.0", r"dense\.csv:3: act_fn at tokens=1 repeats line 2"),
        (
            "dense.csv",
            4,
            "act_fn,-3,1.0",
            r"dense\.csv:4: column tokens: '-3' must be finite and >= 0",
        ),
        (
            "attention.csv",
            6,
            "0,0,1,16,2.0",
            r"attention\.csv:6: the point \(0, 0, 1, 16\) repeats line 2",
        ),
        (
            "attention.csv",
            3,
            "0,0,0,32,2.0",
            r"attention\.csv:3: a point with no prefill and no decode",
        ),
        (
            "per_sequence.csv",
            2,
            "lm_head,1.5,9.0",
            r"per_sequence\.csv:2: column sequences: '1.5' is not an integer",
        ),
    ],
)
def test_malformed_bundle_is_one_line_naming_file_and_line(
    bundle: Path, file: str, line: int, text: str, match: str
) -> None:
    _edit(bundle / "tp1" / file, line, text)
    with pytest.raises(InputError, match=match) as exc:
        read_profile(bundle, "llmservingsim", 1)
    assert "\n" not in str(exc.value)


def test_bundle_level_errors(bundle: Path) -> None:
    with pytest.raises(InputError, match=r"no tp2/ folder \(profiled: tp1\)"):
        read_profile(bundle, "llmservingsim", 2)
    (bundle / "tp1" / "moe.csv").write_text("tokens,activated_experts,time_us\n1,8,5.0\n")
    # an MoE table is read now, and a dense model refuses to be priced with one
    assert read_profile(bundle, "llmservingsim", 1).moe is not None
    with pytest.raises(InputError, match="has moe.csv, but model llama-3.1-8b has no experts"):
        profiled(bundle)
    (bundle / "tp1" / "moe.csv").unlink()
    (bundle / "meta.yaml").write_text("a: [1,\n")
    with pytest.raises(InputError, match=r"meta\.yaml:2: invalid YAML"):
        read_profile(bundle, "llmservingsim", 1)
    (bundle / "meta.yaml").unlink()
    with pytest.raises(InputError, match=r"meta\.yaml: file not found"):
        read_profile(bundle, "llmservingsim", 1)
    with pytest.raises(InputError, match="not a folder"):
        read_profile(bundle / "tp1" / "dense.csv", "llmservingsim", 1)


def test_profile_error_in_a_scenario_names_the_key(bundle: Path) -> None:
    _edit(bundle / "tp1" / "dense.csv", 2, "act_fn,1,x")
    with pytest.raises(InputError, match=r"^cost_model\.profile: .*dense\.csv:2:"):
        profiled(bundle)


def test_vidur_errors(tmp_path: Path) -> None:
    with pytest.raises(
        InputError, match=r"no rows with num_tensor_parallel_workers=3 \(has: \[1, 2, 4, 8\]\)"
    ):
        read_profile(VIDUR, "vidur-mlp", 3)
    bad = tmp_path / "mlp.csv"
    lines = VIDUR.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[5].split(",")
    row[header.index("time_stats.mlp_up_proj.median")] = "nan"
    bad.write_text("\n".join([lines[0], *lines[1:5], ",".join(row)]) + "\n")
    with pytest.raises(
        InputError, match=r"mlp\.csv:6: column time_stats\.mlp_up_proj\.median: 'nan'"
    ):
        read_profile(bad, "vidur-mlp", 1)
