"""Regenerate the shipped fitted presets, the tables of ``docs/fidelity.md`` and its plots.

Run by hand from the repo root (reads ``../shared/data``, else ``data/`` after
``servesim fetch profiles``)::

    .venv/bin/python benchmarks/fidelity.py

Writes ``configs/fitted/*.yaml``, ``docs/img/fidelity_*.png`` and replaces the block between
the ``BEGIN GENERATED`` / ``END GENERATED`` markers of ``docs/fidelity.md``. Deterministic: the
folds come from ``numpy.random.default_rng(SEED)``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.cost.batch import Batch  # noqa: E402
from simulator.cost.calibration.calibrate import calibrate, write_preset  # noqa: E402
from simulator.cost.calibration.convert import convert_splitwise, convert_vidur_mlp  # noqa: E402
from simulator.cost.calibration.crossval import error_summary  # noqa: E402
from simulator.cost.calibration.measurements import step_kinds  # noqa: E402
from simulator.cost.fitted import FittedCostModel, FittedPreset  # noqa: E402
from simulator.cost.presets import load_hardware, load_model  # noqa: E402
from simulator.cost.roofline import RooflineCostConfig, RooflineCostModel  # noqa: E402
from simulator.scheduling import Sequence, StepScheduler  # noqa: E402
from tests.paths import DATA, MISSING  # noqa: E402

FITTED = ROOT / "configs" / "fitted"
DOC = ROOT / "docs" / "fidelity.md"
IMG = ROOT / "docs" / "img"
SEED = 0
FOLDS = 5
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"
# e2e rows further than this from prompt_time + (T-1) * token_time are reported apart.
E2E_SELF_TOL = 0.05

SPLITWISE_SOURCE = {
    "file": "splitwise_perf_model.csv",
    "repo": "Mutinifni/splitwise-sim",
    "path": "data/perf_model.csv",
    "commit": "8f99e7dc9b407f4ce2488d03dd44c0b8b946dab0",
    "license": "MIT",
}
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
VIDUR_FILES = (
    # (file, model preset, hardware preset, path in microsoft/vidur)
    (
        "vidur_a100_llama2-7b_mlp.csv",
        "llama-2-7b",
        "a100-80gb",
        "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
    ),
    (
        "vidur_h100_llama2-7b_mlp.csv",
        "llama-2-7b",
        "h100-sxm",
        "data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
    ),
    (
        "vidur_a100_llama3-8b_mlp.csv",
        "llama-3-8b",
        "a100-80gb",
        "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
    ),
)
VIDUR_FEATURES = ("overhead", "gemm", "gemm_large")
SPLITWISE_HW_NAME = {
    "a100-80gb": "a100-80gb",
    "h100-80gb": "h100-sxm",
    "h100-80gb-pcap": "h100-sxm-pcap",
}


@dataclass
class GroupResult:
    """Everything one calibrated group contributes to the docs."""

    name: str
    label: str
    preset: FittedPreset
    rows: pd.DataFrame
    roofline_ms: np.ndarray
    e2e: pd.DataFrame | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _roofline_ms(rows: pd.DataFrame, model: str, hardware: str, tp: int) -> np.ndarray:
    """Uncalibrated roofline (default efficiencies) of every uniform row, ms."""
    cfg = RooflineCostConfig(model=model, hardware=hardware, tp=tp)
    roof = RooflineCostModel(cfg, load_model(model), load_hardware(hardware))
    return np.array(
        [
            roof.step_time(Batch.uniform(int(r.num_seqs), int(r.new_tokens), int(r.context_len)))
            * 1e3
            for r in rows.itertuples()
        ]
    )


def splitwise_groups() -> list[GroupResult]:
    """Calibrate every (model, hardware, tp) group of the Splitwise file."""
    allrows = convert_splitwise(DATA / SPLITWISE_SOURCE["file"])
    out = []
    for group, meas in allrows.groupby("group", sort=True):
        first = meas.iloc[0]
        model, hardware, tp = str(first.model), str(first.hardware), int(first.tp)
        name = f"{model}_{SPLITWISE_HW_NAME[str(first.hardware_src)]}_tp{tp}"
        source = SPLITWISE_SOURCE | {"group": str(group)}
        preset, rows = calibrate(
            meas,
            model,
            hardware,
            tp,
            folds=FOLDS,
            rng=np.random.default_rng(SEED),
            name=name,
            source=source,
        )
        update = {"notes": preset.notes + _splitwise_note(str(group)), "stack": SPLITWISE_STACK}
        preset = preset.model_copy(update=update)
        out.append(
            GroupResult(name, str(group), preset, rows, _roofline_ms(rows, model, hardware, tp))
        )
    return out


SPLITWISE_STACK = (
    "Splitwise's measurements on DGX-A100 and DGX-H100 (Patel et al., ISCA 2024), the serving "
    "software of its 2023 characterisation: a 2023 stack; today's vLLM is far faster (held "
    "against real vLLM runs on H100s, its Llama-2-70B decode steps came out 2-3x slower, "
    "docs/fidelity.md)"
)
"""What the Splitwise presets time (their ``stack``)."""

VIDUR_STACK = (
    "Vidur's profiler on one {gpu} (Agrawal et al., MLSys 2024): PyTorch operators timed one by "
    "one on a 2024 stack, token-parallel operators only; today's serving stacks fuse and "
    "overlap more"
)
"""What the Vidur MLP presets time (their ``stack``; ``{gpu}``: A100 or H100)."""


def _splitwise_note(group: str) -> str:
    note = (
        ". Splitwise measured batches of B equal prompts: prefill rows are B x P tokens at "
        "context 0, decode rows B sequences at context P + T/2 (mean of the run)."
    )
    if "pcap" in group:
        note += (
            " In this file the power-capped H100 decode times equal the uncapped ones and its"
            " prefill times are a constant multiple of them."
        )
    return note


def vidur_groups() -> list[GroupResult]:
    """Calibrate the MLP-only part of the step on Vidur's per-operator profiles."""
    out = []
    for file, model, hardware, path in VIDUR_FILES:
        allrows = convert_vidur_mlp(DATA / file, model, hardware)
        for group, meas in allrows.groupby("group", sort=True):
            tp = int(meas.iloc[0].tp)
            name = f"{model}_{hardware}_tp{tp}_mlp"
            source = {
                "file": file,
                "repo": "microsoft/vidur",
                "path": path,
                "commit": VIDUR_COMMIT,
                "license": "MIT",
                "group": str(group),
            }
            preset, rows = calibrate(
                meas,
                model,
                hardware,
                tp,
                folds=FOLDS,
                rng=np.random.default_rng(SEED),
                features=VIDUR_FEATURES,
                name=name,
                source=source,
            )
            note = (
                ". MLP-ONLY: Vidur's mlp.csv times the token-parallel ops of one GPU (QKV/O "
                "projections, MLP, norms, rotary, residual add, embedding); it has no attention "
                "kernel, LM head, TP all-reduce or per-step framework overhead, so this preset "
                "leaves attention, kv_read and the per-sequence terms at 0 and underestimates "
                "whole steps."
            )
            stack = VIDUR_STACK.format(gpu=hardware.split("-")[0].upper())
            preset = preset.model_copy(update={"notes": preset.notes + note, "stack": stack})
            roof = _roofline_ms(rows, model, hardware, tp)
            out.append(GroupResult(name, str(group), preset, rows, roof))
    return out


