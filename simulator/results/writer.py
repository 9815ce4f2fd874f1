"""Writing results into their folder: a run's tables, summary.json (strict JSON), resolved
scenario and plots; a sweep's table, grid, base scenario and plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.result import SimulationResult
from simulator.engine.step_sink import MemorySink
from simulator.metrics import Columns
from simulator.results.reader import SWEEP_META
from simulator.scenario.config import dump_scenario

if TYPE_CHECKING:
    import pandas as pd

SWEEP_FILE = "sweep.parquet"
"""A sweep folder's table: one row per grid point."""


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity (an undefined metric) as None: strict JSON has no
    NaN, and ``json.dumps(..., allow_nan=False)`` then catches any that slips through."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _strict_json(value: Any) -> str:
    """``value`` as indented strict JSON (``json_safe``: NaN and infinities as null), one
    final newline."""
    return json.dumps(json_safe(value), indent=2, default=_json_default, allow_nan=False) + "\n"


def _write_files(folder: Path, table: tuple[str, pd.DataFrame], texts: dict[str, str]) -> None:
    """Write a sweep's, search's or capacity search's files into ``folder``: its table
    (file name, frame) as Parquet, and each of ``texts`` (file name -> text)."""
    name, frame = table
    frame.to_parquet(folder / name, index=False)
    for file, text in texts.items():
        (folder / file).write_text(text)


def write_table(table: pd.DataFrame | Columns, path: Path) -> None:
    """One table as a parquet file (held as columns, written through Arrow, not pandas)."""
    if isinstance(table, Columns):
        import pyarrow.parquet as pq

        pq.write_table(table.arrow(), path)
    else:
        table.to_parquet(path, index=False)


def write_result(
    result: SimulationResult, folder: Path, plots: bool = True, fmt: str = "png"
) -> None:
    """Write both tables, summary.json, the resolved scenario and plots into ``folder``.

    In summary.json an undefined figure (NaN: no finished request, no 2-token output) is
    ``null``."""
    write_table(result.request_table, folder / "requests.parquet")
    if result.steps is not None:  # else streamed to the folder as the run went, or not kept
        result.steps.to_parquet(folder / "steps.parquet", index=False)
    if result.replicas is not None:
        result.replicas.to_parquet(folder / "replicas.parquet", index=False)
    for name, table in result.tables.items():
        table.to_parquet(folder / f"{name}.parquet", index=False)
    if len(result.rejected_table):
        result.rejected.to_csv(folder / "rejected.csv", index=False)
    summary = dict(result.summary)
    summary["wall_time_s"] = result.extras.get("wall_time_s")
    summary["servesim_version"] = result.extras.get("servesim_version")
    summary["workload_notes"] = list(result.extras.get("workload_notes", []))
    if result.replicas is not None:
        summary["replicas"] = result.replicas.to_dict(orient="records")
    (folder / "summary.json").write_text(_strict_json(summary))
    if result.scenario is not None:
        (folder / "scenario.yaml").write_text(dump_scenario(result.scenario))
    if plots:
        from simulator.plots.run import save_run_plots

        steps: pd.DataFrame | Path | None = result.steps
        if steps is None:  # streamed as the run went (read back a batch at a time), or none
            path = folder / "steps.parquet"
            steps = path if path.exists() else MemorySink().close()
        slo = getattr(result.scenario, "slo", None)  # a scenario without an SLO: None
        save_run_plots(
            result.requests,
            steps,
            folder / "plots",
            fmt=fmt,
            slo_ms=slo_ms(slo),
            model=result.summary.get("uncertainty"),
        )
        if result.replicas is not None and not isinstance(steps, Path) and "replica" in steps:
            from simulator.plots.cluster import save_cluster_plots

            save_cluster_plots(result.requests, steps, folder / "plots", fmt=fmt)
        if "fleet" in result.tables:
            from simulator.plots.fleet import save_fleet_plots

            save_fleet_plots(result.requests, result.tables["fleet"], folder / "plots", fmt=fmt)


def slo_ms(slo: Any) -> dict[str, float]:
    """The TTFT and TPOT targets of an SLO config (or of a saved scenario's ``slo``
    mapping) that the latency CDFs draw, in ms; empty without an SLO."""
    if slo is None:
        return {}
    get = slo.get if isinstance(slo, dict) else lambda key: getattr(slo, key, None)
    targets = {name: get(f"{name}_ms") for name in ("ttft", "tpot")}
    return {k: float(v) for k, v in targets.items() if isinstance(v, int | float)}


def write_sweep(
    table: pd.DataFrame,
    folder: Path,
    meta: dict[str, Any],
    scenario_yaml: str,
    plots: bool = True,
    fmt: str = "png",
) -> None:
    """Write a sweep's table, its grid (``meta``), base scenario and plots into ``folder``."""
    texts = {SWEEP_META: json.dumps(meta, indent=2) + "\n", "scenario.yaml": scenario_yaml}
    _write_files(folder, (SWEEP_FILE, table), texts)
    if plots:
        from simulator.plots.sweep import save_sweep_plots

        save_sweep_plots(table, list(meta["keys"]), folder / "plots", fmt=fmt)


CAPACITY_FILE = "capacity.json"
"""A capacity folder's answer: ``capacity``, its bracket and ``probes``."""


def write_capacity(
    found: dict[str, Any], folder: Path, scenario_yaml: str, plots: bool = True, fmt: str = "png"
) -> None:
    """Write a capacity search's ``capacity.json`` (strict JSON), its probes as a table,
    its base scenario and its figure into ``folder``."""
    texts = {CAPACITY_FILE: _strict_json(found), "scenario.yaml": scenario_yaml}
    import pandas as pd

    _write_files(folder, ("probes.parquet", pd.DataFrame(found["probes"])), texts)
    if plots:
        from simulator.plots.capacity import save_capacity_plot

        save_capacity_plot(found, folder / "plots", fmt=fmt)


SEARCH_FILE = "search.parquet"
"""A search folder's table: one row per deployment."""


def write_search(
    table: pd.DataFrame,
    folder: Path,
    meta: dict[str, Any],
    scenario_yaml: str,
    plots: bool = True,
    fmt: str = "png",
) -> None:
    """Write a design search's table, what it searched (``search.json``), its base scenario
    and its Pareto figure into ``folder``."""
    texts = {"search.json": _strict_json(meta), "scenario.yaml": scenario_yaml}
    _write_files(folder, (SEARCH_FILE, table), texts)
    if plots:
        from simulator.plots.search import save_search_plot

        title = f"Design search of {meta.get('scenario_name', '')}: {meta['slo']['text']}"
        save_search_plot(table, list(meta["keys"]), folder / "plots", fmt=fmt, title=title)
