"""Deployments vLLM would not start, refused in one line before anything runs: a token budget
below ``max_num_seqs``; a TP group larger than one node whose network the scenario does not
describe (and, once it does, the all-reduces' cross-node part priced over that link)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulator.cli import main
from simulator.cost import RooflineCostConfig, build_cost_model
from simulator.cost.batch import Batch
from simulator.cost.network import NetworkConfig
from simulator.cost.roofline import RooflineCostModel
from simulator.errors import DoesNotFit, InputError
from simulator.scenario.runner import resolve
from tests.paths import ROOT

QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")


def _one_line_error(args: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> str:
    """Run ``args``: exit 2, one line on stderr, nothing written."""
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert not out.exists()
    return err.removeprefix("servesim: error: ")


def _scenario(scheduler: dict[str, Any], **cost_model: Any) -> dict[str, Any]:
    return {
        "name": "checks",
        "scheduler": scheduler,
        "cost_model": {
            "type": "roofline",
            "model": "llama-3-8b",
            "hardware": "h100-sxm",
            **cost_model,
        },
        "workload": {
            "num_requests": 4,
            "arrival": {"process": "poisson", "rate": 1},
            "prompt_len": {"dist": "fixed", "value": 100},
            "output_len": {"dist": "fixed", "value": 10},
        },
    }


# ---- budgets -------------------------------------------------------------------------------


def test_a_token_budget_below_max_num_seqs_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the newcomer's run: 8 tokens a step for 256 sequences ran 45 s and exited 0
    args = ["run", QUICKSTART, "--set", "scheduler.max_num_batched_tokens=8"]
    args += ["--set", "scheduler.max_num_seqs=256"]
    err = _one_line_error(args, capsys, tmp_path / "out")
    assert err.startswith("scheduler.max_num_batched_tokens: 8 is below max_num_seqs (256)")


def test_a_default_budget_below_the_given_max_num_seqs_says_it_is_the_default() -> None:
    # vllm serve's 8192 on an H100: 9000 sequences cannot run a token each
    with pytest.raises(InputError, match=r"8,192 \(vllm serve's default on this GPU\) is below"):
        resolve(_scenario({"max_num_seqs": 9000}))


@pytest.mark.parametrize(
    "scheduler",
    [{}, {"max_num_batched_tokens": 8}, {"max_num_seqs": 1024}, {"max_num_batched_tokens": 64}],
)
def test_budgets_left_out_or_equal_still_validate(scheduler: dict[str, Any]) -> None:
    # a budget left out is never below the other: max_num_seqs defaults to at most the tokens
    tokens, seqs = resolve(_scenario(scheduler)).scheduler.budgets()
    assert tokens >= seqs


# ---- TP across nodes -----------------------------------------------------------------------


def test_tp_beyond_one_node_without_a_network_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _one_line_error(
        ["run", QUICKSTART, "--set", "cost_model.tp=16"], capsys, tmp_path / "out"
    )
    assert err.startswith("cost_model.tp: 16 GPUs span 2 nodes of h100-sxm (8 GPUs a node)")
    assert "cost_model.network" in err
    resolve(_scenario({}, tp=8))  # one node: as before


def test_kernels_beyond_one_node_says_it_cannot_price_a_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the kernel database times all-reduces within a node, and its config has no network
    sets = ["--set", "cost_model.type=kernels", "--set", "cost_model.model=llama-3-8b"]
    sets += ["--set", "cost_model.hardware=h100-sxm", "--set", "cost_model.tp=16"]
    err = _one_line_error(["run", QUICKSTART, *sets], capsys, tmp_path / "out")
    assert err.startswith("cost_model.tp: 16 GPUs span more than one node of h100-sxm")
    assert "which cost model kernels cannot price" in err and "tp <= 8" in err


def test_a_cluster_replica_group_beyond_a_node_is_named() -> None:
    cfg = _scenario({})
    cfg["cluster"] = {
        "replicas": [
            {"count": 1},
            {"count": 1, "cost_model": {**cfg["cost_model"], "tp": 16}},
        ]
    }
    with pytest.raises(DoesNotFit, match=r"cluster\.replicas\.1\.cost_model\.tp: 16 GPUs"):
        resolve(cfg)


def test_tp_beyond_a_node_takes_whole_nodes() -> None:
    net = {"bandwidth": 50e9}
    with pytest.raises(DoesNotFit, match="multiple of 8"):
        resolve(_scenario({}, tp=12, model="llama-3-70b", network=net))
    resolve(_scenario({}, tp=16, network=net))


def test_the_cross_node_part_of_each_all_reduce_goes_over_the_network() -> None:
    net = NetworkConfig(bandwidth=50e9, latency_us=10.0)
    one_node = RooflineCostConfig(model="llama-3-8b", hardware="h100-sxm", tp=8)
    two_nodes = one_node.model_copy(update={"tp": 16, "network": net})
    batch = Batch((100,), (0,))
    comm = []
    for cfg in (one_node, two_nodes):
        cost = build_cost_model(cfg)
        assert isinstance(cost, RooflineCostModel)
        comm.append(cost.breakdown(batch)["t_comm"])
    assert comm[0] == 0.0  # no NVLink bandwidth or latency given: none priced within a node
    # 2 all-reduces x 32 layers, each GPU's 1/8 slice of 4096 bf16 activations per token,
    # 2 (n - 1) / n = 1 of it over 50 GB/s between the 2 nodes, plus 10 us each
    per_token = 64 * 1.0 * (4096 * 2 / 8) / 50e9
    assert comm[1] == pytest.approx(64 * 10e-6 + 100 * per_token)


def test_hardware_presets_say_how_many_gpus_a_node_holds() -> None:
    from simulator.cost.presets import load_hardware

    for name in ("a100-80gb", "h100-sxm", "h200", "b200", "mi300x"):
        hw = load_hardware(name)
        assert hw.gpus_per_node == 8 and "gpus_per_node" in hw.sources, name
