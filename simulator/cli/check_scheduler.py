"""``servesim check-scheduler``: replay recorded scheduler cases through a policy."""

from __future__ import annotations

import argparse

from simulator.cli.common import Subparsers


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``check-scheduler`` command."""
    p = subparsers.add_parser(
        "check-scheduler",
        help="replay recorded scheduler steps through a policy and compare",
        description=run.__doc__,
    )
    p.add_argument("cases", help="JSONL file of recorded cases")
    p.add_argument(
        "--policy", choices=["spec", "vllm-v1"], default="vllm-v1", help="policy to check"
    )
    p.add_argument(
        "--fast-path",
        action="store_true",
        help="take every step the scheduler can on its fast path (cases without EOS)",
    )
    p.add_argument(
        "--progress", action="store_true", help="show a progress bar even off a terminal"
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Replay recorded scheduler cases (the format of tests/data/vllm_v1_scheduler/README.md)
    through a policy, step by step. Prints each differing case's first divergent step
    (expected vs got) and a count; exit 1 if any case differs, 0 if all match."""
    from simulator.validation.scheduler_replay import check_file

    progress = None if not args.progress else True
    report = check_file(args.cases, args.policy, progress, fast=args.fast_path)
    for divergence in report.divergences:
        print(divergence.describe())
    print(
        f"{args.cases}: {report.num_matching} of {report.num_cases} cases match policy "
        f"{args.policy}{' (fast path)' if args.fast_path else ''} step for step "
        f"({len(report.divergences)} differ)"
    )
    return 1 if report.divergences else 0
