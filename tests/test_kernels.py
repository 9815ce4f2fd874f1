"""The ``kernels`` cost model against the installed kernel database (aiconfigurator-core,
in ``dev``): lookups exact at measured points (read here from the parquet files
independently), the fast path bit for bit, the default a config without ``type`` gets, and
bad GPUs or versions as one line through the command line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.cost import KernelsCostConfig, build_cost_model, default_type
from simulator.cost.batch import Batch, StepSums
from simulator.cost.kernel_db import KernelDatabase, data_root, measured_gpus, measured_versions
from simulator.cost.kernels import KernelsCostModel
from simulator.errors import InputError
from simulator.scenario.config import validate
from tests.paths import DATA, ROOT
from tests.test_cli_messages import QUICKSTART, error_of

GPU = "rtx_pro_6000_server"


def _table(path: str) -> pd.DataFrame:
    return pd.read_parquet(data_root() / GPU / path)


@pytest.fixture(scope="module")
def llama() -> KernelsCostModel:
    cm = build_cost_model(KernelsCostConfig(model="llama-3.1-8b", hardware="rtx-pro-6000"))
    assert isinstance(cm, KernelsCostModel)
    return cm


def test_the_database_lists_its_gpus_and_versions() -> None:
    gpus = measured_gpus()
    for gpu in ("h100_sxm", "h200_sxm", "b200_sxm", "l40s", GPU, "a100_sxm"):
        assert gpu in gpus
    assert "l4" not in gpus  # its folder has no vLLM tables
    assert measured_versions(GPU)[-1] == "0.24.0"
    assert measured_versions("a100_sxm") == ["0.14.0"]
    db = KernelDatabase.open(GPU, "0.24", "rtx-pro-6000")  # 0.24 is 0.24.0
    assert db.version == "0.24.0"
    # a table missing at the version falls back to the newest older one
    assert KernelDatabase("l40s", "0.24.0").path("comm/custom_allreduce_perf") is not None


def test_gemm_lookups_are_exact_at_measured_points(llama: KernelsCostModel) -> None:
    gemm = _table("gemm/vllm/0.24.0/gemm_perf.parquet")
    rows = gemm[(gemm.gemm_dtype == "bfloat16") & (gemm.n == 4096) & (gemm.k == 4096)]
    from simulator.cost.kernel_layers import ModelKernels

    kernels = ModelKernels(llama.db, llama.model, 1, llama.hw.hbm_bandwidth)
    curve = kernels.gemm(4096, 4096)
    for m in (1, 64, 1024, 4096):
        want = float(rows[rows.m == m].latency.iloc[0]) * 1e-3
        assert curve.at(m) == pytest.approx(want, rel=1e-12)
    # a width between measured ones lies between their times
    lo, hi = kernels.gemm(4096, 12288).at(2048), kernels.gemm(4096, 16384).at(2048)
    assert lo < kernels.gemm(4096, 14336).at(2048) < hi


def test_attention_lookups_are_exact_at_measured_points(llama: KernelsCostModel) -> None:
    gen = _table("attention/vllm/0.24.0/generation_attention_perf.parquet")
    ctx = _table("attention/vllm/0.24.0/context_attention_perf.parquet")
    layout = (gen.num_heads == 32) & (gen.num_key_value_heads == 8) & (gen.head_dim == 128)
    pick = gen[layout & (gen.kv_cache_dtype == "bfloat16") & (gen.window_size == 0)]
    row = pick[(pick.batch_size == 128) & (pick.step == 2047)].latency.iloc[0]
    t, outside = llama._attention.decode(128, 2047.0)
    assert outside is None
    assert t == pytest.approx(32 * float(row) * 1e-3, rel=1e-12)
    layout = (ctx.num_heads == 32) & (ctx.num_key_value_heads == 8) & (ctx.head_dim == 128)
    pick = ctx[layout & (ctx.kv_cache_dtype == "bfloat16") & (ctx.window_size == 0)]
    row = pick[(pick.batch_size == 4) & (pick.isl == 1024)].latency.iloc[0]
    t, outside = llama._attention.prefill(4, 1024 * 1025 / 2)
    assert outside is None
    assert t == pytest.approx(32 * float(row) * 1e-3, rel=1e-12)


def test_the_all_reduce_is_the_measured_custom_all_reduce() -> None:
    cm = build_cost_model(KernelsCostConfig(model="llama-3.1-8b", hardware="h100-sxm", tp=2))
    assert isinstance(cm, KernelsCostModel)
    one = build_cost_model(KernelsCostConfig(model="llama-3.1-8b", hardware="h100-sxm"))
    batch = Batch((512,), (0,))
    assert cm.step_time(batch) < one.step_time(batch)  # half the work, plus all-reduces


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 700), st.integers(0, 9000)),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 200),
    st.integers(0, 5000),
)
def test_time_sums_equals_step_time_bit_for_bit(
    chunks: list[tuple[int, int]], decodes: int, context: int
) -> None:
    cm = _LLAMA
    new = [n for n, _ in chunks] + [1] * decodes
    ctx = [c for _, c in chunks] + [context + i for i in range(decodes)]
    batch = Batch(new, ctx)
    assert cm.time_sums(tuple(StepSums.of(batch))) == cm.step_time(batch)  # type: ignore[arg-type]
    if decodes:
        only = Batch([1] * decodes, ctx[len(chunks) :])
        start = sum(only.context_lens)
        assert cm.time_decodes(decodes, range(start, start + 10**5, 10**4))[0] == (
            cm.step_time(only)
        )


_LLAMA = build_cost_model(
    KernelsCostConfig(model="llama-3.1-8b", hardware="rtx-pro-6000", skew=False)
)


def test_the_skew_correction_needs_the_batch() -> None:
    kw = {"model": "llama-3.1-8b", "hardware": "rtx-pro-6000"}
    skewed, flat = build_cost_model(KernelsCostConfig(**kw)), _LLAMA
    assert skewed.times_from_sums is False and flat.times_from_sums is True
    even, spread = Batch((1,) * 64, (1000,) * 64), Batch((1,) * 64, (100,) * 32 + (1900,) * 32)
    assert skewed.step_time(even) == flat.step_time(even)  # no spread, no correction
    assert flat.step_time(spread) == flat.step_time(even)  # the same sums
    extra = skewed.step_time(spread) - flat.step_time(spread)
    assert isinstance(skewed, KernelsCostModel)
    rows = skewed._attention
    gap = rows.decode(64, 1900.0)[0] - rows.decode(64, 1000.0)[0]
    assert extra == pytest.approx(0.065 * gap, rel=1e-9)  # configs/kernels/overheads.yaml


def test_dtypes_select_the_tables() -> None:
    kw = {"model": "llama-3.1-8b", "hardware": "h100-sxm"}
    bf16 = build_cost_model(KernelsCostConfig(**kw))
    fp8 = build_cost_model(KernelsCostConfig(**kw, weight_dtype="fp8", kv_dtype="fp8"))
    prefill, decode = Batch((2048,), (0,)), Batch((1,) * 64, (4000,) * 64)
    assert fp8.step_time(prefill) < 0.8 * bf16.step_time(prefill)
    assert fp8.step_time(decode) < bf16.step_time(decode)


def test_a_moe_model_runs_its_measured_experts() -> None:
    model = str(DATA / "llmservingsim" / "models" / "Qwen3-30B-A3B-Instruct-2507.json")
    kw = {"model": model, "hardware": "rtx-pro-6000"}
    alone = build_cost_model(KernelsCostConfig(**kw))
    split = build_cost_model(KernelsCostConfig(**kw, expert_parallel=2))
    assert isinstance(split, KernelsCostModel)
    batch = Batch((1024,), (0,))
    # each GPU runs half the experts' work over both ranks' tokens, plus the exchange
    both = split.step_time_in_dp(batch, [1024, 1024], 0)
    assert both > split.step_time_in_dp(batch, [1024, 1], 0)
    assert alone.step_time(batch) > 0


def test_a_step_outside_the_grids_is_counted_and_warned_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cm = build_cost_model(KernelsCostConfig(model="llama-3.1-8b", hardware="rtx-pro-6000"))
    assert isinstance(cm, KernelsCostModel)
    inside = cm.step_time(Batch((1,) * 8, (1000,) * 8))
    assert cm.extrapolated == 0 and capsys.readouterr().err == ""
    far = Batch((1,) * 512, (60000,) * 512)  # 512 decodes of 60k tokens: not measured
    assert cm.step_time(far) > inside
    cm.step_time(far)
    assert cm.extrapolated == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "extrapolated" in err[0] and "warned once" in err[0]


def test_a_gpu_the_database_lacks_is_one_line_naming_the_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = ["--set", "cost_model.type=kernels", "--set", "cost_model.model=llama-3-8b"]
    sets = [*kernels, "--set", "cost_model.hardware=mi300x"]
    err = error_of(["run", QUICKSTART, *sets], capsys, tmp_path / "out")
    assert err.startswith("cost_model.hardware: mi300x: no vLLM kernels measured")
    assert "h100_sxm" in err and err.endswith("use cost_model.type: physics")
    sets = [*kernels, "--set", "cost_model.hardware=h100-sxm"]
    err = error_of(
        ["run", QUICKSTART, *sets, "--set", "cost_model.vllm_version='0.9'"],
        capsys,
        tmp_path / "out",
    )
    assert err.startswith("cost_model.vllm_version: 0.9: not measured on h100_sxm")
    assert "0.24.0" in err
    err = error_of(
        ["run", QUICKSTART, *sets, "--set", "cost_model.vllm_version=0.20"], capsys, tmp_path / "o"
    )
    assert "cost_model.vllm_version" in err and "quoted" in err


def _no_type(hardware: str) -> dict:
    return {
        "name": "default",
        "scheduler": {"policy": "spec"},
        "cost_model": {"model": "llama-3-8b", "hardware": hardware},
        "workload": {
            "num_requests": 20,
            "arrival": {"process": "poisson", "rate": 5},
            "prompt_len": {"dist": "fixed", "value": 200},
            "output_len": {"dist": "fixed", "value": 20},
        },
    }


def test_a_config_without_type_gets_kernels_where_measured_else_physics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert default_type("rtx-pro-6000") == "kernels"
    assert default_type("l4") == "physics"  # in the database, no vLLM tables
    assert default_type("mi300x") == "physics"
    # a hybrid model's windowed layers are not read from the database yet: physics, not a refusal
    gpt_oss = Path(__file__).parents[2] / "shared" / "data" / "models" / "gpt-oss-20b.json"
    assert default_type("rtx-pro-6000", str(gpt_oss)) == "physics"
    assert default_type("rtx-pro-6000", "llama-3.1-8b") == "kernels"
    assert validate(_no_type("h100-sxm"), "s").cost_model.type == "kernels"
    assert validate(_no_type("rtx-4090"), "s").cost_model.type == "physics"
    import yaml

    for hardware, kind in (("h100-sxm", "kernels"), ("rtx-4090", "physics")):
        path = tmp_path / f"{hardware}.yaml"
        path.write_text(yaml.safe_dump(_no_type(hardware)))
        out = tmp_path / hardware
        assert main(["run", str(path), "--out", str(out), "--no-plots"]) == 0
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert last.startswith("server ") and last.endswith(f"; {kind} cost model")
        assert yaml.safe_load((out / "scenario.yaml").read_text())["cost_model"]["type"] == kind


def test_an_unknown_hardware_without_type_is_physics_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InputError, match="cost_model.hardware"):
        from simulator.scenario.runner import resolve

        resolve(validate(_no_type("no-such-gpu"), "s"))
    assert ROOT.is_dir()


def test_layouts_and_versions_the_tables_lack_are_derived_or_refused() -> None:
    # MHA decodes: measured up to 8 KV heads; Llama-2-7B's 32 are priced as 4 x (8, 8)
    mha = build_cost_model(KernelsCostConfig(model="llama-2-7b", hardware="h100-sxm"))
    assert isinstance(mha, KernelsCostModel)
    gen = pd.read_parquet(
        data_root() / "h100_sxm/attention/vllm/0.24.0/generation_attention_perf.parquet"
    )
    pick = gen[
        (gen.num_heads == 8)
        & (gen.num_key_value_heads == 8)
        & (gen.head_dim == 128)
        & (gen.kv_cache_dtype == "bfloat16")
        & (gen.window_size == 0)
    ]
    lane = pick.kernel_source.value_counts().sort_index().idxmax()
    row = pick[(pick.kernel_source == lane) & (pick.batch_size == 256) & (pick.step == 1023)]
    want = 4 * 32 * float(row.latency.iloc[0]) * 1e-3
    assert mha._attention.decode(256, 1023.0)[0] == pytest.approx(want, rel=1e-12)
    # A100's vLLM 0.14 tables have no window_size column
    a100 = build_cost_model(KernelsCostConfig(model="llama-3.1-8b", hardware="a100-80gb"))
    assert isinstance(a100, KernelsCostModel) and a100.db.version == "0.14.0"
    with pytest.raises(InputError, match="no decode attention of 14 heads, 2 KV heads"):
        build_cost_model(KernelsCostConfig(model="qwen-2.5-7b", hardware="l40s", tp=2))
