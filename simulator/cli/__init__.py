"""The ``servesim`` command: run, sweep, plot, validate, presets, fetch, calibrate, predict,
convert."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import Any

from simulator.errors import InputError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE
EXIT_TERMINATED = 143  # 128 + SIGTERM


def format_summary(summary: dict[str, Any]) -> str:
    """A short human table of a run's headline figures."""

    def num(key: str, fmt: str, scale: float = 1.0) -> str:
        """An undefined figure (NaN, or None as summary.json writes it) shows as "-"."""
        v = summary.get(key)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        return format(v * scale, fmt)

    lines = [
        f"requests   {summary['num_finished']} finished, {summary['num_rejected']} rejected "
        f"of {summary['num_requests']}, {summary['num_preemptions']} preemptions",
        f"duration   {num('duration_s', '.2f')} s simulated, {summary['num_steps']} steps",
        f"throughput {num('request_throughput', '.2f')} req/s, "
        f"{num('output_token_throughput', '.0f')} output tok/s, "
        f"{num('total_token_throughput', '.0f')} total tok/s",
        f"KV blocks  {num('kv_utilization_mean', '.1f', 100)}% mean, "
        f"{num('kv_utilization_max', '.1f', 100)}% max",
        f"{'latency ms':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for m in ("ttft", "tpot", "itl", "e2e", "queue_delay"):
        row = [num(f"{m}_{s}_s", ".1f", 1e3) for s in ("mean", "p50", "p90", "p99")]
        lines.append(f"{m:<12}" + "".join(f"{v:>10}" for v in row))
    if "goodput" in summary:
        lines.append(
            f"goodput    {num('goodput', '.2f')} req/s "
            f"({num('slo_attainment', '.1f', 100)}% of requests meet the SLO)"
        )
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    """Simulate one scenario and write its tables, summary, resolved scenario and plots."""
    from simulator.config import load_scenario, parse_overrides
    from simulator.results.outdir import atomic_dir, check_out_dir, default_out_dir, reserve_out_dir
    from simulator.results.writer import write_result
    from simulator.runner import resolve, run

    cfg = resolve(load_scenario(args.scenario, parse_overrides(args.set)))
    given = bool(args.out)
    # A default folder is created now, under a name no other run has (not even one started
    # in the same second), and removed again if this run fails.
    out = Path(args.out) if given else reserve_out_dir(default_out_dir(cfg))
    try:
        check_out_dir(out, args.overwrite, given=given)  # fail before the simulation, not after
        result = run(cfg, progress=None if not args.progress else True)
        with atomic_dir(out, args.overwrite, given=given) as tmp:
            write_result(result, tmp, plots=not args.no_plots, fmt=args.format)
    except BaseException:
        if not given:
            with suppress(OSError):
                out.rmdir()  # only if still empty
        raise
    print(f"{cfg.name}: results in {out}")
    print(format_summary(result.summary))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a scenario (presets and input files too) and print it resolved, every default
    spelled out."""
    from simulator.config import dump_scenario, load_scenario, parse_overrides
    from simulator.cost import build_cost_model
    from simulator.runner import resolve
    from simulator.workload import check_inputs

    cfg = resolve(load_scenario(args.scenario, parse_overrides(args.set)))
    # what run would fail on before simulating: presets, their fit (tp), and input files
    build_cost_model(cfg.cost_model)
    check_inputs(cfg.workload)
    print(f"# {args.scenario}: valid", file=sys.stderr)
    print(dump_scenario(cfg), end="")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    """List the model, hardware and fitted cost-model presets."""
    from simulator.cost.fitted import list_fitted, load_preset
    from simulator.cost.presets import list_presets, load_hardware, load_model

    presets = list_presets()
    print("models:")
    for name in presets.get("models", []):
        m = load_model(name)
        print(
            f"  {name:<14} {m.num_params / 1e9:6.1f} B params, {m.num_layers} layers, "
            f"KV {m.kv_bytes_per_token / 1024:.0f} KiB/token"
        )
    print("hardware:")
    for name in presets.get("hardware", []):
        h = load_hardware(name)
        print(
            f"  {name:<14} {h.peak_flops / 1e12:6.0f} TFLOP/s, "
            f"{h.hbm_bandwidth / 1e12:.2f} TB/s, {h.memory_bytes / 1e9:.0f} GB"
        )
    print("fitted cost models (cost_model: {type: fitted, path: NAME}):")
    for name in list_fitted():
        p = load_preset(name)
        print(f"  {name:<36} {p.model} on {p.tp} x {p.hardware}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    """Download public traces and profiles, pinned to a commit and verified by sha256.

    NAME is a file, a group (traces, lengths, profiles) or all; no NAME means traces, the files
    the trace scenarios read. Files already present with the right sha256 are not downloaded
    again. The source is raw.githubusercontent.com, or a mirror laid out as
    BASE/OWNER/REPO/COMMIT/PATH named by --base-url or $SERVESIM_DATA_URL (file:// works).
    """
    from simulator.workload.datasets import fetch, format_listing, select

    if args.list:
        # a listing with no names shows everything, not just the default selection
        print(format_listing(select(args.names or ["all"]), args.dest))
        return 0
    paths = fetch(
        args.names, args.dest, args.base_url, force=args.force, progress=not args.no_progress
    )
    print(f"{len(paths)} file(s) verified under {args.dest}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run the cartesian product of grids in parallel processes."""
    from simulator.explore.sweep import cmd_sweep as sweep

    return sweep(args)


def cmd_plot(args: argparse.Namespace) -> int:
    """Redraw the plots of a run folder or a sweep folder."""
    from simulator.explore.sweep import cmd_plot as plot

    return plot(args)


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set scheduler.max_num_seqs=64 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from simulator import __version__

    parser = argparse.ArgumentParser(
        prog="servesim",
        description="Discrete-event simulator of an LLM inference server (vLLM-style scheduler).",
    )
    parser.add_argument("--version", action="version", version=f"servesim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="simulate one scenario", description=cmd_run.__doc__)
    _add_scenario_args(p)
    p.add_argument("--out", help="output folder (default: results/<name>/<timestamp>/)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--no-plots", action="store_true", help="skip drawing plots")
    p.add_argument("--format", choices=["png", "svg"], default="png", help="plot file format")
    p.add_argument(
        "--progress", action="store_true", help="show a progress bar even off a terminal"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "sweep", help="run a grid of scenario variants in parallel", description=cmd_sweep.__doc__
    )
    p.add_argument("scenario", help="base scenario YAML file")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        required=True,
        metavar="KEY=V1,V2,...",
        help="values of a dotted key to sweep (repeatable: the cartesian product is run)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="fixed override")
    p.add_argument("--jobs", type=int, default=0, help="parallel processes (default: all cores)")
    p.add_argument("--out", help="output folder (default: results/<name>-sweep/<timestamp>/)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--no-plots", action="store_true", help="skip drawing plots")
    p.add_argument("--format", choices=["png", "svg"], default="png", help="plot file format")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "plot", help="redraw the plots of a run or sweep folder", description=cmd_plot.__doc__
    )
    p.add_argument("folder", help="a folder written by `servesim run` or `servesim sweep`")
    p.add_argument("--format", choices=["png", "svg"], default="png", help="plot file format")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser(
        "validate", help="check a scenario, print it resolved", description=cmd_validate.__doc__
    )
    _add_scenario_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "presets", help="list model/hardware presets", description=cmd_presets.__doc__
    )
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser(
        "fetch",
        help="download public traces and profiles (sha256-verified)",
        description=inspect.cleandoc(cmd_fetch.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="file, group (traces, lengths, profiles) or all; default: traces",
    )
    p.add_argument("--dest", default="data", help="base folder of the files (default: data)")
    p.add_argument(
        "--base-url",
        help="mirror to download from instead of raw.githubusercontent.com "
        "(default: $SERVESIM_DATA_URL if set)",
    )
    p.add_argument("--force", action="store_true", help="download even verified files again")
    p.add_argument(
        "--list",
        action="store_true",
        help="list the files and whether each is present and verified",
    )
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.set_defaults(func=cmd_fetch)

    from simulator.cli.calibration import add_subcommands

    add_subcommands(sub)
    return parser


class Terminated(BaseException):
    """SIGTERM arrived. Like KeyboardInterrupt, not an ``Exception``: nothing catches it by
    mistake, and every ``finally`` (the temporary results folder's removal) runs."""


@contextmanager
def _sigterm_raises_terminated() -> Iterator[None]:
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


def _silence_stdout() -> None:
    """After a broken pipe (``servesim presets | head -1``), send what is left of stdout to
    /dev/null, so Python's final flush fails no more (see "Note on SIGPIPE" in the ``signal``
    module's documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no real file (captured in tests)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, dispatch, and turn bad input into one line and exit code 2.

    Also one line each, with no traceback: out of memory (2), Ctrl-C (130), a closed pipe on
    stdout (141, silent) and SIGTERM (143)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with _sigterm_raises_terminated():
            code = int(args.func(args))
            sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
            return code
    except InputError as err:
        print(f"servesim: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError as err:
        detail = str(err).strip().splitlines()
        reason = f" ({detail[0]})" if detail else ""
        print(
            f"servesim: error: out of memory{reason}; try a smaller workload.num_requests",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("servesim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("servesim: terminated", file=sys.stderr)
        return EXIT_TERMINATED


if __name__ == "__main__":
    sys.exit(main())
