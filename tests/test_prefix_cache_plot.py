"""The prefix-cache figure: the windowed hit rate it draws, and that runs with a cache get it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator.plots.prefix_cache import has_prefix_cache, hit_rate_over_time, plot_prefix_cache
from simulator.plots.run import save_run_plots
from simulator.plots.step_bins import bin_steps


def requests(first: list[float], prompt: list[int], cached: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {"first_scheduled_s": first, "prompt_len": prompt, "num_cached_tokens": cached}
    )


def test_hit_rate_per_bin_is_cached_over_prompt_tokens_of_requests_scheduled_in_it() -> None:
    req = requests([0.0, 1.0, 2.0, 3.0, float("nan")], [100, 100, 50, 150, 10], [0, 80, 0, 150, 0])
    rates = hit_rate_over_time(req, max_bins=2)  # bins [0, 1.5) and [1.5, 3]
    assert rates["prompt_tokens"].tolist() == [200, 200]  # the unscheduled request is left out
    assert rates["hit_rate"].tolist() == [0.4, 0.75]
    assert hit_rate_over_time(req.iloc[4:]).empty


def test_runs_with_a_prefix_cache_get_the_figure(tmp_path: Path) -> None:
    req = requests([0.0, 1.0], [10, 10], [0, 8])
    steps = pd.DataFrame({"start_s": [0.0, 1.0], "num_cached_blocks": [0, 2]})
    for col in ("output_len", "ttft_s", "tpot_s", "e2e_s", "finish_s", "arrival_s"):
        req[col] = 1.0
    req["status"] = "finished"
    for col in ("duration_s", "kv_utilization", "num_running", "num_waiting", "num_tokens"):
        steps[col] = 0.5
    steps["num_preemptions"] = 0
    paths = save_run_plots(req, steps, tmp_path)
    assert tmp_path / "prefix_cache.png" in paths and (tmp_path / "prefix_cache.png").stat().st_size
    none = req.assign(num_cached_tokens=0)
    assert not has_prefix_cache(none, bin_steps(steps.assign(num_cached_blocks=0)))
    assert tmp_path / "x" / "prefix_cache.png" not in save_run_plots(
        none, steps.assign(num_cached_blocks=0), tmp_path / "x"
    )


def test_a_million_steps_draw_a_bounded_number_of_points() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    steps = pd.DataFrame(
        {
            "start_s": np.arange(n) * 0.01,
            "duration_s": 0.01,
            "num_cached_blocks": rng.integers(0, 500, n),
        }
    )
    req = requests(list(np.sort(rng.uniform(0, n * 0.01, 50_000))), [100] * 50_000, [50] * 50_000)
    fig = plot_prefix_cache(req, bin_steps(steps))
    assert all(len(line.get_xdata()) <= 1000 for ax in fig.axes for line in ax.lines)
    assert fig.axes[0].lines[0].get_ydata().mean() == 50.0  # every request: 50 of 100 tokens
