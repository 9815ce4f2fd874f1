"""``servesim plot``: redraw the plots of a run or sweep folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.cli.common import Subparsers, add_format_arg


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``plot`` command."""
    p = subparsers.add_parser(
        "plot", help="redraw the plots of a run or sweep folder", description=run.__doc__
    )
    p.add_argument("folder", help="a folder written by `servesim run` or `servesim sweep`")
    add_format_arg(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Redraw the plots of a run folder or a sweep folder."""
    from simulator.errors import InputError
    from simulator.output_file import check_output_folder
    from simulator.plots.sweep import save_sweep_plots
    from simulator.results.reader import read_parquet, read_sweep_keys
    from simulator.results.writer import SWEEP_FILE

    folder = Path(args.folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder")
    plots = folder / "plots"
    if _redraw_search(folder, args.format):
        print(f"plot redrawn in {plots}")
        return 0
    req, steps = folder / "requests.parquet", folder / "steps.parquet"
    if (folder / SWEEP_FILE).exists():
        check_output_folder(plots)
        table = read_parquet(folder / SWEEP_FILE)
        save_sweep_plots(table, read_sweep_keys(folder), plots, fmt=args.format)
        print(f"sweep plots redrawn in {plots}")
        return 0
    if req.exists() and steps.exists():
        check_output_folder(plots)
        paths = _redraw_run(req, steps, plots, args.format)
        print(f"{len(paths)} plots redrawn in {plots}")
        return 0
    raise InputError(
        f"{folder}: neither a run folder (requests.parquet, steps.parquet) nor a sweep, "
        f"capacity or search folder ({SWEEP_FILE}, capacity.json, search.parquet)"
    )


def _redraw_run(req: Path, steps: Path, plots: Path, fmt: str) -> list[Path]:
    """A run's figures, and a cluster's when its step table has a ``replica`` column."""
    from simulator.plots.run import save_run_plots
    from simulator.results.reader import open_parquet, read_parquet

    requests = read_parquet(req)
    # the step table is binned a batch of rows at a time, never read whole (but for a
    # cluster's per-replica figures)
    paths = save_run_plots(requests, steps, plots, fmt=fmt, slo_ms=_saved_slo(req.parent))
    if "replica" in open_parquet(steps).schema_arrow.names:  # a cluster's run
        from simulator.plots.cluster import save_cluster_plots

        paths += save_cluster_plots(requests, read_parquet(steps), plots, fmt=fmt)
    return paths


def _saved_slo(folder: Path) -> dict[str, float]:
    """The SLO targets of the scenario a run folder saved (``scenario.yaml``), if any."""
    from simulator.results.writer import slo_ms

    path = folder / "scenario.yaml"
    if not path.is_file():
        return {}
    from simulator.yaml_file import read_yaml_file

    data = read_yaml_file(path)
    return slo_ms(data.get("slo") if isinstance(data, dict) else None)


def _redraw_search(folder: Path, fmt: str) -> bool:
    """Redraw a capacity or design-search folder's figure; False if it is neither."""
    from simulator.output_file import check_output_folder
    from simulator.results.reader import read_json, read_parquet, read_search_keys
    from simulator.results.writer import CAPACITY_FILE, SEARCH_FILE

    if (folder / CAPACITY_FILE).exists():
        from simulator.plots.capacity import save_capacity_plot

        check_output_folder(folder / "plots")
        found = read_json(folder / CAPACITY_FILE, ["slo", "probes", "unit", "capacity"])
        save_capacity_plot(found, folder / "plots", fmt=fmt)
        return True
    if (folder / SEARCH_FILE).exists():
        from simulator.plots.search import save_search_plot

        check_output_folder(folder / "plots")
        keys = read_search_keys(folder)
        table = read_parquet(folder / SEARCH_FILE)
        save_search_plot(table, keys, folder / "plots", fmt=fmt)
        return True
    return False
