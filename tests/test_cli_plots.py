"""Issue 23's figures, through the command line: the latency CDFs draw the scenario's SLO (on
a run and when ``servesim plot`` redraws it) and the decode band of the tokens-per-step panel
is visible next to large prefills."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from matplotlib.figure import Figure

import simulator.plots.run as run_plots
from simulator.cli import main

SCENARIO: dict[str, Any] = {
    "name": "plot-test",
    "seed": 2,
    "scheduler": {"max_num_batched_tokens": 2048, "max_num_seqs": 32, "num_blocks": 2000},
    "cost_model": {"type": "linear", "base_ms": 4, "per_token_ms": 0.03, "per_seq_ms": 0.05},
    "workload": {
        "num_requests": 120,
        "arrival": {"process": "poisson", "rate": 4},
        # long prompts, short outputs: ~2,000-token prefill steps beside ~10 decodes
        "prompt_len": {"dist": "uniform", "low": 1500, "high": 2000},
        "output_len": {"dist": "uniform", "low": 2, "high": 40},
    },
    "slo": {"ttft_ms": 150, "tpot_ms": 9},
}


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """Every run figure saved, by file stem, instead of only its PNG."""
    figures: dict[str, Figure] = {}
    save = run_plots.save_figure

    def keep(fig: Figure, path: Path, fmt: str = "png") -> Path:
        figures[Path(path).stem] = fig
        return save(fig, path, fmt)

    monkeypatch.setattr(run_plots, "save_figure", keep)
    return figures


def slo_lines(fig: Figure) -> list[str]:
    return [ln.get_label() for ax in fig.axes for ln in ax.get_lines() if "SLO" in ln.get_label()]


def test_the_cdfs_draw_the_slo_on_a_run_and_on_a_redraw(
    tmp_path: Path, drawn: dict[str, Figure]
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out)]) == 0
    labels = slo_lines(drawn["ttft_tpot_cdf"])
    assert len(labels) == 2
    assert labels[0].startswith("SLO 150 ms (") and labels[1].startswith("SLO 9.00 ms (")
    assert all(label.endswith("% within)") for label in labels)

    drawn.clear()
    assert main(["plot", str(out)]) == 0  # the SLO comes from the saved scenario.yaml
    assert slo_lines(drawn["ttft_tpot_cdf"]) == labels


def test_the_decode_band_is_visible_beside_large_prefills(
    tmp_path: Path, drawn: dict[str, Figure]
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    assert main(["run", str(scenario), "--out", str(tmp_path / "run")]) == 0
    tokens = drawn["step_timeline"].axes[1]
    assert tokens.get_yscale() == "log"  # linear, ~10 decodes under 2,000 would be a hairline
    low, high = tokens.get_ylim()
    assert low < 10 and high > 1000
