"""A sweep: the cartesian product of grids (``grid.py``) over a base scenario, each point run
(in parallel processes) into its own folder, and one summary row per point."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import DoesNotFit, InputError, MissingFile
from simulator.explore.backend import Done
from simulator.explore.backends import make_backend
from simulator.explore.grid import (
    GridPoint,
    axis_text,
    cell_keys,
    grid_points,
    parse_grid,
    plot_keys,
    seeded_grid,
)
from simulator.scenario.config import (
    ScenarioConfig,
    apply_overrides,
    dump_scenario,
    parse_overrides,
    read_yaml,
    validate,
)

__all__ = [
    "GridPoint",
    "base_yaml",
    "check_points_fit",
    "check_some_point_is_valid",
    "grid_points",
    "headed_yaml",
    "parse_grid",
    "plot_keys",
    "run_sweep",
    "seeded_grid",
    "sweep_base",
]


def _run_point(
    point: GridPoint,
    base: dict[str, Any],
    source: str,
    runs: Path,
    plots: bool,
    fmt: str,
    ship: bool = False,
) -> tuple[dict[str, Any], dict[str, bytes] | None]:
    """Run one grid point (in a worker); its summary row, and with ``ship`` its folder's
    files (written in a temporary folder of the worker, for a driver on another machine)
    instead of writing them into ``runs/<point>``."""
    from simulator.results.writer import write_result
    from simulator.scenario.runner import resolve, run

    cfg = validate(apply_overrides(base, point.values, source), f"{source} [{point.name}]")
    cfg = resolve(cfg)
    result = run(cfg, progress=False)
    if not ship:
        folder = runs / point.name
        folder.mkdir(parents=True)
        write_result(result, folder, plots=plots, fmt=fmt)
        return dict(result.summary), None
    with tempfile.TemporaryDirectory(prefix="servesim-point-") as tmp:
        write_result(result, Path(tmp), plots=plots, fmt=fmt)
        files = {
            str(f.relative_to(tmp)): f.read_bytes() for f in Path(tmp).rglob("*") if f.is_file()
        }
    return dict(result.summary), files


def _unpack(folder: Path, files: dict[str, bytes]) -> None:
    """Write a run folder's files shipped from a worker."""
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _take(point: GridPoint, done: Done, runs: Path) -> dict[str, Any]:
    """A finished point's row (its shipped files written into ``runs/<point>``)."""
    if done.error is not None:
        return _row(point, None, _one_line(done.error))
    summary, files = done.value
    if files is not None:
        _unpack(runs / point.name, files)
    return _row(point, summary, None)


def _row(point: GridPoint, summary: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {key: _cell(v) for key, v in point.cells.items()}
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
    jobs: int | None = None,
    plots: bool = True,
    fmt: str = "png",
    progress: bool | None = None,
    backend: str = "local",
    address: str | None = None,
    report: Callable[[str], object] | None = None,
) -> pd.DataFrame:
    """Run every grid point into ``out/runs/<point>/``, on ``backend`` (``local``: ``jobs``
    processes, None = one per core, 1 = this process; ``ray``: Ray tasks). ``report``, if given,
    gets a progress line at each tenth of the runs done and at least every 30 s (for logs,
    where a bar cannot redraw).

    Returns one row per point in grid order, whatever order they finished in, so neither
    ``jobs`` nor the backend changes the table. A point that fails is a row with
    ``status == "failed"``."""
    from tqdm import tqdm

    points = grid_points(grid)
    rows: dict[int, dict[str, Any]] = {}
    if backend == "local" and jobs != 1:
        jobs = min(jobs or os.cpu_count() or 1, len(points))
    # disable=None: tqdm shows itself only on a terminal
    bar = tqdm(
        total=len(points),
        desc="sweep",
        unit="run",
        file=sys.stderr,
        disable=None if progress is None else not progress,
    )
    ship = backend != "local"  # a Ray worker may be on another machine: files come back
    lines = ProgressLines(len(points), report) if report else None
    try:
        with make_backend(backend, jobs, address) as pool:
            args = (base, source, out / "runs", plots, fmt, ship)
            tickets = {pool.submit(_run_point, p, *args): p for p in points}
            while tickets:
                for done in pool.wait():
                    p = tickets.pop(done.ticket)
                    rows[p.index] = _take(p, done, out / "runs")
                    if rows[p.index]["error"] is not None:
                        values = ", ".join(f"{k}={v}" for k, v in p.values.items())
                        failed = f"run {p.name} ({values}) failed: {rows[p.index]['error']}"
                        bar.write(f"servesim: {failed}", file=sys.stderr)
                    bar.update(1)
                    if lines:
                        lines.done(rows[p.index]["error"] is not None)
    finally:
        bar.close()
    table = pd.DataFrame([rows[i] for i in range(len(points))])
    for key in cell_keys(grid):
        if table[key].map(type).nunique() > 1:  # mixed int/float grid values: one dtype
            table[key] = table[key].astype(str)
    return table