# -- end-to-end check ----------------------------------------------------------------------


def simulate_batch_run(model: FittedCostModel, b: int, p: int, t: int) -> float:
    """ms for B requests of P prompt and T output tokens arriving together (one prefill step,
    then decode steps), driven through the real scheduler with ample blocks and budget."""
    block = 16
    sched = StepScheduler(
        num_blocks=b * (-(-(p + t) // block)) + 1,
        block_size=block,
        max_num_seqs=b,
        max_num_batched_tokens=b * p,
        sample_fn=lambda seq: 0,
    )
    for i in range(b):
        sched.add(Sequence(i, p, t))
    total = 0.0
    while sched.has_work():
        plan = sched.schedule()
        batch = Batch(tuple(plan.num_new_tokens), tuple(plan.context_lens))
        total += model.step_ms(batch)
        sched.update()
    return total


def e2e_check(groups: list[GroupResult]) -> pd.DataFrame:
    """Simulated vs measured e2e_time for every Splitwise run (median of repeats)."""
    raw = pd.read_csv(DATA / SPLITWISE_SOURCE["file"])
    raw["group"] = raw["model"] + "_" + raw["hardware"] + "_tp" + raw["tensor_parallel"].astype(str)
    runs = (
        raw.groupby(["group", "batch_size", "prompt_size", "token_size"], as_index=False)[
            ["prompt_time", "token_time", "e2e_time"]
        ]
        .median()
        .rename(columns={"batch_size": "B", "prompt_size": "P", "token_size": "T"})
    )
    runs["self_ms"] = runs.prompt_time + (runs["T"] - 1) * runs.token_time
    runs["self_consistent"] = (runs.e2e_time - runs.self_ms).abs() <= E2E_SELF_TOL * runs.e2e_time
    models = {g.label: FittedCostModel(g.preset) for g in groups}
    runs["sim_ms"] = [
        simulate_batch_run(models[r.group], int(r.B), int(r.P), int(r.T)) for r in runs.itertuples()
    ]
    runs["ape_vs_e2e"] = (runs.sim_ms - runs.e2e_time).abs() / runs.e2e_time * 100
    runs["ape_vs_self"] = (runs.sim_ms - runs.self_ms).abs() / runs.self_ms * 100
    return runs


# -- plots ---------------------------------------------------------------------------------


def plot_groups(groups: list[GroupResult], path: Path, title: str, ncols: int = 4) -> None:
    """Held-out fitted and roofline predictions against measurements, one panel per group."""
    nrows = -(-len(groups) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.3 * ncols, 3.1 * nrows), squeeze=False)
    colors = {"prefill": "tab:blue", "decode": "tab:orange", "mlp": "tab:green"}
    for ax, g in zip(axes.flat, groups, strict=False):
        y = g.rows.step_ms.to_numpy()
        kinds = step_kinds(g.rows).to_numpy()
        ax.scatter(y, g.roofline_ms, s=9, c="0.7", marker="x", label="roofline (default)")
        for kind in sorted(set(kinds)):
            m = kinds == kind
            ax.scatter(
                y[m],
                g.rows.heldout_ms.to_numpy()[m],
                s=10,
                c=colors.get(kind, "k"),
                label=f"fitted, held-out ({kind})",
            )
        bad = g.rows.inconsistent.to_numpy()
        if bad.any():
            ax.scatter(
                y[bad],
                g.rows.heldout_ms.to_numpy()[bad],
                s=60,
                facecolors="none",
                edgecolors="red",
                label="inconsistent point",
            )
        lo = min(y.min(), g.roofline_ms.min(), g.rows.heldout_ms.min()) * 0.8
        hi = max(y.max(), g.roofline_ms.max(), g.rows.heldout_ms.max()) * 1.25
        ax.plot([lo, hi], [lo, hi], c="k", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_title(g.name, fontsize=8)
        ax.tick_params(labelsize=7)
        # Minor-tick labels pile up on panels spanning under a decade.
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("measured ms", fontsize=7)
        ax.set_ylabel("predicted ms", fontsize=7)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    handles, labels = {}, {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
            labels[lab] = lab
    fig.legend(list(handles.values()), list(labels), loc="lower center", ncol=5, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_e2e(runs: pd.DataFrame, path: Path) -> None:
    """Simulated vs measured e2e time, self-consistent rows apart from the others."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ok = runs.self_consistent
    ax.scatter(
        runs.e2e_time[ok] / 1e3, runs.sim_ms[ok] / 1e3, s=12, label="e2e = prompt + (T-1) token"
    )
    ax.scatter(
        runs.e2e_time[~ok] / 1e3,
        runs.sim_ms[~ok] / 1e3,
        s=16,
        marker="x",
        c="tab:red",
        label="e2e disagrees with prompt + (T-1) token (>5%)",
    )
    lo, hi = 1.0, max(runs.e2e_time.max(), runs.sim_ms.max()) / 1e3 * 1.3
    ax.plot([lo, hi], [lo, hi], c="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured e2e_time (s)")
    ax.set_ylabel("simulated with fitted preset (s)")
    ax.set_title("Splitwise batch runs, end to end", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- tables --------------------------------------------------------------------------------


def _fmt(s: dict[str, float] | None) -> str:
    if not s:
        return "-"
    return f"{s['median_ape_pct']:.1f} / {s['mean_ape_pct']:.1f}"


def _mark(s: dict[str, float] | None) -> str:
    if not s:
        return ""
    return "" if s["median_ape_pct"] <= 5 and s["mean_ape_pct"] <= 10 else " **miss**"


def error_tables(groups: list[GroupResult], kinds: tuple[str, ...]) -> str:
    """Markdown: per group and kind, fitted held-out vs roofline median / mean APE."""
    head = ["group", "points"]
    for k in kinds:
        head += [f"{k}: fitted held-out", f"{k}: fitted (consistent pts)", f"{k}: roofline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        y = g.rows.step_ms.to_numpy()
        kinds_row = step_kinds(g.rows).tolist()
        roof = error_summary(kinds_row, y, g.roofline_ms)
        rep = g.preset.heldout
        n_bad = len(rep["inconsistent"])
        cells = [f"`{g.name}`", f"{len(y)}" + (f" ({n_bad} incons.)" if n_bad else "")]
        for k in kinds:
            cons = rep["consistent_points"].get(k)
            cells += [
                _fmt(rep["all_points"].get(k)) + _mark(rep["all_points"].get(k)),
                _fmt(cons) + _mark(cons),
                _fmt(roof.get(k)),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def coefficient_table(groups: list[GroupResult]) -> str:
    """Markdown: fitted coefficients and knee per preset."""
    from simulator.cost.features import FEATURES

    head = ["preset", *FEATURES, "knee_tokens", "zero-weight rows"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        c = g.preset.coefficients
        zero = g.preset.notes.split("zero weight to ")[1].split(";")[0]
        cells = [f"`{g.name}`", *(f"{c[f]:.3g}" for f in FEATURES)]
        cells += [str(g.preset.scales.knee_tokens), zero]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def inconsistent_list(groups: list[GroupResult]) -> str:
    """Markdown bullets of the points the consistency check flagged."""
    items = []
    for g in groups:
        for p in g.preset.heldout["inconsistent"]:
            items.append(
                f"- `{g.name}` {p['kind']} B={p['num_seqs']}, new_tokens={p['new_tokens']}, "
                f"context={p['context_len']}: {p['step_ms']:.1f} ms"
            )
    return "\n".join(items) or "- none"


def e2e_table(runs: pd.DataFrame) -> str:
    """Markdown: e2e APE per group, self-consistent rows and the rest apart."""
    head = [
        "group",
        "runs (consistent)",
        "median / mean APE vs e2e_time (consistent)",
        "runs (other)",
        "median / mean APE vs e2e_time (other)",
        "median / mean APE vs prompt+(T-1)token (other)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group, r in runs.groupby("group", sort=True):
        ok, bad = r[r.self_consistent], r[~r.self_consistent]

        def mm(s: pd.Series) -> str:
            return "-" if s.empty else f"{s.median():.1f} / {s.mean():.1f}"

        lines.append(
            f"| `{group}` | {len(ok)} | {mm(ok.ape_vs_e2e)} | {len(bad)} | {mm(bad.ape_vs_e2e)} | "
            f"{mm(bad.ape_vs_self)} |"
        )
    ok, bad = runs[runs.self_consistent], runs[~runs.self_consistent]
    lines.append(
        f"| **all** | {len(ok)} | {ok.ape_vs_e2e.median():.1f} / {ok.ape_vs_e2e.mean():.1f} | "
        f"{len(bad)} | {bad.ape_vs_e2e.median():.1f} / {bad.ape_vs_e2e.mean():.1f} | "
        f"{bad.ape_vs_self.median():.1f} / {bad.ape_vs_self.mean():.1f} |"
    )
    return "\n".join(lines)


def generated_block(sw: list[GroupResult], vd: list[GroupResult], runs: pd.DataFrame) -> str:
    """The whole generated part of docs/fidelity.md."""
    return "\n\n".join(
        [
            BEGIN,
            "### Splitwise groups: absolute percentage error, median / mean (%)",
            error_tables(sw, ("prefill", "decode")),
            "Points flagged inconsistent by the data check (more work, >10% less time than a "
            "point they dominate):",
            inconsistent_list(sw),
            "![Splitwise: predicted vs measured](img/fidelity_splitwise.png)",
            "### Vidur MLP-only groups: absolute percentage error, median / mean (%)",
            error_tables(vd, ("mlp",)),
            "![Vidur MLP: predicted vs measured](img/fidelity_vidur_mlp.png)",
            "### Fitted coefficients",
            coefficient_table(sw + vd),
            "### End to end: Splitwise batch runs simulated with the shipped presets",
            e2e_table(runs),
            "![E2E simulated vs measured](img/fidelity_e2e.png)",
            END,
        ]
    )


def write_doc(block: str) -> None:
    """Replace the generated block of docs/fidelity.md (or append one)."""
    text = DOC.read_text() if DOC.exists() else ""
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1]
        text = pre + block + post
    else:
        text = text + "\n" + block + "\n"
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Regenerate presets, plots and tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print tables only")
    args = parser.parse_args(argv)
    if not (DATA / SPLITWISE_SOURCE["file"]).is_file():
        raise SystemExit(f"{DATA / SPLITWISE_SOURCE['file']} {MISSING}")
    t0 = time.monotonic()
    sw = splitwise_groups()
    vd = vidur_groups()
    runs = e2e_check(sw)
    block = generated_block(sw, vd, runs)
    print(block)
    if not args.no_write:
        FITTED.mkdir(parents=True, exist_ok=True)
        for g in sw + vd:
            write_preset(g.preset, FITTED / f"{g.name}.yaml")
        plot_groups(sw, IMG / "fidelity_splitwise.png", "Splitwise step times: 5-fold held-out")
        plot_groups(
            vd, IMG / "fidelity_vidur_mlp.png", "Vidur MLP-only step times: 5-fold held-out"
        )
        plot_e2e(runs, IMG / "fidelity_e2e.png")
        write_doc(block)
    print(f"done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
