"""The 2026 hybrid models from their config.json (../shared/data/models): their layer kinds and
shapes, the KV groups and blocks a scenario derives for them, refusals of layer kinds servesim
cannot hold, their costs (windowed attention cheaper than full at long context, state layers'
decode cost independent of context) and a run of each on H100 (DeepSeek-V3.2 on H200: its
671 B fp8 weights do not fit 8 x 80 GB)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.cost import build_cost_model
from simulator.cost.batch import Batch
from simulator.cost.hf_config import read_hf_config
from simulator.cost.hybrid_terms import window_pairs
from simulator.errors import InputError
from simulator.scenario.config import validate
from simulator.scenario.kv_groups import kv_layout_for
from simulator.scheduling import SchedulerConfig

MODELS = Path(__file__).parents[2] / "shared" / "data" / "models"

RUNS = [  # model, GPU, tp: where each fits
    ("gpt-oss-20b", "h100-sxm", 1),
    ("gpt-oss-120b", "h100-sxm", 1),
    ("gemma-4-26B-A4B", "h100-sxm", 1),
    ("Qwen3.5-35B-A3B", "h100-sxm", 2),
    ("Nemotron-H-56B-Base-8K", "h100-sxm", 2),
    ("DeepSeek-V3.2", "h200", 8),
]


def _path(name: str) -> str:
    return str(MODELS / f"{name}.json")


def _scenario(model: str, hardware: str, tp: int, kind: str = "roofline") -> dict[str, Any]:
    return {
        "name": "hybrid",
        "seed": 1,
        "scheduler": {"policy": "vllm-v1"},
        "cost_model": {"type": kind, "model": model, "hardware": hardware, "tp": tp},
        "workload": {
            "num_requests": 30,
            "arrival": {"process": "poisson", "rate": 4},
            "prompt_len": {"dist": "uniform", "low": 200, "high": 3000},
            "output_len": {"dist": "uniform", "low": 10, "high": 120},
        },
    }


@pytest.mark.parametrize(
    ("name", "kinds", "params_b", "window"),
    [
        ("gpt-oss-20b", {"sliding": 12, "full": 12}, 20.9, 128),
        ("gpt-oss-120b", {"sliding": 18, "full": 18}, 116.8, 128),
        ("gemma-4-26B-A4B", {"sliding": 25, "full": 5}, 25.2, 1024),
        ("Qwen3.5-35B-A3B", {"linear": 30, "full": 10}, 34.7, None),
        ("Nemotron-H-56B-Base-8K", {"mamba": 54, "full": 10}, 56.3, None),
        ("DeepSeek-V3.2", {"full": 61}, 671.9, None),
    ],
)
def test_each_config_reads_as_its_layers(
    name: str, kinds: dict[str, int], params_b: float, window: int | None
) -> None:
    model = read_hf_config(_path(name))
    assert model.layers is not None
    assert {k: model.layers.count(k) for k in set(model.layers.kinds)} == kinds  # type: ignore[arg-type]
    assert model.layers.sliding_window == window
    assert model.num_params / 1e9 == pytest.approx(params_b, abs=0.1)  # the model card's size


def test_shapes_read_per_family() -> None:
    gemma = read_hf_config(_path("gemma-4-26B-A4B"))
    assert gemma.layers is not None
    assert gemma.layers.kv_shape(gemma, "full") == (2, 512)  # global layers
    assert gemma.layers.kv_shape(gemma, "sliding") == (8, 256)
    qwen = read_hf_config(_path("Qwen3.5-35B-A3B"))  # multimodal: its text_config
    assert qwen.layers is not None and qwen.layers.state_bytes(qwen, "linear") == 2_146_304
    nemo = read_hf_config(_path("Nemotron-H-56B-Base-8K"))  # conv 3 x 20480 bf16 + fp32 SSM
    assert nemo.layers is not None and nemo.layers.state_bytes(nemo, "mamba") == 16_900_096
    ds = read_hf_config(_path("DeepSeek-V3.2"))
    assert ds.layers is not None and ds.layers.index_topk == 2048
    assert ds.layers.indexer_bytes_per_token == 132
    oss = read_hf_config(_path("gpt-oss-120b"))
    assert oss.weight_dtype == "fp4" and oss.layers is not None and oss.layers.attention_sinks


def _edited(tmp_path: Path, name: str, **changes: Any) -> Path:
    raw = json.loads(Path(_path(name)).read_text())
    target = raw.get("text_config", raw)
    for key, value in changes.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(raw))
    return out


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        (
            "gpt-oss-20b",
            {"layer_types": ["chunked_attention"] * 24},
            "field 'layer_types': 'chunked_attention' layers cannot be held",
        ),
        (
            "Nemotron-H-56B-Base-8K",
            {"hybrid_override_pattern": "E" * 118},
            "field 'hybrid_override_pattern': blocks ['E'] cannot be held",
        ),
        (
            "gemma-4-26B-A4B",
            {"num_kv_shared_layers": 10},
            "field 'num_kv_shared_layers': layers sharing another's KV cannot be held",
        ),
    ],
)
def test_unknown_layer_kinds_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, changes: Any, message: str
) -> None:
    path = _edited(tmp_path, name, **changes)
    with pytest.raises(InputError, match="cannot be held"):
        read_hf_config(path)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(_scenario(str(path), "h100-sxm", 1)))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not out.exists()


def test_kernels_refuses_hybrid_layers_in_one_line() -> None:
    cfg = validate(_scenario(_path("gpt-oss-20b"), "h100-sxm", 1, "kernels"), "scenario")
    with pytest.raises(InputError, match="kernels does not price gpt-oss-20b's sliding layers"):
        build_cost_model(cfg.cost_model)


def test_window_pairs_count_each_query_at_most_window_keys() -> None:
    for new, ctx, window in [(1, 0, 4), (5, 0, 3), (3, 10, 4), (10, 2, 6), (1, 100, 128)]:
        brute = sum(min(p, window) for p in range(ctx + 1, ctx + new + 1))
        assert window_pairs(new, ctx, window) == brute


def _costs(tmp_path: Path, kind: str) -> dict[str, Any]:
    no_window = _edited(tmp_path, "gpt-oss-120b", sliding_window=None)
    out = {}
    for label, model in (("window", _path("gpt-oss-120b")), ("none", str(no_window))):
        cfg = validate(_scenario(model, "h100-sxm", 1, kind), "scenario")
        out[label] = build_cost_model(cfg.cost_model)
    return out


@pytest.mark.parametrize("kind", ["roofline", "physics"])
def test_windowed_attention_is_cheaper_than_full_at_long_context(tmp_path: Path, kind: str) -> None:
    cost = _costs(tmp_path, kind)
    for batch in (Batch.uniform(32, 1, 32_000), Batch.uniform(1, 4096, 32_000)):
        assert cost["window"].step_time(batch) < 0.85 * cost["none"].step_time(batch)
    short = Batch.uniform(8, 1, 100)  # within the window: the same work
    assert cost["window"].step_time(short) == pytest.approx(cost["none"].step_time(short))


@pytest.mark.parametrize("kind", ["roofline", "physics"])
@pytest.mark.parametrize(("name", "tp"), [("Qwen3.5-35B-A3B", 2), ("Nemotron-H-56B-Base-8K", 2)])
def test_state_layers_decode_cost_is_independent_of_context(name: str, tp: int, kind: str) -> None:
    """A decode's state layers cost the same at any context; only the full layers' KV read
    grows, so the growth is that of a model of the full layers alone."""
    cfg = validate(_scenario(_path(name), "h100-sxm", tp, kind), "scenario")
    cost = build_cost_model(cfg.cost_model)
    model = cost.model  # type: ignore[attr-defined]
    if kind == "roofline":
        kv = model.kv_bytes_per_token_per_gpu(tp)
        b1 = cost.breakdown(Batch.uniform(16, 1, 1000))  # type: ignore[attr-defined]
        b2 = cost.breakdown(Batch.uniform(16, 1, 9000))  # type: ignore[attr-defined]
        assert b2["bytes_kv"] - b1["bytes_kv"] == pytest.approx(kv * 16 * 8000, rel=1e-9)
        assert b1["bytes_kv"] > kv * 16 * 1001  # the states are read and written too
    t = [cost.step_time(Batch.uniform(16, 1, c)) for c in (1000, 5000, 9000)]
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=0.05)  # linear in the full layers


def _sched(**keys: Any) -> SchedulerConfig:
    return SchedulerConfig(policy="vllm-v1", **keys)


def test_gpt_oss_holds_more_long_requests_with_its_window(tmp_path: Path) -> None:
    """32k-token prompts on one H100: the window's layers hold ~9 blocks a request, not 2,000,
    so the same memory holds about twice the requests (issue 37's check)."""
    from simulator.scenario.runner import scheduler_for

    held = {}
    for label, path in (
        ("window", _path("gpt-oss-120b")),
        ("none", str(_edited(tmp_path, "gpt-oss-120b", sliding_window=None))),
    ):
        cfg = validate(_scenario(path, "h100-sxm", 1), "scenario")
        sched = scheduler_for(cfg.scheduler, cfg.cost_model)
        model = read_hf_config(path)
        layout = kv_layout_for(sched, model, 1)
        assert sched.num_blocks is not None and sched.kv_groups is not None
        held[label] = sched.num_blocks // layout.blocks_held(32_768)
    assert held["window"] >= 1.8 * held["none"] >= 1


def test_qwen35_kv_per_request_grows_with_its_full_layers_only() -> None:
    model = read_hf_config(_path("Qwen3.5-35B-A3B"))
    layout = kv_layout_for(_sched(max_model_len=65_536), model, 2)
    full = [g for g in layout.groups if g.kind == "full"]
    mamba = [g for g in layout.groups if g.kind == "mamba"]
    assert len(full) == 1 and len(mamba) == 3 and full[0].num_layers == 10
    bs = full[0].block_size
    grow = layout.blocks_held(40 * bs) - layout.blocks_held(20 * bs)
    assert grow == 20  # the full group's blocks; the state groups hold one state each
    assert layout.blocks_held(bs) == 1 + 3  # none mode: one state block per group


@pytest.mark.parametrize(("name", "hardware", "tp"), RUNS)
def test_each_model_runs_from_its_config(tmp_path: Path, name: str, hardware: str, tp: int) -> None:
    scenario = tmp_path / "s.yaml"
    keys = _scenario(_path(name), hardware, tp)
    if name.startswith("gemma"):  # groups of blocks 16 and 32: prefix caching not simulated
        keys["scheduler"]["enable_prefix_caching"] = False
    scenario.write_text(yaml.safe_dump(keys))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--no-plots"]) == 0
    resolved = yaml.safe_load((out / "scenario.yaml").read_text())["scheduler"]
    groups = resolved["kv_groups"]
    assert groups and resolved["num_blocks"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 30 and summary["ttft_mean_s"] > 0


def test_prefix_caching_over_groups_of_different_block_sizes_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gemma 4's pages unify as blocks of 16 and 32 tokens; vLLM hashes at their gcd, which
    the KV manager does not: refused by name rather than run wrong."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(_scenario(_path("gemma-4-26B-A4B"), "h100-sxm", 1)))
    assert main(["run", str(scenario), "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scheduler.enable_prefix_caching" in err[0] and "[16, 32]" in err[0]


def test_gpt_oss_runs_more_long_requests_at_once_with_its_window(tmp_path: Path) -> None:
    """End to end through the scheduler's groups: 60 prompts of 32k tokens at once on one
    H100; the window's blocks given back let more of them run together (issue 37)."""
    most = {}
    for label, path in (
        ("window", _path("gpt-oss-120b")),
        ("none", str(_edited(tmp_path, "gpt-oss-120b", sliding_window=None))),
    ):
        keys = _scenario(path, "h100-sxm", 1)
        keys["scheduler"]["max_model_len"] = 33_000
        keys["workload"] = {
            "num_requests": 60,
            "arrival": {"process": "poisson", "rate": 1000},
            "prompt_len": {"dist": "fixed", "value": 32_000},
            "output_len": {"dist": "fixed", "value": 64},
        }
        scenario = tmp_path / f"{label}.yaml"
        scenario.write_text(yaml.safe_dump(keys))
        out = tmp_path / label
        assert main(["run", str(scenario), "--out", str(out), "--no-plots"]) == 0
        steps = pd.read_parquet(out / "steps.parquet")
        most[label] = int(steps["num_running"].max())
    assert most["window"] >= 1.8 * most["none"] >= 2


def test_layer_types_of_a_dense_family_are_held(tmp_path: Path) -> None:
    """Qwen2-style ``layer_types``: sliding layers held with their window; a null window
    makes them full attention (no layer kinds at all)."""
    raw = {
        "model_type": "qwen2",
        "num_hidden_layers": 4,
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": 4096,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    model = read_hf_config(path)
    assert model.layers is not None and model.layers.kinds == ("sliding", "full") * 2
    assert model.layers.sliding_window == 4096
    path.write_text(json.dumps({**raw, "sliding_window": None}))
    assert read_hf_config(path).layers is None
