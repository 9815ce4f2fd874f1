"""Extension without editing servesim: a router, a cost model and a policy of one's own, each
a few lines in a module of the user's, named by import path in a scenario (docs/architecture.md,
"Adding things")."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simulator
from tests.test_engine import scenario

ROUTER = '''
from simulator.cluster.router import Router


class FewestWaiting(Router):
    """The replica with the fewest requests waiting (then the lowest index)."""

    def choose(self, request, replicas):
        return min(replicas, key=lambda r: (r.num_waiting, r.index))
'''

COST_MODEL = '''
from simulator.cost.interface import CostModel


class PerToken(CostModel):
    """``params.base_ms`` plus ``params.token_us`` per token computed."""

    times_from_sums = True

    def __init__(self, cfg):
        self.base = cfg.params["base_ms"] * 1e-3
        self.per_token = cfg.params["token_us"] * 1e-6

    def step_time(self, batch):
        return self.base + self.per_token * sum(batch.new_tokens)

    def time_sums(self, sums):  # the StepSums fields, by position
        return self.base + self.per_token * sums[2]
'''

POLICY = '''
from simulator.scheduling.step_scheduler import StepScheduler


class EvictLargest(StepScheduler):
    """The spec's scheduler, but a preemption takes the sequence holding the most KV."""

    def _victim(self):
        return max(self._running, key=lambda s: (s.num_blocks, s.arrival_order))
'''


@pytest.fixture
def mypkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package ``mypkg`` of the user's, importable for the test."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, source in (("routers", ROUTER), ("costs", COST_MODEL), ("policies", POLICY)):
        (pkg / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return pkg


def test_each_extension_is_under_30_lines(mypkg: Path) -> None:
    for name in ("routers", "costs", "policies"):
        assert len((mypkg / f"{name}.py").read_text().strip().splitlines()) < 30


def test_a_router_by_import_path(mypkg: Path) -> None:
    from simulator.cluster.routers import ROUTERS

    cfg = scenario()
    cfg["cluster"] = {"replicas": 3, "router": "mypkg.routers:FewestWaiting"}
    result = simulator.run(cfg)
    assert set(result.requests["replica"]) == {0, 1, 2}
    # the same class registered by name routes the same: the path reached it
    import mypkg.routers  # type: ignore[import-not-found]

    ROUTERS["fewest_waiting"] = mypkg.routers.FewestWaiting
    try:
        cfg["cluster"]["router"] = "fewest_waiting"
        named = simulator.run(cfg)
    finally:
        del ROUTERS["fewest_waiting"]
    pd.testing.assert_frame_equal(result.requests, named.requests)


def test_a_cost_model_by_import_path(mypkg: Path) -> None:
    cfg = scenario(
        cost_model={"type": "mypkg.costs:PerToken", "params": {"base_ms": 3, "token_us": 40}}
    )
    fast = simulator.run(cfg)
    steps = fast.steps
    assert steps is not None and len(steps)
    want = 3e-3 + 40e-6 * steps["num_tokens"].to_numpy()
    np.testing.assert_allclose(steps["duration_s"].to_numpy(), want, rtol=1e-12)
    # the plain path times whole batches
    slow = simulator.scenario.runner.run(cfg, fast_decode=False)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


def test_a_policy_by_import_path(mypkg: Path) -> None:
    tight: dict[str, Any] = {
        "max_num_batched_tokens": 256,
        "max_num_seqs": 32,
        "num_blocks": 120,
        "block_size": 16,
    }
    mine = simulator.run(scenario(scheduler={**tight, "policy": "mypkg.policies:EvictLargest"}))
    spec = simulator.run(scenario(scheduler=tight))
    assert mine.requests["num_preemptions"].sum() > 0
    assert mine.requests["finish_s"].notna().all()
    # a different victim changes who is preempted (and so the run)
    assert not mine.requests["num_preemptions"].equals(spec.requests["num_preemptions"])
    slow = simulator.scenario.runner.run(
        scenario(scheduler={**tight, "policy": "mypkg.policies:EvictLargest"}), fast_decode=False
    )
    pd.testing.assert_frame_equal(mine.requests, slow.requests, check_exact=True)


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("router", "mypkg.routers:Nope", "has no 'Nope'"),
        ("router", "nopkg.x:Router", "cannot import 'nopkg.x'"),
        ("router", "mypkg.costs:PerToken", "is not a Router subclass"),
        ("policy", "mypkg.routers:FewestWaiting", "is not a Scheduler subclass"),
    ],
)
def test_a_bad_import_path_is_one_line_naming_the_field(
    mypkg: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, said: str
) -> None:
    import yaml

    from simulator.cli import main

    cfg = scenario()
    if key == "router":
        cfg["cluster"] = {"replicas": 2, "router": value}
    else:
        cfg["scheduler"]["policy"] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and said in err, err
    assert not (tmp_path / "out").exists()
