"""What every ``servesim`` command shares: exit codes, the scenario arguments, the run summary
table, and the signal handling of ``main``."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

# what ``ArgumentParser.add_subparsers`` returns (a private class of argparse, generic only
# in its type stubs)
if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE
EXIT_TERMINATED = 143  # 128 + SIGTERM


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    """The scenario file and its ``--set`` overrides."""
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set scheduler.max_num_seqs=64 (repeatable)",
    )


def add_format_arg(p: argparse.ArgumentParser) -> None:
    """``--format`` of the plots a command draws."""
    # plots.style.FORMATS, spelt out: importing matplotlib would slow every command's start
    p.add_argument("--format", choices=["png", "svg"], default="png", help="plot file format")


def add_out_args(p: argparse.ArgumentParser, folder: str, plots: str) -> None:
    """``--out`` (default ``results/<folder>/<timestamp>/``), ``--overwrite``, ``--no-plots``
    (skip drawing ``plots``) and ``--format``: where a command writes its results folder."""
    p.add_argument("--out", help=f"output folder (default: results/{folder}/<timestamp>/)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--no-plots", action="store_true", help=f"skip drawing {plots}")
    add_format_arg(p)


def add_uncertainty_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--uncertainty on|off``: whether ``what`` gets the cost model's error band."""
    p.add_argument(
        "--uncertainty",
        choices=["on", "off"],
        default="on",
        help=f"on (default): {what} a 90%% interval from the cost model's measured held-out "
        "step-time error, by two more runs at the ends of its band (docs/metrics.md); off: "
        "skip them",
    )


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """``--backend``, ``--address`` and ``--jobs``: where a command's simulations run."""
    # explore.backends.BACKENDS, spelt out: the explore package is not imported at start-up
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="where simulations run: local processes (default) or Ray tasks "
        "(pip install 'servesim[ray]'); results are the same",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="with --backend ray: join the Ray cluster at ADDR (e.g. auto, or HOST:PORT); "
        "default: start a local Ray instance",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="simulations at once: local processes, or the CPUs of a local Ray instance "
        "(default: all cores; 1: in this process)",
    )


def add_steps_arg(p: argparse.ArgumentParser) -> None:
    """``--steps``: how much of the step table a run keeps."""
    # engine.step_sink.STEP_MODES, spelt out: the engine is not imported at start-up
    p.add_argument(
        "--steps",
        choices=["full", "sampled", "none"],
        default="full",
        help="step rows to write: every step (default; streamed to disk as the run goes), "
        "one in 100 plus every step that preempted, or none (the summary counts all steps)",
    )


def _percentile_columns(summary: dict[str, Any]) -> list[str]:
    """The percentiles a summary holds (``metrics.percentiles``), as ``p50``, ``p99.9``."""
    found = [k[len("ttft_") : -len("_s")] for k in summary if k.startswith("ttft_p")]
    return sorted(found, key=lambda p: float(p[1:]))


def format_summary(summary: dict[str, Any]) -> str:
    """A short human table of a run's headline figures."""

    def num(key: str, fmt: str, scale: float = 1.0) -> str:
        """An undefined figure (NaN, or None as summary.json writes it) shows as "-"."""
        v = summary.get(key)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        return format(v * scale, fmt)

    stats = ["mean", *_percentile_columns(summary)]
    lines = [
        f"rejected   {summary['num_rejected']:,} of {summary['num_requests']:,} requests "
        f"({num('rejected_share', '.1%')})"
        + (": they can never be served (rejected.csv says why)" if summary["num_rejected"] else ""),
        f"requests   {summary['num_finished']:,} finished, "
        f"{summary['num_preemptions']:,} preemptions",
        f"duration   {num('duration_s', '.2f')} s simulated, {summary['num_steps']} steps",
        f"throughput {num('request_throughput', '.2f')} req/s, "
        f"{num('output_token_throughput', '.0f')} output tok/s, "
        f"{num('total_token_throughput', '.0f')} total tok/s",
        f"KV blocks  {num('kv_utilization_mean', '.1f', 100)}% mean, "
        f"{num('kv_utilization_max', '.1f', 100)}% max",
        f"saturated  {num('saturated_share', '.1f', 100)}% of the time (steps that left out "
        "a request the server held)",
        f"{'latency ms':<12}" + "".join(f"{s:>10}" for s in stats),
    ]
    for m in ("ttft", "tpot", "itl", "e2e", "queue_delay"):
        row = [num(f"{m}_{s}_s", ".1f", 1e3) for s in stats]
        lines.append(f"{m:<12}" + "".join(f"{v:>10}" for v in row))
    if "goodput" in summary:
        lines.append(
            f"goodput    {num('goodput', '.2f')} req/s "
            f"({num('slo_attainment', '.1f', 100)}% of requests meet the SLO)"
        )
    if "encoder_tokens" in summary:  # a run with images (docs/multimodal.md)
        lines.append(
            f"images     {summary['encoder_tokens']:,} tokens encoded, "
            f"{num('encoder_cache_hit_rate', '.1%')} served without encoding"
        )
    lines += format_uncertainty(summary.get("uncertainty"))
    return "\n".join(lines)


