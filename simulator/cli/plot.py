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
    import pandas as pd

    from simulator.errors import InputError
    from simulator.plots.run import save_run_plots
    from simulator.plots.sweep import save_sweep_plots
    from simulator.results.writer import SWEEP_FILE, read_sweep_keys

    folder = Path(args.folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder")
    if _redraw_search(folder, args.format):
        print(f"plot redrawn in {folder / 'plots'}")
        return 0
    if (folder / SWEEP_FILE).exists():
        table = pd.read_parquet(folder / SWEEP_FILE)
        save_sweep_plots(table, read_sweep_keys(folder), folder / "plots", fmt=args.format)
        print(f"sweep plots redrawn in {folder / 'plots'}")
        return 0
    req, steps = folder / "requests.parquet", folder / "steps.parquet"
    if req.exists() and steps.exists():
        requests, step_table = pd.read_parquet(req), pd.read_parquet(steps)
        paths = save_run_plots(requests, step_table, folder / "plots", fmt=args.format)
        if "replica" in step_table:  # a cluster's run
            from simulator.plots.cluster import save_cluster_plots

            paths += save_cluster_plots(requests, step_table, folder / "plots", fmt=args.format)
        print(f"{len(paths)} plots redrawn in {folder / 'plots'}")
        return 0
    raise InputError(
        f"{folder}: neither a run folder (requests.parquet, steps.parquet) nor a sweep, "
        f"capacity or search folder ({SWEEP_FILE}, capacity.json, search.parquet)"
    )


def _redraw_search(folder: Path, fmt: str) -> bool:
    """Redraw a capacity or design-search folder's figure; False if it is neither."""
    import json

    import pandas as pd

    from simulator.results.writer import CAPACITY_FILE, SEARCH_FILE

    if (folder / CAPACITY_FILE).exists():
        from simulator.plots.capacity import save_capacity_plot

        found = json.loads((folder / CAPACITY_FILE).read_text())
        save_capacity_plot(found, folder / "plots", fmt=fmt)
        return True
    if (folder / SEARCH_FILE).exists():
        from simulator.plots.search import save_search_plot

        meta = json.loads((folder / "search.json").read_text())
        table = pd.read_parquet(folder / SEARCH_FILE)
        save_search_plot(table, list(meta["keys"]), folder / "plots", fmt=fmt)
        return True
    return False
