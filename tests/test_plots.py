"""Tests for simulator.plots (run and sweep figures) on synthetic data (no engine needed)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.scale import LogTransform

from simulator.errors import InputError
from simulator.plots.run import (
    binned_median,
    plot_e2e_vs_prompt,
    plot_kv_timeline,
    plot_latency_cdfs,
    plot_step_timeline,
    save_run_plots,
)
from simulator.plots.step_bins import MAX_TIME_BINS, bin_steps, bin_steps_file
from simulator.plots.sweep import plot_budget_comparison, plot_sweep, save_sweep_plots

# Any matplotlib warning (log axis on non-positive data, layout failures...) is a defect.
pytestmark = pytest.mark.filterwarnings("error")

BUDGET = "scheduler.max_num_batched_tokens"
RATE = "workload.arrival.rate"


# --------------------------------------------------------------------------- synthetic data


def make_requests(
    rng: np.random.Generator, n: int = 400, rate: float = 4.0, reject_frac: float = 0.05
) -> pd.DataFrame:
    """An M/M/1-like run: Poisson arrivals, FCFS waits by the Lindley recursion."""
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    prompt = np.clip(rng.lognormal(6.5, 0.9, n), 4, 8000).astype(int)
    output = rng.geometric(1 / 120, n)
    output[rng.random(n) < 0.1] = 1  # single-token answers: TPOT undefined
    service = 0.05 + prompt * 2e-5  # prefill cost grows with the prompt
    wait = np.zeros(n)
    for i in range(1, n):
        gap = arrival[i] - arrival[i - 1]
        wait[i] = max(0.0, wait[i - 1] + service[i - 1] * 0.9 - gap)
    tpot = rng.gamma(8, 0.003, n) + 0.01
    ttft = wait + service
    e2e = ttft + (output - 1) * tpot
    rejected = rng.random(n) < reject_frac
    df = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "arrival_s": arrival,
            "prompt_len": prompt,
            "output_len": output,
            "first_scheduled_s": arrival + wait,
            "first_token_s": arrival + ttft,
            "finish_s": arrival + e2e,
            "ttft_s": ttft,
            "tpot_s": np.where(output > 1, tpot, np.nan),
            "e2e_s": e2e,
            "queue_delay_s": wait,
            "num_preemptions": rng.poisson(0.05, n),
            "status": np.where(rejected, "rejected", "finished"),
        }
    )
    times = ["first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s"]
    df.loc[rejected, times + ["queue_delay_s"]] = np.nan
    return df


def make_steps(rng: np.random.Generator, n: int = 3000, capacity: int = 2000) -> pd.DataFrame:
    """Steps whose load rises and falls; preemptions happen only when KV is near full."""
    phase = np.linspace(0, 3 * np.pi, n)
    running = np.clip(40 + 35 * np.sin(phase) + rng.normal(0, 4, n), 1, None).astype(int)
    waiting = np.clip(30 * np.sin(phase) + rng.normal(0, 3, n), 0, None).astype(int)
    prefill = np.where(rng.random(n) < 0.3, rng.integers(16, 2048, n), 0)
    decode = running - (prefill > 0)
    blocks = np.clip(running * 25 + rng.integers(0, 100, n), 0, capacity)
    util = blocks / capacity
    preempt = np.where(util > 0.97, rng.poisson(1.0, n), 0)
    duration = 0.008 + 4e-5 * decode + 1.2e-5 * prefill
    start = np.concatenate([[0.0], np.cumsum(duration)[:-1]])
    return pd.DataFrame(
        {
            "step": np.arange(n),
            "start_s": start,
            "duration_s": duration,
            "num_seqs": running,
            "num_tokens": prefill + decode,
            "num_prefill_tokens": prefill,
            "num_decode_seqs": decode,
            "blocks_used": blocks,
            "kv_utilization": util,
            "num_running": running,
            "num_waiting": waiting,
            "num_preemptions": preempt,
        }
    )


def summarize(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float]:
    """The summary figures the sweep table carries (a subset computed independently)."""
    done = requests[requests["status"] == "finished"]
    dur = float(steps["start_s"].iloc[-1] + steps["duration_s"].iloc[-1])
    out: dict[str, float] = {
        "num_requests": len(requests),
        "num_finished": len(done),
        "output_token_throughput": done["output_len"].sum() / dur,
        "total_token_throughput": (done["output_len"] + done["prompt_len"]).sum() / dur,
        "num_preemptions": float(steps["num_preemptions"].sum()),
    }
    for m in ("ttft", "tpot"):
        v = done[f"{m}_s"].dropna()
        for p in (50, 90, 99):
            out[f"{m}_p{p}_s"] = float(np.percentile(v, p))
    return out


def make_sweep(rng: np.random.Generator, extra_key: bool = False) -> pd.DataFrame:
    """A budget x rate grid where latency falls with the budget and rises with the rate."""
    rows = []
    seeds = [0, 1] if extra_key else [0]
    for budget in (256, 512, 1024, 2048, 4096, 8192):
        for rate in (1.0, 4.0, 16.0):
            for seed in seeds:
                ttft = 0.05 * rate / np.sqrt(budget / 256) * rng.uniform(0.9, 1.1)
                tpot = 0.02 + 1e-6 * budget * rate
                row = {
                    BUDGET: budget,
                    RATE: rate,
                    "ttft_p50_s": ttft,
                    "ttft_p99_s": 4 * ttft,
                    "tpot_p50_s": tpot,
                    "tpot_p99_s": 1.5 * tpot,
                    "output_token_throughput": 100 * rate * (1 - 1 / budget),
                    "total_token_throughput": 900 * rate,
                    "num_preemptions": int(rate * 3),
                    "status": "ok",
                    "error": None,
                }
                if extra_key:
                    row["seed"] = seed
                rows.append(row)
    failed = {BUDGET: 1024, RATE: 4.0, "status": "failed", "error": "boom"}
    failed.update({"ttft_p50_s": 1e6, "ttft_p99_s": 1e6})  # must not leak into the plot
    if extra_key:
        failed["seed"] = 0
    rows.append(failed)
    return pd.DataFrame(rows)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh seeded generator per test."""
    return np.random.default_rng(12345)


