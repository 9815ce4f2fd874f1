"""Calibration of the fitted cost model: recovery of known coefficients, held-out error on the
real Splitwise data, converters, predict, presets and bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.cost.batch import Batch
from simulator.cost.calibration.calibrate import calibrate, predict
from simulator.cost.calibration.convert import convert_splitwise, convert_vidur_mlp
from simulator.cost.calibration.crossval import kfold_predictions
from simulator.cost.calibration.measurements import (
    aggregate_repeats,
    inconsistent_points,
    read_measurements,
    step_kinds,
)
from simulator.cost.calibration.shape import fit_preset_coefficients
from simulator.cost.features import FEATURES, FeatureScales, batch_features, uniform_features
from simulator.cost.fitted import (
    FittedCostConfig,
    FittedCostModel,
    FittedPreset,
    list_fitted,
    load_fitted,
    load_preset,
)
from simulator.cost.presets import load_hardware, load_model
from simulator.errors import InputError
from tests.paths import DATA, MISSING, DataFolder

SPLITWISE = DATA / "splitwise_perf_model.csv"
VIDUR_A100_L2 = DATA / "vidur_a100_llama2-7b_mlp.csv"


@pytest.fixture(scope="module")
def data_dir() -> DataFolder:
    """The real data: its absence is a failure, never a skip."""
    assert SPLITWISE.is_file(), f"{SPLITWISE} {MISSING}"
    assert VIDUR_A100_L2.is_file(), f"{VIDUR_A100_L2} {MISSING}"
    return DATA


@pytest.fixture(scope="module")
def splitwise_rows(data_dir: DataFolder) -> pd.DataFrame:
    """The whole Splitwise file converted once for the module."""
    return convert_splitwise(data_dir / "splitwise_perf_model.csv")


# -- synthetic data from known coefficients -------------------------------------------------

SCALES = FeatureScales(
    matmul_ms_per_token=0.05,
    weight_read_ms=9.0,
    attention_ms_per_pair=1.0e-6,
    kv_read_ms_per_token=2.0e-5,
    knee_tokens=2048,
)
TRUE = {
    "overhead": 12.0,
    "prefill_step": 8.0,
    "per_prefill_seq": 3.0,
    "per_decode_seq": 0.4,
    "gemm": 1.8,
    "gemm_large": 0.6,
    "attention": 5.0,
    "kv_read": 2.5,
}


def synthetic_points() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Splitwise-like design: prefill sweeps over P and B, decode sweeps over B and context."""
    b, n, c = [], [], []
    for p in (64, 128, 256, 512, 1024, 2048, 4096, 8192):
        b, n, c = [*b, 1], [*n, p], [*c, 0]
    for bs in (2, 4, 8, 16, 32):
        for p in (256, 512):
            b, n, c = [*b, bs], [*n, p], [*c, 0]
    for bs in (1, 2, 4, 8, 16, 32, 64, 128):
        for ctx in (200, 1000, 4000):
            b, n, c = [*b, bs], [*n, 1], [*c, ctx]
    return np.array(b, float), np.array(n, float), np.array(c, float)


def fold_rng() -> np.random.Generator:
    """The inner cross-validation's fold stream of a test."""
    return np.random.default_rng(0)


