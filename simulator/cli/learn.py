"""``servesim learn``: refit the `physics` cost model's parameters from public operator
profiles (``configs/physics/sources.yaml``), deterministically."""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.cli.common import Subparsers
from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.cost.physics_params import AllReduceFit


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``learn`` command."""
    p = subparsers.add_parser(
        "learn",
        help="refit the physics cost model's parameters from operator profiles",
        description=run.__doc__,
    )
    p.add_argument("--out", required=True, help="parameters YAML to write")
    p.add_argument(
        "--data",
        default="data",
        help="folder holding the profiles named in the sources file (default: data, where "
        "`servesim fetch` saves them; the shared copies: ../shared/data)",
    )
    p.add_argument("--sources", help="training set YAML (default: configs/physics/sources.yaml)")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PRESET",
        help="leave out every source of this hardware or model preset (repeatable): the "
        "parameters then price it from its spec sheet alone",
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Fit the physics cost model's shared parameters and per-GPU scales to the operator
    profiles of a training set; write them with what they were fitted on and their step-time
    error per group."""
    from simulator.output_file import check_output_file, write_text

    out = check_output_file(args.out)
    import yaml

    from simulator.cost.learn.run import learn
    from simulator.cost.learn.sources import default_sources_path, load_sources

    data = Path(args.data)
    if not data.is_dir():
        raise InputError(f"--data {args.data}: not a folder")
    sources = load_sources(Path(args.sources) if args.sources else default_sources_path())
    known = {s.hardware for s in sources.sources} | {s.model for s in sources.sources}
    known |= set(sources.kernels.gpus if sources.kernels else [])
    for name in args.exclude:
        if name not in known:
            raise InputError(f"--exclude {name}: no source of that preset (known: {sorted(known)})")
    started = time.monotonic()
    command = "servesim learn " + " ".join(
        shlex.quote(a) for a in ["--out", str(args.out), *_exclude_args(args.exclude)]
    )
    # the all-reduce profiles are not in the shared data: also where `servesim fetch` saves
    roots = list(dict.fromkeys([data, Path("data")]))
    params = learn(sources, data, command, args.exclude, roots, _shipped_allreduce())
    write_text(out, yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False))
    for group, err in params.errors.items():
        print(f"{group}: {err.points} steps, median {err.median_pct:.1f}%, p90 {err.p90_pct:.1f}%")
    print(f"wrote {args.out} ({time.monotonic() - started:.1f} s)")
    return 0


def _exclude_args(names: list[str]) -> list[str]:
    return [a for n in names for a in ("--exclude", n)]


def _shipped_allreduce() -> AllReduceFit | None:
    """The shipped parameters' all-reduce fit, kept when its profiles are absent (None when
    the shipped file is absent or no longer valid, e.g. while a parameter is being added)."""
    from simulator.cost.physics_params import load_params

    try:
        return load_params(None).allreduce
    except InputError:
        return None
