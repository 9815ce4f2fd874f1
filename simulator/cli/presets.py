"""``servesim presets``: list the model, hardware and fitted cost-model presets, each with
where its figures come from."""

from __future__ import annotations

import argparse
import textwrap

from simulator.cli.common import Subparsers

WIDTH = 120
"""Columns of the listing: long sources wrap under their preset."""

PCAP = (
    "-pcap: Splitwise's runs of the H100 with its power capped (Splitwise's h100-80gb-pcap, "
    "for power-efficient token machines); the same GPU (hardware preset h100-sxm), timed as "
    "measured under the cap: in Splitwise's file its decode steps take as long as uncapped, "
    "its prefills a constant factor longer."
)
"""What the ``-pcap`` of fitted preset names means."""


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``presets`` command."""
    return subparsers.add_parser(
        "presets",
        help="list model, hardware and fitted cost-model presets, with their sources",
        description=run.__doc__,
    )


def _wrapped(label: str, text: str) -> str:
    """``text`` under a preset, wrapped to ``WIDTH``, its first line headed ``label``."""
    lead = f"    {label:<9}"
    return textwrap.fill(text, WIDTH, initial_indent=lead, subsequent_indent=" " * len(lead))


def run(args: argparse.Namespace) -> int:
    """List the model, hardware and fitted cost-model presets, each value's source, the GPU
    prices' sources and the serving stack (and year) each fitted preset was measured on."""
    from simulator.cost.presets import list_presets, load_hardware, load_model, serve_budgets

    presets = list_presets()
    print("models:")
    for name in presets.get("models", []):
        m = load_model(name)
        print(
            f"  {name:<14} {m.num_params / 1e9:6.1f} B params, {m.num_layers} layers, "
            f"KV {m.kv_bytes_per_token / 1024:.0f} KiB/token"
        )
        print(_wrapped("source:", m.source))
    print(
        "hardware (prices: on-demand rental per GPU-hour; "
        "`servesim search --gpu-cost NAME=USD` overrides):"
    )
    for name in presets.get("hardware", []):
        h = load_hardware(name)
        cost = "" if h.cost_per_hour is None else f", ${h.cost_per_hour:.2f}/GPU-hour"
        print(
            f"  {name:<14} {h.peak_flops / 1e12:6.0f} TFLOP/s, "
            f"{h.hbm_bandwidth / 1e12:.2f} TB/s, {h.memory_bytes / 1e9:.0f} GB{cost}"
        )
        print(_wrapped("source:", h.source))
        print(_wrapped("price:", h.cost_source or "none: give one with --gpu-cost"))
        tokens, seqs = serve_budgets(h, None, None)
        print(
            _wrapped("budgets:", f"vllm serve's defaults: {tokens} tokens a step, {seqs} sequences")
        )
    _print_fitted()
    return 0


def _print_fitted() -> None:
    """The fitted presets: what each times, measured on what stack, from which file."""
    from simulator.cost.fitted import list_fitted, load_preset

    print("fitted cost models (cost_model: {type: fitted, path: NAME}):")
    for name in list_fitted():
        p = load_preset(name)
        print(f"  {name:<36} {p.model} on {p.tp} x {p.hardware}")
        if p.stack:
            print(_wrapped("measured:", p.stack))
        src = p.source
        if src.get("repo"):
            where = f"{src['repo']}@{str(src.get('commit', ''))[:7]} {src.get('path', '')}"
            print(_wrapped("from:", f"{where} ({src.get('license', '?')})"))
    print(textwrap.fill(PCAP, WIDTH))