def format_uncertainty(u: dict[str, Any] | None) -> list[str]:
    """The lines of a run's model uncertainty (``explore.uncertainty``): the mean latencies'
    and throughput's intervals, or why there are none; no line when it was not asked."""
    if not u:
        return []
    level = f"{u['level']:.0%}"
    if not u.get("available"):
        return [f"model      no {level} interval: {u['reason']}"]

    def span(key: str, scale: float, fmt: str) -> str:
        lo_hi = u.get(key)
        if lo_hi is None:
            return "-"
        # thousands grouped, no decimals once large (a band's slow end may be a long queue)
        return "-".join(format(v * scale, fmt if v * scale < 1000 else ",.0f") for v in lo_hi)

    low, high = u["step_time_error"]
    parts = [f"{m} {span(f'{m}_mean_s', 1e3, '.1f')}" for m in ("ttft", "tpot", "e2e")]
    return [
        f"model      {level} interval ({u['cost_model']}: steps {low:+.1%} to {high:+.1%} "
        "off on held-out GPUs/models)",
        f"           mean ms: {', '.join(parts)}; "
        f"throughput {span('request_throughput', 1, '.2f')} req/s",
    ]


def format_server(sched: Any, ranks: int = 1, cost_model: Any = None) -> str:
    """One line of what the server (each of its data-parallel ``ranks``) ran with, defaults
    resolved (``SchedulerConfig``), and which cost model timed its steps."""
    tokens, seqs = sched.budgets()
    blocks, size = sched.num_blocks, sched.block_size
    extras = [", prefix caching"] if sched.enable_prefix_caching else []
    if ranks > 1:
        extras.append(f"; each of {ranks} data-parallel ranks")
    if sched.max_model_len is not None:
        extras.append(f", max_model_len {sched.max_model_len:,}")
    kind = getattr(cost_model, "type", None)
    if isinstance(kind, str):
        extras.append(f"; {kind} cost model")
    kv = f"{blocks:,} KV blocks of {size} ({blocks * size:,} tokens)"
    if sched.kv_groups:  # one pool shared by the groups: a block is a page of each group
        kinds = ", ".join(sorted({g.kind.replace("_", " ") for g in sched.kv_groups}))
        n = len(sched.kv_groups)
        kv = f"{blocks:,} KV blocks shared by {n} group{'s' * (n > 1)} ({kinds})"
    return (
        f"server     {sched.policy}, {tokens:,} tokens a step, {seqs:,} sequences, {kv}"
        + "".join(extras)
    )


MOST_REJECTED = 0.5
"""A run that rejects more than this share of its requests exits 1 (``served_too_little``)."""


def served_too_little(summary: dict[str, Any]) -> str | None:
    """Why a run served too little to pass for a result (exit 1): no request finished, or
    most were rejected; None otherwise."""
    n, done, rejected = summary["num_requests"], summary["num_finished"], summary["num_rejected"]
    if n and done == 0:
        return f"no request finished ({rejected:,} of {n:,} rejected)"
    if n and rejected / n > MOST_REJECTED:
        return (
            f"{rejected:,} of {n:,} requests ({rejected / n:.1%}) rejected: they can never be "
            "served (scheduler.num_blocks or max_model_len, or prompt/output lengths)"
        )
    return None


