"""``servesim sweep``: the cartesian product of grids, run in parallel processes, and
``servesim plot``: redraw the plots of a run or sweep folder."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.config import (
    ScenarioConfig,
    apply_overrides,
    dump_scenario,
    parse_overrides,
    parse_value,
    read_yaml,
    validate,
)
from simulator.errors import InputError

SWEEP_FILE = "sweep.parquet"
SWEEP_META = "sweep.json"


@dataclass(frozen=True)
class GridPoint:
    """One run of a sweep: its position, its folder name and the grid values it sets."""

    index: int
    name: str
    values: dict[str, Any]


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["a.b=1,2", "c=x,y"]`` -> ``{"a.b": [1, 2], "c": ["x", "y"]}`` (YAML scalars)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--grid {item!r}: expected dotted.key=v1,v2,...")
        if key in grid:
            raise InputError(f"--grid {key}: given twice")
        parsed = [parse_value(v.strip()) for v in values.split(",") if v.strip()]
        if not parsed:
            raise InputError(f"--grid {key}: no values")
        if len({json.dumps(v, sort_keys=True) for v in parsed}) != len(parsed):
            raise InputError(f"--grid {key}: repeated values")
        grid[key] = parsed
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[GridPoint]:
    """The cartesian product in a fixed order (first key slowest), each with a folder name."""
    keys = list(grid)
    points = []
    for i, combo in enumerate(itertools.product(*(grid[k] for k in keys))):
        values = dict(zip(keys, combo, strict=True))
        label = "_".join(f"{k.split('.')[-1]}={v}" for k, v in values.items())
        points.append(GridPoint(i, f"{i:03d}_{re.sub(r'[^A-Za-z0-9_.=-]+', '-', label)}", values))
    return points


def _run_point(
    base: dict[str, Any], point: GridPoint, source: str, folder: Path, plots: bool, fmt: str
) -> dict[str, Any]:
    """Run one grid point into ``folder`` (in a worker process); return its summary row."""
    from simulator.results.writer import write_result
    from simulator.runner import resolve, run

    cfg = validate(apply_overrides(base, point.values, source), f"{source} [{point.name}]")
    cfg = resolve(cfg)
    result = run(cfg, progress=False)
    folder.mkdir(parents=True)
    write_result(result, folder, plots=plots, fmt=fmt)
    return dict(result.summary)


def _row(point: GridPoint, summary: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {key: _cell(v) for key, v in point.values.items()}
    row["run"] = point.name
    row.update(summary or {})
    row["status"] = "ok" if error is None else "failed"
    row["error"] = error
    return row


def _cell(value: Any) -> Any:
    """Lists and mappings as JSON text, so every grid column has one plain type."""
    return json.dumps(value) if isinstance(value, list | dict) else value


def run_sweep(
    base: dict[str, Any],
    grid: dict[str, list[Any]],
    out: Path,
    *,
    source: str = "scenario",
    jobs: int = 0,
    plots: bool = True,
    fmt: str = "png",
    progress: bool | None = None,
) -> pd.DataFrame:
    """Run every grid point (in ``jobs`` processes; 0 = all cores) into ``out/runs/<point>/``.

    Returns one row per point in grid order, whatever order they finished in, so ``jobs``
    never changes the table. A point that fails is a row with ``status == "failed"``."""
    from tqdm import tqdm

    points = grid_points(grid)
    jobs = jobs or os.cpu_count() or 1
    rows: dict[int, dict[str, Any]] = {}
    # disable=None: tqdm shows itself only on a terminal
    bar = tqdm(
        total=len(points),
        desc="sweep",
        unit="run",
        file=sys.stderr,
        disable=None if progress is None else not progress,
    )

    def record(point: GridPoint, summary: dict[str, Any] | None, error: str | None) -> None:
        rows[point.index] = _row(point, summary, error)
        if error is not None:
            values = ", ".join(f"{k}={v}" for k, v in point.values.items())
            bar.write(f"servesim: run {point.name} ({values}) failed: {error}", file=sys.stderr)
        bar.update(1)

    def folder(p: GridPoint) -> Path:
        return out / "runs" / p.name

    try:
        if jobs == 1 or len(points) == 1:
            for p in points:
                try:
                    record(p, _run_point(base, p, source, folder(p), plots, fmt), None)
                except Exception as err:  # one bad point must not lose the others
                    record(p, None, _one_line(err))
        else:
            with ProcessPoolExecutor(max_workers=min(jobs, len(points))) as pool:
                futures = {
                    pool.submit(_run_point, base, p, source, folder(p), plots, fmt): p
                    for p in points
                }
                try:
                    for fut in as_completed(futures):
                        p = futures[fut]
                        try:
                            record(p, fut.result(), None)
                        except Exception as err:
                            record(p, None, _one_line(err))
                except BaseException:
                    # Ctrl-C or SIGTERM: drop the queued points instead of running them first
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    finally:
        bar.close()
    table = pd.DataFrame([rows[i] for i in range(len(points))])
    for key in grid:
        if table[key].map(type).nunique() > 1:  # mixed int/float grid values: one dtype
            table[key] = table[key].astype(str)
    return table


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    msg = text[0] if text else ""
    return msg if isinstance(err, InputError) else f"{type(err).__name__}: {msg}"


def cmd_sweep(args: argparse.Namespace) -> int:
    """CLI: validate every grid point first, then run them, then write table and plots."""
    from simulator.results.outdir import reserve_out_dir

    grid = parse_grid(args.grid)
    base = read_yaml(args.scenario)
    if args.set:
        overrides = parse_overrides(args.set)
        both = sorted(set(overrides) & set(grid))
        if both:
            # the grid would silently win over --set: make the user pick one
            raise InputError(f"--set {both[0]}: also a --grid key; give it in one of the two")
        base = apply_overrides(base, overrides, args.scenario)
    base_cfg = validate(base, args.scenario)
    name = base_cfg.name
    if args.jobs < 0:
        raise InputError(f"--jobs {args.jobs}: must be >= 0 (0 = all cores)")
    _check_some_point_is_valid(base, grid, args.scenario)
    given = bool(args.out)
    # a default folder is reserved under a name no other sweep has, and removed on failure
    out = Path(args.out) if given else reserve_out_dir(Path("results") / f"{name}-sweep" / _stamp())
    try:
        table = _run_into(out, given, args, base, base_cfg, grid)
    except BaseException:
        if not given:
            with suppress(OSError):
                out.rmdir()  # only if still empty
        raise
    failed = table[table["status"] == "failed"]
    print(f"{name}: {len(table) - len(failed)} of {len(table)} runs ok; results in {out}")
    print(_sweep_table(table, list(grid)))
    # exit 1 if any point failed, so a script notices; the table still holds every point
    return 1 if len(failed) else 0


def _run_into(
    out: Path,
    given: bool,
    args: argparse.Namespace,
    base: dict[str, Any],
    base_cfg: ScenarioConfig,
    grid: dict[str, list[Any]],
) -> pd.DataFrame:
    """Run the sweep into a temporary folder renamed to ``out`` at the end; the table."""
    from simulator.results.outdir import atomic_dir, check_out_dir

    check_out_dir(out, args.overwrite, given=given)
    with atomic_dir(out, args.overwrite, given=given) as tmp:
        table = run_sweep(
            base,
            grid,
            tmp,
            source=args.scenario,
            jobs=args.jobs,
            plots=not args.no_plots,
            fmt=args.format,
            progress=None,
        )
        table.to_parquet(tmp / SWEEP_FILE, index=False)
        meta = {"scenario": args.scenario, "grid": grid, "set": args.set, "keys": list(grid)}
        (tmp / SWEEP_META).write_text(json.dumps(meta, indent=2) + "\n")
        (tmp / "scenario.yaml").write_text(_base_yaml(base_cfg, args.scenario, args.set, grid))
        if not args.no_plots:
            _sweep_plots(table, list(grid), tmp / "plots", args.format)
    return table


def _base_yaml(
    cfg: ScenarioConfig, source: str, sets: list[str] | None, grid: dict[str, list[Any]]
) -> str:
    """The sweep's base scenario, ``--set`` applied and defaults spelled out, headed by what
    the grid changes (each run's own resolved scenario is in ``runs/<point>/``)."""
    head = [f"# base scenario of a sweep: {source}"]
    head += [f"#   --set {item}" for item in sets or []]
    head += [f"#   --grid {key}={','.join(map(str, values))}" for key, values in grid.items()]
    head.append("# each run's resolved scenario: runs/<point>/scenario.yaml")
    return "\n".join(head) + "\n" + dump_scenario(cfg)


def _check_some_point_is_valid(base: dict[str, Any], grid: dict[str, list[Any]], src: str) -> None:
    """A grid whose every point is invalid (a misspelt key, say) is bad input, not a sweep of
    failures: say why in one line before anything runs or is written."""
    first: InputError | None = None
    for point in grid_points(grid):
        try:
            validate(apply_overrides(base, point.values, src), f"{src} [{point.name}]")
        except InputError as err:
            first = first or err
        else:
            return
    assert first is not None
    raise InputError(f"every grid point is invalid, e.g. {first}")


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def _sweep_table(table: pd.DataFrame, keys: list[str]) -> str:
    cols = [
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "request_throughput",
        "num_preemptions",
    ]
    show = table[[*keys, "status", *[c for c in cols if c in table]]].copy()
    for c in cols:
        if c in show and c.endswith("_s"):
            show[c.replace("_s", "_ms")] = show.pop(c) * 1e3
    return show.to_string(index=False, float_format=lambda v: f"{v:.1f}")


def _sweep_plots(table: pd.DataFrame, keys: list[str], folder: Path, fmt: str) -> None:
    from simulator.plots.run import save_sweep_plots

    save_sweep_plots(table, keys, folder, fmt=fmt)


def cmd_plot(args: argparse.Namespace) -> int:
    """CLI: redraw the plots of a run folder or a sweep folder in place."""
    from simulator.plots.run import save_run_plots

    folder = Path(args.folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder")
    if (folder / SWEEP_FILE).exists():
        table = pd.read_parquet(folder / SWEEP_FILE)
        meta_file = folder / SWEEP_META
        keys = json.loads(meta_file.read_text())["keys"] if meta_file.exists() else []
        _sweep_plots(table, keys, folder / "plots", args.format)
        print(f"sweep plots redrawn in {folder / 'plots'}")
        return 0
    req, steps = folder / "requests.parquet", folder / "steps.parquet"
    if req.exists() and steps.exists():
        paths = save_run_plots(
            pd.read_parquet(req), pd.read_parquet(steps), folder / "plots", fmt=args.format
        )
        print(f"{len(paths)} plots redrawn in {folder / 'plots'}")
        return 0
    raise InputError(
        f"{folder}: neither a run folder (requests.parquet, steps.parquet) nor a sweep folder "
        f"({SWEEP_FILE})"
    )