def true_ms(b: np.ndarray, n: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Step times the known coefficients give."""
    x = uniform_features(b, n, c, SCALES)
    return x @ np.array([TRUE[f] for f in FEATURES])


def test_hand_computed_features_of_a_mixed_batch() -> None:
    # One prefill chunk of 100 tokens on 50 cached, two decodes at context 10 and 20.
    batch = Batch((100, 1, 1), (50, 10, 20))
    tokens = 102
    pairs = 100 * 50 + 100 * 101 // 2 + (10 + 1) + (20 + 1)
    expected = [
        1.0,
        1.0,
        1.0,
        2.0,
        max(tokens * 0.05, 9.0),
        # gemm_large: the smooth step 1 / (1 + (knee / tokens)^4) of the matmul time.
        tokens * 0.05 / (1.0 + (2048 / tokens) ** 4),
        (80 + tokens) * 2.0e-5,
        pairs * 1.0e-6,
    ]
    assert batch_features(batch, SCALES) == pytest.approx(expected, rel=1e-12)


def test_batch_and_vectorised_features_agree_on_uniform_batches() -> None:
    b, n, c = synthetic_points()
    x = uniform_features(b, n, c, SCALES)
    for i in range(len(b)):
        row = batch_features(Batch.uniform(int(b[i]), int(n[i]), int(c[i])), SCALES)
        assert row == pytest.approx(x[i], rel=1e-12)


def test_fit_recovers_known_coefficients_and_knee() -> None:
    b, n, c = synthetic_points()
    y = true_ms(b, n, c)
    fit = fit_preset_coefficients(b, n, c, y, SCALES.with_knee(None), FEATURES, rng=fold_rng())
    assert fit.knee_tokens == 2048
    assert fit.coefficients == pytest.approx(TRUE, rel=1e-6)
    assert np.all(fit.weights > 0.99)


def test_fit_ignores_injected_outliers() -> None:
    b, n, c = synthetic_points()
    y = true_ms(b, n, c)
    # A wildly low prefill (like Splitwise's TP2 B=64 row), a 3x slow decode and a 40% one.
    bad = {12: 0.07, 25: 3.0, 40: 1.4}
    for i, factor in bad.items():
        y[i] *= factor
    fit = fit_preset_coefficients(b, n, c, y, SCALES.with_knee(None), FEATURES, rng=fold_rng())
    assert fit.knee_tokens == 2048
    assert fit.coefficients == pytest.approx(TRUE, rel=1e-4)
    assert set(np.flatnonzero(fit.weights == 0)) == set(bad)


def test_fit_with_noise_stays_close() -> None:
    b, n, c = synthetic_points()
    rng = np.random.default_rng(7)
    y = true_ms(b, n, c) * rng.lognormal(0.0, 0.01, size=len(b))
    fit = fit_preset_coefficients(b, n, c, y, SCALES, FEATURES, rng=fold_rng())
    pred = uniform_features(b, n, c, SCALES.with_knee(fit.knee_tokens)) @ np.array(
        [fit.coefficients[f] for f in FEATURES]
    )
    # 1% multiplicative noise: the fitted curve must sit within a few noise widths of the truth.
    assert np.max(np.abs(pred / true_ms(b, n, c) - 1)) < 0.03
    assert all(v >= 0 for v in fit.coefficients.values())


def test_features_outside_the_requested_set_stay_zero() -> None:
    b, n, c = synthetic_points()
    fit = fit_preset_coefficients(
        b, n, c, true_ms(b, n, c), SCALES, features=("overhead", "gemm", "kv_read"), rng=fold_rng()
    )
    assert {k for k, v in fit.coefficients.items() if v > 0} <= {"overhead", "gemm", "kv_read"}
    assert "attention" in fit.dropped


def test_decode_only_rows_keep_kv_read_not_attention() -> None:
    b = np.array([1, 4, 16, 64, 1, 4, 16, 64], float)
    c = np.array([100, 100, 100, 100, 3000, 3000, 3000, 3000], float)
    n = np.ones_like(b)
    flat = SCALES.with_knee(None)  # no gemm_large term in the truth
    y = uniform_features(b, n, c, flat) @ np.array([TRUE[f] for f in FEATURES])
    fit = fit_preset_coefficients(b, n, c, y, flat, FEATURES, rng=fold_rng())
    assert "attention" in fit.dropped and fit.coefficients["kv_read"] > 0
    pred = uniform_features(b, n, c, flat) @ np.array([fit.coefficients[f] for f in FEATURES])
    assert pred == pytest.approx(y, rel=1e-6)


def test_unidentifiable_feature_is_dropped_not_split() -> None:
    # Only uniform prefills of one sequence at context 0: per_prefill_seq == prefill_step == 1
    # on every row, collinear with overhead; only the first of them may carry weight.
    n = np.array([64, 128, 512, 1024, 4096, 8192], float)
    ones, zeros = np.ones_like(n), np.zeros_like(n)
    y = 5.0 + 1.5 * np.maximum(n * 0.05, 9.0)
    fit = fit_preset_coefficients(ones, n, zeros, y, SCALES, features=FEATURES, rng=fold_rng())
    assert fit.coefficients["prefill_step"] == 0.0
    assert fit.coefficients["per_prefill_seq"] == 0.0
    assert fit.coefficients["overhead"] + fit.coefficients["gemm"] > 0


# -- k-fold, consistency check --------------------------------------------------------------


def test_kfold_never_predicts_a_point_from_itself() -> None:
    b, n, c = synthetic_points()
    y = true_ms(b, n, c)
    y[5] *= 2.0  # P=2048 prefill: in-sample it could be fitted, held out it cannot
    meas = pd.DataFrame({"num_seqs": b, "new_tokens": n, "context_len": c, "step_ms": y})
    pred = kfold_predictions(meas, SCALES, 4, np.random.default_rng(0), FEATURES)
    assert pred[5] == pytest.approx(y[5] / 2.0, rel=1e-3)
    keep = np.arange(len(y)) != 5
    assert np.max(np.abs(pred[keep] / y[keep] - 1)) < 1e-4


def test_inconsistent_points_flags_the_faster_bigger_point() -> None:
    meas = pd.DataFrame(
        {
            "num_seqs": [1, 2, 4, 8, 1],
            "new_tokens": [512, 512, 512, 512, 1],
            "context_len": [0, 0, 0, 0, 100],
            "step_ms": [100.0, 190.0, 20.0, 700.0, 30.0],
        }
    )
    flags = inconsistent_points(meas)
    assert flags.tolist() == [False, False, True, False, False]


def test_aggregate_takes_the_median_of_repeats() -> None:
    meas = pd.DataFrame(
        {
            "num_seqs": [2, 2, 2, 1],
            "new_tokens": [8, 8, 8, 1],
            "context_len": [0, 0, 0, 9],
            "step_ms": [10.0, 30.0, 11.0, 4.0],
        }
    )
    agg = aggregate_repeats(meas)
    assert len(agg) == 2
    row = agg[agg.new_tokens == 8].iloc[0]
    assert row.step_ms == 11.0 and row.n_repeats == 3 and row.kind == "prefill"


# -- the real data ---------------------------------------------------------------------------

# Targets: held-out median APE <= 5% and mean APE <= 10%, per kind, on the points that pass the
# consistency check. The groups below still MISS a target (see docs/fidelity.md): they are held
# to the error they achieve now (5-fold, seed 0, the shape chosen by inner cross-validation in
# each fold), so a regression fails; every other group and kind must meet the targets itself.
# The BLOOM prefills missed less (4.3-5.4%) when every fit used attention; without it (the
# default since attention extrapolated worst on random held-out thirds) they miss more.
TARGET = (5.0, 10.0)
CURRENT_MISSES: dict[tuple[str, str], tuple[float, float]] = {
    ("bloom-176b_a100-80gb_tp8", "prefill"): (6.2, 10.0),
    ("bloom-176b_h100-80gb-pcap_tp8", "prefill"): (7.6, 10.0),
    ("bloom-176b_h100-80gb_tp8", "prefill"): (5.1, 10.0),
    ("llama2-70b_a100-80gb_tp8", "prefill"): (6.3, 10.0),
    ("llama2-70b_a100-80gb_tp2", "decode"): (5.2, 10.0),
}
SPLITWISE_GROUPS = (
    "bloom-176b_a100-80gb_tp8",
    "bloom-176b_h100-80gb-pcap_tp8",
    "bloom-176b_h100-80gb_tp8",
    *(f"llama2-70b_{gpu}_tp{tp}" for gpu in ("a100-80gb", "h100-80gb-pcap", "h100-80gb")
      for tp in (2, 4, 8)),
)  # fmt: skip


@pytest.mark.parametrize("group", SPLITWISE_GROUPS)
def test_splitwise_heldout_error_meets_targets_or_its_recorded_miss(
    splitwise_rows: pd.DataFrame, group: str
) -> None:
    meas = splitwise_rows[splitwise_rows.group == group]
    first = meas.iloc[0]
    preset, _ = calibrate(
        meas, first.model, first.hardware, int(first.tp), rng=np.random.default_rng(0)
    )
    misses = []
    for kind, s in preset.heldout["consistent_points"].items():
        med, mean = CURRENT_MISSES.get((group, kind), TARGET)
        if s["median_ape_pct"] > med or s["mean_ape_pct"] > mean:
            misses.append((kind, s["median_ape_pct"], s["mean_ape_pct"]))
    # At most 2 of 32 points may be set aside as inconsistent in any group.
    assert len(preset.heldout["inconsistent"]) <= 2
    assert not misses


def test_fitted_beats_uncalibrated_roofline_on_splitwise(splitwise_rows: pd.DataFrame) -> None:
    from simulator.cost.roofline import RooflineCostConfig, RooflineCostModel

    meas = splitwise_rows[splitwise_rows.group == "llama2-70b_h100-80gb_tp4"]
    _, rows = calibrate(meas, "llama-2-70b", "h100-sxm", 4, rng=np.random.default_rng(1))
    roof = RooflineCostModel(
        RooflineCostConfig(model="llama-2-70b", hardware="h100-sxm", tp=4),
        load_model("llama-2-70b"),
        load_hardware("h100-sxm"),
    )
    y = rows.step_ms.to_numpy()
    roof_ms = np.array(
        [
            roof.step_time(Batch.uniform(r.num_seqs, r.new_tokens, r.context_len)) * 1e3
            for r in rows.itertuples()
        ]
    )
    heldout_ape = np.abs(rows.heldout_ms.to_numpy() / y - 1)
    roof_ape = np.abs(roof_ms / y - 1)
    assert np.median(heldout_ape) < 0.5 * np.median(roof_ape)


def test_convert_splitwise_real_file(splitwise_rows: pd.DataFrame, data_dir: DataFolder) -> None:
    raw = pd.read_csv(data_dir / "splitwise_perf_model.csv")
    assert splitwise_rows.group.nunique() == 12
    assert set(splitwise_rows.group) == set(SPLITWISE_GROUPS)  # every group has its test
    counts = splitwise_rows.groupby(["group", "kind"]).size()
    assert set(counts.xs("prefill", level="kind")) == {13}
    assert set(counts.xs("decode", level="kind")) == {19}
    # Prefill B=1, P=512 of one group: the median over every T's repeats (7 runs x 5).
    sel = raw[
        (raw.model == "llama2-70b")
        & (raw.hardware == "a100-80gb")
        & (raw.tensor_parallel == 8)
        & (raw.batch_size == 1)
        & (raw.prompt_size == 512)
    ]
    row = splitwise_rows[
        (splitwise_rows.group == "llama2-70b_a100-80gb_tp8")
        & (splitwise_rows.kind == "prefill")
        & (splitwise_rows.num_seqs == 1)
        & (splitwise_rows.new_tokens == 512)
    ].iloc[0]
    assert row.step_ms == pytest.approx(float(np.median(sel.prompt_time)))
    assert row.n_repeats == len(sel)
    assert set(splitwise_rows.hardware) == {"a100-80gb", "h100-sxm"}


def test_convert_vidur_real_file(data_dir: DataFolder) -> None:
    rows = convert_vidur_mlp(data_dir / "vidur_a100_llama2-7b_mlp.csv", "llama-2-7b", "a100-80gb")
    raw = pd.read_csv(data_dir / "vidur_a100_llama2-7b_mlp.csv")
    assert rows.group.nunique() == 4
    layer_ops = [
        "input_layernorm",
        "attn_pre_proj",
        "attn_rope",
        "attn_post_proj",
        "post_attention_layernorm",
        "mlp_up_proj",
        "mlp_act",
        "mlp_down_proj",
        "add",
    ]
    # The file profiles some points more than once: the converter keeps the median.
    same = raw[(raw.num_tokens == 4096) & (raw.num_tensor_parallel_workers == 1)]
    per_row = [
        32 * sum(r[f"time_stats.{op}.median"] for op in layer_ops) + r["time_stats.emb.median"]
        for _, r in same.iterrows()
    ]
    expected = float(np.median(per_row))
    got = rows[(rows.tp == 1) & (rows.new_tokens == 4096)].iloc[0]
    assert got.step_ms == pytest.approx(expected)
    assert (got.num_seqs, got.context_len, got.kind) == (1, 0, "mlp")


# -- converters on hand-written samples -------------------------------------------------------

SPLITWISE_SAMPLE = """model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,\
prompt_time,token_time,e2e_time,tensor_parallel
llama2-70b,a100-80gb,512,2,128,1,1,100.0,40.0,5180.0,8
llama2-70b,a100-80gb,512,2,128,1,1,104.0,42.0,5440.0,8
llama2-70b,a100-80gb,512,2,128,1,1,150.0,41.0,5300.0,8
llama2-70b,a100-80gb,512,2,256,1,1,102.0,50.0,12852.0,8
bloom-176b,h100-80gb-pcap,128,1,128,1,1,60.0,30.0,3870.0,8
"""


def test_convert_splitwise_sample(tmp_path: Path) -> None:
    src = tmp_path / "perf.csv"
    src.write_text(SPLITWISE_SAMPLE)
    rows = convert_splitwise(src)
    llama = rows[rows.group == "llama2-70b_a100-80gb_tp8"]
    pre = llama[llama.kind == "prefill"]
    assert len(pre) == 1
    # The prefill of B=2, P=512 is the same measurement under T=128 and T=256: 4 repeats.
    assert pre.iloc[0][["num_seqs", "new_tokens", "context_len"]].tolist() == [2, 512, 0]
    assert pre.iloc[0].step_ms == pytest.approx(103.0)
    dec = llama[llama.kind == "decode"].sort_values("context_len")
    assert dec.context_len.tolist() == [512 + 64, 512 + 128]
    assert dec.step_ms.tolist() == pytest.approx([41.0, 50.0])
    bloom = rows[rows.group == "bloom-176b_h100-80gb-pcap_tp8"]
    assert set(bloom.hardware) == {"h100-sxm"} and set(bloom.model) == {"bloom-176b"}
    only = convert_splitwise(src, group="bloom-176b_h100-80gb-pcap_tp8")
    assert set(only.group) == {"bloom-176b_h100-80gb-pcap_tp8"} and len(only) == 2
    with pytest.raises(InputError, match="no group 'nope'"):
        convert_splitwise(src, group="nope")


def test_convert_splitwise_bad_input(tmp_path: Path) -> None:
    src = tmp_path / "perf.csv"
    src.write_text("model,hardware\nx,y\n")
    with pytest.raises(InputError, match="missing"):
        convert_splitwise(src)
    src.write_text(SPLITWISE_SAMPLE.replace("bloom-176b", "gpt-5"))
    with pytest.raises(InputError, match="gpt-5"):
        convert_splitwise(src)
    with pytest.raises(InputError, match="not found"):
        convert_splitwise(tmp_path / "absent.csv")


def _vidur_sample(n_embd: int) -> str:
    head = (
        "time_stats.emb.median,time_stats.mlp_up_proj.median,time_stats.add.median,"
        "time_stats.add.mean,n_embd,num_tokens,num_tensor_parallel_workers"
    )
    rows = [
        f"0.5,2.0,0.25,9.9,{n_embd},128,1",
        f"0.5,2.0,0.75,9.9,{n_embd},128,1",  # a repeat of the same point: median is taken
        f"0.6,4.0,0.5,9.9,{n_embd},256,2",
    ]
    return "\n".join([head, *rows]) + "\n"


def test_convert_vidur_sample(tmp_path: Path) -> None:
    src = tmp_path / "mlp.csv"
    src.write_text(_vidur_sample(4096))
    rows = convert_vidur_mlp(src, "llama-2-7b", "a100-80gb")
    tp1 = rows[rows.tp == 1].iloc[0]
    # 32 layers x (2.0 + 0.25) + 0.5 and 32 x (2.0 + 0.75) + 0.5, median of the two repeats.
    assert tp1.step_ms == pytest.approx((32 * 2.25 + 0.5 + 32 * 2.75 + 0.5) / 2)
    tp2 = rows[rows.tp == 2].iloc[0]
    assert tp2.step_ms == pytest.approx(32 * 4.5 + 0.6)
    assert set(rows.group) == {"llama-2-7b_a100-80gb_tp1", "llama-2-7b_a100-80gb_tp2"}
    src.write_text(_vidur_sample(5120))
    with pytest.raises(InputError, match="n_embd"):
        convert_vidur_mlp(src, "llama-2-7b")


# -- predict, presets, CLI --------------------------------------------------------------------


def _synthetic_csv(path: Path) -> pd.DataFrame:
    b, n, c = synthetic_points()
    meas = pd.DataFrame(
        {
            "num_seqs": b.astype(int),
            "new_tokens": n.astype(int),
            "context_len": c.astype(int),
            "step_ms": true_ms(b, n, c),
            "note": "x",
        }
    )
    meas.to_csv(path, index=False)
    return meas


def test_predict_adds_predicted_ms_matching_step_time(tmp_path: Path) -> None:
    meas = _synthetic_csv(tmp_path / "m.csv")
    preset = FittedPreset(name="t", model="m", hardware="h", tp=1, scales=SCALES, coefficients=TRUE)
    out = predict(preset, read_measurements(tmp_path / "m.csv"))
    assert list(out.columns) == [*meas.columns, "predicted_ms"]
    model = FittedCostModel(preset)
    for r in out.head(30).itertuples():
        batch = Batch.uniform(r.num_seqs, r.new_tokens, r.context_len)
        assert model.step_time(batch) == pytest.approx(r.predicted_ms / 1e3, rel=1e-12)
    assert out.predicted_ms.to_numpy() == pytest.approx(meas.step_ms.to_numpy(), rel=1e-12)


def test_cli_calibrate_then_predict_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _synthetic_csv(tmp_path / "m.csv")
    out = tmp_path / "fit.yaml"
    code = main(
        [
            "calibrate",
            str(tmp_path / "m.csv"),
            "--model",
            "llama-2-70b",
            "--hardware",
            "a100-80gb",
            "--tp",
            "8",
            "--out",
            str(out),
            "--source",
            "repo=test",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "held-out" in text and "prefill" in text and "decode" in text
    preset = load_preset(str(out))
    assert preset.source["repo"] == "test" and preset.tp == 8
    model = load_fitted(FittedCostConfig(path=str(out)))
    assert model.step_time(Batch.uniform(4, 1, 1000)) > 0
    assert (
        main(["predict", str(out), str(tmp_path / "m.csv"), "--out", str(tmp_path / "p.csv")]) == 0
    )
    pred = pd.read_csv(tmp_path / "p.csv")
    assert "predicted_ms" in pred.columns and len(pred) == 42
    assert "median APE" in capsys.readouterr().out


def test_shipped_presets_load_and_name_their_source() -> None:
    names = list_fitted()
    assert len(names) == 24
    for name in names:
        preset = load_preset(name)
        assert len(preset.source["commit"]) == 40 and preset.source["repo"]
        assert preset.heldout["all_points"]
        model = load_fitted(FittedCostConfig(path=name))
        assert model.step_time(Batch((300, 1, 1), (0, 500, 900))) > 0


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("num_seqs,new_tokens,context_len\n1,1,0\n", "missing column"),
        (
            "num_seqs,new_tokens,context_len,step_ms\n1,1,0,5\n1,x,0,5\n",
            "line 3, column new_tokens",
        ),
        ("num_seqs,new_tokens,context_len,step_ms\n1,1,0,0\n", "line 2, column step_ms"),
        ("num_seqs,new_tokens,context_len,step_ms\n1,1,-4,2\n", "line 2, column context_len"),
        ("num_seqs,new_tokens,context_len,step_ms\n1.5,1,0,2\n", "line 2, column num_seqs"),
        ("num_seqs,new_tokens,context_len,step_ms\n", "no data rows"),
        # one field too many: an error, not every value shifted one column left
        ("num_seqs,new_tokens,context_len,step_ms\n1,2,1,0,5\n1,1,0,5\n", "line 2: 5 fields"),
        ("num_seqs,new_tokens,context_len,step_ms\n1,1,0,5\n1,2,1,0,5\n", "line 3, saw 5"),
    ],
)
def test_read_measurements_bad_input(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(InputError, match=match):
        read_measurements(path)


def test_cli_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "m.csv"
    _synthetic_csv(good)
    multi = tmp_path / "multi.csv"
    pd.read_csv(good).assign(group=["a", "b"] * 21).to_csv(multi, index=False)
    out = str(tmp_path / "o.yaml")
    cases = [
        ["calibrate", str(tmp_path / "absent.csv"), "--out", out],
        ["calibrate", str(good), "--out", out],  # no --model and no model column
        [
            "calibrate",
            str(multi),
            "--model",
            "llama-2-7b",
            "--hardware",
            "a100-80gb",
            "--tp",
            "1",
            "--out",
            out,
        ],
        ["calibrate", str(multi), "--group", "zzz", "--out", out],
        [
            "calibrate",
            str(good),
            "--model",
            "llama-2-7b",
            "--hardware",
            "a100-80gb",
            "--tp",
            "1",
            "--features",
            "overhead,warp_drive",
            "--out",
            out,
        ],
        [
            "calibrate",
            str(good),
            "--model",
            "nope",
            "--hardware",
            "a100-80gb",
            "--tp",
            "1",
            "--out",
            out,
        ],
        [
            "calibrate",
            str(good),
            "--model",
            "llama-2-7b",
            "--hardware",
            "a100-80gb",
            "--tp",
            "1",
            "--folds",
            "1",
            "--out",
            out,
        ],
        ["predict", "no-such-preset", str(good), "--out", out],
        ["convert", "vidur-mlp", str(good), "--out", out],
        ["convert", "splitwise", str(good), "--out", out],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("servesim: error:") and err.count("\n") == 1, (argv, err)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("name: [unclosed\n", "invalid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("name: x\nmodel: m\nhardware: h\ntp: 1\n", "scales"),
    ],
)
def test_load_fitted_bad_files(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=match) as info:
        load_fitted(FittedCostConfig(path=str(path)))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_load_fitted_rejects_negative_or_unknown_coefficients(tmp_path: Path) -> None:
    base = FittedPreset(name="t", model="m", hardware="h", tp=1, scales=SCALES, coefficients=TRUE)
    data = base.model_dump(mode="json")
    for bad in ({"gemm": -1.0}, {"warp": 1.0}):
        data["coefficients"] = TRUE | bad
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(InputError, match="coefficients"):
            load_preset(str(path))
    with pytest.raises(InputError, match="not found"):
        load_fitted(FittedCostConfig(path=str(tmp_path / "absent.yaml")))
    with pytest.raises(InputError, match="unknown fitted preset"):
        load_fitted(FittedCostConfig(path="no-such-preset"))


# -- a preset under which a step can take no time is refused when loaded ---------------------


def _preset_file(tmp_path: Path, coefficients: dict[str, float], scales: FeatureScales) -> Path:
    """A preset file with these coefficients (written as is, not validated)."""
    base = FittedPreset(name="t", model="m", hardware="h", tp=1, scales=scales, coefficients=TRUE)
    data = base.model_dump(mode="json") | {"coefficients": coefficients}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# every step of >= 1 sequence, in small shapes: decode-only, prefill-only (chunks and whole
# prompts, with and without cached context) and mixed
STEPS = [
    Batch([1], [0]),
    Batch([1, 1, 1], [5, 0, 700]),
    Batch([2], [0]),
    Batch([64, 3], [0, 9]),
    Batch([1, 16], [40, 0]),
    Batch([1, 1, 512], [3, 3, 100]),
]


@pytest.mark.parametrize(
    ("coefficients", "kind", "fix", "zero_step"),
    [
        ({"prefill_step": 5.0}, "decode-only", "per_decode_seq", Batch([1, 1], [0, 9])),
        ({"per_prefill_seq": 2.0}, "decode-only", "per_decode_seq", Batch([1], [0])),
        ({"per_decode_seq": 0.4}, "prefill-only", "prefill_step or per_prefill_seq", STEPS[2]),
        ({"gemm_large": 1.0}, "decode-only", "per_decode_seq", Batch([1], [0])),
    ],
)
def test_a_preset_that_can_time_a_step_at_zero_is_refused_at_load(
    tmp_path: Path, coefficients: dict[str, float], kind: str, fix: str, zero_step: Batch
) -> None:
    # no knee: gemm_large is then exactly 0 on every step (with one it only fades to ~0)
    scales = SCALES.with_knee(None)
    path = _preset_file(tmp_path, coefficients, scales)
    with pytest.raises(InputError) as info:
        load_preset(str(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: field 'coefficients'")
    assert f"a {kind} step would take no time; set {fix} (or one of overhead," in message
    # the refusal is right: unvalidated, the model times such a step at 0 s
    unchecked = FittedPreset.model_construct(scales=scales, coefficients=coefficients)
    assert FittedCostModel(unchecked).step_time(zero_step) == 0.0


@pytest.mark.parametrize(
    "coefficients",
    [
        {"overhead": 1.0},
        {"gemm": 1.0},
        {"kv_read": 1.0},
        {"attention": 1.0},
        {"per_decode_seq": 0.4, "prefill_step": 5.0},
        {"per_decode_seq": 0.4, "per_prefill_seq": 2.0},
    ],
)
def test_a_preset_under_which_every_step_takes_time_loads(
    tmp_path: Path, coefficients: dict[str, float]
) -> None:
    preset = load_preset(str(_preset_file(tmp_path, coefficients, SCALES)))
    model = FittedCostModel(preset)
    assert all(model.step_time(step) > 0 for step in STEPS)


def test_cli_refuses_a_zero_time_preset_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_cli import SMALL

    path = _preset_file(tmp_path, {"prefill_step": 5.0}, SCALES)
    scenario = tmp_path / "s.yaml"
    cost_model = {"type": "fitted", "path": str(path)}
    scenario.write_text(yaml.safe_dump(SMALL | {"cost_model": cost_model}))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("servesim: error: ")
    assert "decode-only step would take no time; set per_decode_seq" in err
    assert not out.exists()


def test_calibrate_refuses_a_fit_that_times_a_step_at_zero() -> None:
    b, n, c = synthetic_points()
    meas = pd.DataFrame(
        {"num_seqs": b, "new_tokens": n, "context_len": c, "step_ms": true_ms(b, n, c)}
    )
    with pytest.raises(InputError, match="would time a decode-only step at 0 s") as info:
        calibrate(
            meas, "llama-2-7b", "a100-80gb", 1, rng=np.random.default_rng(0),
            features=("prefill_step", "per_prefill_seq"),
        )  # fmt: skip
    assert "per_decode_seq" in str(info.value)


def test_step_kinds_from_shape_or_column() -> None:
    meas = pd.DataFrame({"num_seqs": [1, 4], "new_tokens": [7, 1], "context_len": [0, 3]})
    assert step_kinds(meas).tolist() == ["prefill", "decode"]
    assert step_kinds(meas.assign(kind=["mlp", "mlp"])).tolist() == ["mlp", "mlp"]
