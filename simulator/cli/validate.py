"""``servesim validate``: check a scenario and print it resolved."""

from __future__ import annotations

import argparse
import sys

from simulator.cli.common import Subparsers, add_scenario_args


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``validate`` command."""
    p = subparsers.add_parser(
        "validate", help="check a scenario, print it resolved", description=run.__doc__
    )
    add_scenario_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Check a scenario (presets and input files too) and print it resolved, every default
    spelled out."""
    from simulator.cost import build_cost_model
    from simulator.scenario.config import dump_scenario, load_scenario, parse_overrides
    from simulator.scenario.runner import resolve
    from simulator.workload import check_inputs

    cfg = resolve(load_scenario(args.scenario, parse_overrides(args.set)))
    # what run would fail on before simulating: presets, their fit (tp), and input files
    build_cost_model(cfg.cost_model)
    if cfg.cluster is not None:
        from simulator.scenario.cluster import check_cluster

        check_cluster(cfg)
    check_inputs(cfg.workload)
    print(f"# {args.scenario}: valid", file=sys.stderr)
    print(dump_scenario(cfg), end="")
    return 0