class ProgressLines:
    """Progress of a sweep as lines (``12/40 runs done (1 failed), 1 min 5 s, ~3 min
    left``): one at each tenth of the runs and at least every ``every_s`` seconds."""

    def __init__(self, total: int, report: Callable[[str], object], every_s: float = 30.0):
        self.total, self.report, self.every_s = total, report, every_s
        self.count = self.failed = 0
        self.start = self.last = time.monotonic()

    def done(self, failed: bool) -> None:
        """One more run finished (``failed``: with an error)."""
        self.count += 1
        self.failed += failed
        now = time.monotonic()
        tenth = self.count * 10 // self.total != (self.count - 1) * 10 // self.total
        if not (tenth or now - self.last >= self.every_s or self.count == self.total):
            return
        self.last = now
        elapsed = now - self.start
        left = elapsed / self.count * (self.total - self.count)
        bad = f" ({self.failed} failed)" if self.failed else ""
        eta = f", ~{duration_text(left)} left" if self.count < self.total else ""
        self.report(
            f"sweep: {self.count}/{self.total} runs done{bad}, {duration_text(elapsed)}{eta}"
        )


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``: a duration to the precision a person reads."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    msg = text[0] if text else ""
    return msg if isinstance(err, InputError) else f"{type(err).__name__}: {msg}"


def sweep_base(
    scenario: str, sets: list[str], grid: dict[str, list[Any]]
) -> tuple[dict[str, Any], ScenarioConfig]:
    """The base scenario of a sweep with ``--set`` applied, raw and validated; a key both set
    and swept is refused."""
    base = read_yaml(scenario)
    if sets:
        overrides = parse_overrides(sets)
        both = sorted(set(overrides) & set(cell_keys(grid)))
        if both:
            # the grid would silently win over --set: make the user pick one
            raise InputError(f"--set {both[0]}: also a --grid key; give it in one of the two")
        base = apply_overrides(base, overrides, scenario)
    return base, validate(base, scenario)


def base_yaml(
    cfg: ScenarioConfig, source: str, sets: list[str] | None, grid: dict[str, list[Any]]
) -> str:
    """The sweep's base scenario, ``--set`` applied and defaults spelled out, headed by what
    the grid changes (each run's own resolved scenario is in ``runs/<point>/``)."""
    notes = [f"#   --grid {axis_text(axis, values)}" for axis, values in grid.items()]
    notes.append("# each run's resolved scenario: runs/<point>/scenario.yaml")
    return headed_yaml(cfg, "a sweep", source, sets, notes)


def headed_yaml(
    cfg: ScenarioConfig, what: str, source: str, sets: list[str] | None, notes: list[str]
) -> str:
    """The base scenario of ``what`` (a sweep, a search) as YAML, defaults spelled out, under
    comment lines: the file it came from, each ``--set`` applied, then ``notes``."""
    head = [f"# base scenario of {what}: {source}"]
    head += [f"#   --set {item}" for item in sets or []]
    return "\n".join([*head, *notes]) + "\n" + dump_scenario(cfg)


def check_some_point_is_valid(base: dict[str, Any], grid: dict[str, list[Any]], src: str) -> None:
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


_MEMORY_KEYS = ("scheduler", "cost_model", "cluster", "parallel")
"""Top-level keys a deployment's memory depends on (a grid of loads or seeds is checked once)."""
_FILE_KEYS = ("path", "rate_schedule_csv")
"""Ends of the keys that name input files (checked once per file)."""


def check_points_fit(base: dict[str, Any], grid: dict[str, list[Any]], src: str) -> None:
    """Every valid grid point's deployment fits in its GPUs' memory
    (``simulator.scenario.feasibility``) and the files it names are there, else one line naming
    the first point that fails, before anything runs. Points that set the same scheduler, cost
    model, cluster and file keys are checked once."""
    from simulator.scenario.runner import resolve

    keys = [k for k in cell_keys(grid) if k.split(".")[0] in _MEMORY_KEYS or k.endswith(_FILE_KEYS)]
    seen: set[str] = set()
    for point in grid_points(grid):
        key = json.dumps([point.cells[k] for k in keys], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            resolve(validate(apply_overrides(base, point.values, src), f"{src} [{point.name}]"))
        except (DoesNotFit, MissingFile) as err:
            raise InputError(f"{src} [{point.name}]: {err}") from None
        except InputError:
            continue  # an invalid point fails as a point of the sweep, as before
