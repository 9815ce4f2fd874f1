"""A scenario that leaves out the scheduler's budgets gets what ``vllm serve`` sets on its GPU
(vLLM's ``EngineArgs.get_batch_defaults``, OpenAI API server context): 8192 tokens and 1024
sequences on a GPU of 70 GiB or more that is not an A100, else 2048 and 256."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.cost.hardware_spec import HardwareSpec
from simulator.cost.presets import GIB, derive_num_blocks, load_hardware, load_model, serve_budgets
from simulator.errors import DoesNotFit
from simulator.scenario.config import apply_overrides, validate
from simulator.scenario.runner import resolve


def _scenario(hardware: str | None, **scheduler: Any) -> dict[str, Any]:
    cost: dict[str, Any] = (
        {"type": "linear", "base_ms": 5, "per_token_ms": 0.01}
        if hardware is None
        else {"type": "roofline", "model": "llama-3-8b", "hardware": hardware, "tp": 1}
    )
    if hardware is None:
        scheduler.setdefault("num_blocks", 1000)
    return {
        "name": "budgets",
        "scheduler": scheduler,
        "cost_model": cost,
        "workload": {
            "num_requests": 20,
            "arrival": {"process": "poisson", "rate": 5},
            "prompt_len": {"dist": "fixed", "value": 100},
            "output_len": {"dist": "fixed", "value": 10},
        },
    }


@pytest.mark.parametrize(
    ("hardware", "expected"),
    [
        ("h100-sxm", (8192, 1024)),
        ("h200", (8192, 1024)),
        ("b200", (8192, 1024)),
        ("mi300x", (8192, 1024)),
        ("rtx-pro-6000", (8192, 1024)),
        ("a100-80gb", (2048, 256)),  # 80 GB, but an A100: vLLM keeps the small budgets
        ("l40s", (2048, 256)),
        ("l4", (2048, 256)),
        ("rtx-4090", (2048, 256)),
    ],
)
def test_each_gpu_preset_gets_vllm_serves_budgets(hardware: str, expected: tuple[int, int]) -> None:
    assert serve_budgets(load_hardware(hardware), None, None) == expected
    cfg = resolve(_scenario(hardware))
    assert (cfg.scheduler.max_num_batched_tokens, cfg.scheduler.max_num_seqs) == expected


def test_the_threshold_and_the_name_are_vllms() -> None:
    base = load_hardware("h100-sxm")
    at = base.model_copy(update={"memory_bytes": 70 * GIB})
    below = base.model_copy(update={"memory_bytes": 70 * GIB - 1})
    a100: HardwareSpec = base.model_copy(update={"name": "NVIDIA A100-SXM4-80GB"})
    assert serve_budgets(at, None, None) == (8192, 1024)
    assert serve_budgets(below, None, None) == (2048, 256)
    assert serve_budgets(a100, None, None) == (2048, 256)
    assert serve_budgets(None, None, None) == (2048, 256)  # vLLM when it cannot read the GPU


def test_a_budget_given_is_kept_and_caps_the_sequences() -> None:
    h100 = load_hardware("h100-sxm")
    assert serve_budgets(h100, 512, None) == (512, 512)
    assert serve_budgets(h100, None, 64) == (8192, 64)
    assert serve_budgets(h100, 4096, 300) == (4096, 300)
    cfg = resolve(_scenario("h100-sxm", max_num_batched_tokens=512))
    assert (cfg.scheduler.max_num_batched_tokens, cfg.scheduler.max_num_seqs) == (512, 512)


def test_a_cost_model_without_gpus_gets_the_small_budgets() -> None:
    cfg = resolve(_scenario(None))
    assert (cfg.scheduler.max_num_batched_tokens, cfg.scheduler.max_num_seqs) == (2048, 256)


def test_the_kv_budget_is_derived_with_the_budgets_filled_in() -> None:
    cfg = resolve(_scenario("h100-sxm"))
    expected = derive_num_blocks(
        load_model("llama-3-8b"),
        load_hardware("h100-sxm"),
        1,
        16,
        0.9,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
    )
    assert cfg.scheduler.num_blocks == expected
    given = resolve(_scenario("h100-sxm", max_num_batched_tokens=8192, max_num_seqs=1024))
    assert given.scheduler == cfg.scheduler  # the same as writing vLLM's values out


def test_each_replica_group_gets_its_own_gpus_budgets() -> None:
    raw = _scenario("h100-sxm")
    a100 = {"type": "roofline", "model": "llama-3-8b", "hardware": "a100-80gb", "tp": 1}
    raw["cluster"] = {"replicas": [{"count": 1}, {"count": 1, "cost_model": a100}]}
    cfg = resolve(raw)
    assert (cfg.scheduler.max_num_batched_tokens, cfg.scheduler.max_num_seqs) == (8192, 1024)
    assert cfg.cluster is not None and isinstance(cfg.cluster.replicas, list)
    group = cfg.cluster.replicas[1].scheduler
    assert group is not None
    assert (group.max_num_batched_tokens, group.max_num_seqs) == (2048, 256)


def test_a_search_point_on_other_gpus_gets_their_budgets() -> None:
    """``search`` and ``sweep`` resolve each point from the scenario as written, so a point
    that changes the GPU gets that GPU's budgets, not the base scenario's."""
    base = _scenario("h100-sxm")
    point = apply_overrides(base, {"cost_model.hardware": "a100-80gb"}, "test")
    cfg = resolve(validate(point, "test [a100]"))
    assert (cfg.scheduler.max_num_batched_tokens, cfg.scheduler.max_num_seqs) == (2048, 256)


def test_the_saved_scenario_says_which_budgets_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_scenario("l4")))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-plots"]) == 0
    saved = yaml.safe_load((out / "scenario.yaml").read_text())
    assert saved["scheduler"]["max_num_batched_tokens"] == 2048
    assert saved["scheduler"]["max_num_seqs"] == 256
    blocks = saved["scheduler"]["num_blocks"]
    last = capsys.readouterr().out.strip().splitlines()[-1]  # and so does the console
    assert last == (
        f"server     spec, 2,048 tokens a step, 256 sequences, {blocks:,} KV blocks of 16 "
        f"({blocks * 16:,} tokens); {saved['cost_model']['type']} cost model"
    )


def test_a_deployment_left_no_kv_cache_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama-3-70B on 2 x H100: 70.6 GB of weights per GPU and the activations of vLLM's
    8192-token step leave no KV cache of the 72 GB usable. It cannot exist: ``run`` refuses
    it in one line, and ``search`` marks it infeasible rather than failed."""
    raw = _scenario("h100-sxm")
    raw["cost_model"].update(model="llama-3-70b", tp=2)
    with pytest.raises(DoesNotFit, match="does not fit on 2 x h100-sxm with any KV cache"):
        resolve(raw)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    argv = ["search", str(path), "--grid", "cost_model.tp=1,2", "--seeds", "1", "--jobs", "1"]
    argv += ["--slo", "ttft_p99_ms=1000"]
    # nothing serves: exit 1, with the table and plots of no point found written all the same
    assert main([*argv, "--out", str(tmp_path / "srch")]) == 1
    table = pd.read_parquet(tmp_path / "srch" / "search.parquet")
    assert list(table["status"]) == ["infeasible", "infeasible"]
    assert "3.5 GB activation peak (a step of 8192 tokens)" in table["reason"].iloc[1]
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scheduler.num_blocks: llama-3-70b does not fit" in err[0]
    assert not (tmp_path / "run").exists()


def test_a_scenario_may_leave_the_scheduler_out() -> None:
    raw = _scenario("h100-sxm")
    del raw["scheduler"]
    cfg = resolve(raw)
    assert cfg.scheduler.policy == "spec"
    assert cfg.scheduler.budgets() == (8192, 1024)
    assert cfg.scheduler == resolve(_scenario("h100-sxm")).scheduler