@contextmanager
def results_folder(out: str | None, overwrite: bool, name: str) -> Iterator[tuple[Path, Path]]:
    """``(out, tmp)``: the results folder (``--out``, or ``results/<name>/<timestamp>``
    reserved under a name no other command has) and the temporary folder to write into,
    renamed to ``out`` when the body succeeds; on failure neither is left."""
    from simulator.results.outdir import atomic_dir, default_out_dir, reserve_out_dir

    given = bool(out)
    path = Path(out) if out else reserve_out_dir(default_out_dir(name))
    try:
        with atomic_dir(path, overwrite, given=given) as tmp:
            yield path, tmp
    except BaseException:
        if not given:
            with suppress(OSError):
                path.rmdir()  # only if still empty
        raise


def format_replicas(summary: dict[str, Any], table: Any) -> str:
    """A cluster's per-replica lines (the first 16) under its load figures."""
    imbalance = [f"{k} {v:.2f}" for k, v in summary.items() if k.endswith("load_imbalance")]
    nan = float("nan")
    lines = [
        f"replicas   {summary['num_replicas']}, saturated "
        f"{summary.get('saturated_share_mean', nan) * 100:.1f}% of the time mean, "
        f"{summary.get('saturated_share_max', nan) * 100:.1f}% max (a step left out a request "
        f"it held); stepping {summary['utilization_mean'] * 100:.1f}% mean (any request held)",
        "           " + ", ".join(imbalance) + " (max/mean tokens computed)",
        f"{'replica':>8} {'role':<10}{'requests':>9}{'satur. %':>9}{'busy %':>8}{'req/s':>8}"
        f"{'KV %':>7}{'TTFT ms':>9}",
    ]
    for row in table.head(16).itertuples(index=False):
        ttft = "-" if row.ttft_mean_s != row.ttft_mean_s else f"{row.ttft_mean_s * 1e3:.1f}"
        lines.append(
            f"{row.replica:>8} {row.role:<10}{row.num_requests:>9}"
            f"{row.saturated_share * 100:>9.1f}{row.utilization * 100:>8.1f}"
            f"{row.request_throughput:>8.2f}{row.kv_utilization_mean * 100:>7.1f}{ttft:>9}"
        )
    if len(table) > 16:
        lines.append(f"{'...':>8} (all {len(table)} in replicas.parquet)")
    return "\n".join(lines)


class Terminated(BaseException):
    """SIGTERM arrived. Like KeyboardInterrupt, not an ``Exception``: nothing catches it by
    mistake, and every ``finally`` (the temporary results folder's removal) runs."""


@contextmanager
def sigterm_raises_terminated() -> Iterator[None]:
    """While the CLI runs, SIGTERM raises ``Terminated`` in the main thread instead of killing
    the process at once; the previous handler is restored afterwards.

    Worker processes forked by a sweep inherit the handler: in them it restores the default
    action and re-sends the signal, so a worker still dies of SIGTERM as before. Outside the
    main thread (where ``signal.signal`` is not allowed) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != pid:  # a forked worker: die of SIGTERM, as without this handler
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def console_table(table: Any, keys: list[str], cols: dict[str, tuple[str, float]]) -> Any:
    """A console table of a sweep or search: the grid keys (headed with their units) and
    ``status``, then each of ``cols`` that ``table`` has (column -> (heading, scale)), as
    numbers times the scale."""
    import pandas as pd

    from simulator.plots.sweep import axis_label

    show = table[[*keys, "status"]].rename(columns={k: axis_label(k) for k in keys})
    for col, (heading, scale) in cols.items():
        if col in table:
            values = pd.to_numeric(table[col], errors="coerce")
            show[heading] = values * scale if scale != 1.0 else values
    return show


def silence_stdout() -> None:
    """After a broken pipe (``servesim presets | head -1``), send what is left of stdout to
    /dev/null, so Python's final flush fails no more (see "Note on SIGPIPE" in the ``signal``
    module's documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no real file (captured in tests)
        pass


def warn_stack(cost_model: object) -> None:
    """Warn once that a fitted preset times the (older) stack it was measured on."""
    from simulator.cost.fitted import stack_warning
    from simulator.errors import warn

    note = stack_warning(cost_model)
    if note:
        warn(note)