def render(fig: Figure) -> bytes:
    """Draw the figure fully (layout, ticks, text) and return the PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def data_lines(ax: Axes) -> list[Line2D]:
    """Lines that carry data (not the empty legend placeholders)."""
    return [ln for ln in ax.get_lines() if len(np.asarray(ln.get_xdata())) > 0]


def assert_labelled(fig: Figure) -> None:
    """Every axes has a title and, unless it holds a no-data note, axis labels; panels of a
    multi-panel figure also share a figure title."""
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 1 or fig.get_suptitle()
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            assert ax.get_ylabel()
            continue
        assert ax.get_title()
        if not any(t.get_text().startswith("no data") for t in ax.texts):
            assert ax.get_xlabel() or ax.get_shared_x_axes().get_siblings(ax) != [ax]
            assert ax.get_ylabel()


def log_base(ax: Axes) -> float:
    """The base of a log x axis (fails if the axis is not logarithmic)."""
    tr = ax.xaxis.get_transform()
    assert isinstance(tr, LogTransform)
    return float(tr.base)


def no_data_notes(fig: Figure) -> int:
    """How many axes show a 'no data' note."""
    return sum(any(t.get_text().startswith("no data") for t in ax.texts) for ax in fig.axes)


# --------------------------------------------------------------------------- latency CDFs


def test_latency_cdfs_percentile_markers(rng: np.random.Generator) -> None:
    req = make_requests(rng)
    fig = plot_latency_cdfs(req)
    render(fig)
    assert len(fig.axes) == 2
    assert_labelled(fig)
    done = req[req["status"] == "finished"]
    for ax, col in zip(fig.axes, ("ttft_s", "tpot_s"), strict=True):
        ms = done[col].dropna().to_numpy() * 1000
        lines = ax.get_lines()
        assert len(lines) == 3  # CDF, p50, p99
        by_label = {str(ln.get_label()).split(" ")[0]: ln for ln in lines}
        for p in (50, 99):
            x = np.asarray(by_label[f"p{p}"].get_xdata(), dtype=float)
            assert x == pytest.approx([np.percentile(ms, p)] * 2)
        cdf = by_label["TTFT" if col == "ttft_s" else "TPOT"]
        y = np.asarray(cdf.get_ydata(), dtype=float)
        assert np.all(np.diff(y) >= 0) and y[-1] == pytest.approx(1.0)
        assert np.asarray(cdf.get_xdata())[-1] == pytest.approx(ms.max())
    # The title counts rejected requests, which the simulated run has.
    assert "rejected" in fig.get_suptitle()


def test_latency_cdf_log_axis_only_when_spread_is_wide(rng: np.random.Generator) -> None:
    req = make_requests(rng, reject_frac=0.0)
    req["ttft_s"] = np.geomspace(0.001, 10.0, len(req))  # 4 decades
    req["tpot_s"] = rng.uniform(0.02, 0.03, len(req))  # 1.5x
    fig = plot_latency_cdfs(req)
    render(fig)
    assert fig.axes[0].get_xscale() == "log"
    assert fig.axes[1].get_xscale() == "linear"


def test_latency_cdf_thins_large_inputs_but_keeps_extremes(rng: np.random.Generator) -> None:
    n = 200_000
    req = pd.DataFrame(
        {
            "ttft_s": rng.exponential(0.2, n),
            "tpot_s": rng.exponential(0.03, n),
            "status": "finished",
        }
    )
    fig = plot_latency_cdfs(req)
    cdf = fig.axes[0].get_lines()[0]
    x = np.asarray(cdf.get_xdata())
    assert len(x) <= 2000
    assert x[0] == pytest.approx(req["ttft_s"].min() * 1000)
    assert x[-1] == pytest.approx(req["ttft_s"].max() * 1000)


# --------------------------------------------------------------------------- E2E vs prompt


def test_e2e_scatter_and_median_line(rng: np.random.Generator) -> None:
    req = make_requests(rng)
    fig = plot_e2e_vs_prompt(req)
    render(fig)
    assert len(fig.axes) == 2  # the plot and its output-length colorbar
    assert_labelled(fig)
    ax = fig.axes[0]
    assert "output" in fig.axes[1].get_ylabel()
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(scatters) == 1
    assert len(np.asarray(scatters[0].get_offsets())) == int((req["status"] == "finished").sum())
    assert [ln.get_label() for ln in ax.get_lines()] == ["binned median"]
    assert ax.get_legend() is not None


def test_e2e_hexbin_for_many_points(rng: np.random.Generator) -> None:
    req = make_requests(rng, n=20_000, rate=1.0)
    fig = plot_e2e_vs_prompt(req)
    render(fig)
    assert len(fig.axes) == 2  # the plot and its colorbar
    ax = fig.axes[0]
    assert any(isinstance(c, PolyCollection) for c in ax.collections)
    assert not any(isinstance(c, PathCollection) for c in ax.collections)


def test_binned_median_matches_hand_computation() -> None:
    # Bins [0,10) and [10,20]: medians 2 and 30 by hand; x medians 1 and 15.
    x = np.array([0.0, 1, 2, 10, 15, 20])
    y = np.array([1.0, 2, 100, 10, 30, 40])
    mx, my = binned_median(x, y, np.array([0.0, 10, 20]))
    assert list(mx) == [1.0, 15.0]
    assert list(my) == [2.0, 30.0]


def test_binned_median_drops_sparse_bins() -> None:
    x = np.array([0.0, 1, 2, 15])
    y = np.array([1.0, 2, 3, 99])
    mx, my = binned_median(x, y, np.array([0.0, 10, 20]))
    assert list(my) == [2.0]


# --------------------------------------------------------------------------- step timelines


def test_bin_steps_time_weighted_state_mean() -> None:
    steps = pd.DataFrame(
        {
            "start_s": [0.0, 0.1],
            "duration_s": [0.1, 0.3],
            "kv_utilization": [0.2, 0.8],
            "num_running": [2, 6],
            "num_tokens": [100, 300],
            "num_preemptions": [1, 2],
        }
    )
    b = bin_steps(steps, max_bins=1)
    # (0.2*0.1 + 0.8*0.3) / 0.4 = 0.65; tokens are a per-step mean: 200.
    assert b["kv_utilization_mean"].iloc[0] == pytest.approx(0.65)
    assert b["num_running_mean"].iloc[0] == pytest.approx(5.0)
    assert b["num_tokens_mean"].iloc[0] == pytest.approx(200.0)
    assert b["num_preemptions_sum"].iloc[0] == 3
    assert b["duration_s_max"].iloc[0] == pytest.approx(0.3)


def test_binning_a_parquet_file_in_batches_equals_binning_the_frame(
    rng: np.random.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import simulator.plots.step_bins as step_bins

    steps = make_steps(rng, n=5000)
    path = tmp_path / "steps.parquet"
    steps.to_parquet(path, index=False, row_group_size=700)
    monkeypatch.setattr(step_bins, "_BATCH_ROWS", 333)
    whole, streamed = bin_steps(steps, max_bins=50), bin_steps_file(path, max_bins=50)
    pd.testing.assert_frame_equal(streamed, whole, rtol=1e-12)
    assert streamed.attrs == whole.attrs
    assert whole.attrs["num_steps"] == 5000
    assert whole.attrs["num_preemptions"] == steps["num_preemptions"].sum()


def test_kv_timeline_marks_each_preemption_time(rng: np.random.Generator) -> None:
    steps = make_steps(rng, n=300)
    assert steps["num_preemptions"].sum() > 0
    fig = plot_kv_timeline(steps)
    render(fig)
    assert len(fig.axes) == 3
    assert_labelled(fig)
    ax_kv, ax_q, ax_pre = fig.axes
    # 300 steps over 800 bins: one step per bin, so marks sit at the exact step times.
    hit = steps[steps["num_preemptions"] > 0]
    marks = ax_pre.get_lines()[0]
    assert np.asarray(marks.get_xdata()) == pytest.approx(hit["start_s"].to_numpy())
    assert np.asarray(marks.get_ydata()) == pytest.approx(hit["num_preemptions"].to_numpy())
    bar_collection = ax_pre.collections[0]
    assert isinstance(bar_collection, LineCollection)
    bars = bar_collection.get_segments()
    assert [seg[1][1] for seg in bars] == pytest.approx(hit["num_preemptions"].to_numpy())
    assert f"{int(steps['num_preemptions'].sum()):,} total" in ax_pre.get_title()
    util = np.asarray(ax_kv.get_lines()[0].get_ydata(), dtype=float)
    assert util == pytest.approx(100 * steps["kv_utilization"].to_numpy())
    assert sorted(str(ln.get_label()) for ln in ax_q.get_lines()) == ["running", "waiting"]


def test_kv_timeline_without_preemptions_says_none(rng: np.random.Generator) -> None:
    steps = make_steps(rng, n=500).assign(num_preemptions=0)
    fig = plot_kv_timeline(steps)
    render(fig)
    ax_pre = fig.axes[2]
    assert not ax_pre.get_lines() and not ax_pre.collections
    assert any("no preemptions" in t.get_text() for t in ax_pre.texts)
    assert no_data_notes(fig) == 0
    # The note must not wipe the time ticks the three panels share.
    assert len(ax_pre.get_xticks()) > 2
    assert any(t.get_text() for t in ax_pre.get_xticklabels())


def test_step_timeline_series(rng: np.random.Generator) -> None:
    steps = make_steps(rng, n=5000)
    fig = plot_step_timeline(steps)
    render(fig)
    assert len(fig.axes) == 2
    assert_labelled(fig)
    ax_dt, ax_tok = fig.axes
    assert [ln.get_label() for ln in ax_tok.get_lines()] == ["all tokens"]
    stacked = [c for c in ax_tok.collections if isinstance(c, PolyCollection)]
    assert [c.get_label() for c in stacked] == ["decode tokens", "prefill tokens"]
    mean = np.asarray(ax_dt.get_lines()[0].get_ydata(), dtype=float)
    assert len(mean) <= 800
    # Bin means lie within the data's range (ms).
    ms = steps["duration_s"] * 1000
    assert mean.min() >= ms.min() - 1e-9 and mean.max() <= ms.max() + 1e-9
    assert "time bins" in fig.get_suptitle()


def test_million_steps_are_drawn_as_a_bounded_number_of_bins(rng: np.random.Generator) -> None:
    # What keeps a long run's timelines fast to draw (and readable): lines through at most
    # MAX_TIME_BINS time bins, never a point per step (timings: benchmarks/, not tests).
    steps = make_steps(rng, n=1_000_000)
    for plot in (plot_kv_timeline, plot_step_timeline):
        fig = plot(steps)
        assert len(render(fig)) > 20_000
        points = [len(line.get_xdata()) for ax in fig.axes for line in ax.get_lines()]
        assert points and max(points) <= MAX_TIME_BINS


# --------------------------------------------------------------------------- edge cases


def test_all_rejected_draws_notes(rng: np.random.Generator) -> None:
    req = make_requests(rng, n=50, reject_frac=1.0)
    for plot in (plot_latency_cdfs, plot_e2e_vs_prompt):
        fig = plot(req)
        render(fig)
        assert no_data_notes(fig) == len(fig.axes)
    assert "rejected" in plot_latency_cdfs(req).axes[0].texts[0].get_text()


def test_no_tpot_when_all_outputs_single_token(rng: np.random.Generator) -> None:
    req = make_requests(rng, n=50).assign(output_len=1, tpot_s=np.nan)
    fig = plot_latency_cdfs(req)
    render(fig)
    assert no_data_notes(fig) == 1 and len(fig.axes[0].get_lines()) == 3
    assert "output_len > 1" in fig.axes[1].texts[0].get_text()


def test_single_step_and_empty_steps(rng: np.random.Generator) -> None:
    one = make_steps(rng, n=1)
    empty = one.iloc[0:0]
    for plot in (plot_kv_timeline, plot_step_timeline):
        fig = plot(one)
        render(fig)
        assert no_data_notes(fig) == 0
        assert data_lines(fig.axes[0])[0].get_marker() == "o"  # a lone point stays visible
        fig = plot(empty)
        render(fig)
        assert no_data_notes(fig) == len(fig.axes)


def test_nans_and_single_request(rng: np.random.Generator) -> None:
    req = make_requests(rng, n=30, reject_frac=0.0)
    req.loc[::3, ["ttft_s", "e2e_s", "prompt_len"]] = np.nan
    steps = make_steps(rng, n=100)
    steps.loc[::7, ["kv_utilization", "duration_s", "num_waiting"]] = np.nan
    for fig in (
        plot_latency_cdfs(req),
        plot_e2e_vs_prompt(req),
        plot_e2e_vs_prompt(req.iloc[1:2]),
        plot_latency_cdfs(req.iloc[1:2]),
        plot_kv_timeline(steps),
        plot_step_timeline(steps),
    ):
        render(fig)
        assert no_data_notes(fig) == 0


def test_empty_frames_without_columns() -> None:
    for plot in (plot_latency_cdfs, plot_e2e_vs_prompt, plot_kv_timeline, plot_step_timeline):
        fig = plot(pd.DataFrame())
        render(fig)
        assert no_data_notes(fig) >= 1


# --------------------------------------------------------------------------- sweeps


def test_sweep_two_keys_one_line_per_other_value(rng: np.random.Generator) -> None:
    sweep = make_sweep(rng)
    figs = plot_sweep(sweep, [BUDGET, RATE])
    assert set(figs) == {BUDGET, RATE}
    fig = figs[BUDGET]
    render(fig)
    assert len(fig.axes) == 4
    assert_labelled(fig)
    ttft, tpot, thr, pre = fig.axes
    assert len(ttft.get_lines()) == 2 * 3  # p50 and p99 for each of 3 rates
    assert len(thr.get_lines()) == 3 and len(pre.get_lines()) == 3
    assert len(fig.legends) == 1
    assert log_base(ttft) == 2
    assert list(ttft.get_xticks()) == [256, 512, 1024, 2048, 4096, 8192]
    ok = sweep[(sweep["status"] == "ok") & (sweep[RATE] == 4.0)].sort_values(BUDGET)
    line = next(ln for ln in ttft.get_lines() if ln.get_label() == "4 p50")
    assert np.asarray(line.get_ydata()) == pytest.approx(1000 * ok["ttft_p50_s"].to_numpy())
    assert "failed" in fig.get_suptitle()
    render(figs[RATE])
    assert len(figs[RATE].axes[0].get_lines()) == 2 * 6


def test_sweep_one_key_and_categorical_key(rng: np.random.Generator) -> None:
    sweep = make_sweep(rng)
    one = sweep[sweep[RATE] == 1.0]
    fig = plot_sweep(one, [BUDGET])[BUDGET]
    render(fig)
    assert len(fig.axes[0].get_lines()) == 2
    assert fig.axes[0].get_legend() is not None
    cat = one.assign(policy=np.where(one[BUDGET] > 1000, "priority", "fcfs"))
    fig = plot_sweep(cat, ["policy"])["policy"]
    render(fig)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["fcfs", "priority"]


def test_sweep_three_keys_splits_by_first_other_key(rng: np.random.Generator) -> None:
    sweep = make_sweep(rng, extra_key=True)
    fig = plot_sweep(sweep, [BUDGET, RATE, "seed"])[BUDGET]
    render(fig)
    ttft = fig.axes[0]
    assert len(ttft.get_lines()) == 2 * 3  # p50/p99 per rate, medians over the seeds
    assert len([c for c in ttft.collections if isinstance(c, PolyCollection)]) == 2 * 3
    ok = sweep[(sweep["status"] == "ok") & (sweep[RATE] == 16.0)]
    med = ok.groupby(BUDGET)["ttft_p50_s"].median().to_numpy() * 1000
    line = next(ln for ln in ttft.get_lines() if ln.get_label() == "16 p50")
    assert np.asarray(line.get_ydata()) == pytest.approx(med)
    assert "median over seed" in fig.get_suptitle()


def test_budget_comparison_log2_and_values(rng: np.random.Generator) -> None:
    sweep = make_sweep(rng)
    one_rate = sweep[sweep[RATE] == 4.0]
    fig = plot_budget_comparison(one_rate)
    render(fig)
    assert len(fig.axes) == 3
    assert_labelled(fig)
    for ax in fig.axes:
        assert log_base(ax) == 2
        assert len(ax.get_lines()) == 2 and ax.get_legend() is not None
    ok = one_rate[one_rate["status"] == "ok"]
    p99 = ok.groupby(BUDGET)["ttft_p99_s"].median().to_numpy() * 1000
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "p99")
    assert np.asarray(line.get_ydata()) == pytest.approx(p99)


def test_budget_comparison_splits_by_other_grid_key(rng: np.random.Generator) -> None:
    fig = plot_budget_comparison(make_sweep(rng))
    render(fig)
    assert len(fig.legends) == 1 and "rate" in fig.get_suptitle()
    assert len(fig.axes[0].get_lines()) == 2 * 3
    # The throughput panel's solid/dashed lines mean output/total, explained locally.
    legend = fig.axes[2].get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["output", "total"]


def test_repeated_runs_are_medians_with_band(rng: np.random.Generator) -> None:
    sweep = make_sweep(rng, extra_key=True)  # two seeds per grid point, seed not a grid key
    fig = plot_budget_comparison(sweep[sweep[RATE] == 1.0])
    render(fig)
    assert "median of repeated runs" in fig.get_suptitle()
    assert any(isinstance(c, PolyCollection) for c in fig.axes[0].collections)


def test_sweep_edge_cases(rng: np.random.Generator) -> None:
    sweep = make_sweep(rng)
    failed = sweep.assign(status="failed")
    fig = plot_sweep(failed, [BUDGET])[BUDGET]
    render(fig)
    assert no_data_notes(fig) == 4
    fig = plot_budget_comparison(failed)
    render(fig)
    assert no_data_notes(fig) == 3
    bare = sweep[[BUDGET, "status"]]
    fig = plot_sweep(bare, [BUDGET])[BUDGET]
    render(fig)
    assert no_data_notes(fig) == 4
    assert plot_sweep(sweep, []) == {}
    with pytest.raises(InputError, match="no.such"):
        plot_sweep(sweep, ["no.such"])


# --------------------------------------------------------------------------- files


def test_save_run_plots_png_and_svg(rng: np.random.Generator, tmp_path: Path) -> None:
    req, steps = make_requests(rng), make_steps(rng)
    paths = save_run_plots(req, steps, tmp_path / "run", "png")
    names = [p.name for p in paths]
    assert names == [
        "ttft_tpot_cdf.png",
        "e2e_vs_prompt.png",
        "kv_timeline.png",
        "step_timeline.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 20_000
    svgs = save_run_plots(req, steps, tmp_path / "run", "svg")
    assert all(p.suffix == ".svg" and b"<svg" in p.read_bytes()[:2000] for p in svgs)
    # Atomic writes leave no temp files behind.
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(
        names + [p.name for p in svgs]
    )
    with pytest.raises(InputError, match="pdf"):
        save_run_plots(req, steps, tmp_path, "pdf")


def test_save_sweep_plots(rng: np.random.Generator, tmp_path: Path) -> None:
    sweep = make_sweep(rng)
    paths = save_sweep_plots(sweep, [BUDGET, RATE], tmp_path)
    assert [p.name for p in paths] == [
        "sweep_scheduler_max_num_batched_tokens.png",
        "sweep_workload_arrival_rate.png",
        "budget_comparison.png",
    ]
    assert all(p.stat().st_size > 20_000 for p in paths)
    assert len(save_sweep_plots(sweep, [RATE], tmp_path / "r")) == 1


def test_summaries_from_synthetic_runs_feed_the_sweep(rng: np.random.Generator) -> None:
    # A sweep assembled from real per-run summaries (not a formula) plots without notes.
    rows = []
    for budget in (512, 2048):
        for rate in (2.0, 8.0):
            s = summarize(make_requests(rng, n=150, rate=rate), make_steps(rng, n=200))
            rows.append({BUDGET: budget, RATE: rate, **s, "status": "ok", "error": None})
    fig = plot_sweep(pd.DataFrame(rows), [BUDGET, RATE])[RATE]
    render(fig)
    assert no_data_notes(fig) == 0
