"""``servesim fetch``: download public traces and profiles, sha256-verified."""

from __future__ import annotations

import argparse
import inspect

from simulator.cli.common import Subparsers


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``fetch`` command."""
    p = subparsers.add_parser(
        "fetch",
        help="download public traces and profiles (sha256-verified)",
        description=inspect.cleandoc(run.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="file, group (traces, lengths, profiles, llmservingsim) or all; default: traces; "
        "or kernels [GPU [VERSION]]: NVIDIA's kernel database",
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
    return p


def run(args: argparse.Namespace) -> int:
    """Download public traces and profiles, pinned to a commit and verified by sha256.

    NAME is a file, a group (traces, lengths, profiles, llmservingsim) or all; no NAME means
    traces, the files the trace scenarios read (the real-* scenarios read llmservingsim).
    `kernels [GPU [VERSION]]` gets NVIDIA's database of measured vLLM kernels (all of it, one
    GPU, by its folder or hardware preset name, or the tables one vLLM version of it reads)
    into DEST/kernels, where cost_model.type kernels reads it when aiconfigurator-core is not
    installed. Files
    already present with the right sha256 are not downloaded again. The source is
    raw.githubusercontent.com, or a mirror laid out as BASE/OWNER/REPO/COMMIT/PATH named by
    --base-url or $SERVESIM_DATA_URL (file:// works).
    """
    from simulator.workload.datasets import fetch_files, format_listing, select
    from simulator.workload.kernel_files import select_kernels

    names = list(args.names)
    kernels = names[:1] == ["kernels"]
    if kernels:
        entries = select_kernels([_kernels_gpu(n) for n in names[1:2]] + names[2:])
    else:
        # a listing with no names shows everything, not just the default selection
        entries = select(names or (["all"] if args.list else []))
    if args.list:
        print(format_listing(entries, args.dest, with_groups=not kernels))
        return 0
    paths = fetch_files(
        entries,
        args.dest,
        args.base_url,
        force=args.force,
        progress=not args.no_progress,
        report=print,
    )
    print(f"{len(paths)} file(s) verified under {args.dest}")
    return 0


def _kernels_gpu(name: str) -> str:
    """The database's GPU folder a hardware preset names (``h100-sxm``: ``h100_sxm``), else
    ``name`` as given."""
    from simulator.cost.presets import load_hardware
    from simulator.errors import InputError

    try:
        return load_hardware(name).kernels_gpu or name
    except InputError:
        return name
