"""``servesim presets``: list the model, hardware and fitted cost-model presets."""

from __future__ import annotations

import argparse

from simulator.cli.common import Subparsers


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add the ``presets`` command."""
    return subparsers.add_parser(
        "presets",
        help="list model, hardware and fitted cost-model presets",
        description=run.__doc__,
    )


def run(args: argparse.Namespace) -> int:
    """List the model, hardware and fitted cost-model presets."""
    from simulator.cost.fitted import list_fitted, load_preset
    from simulator.cost.presets import list_presets, load_hardware, load_model

    presets = list_presets()
    print("models:")
    for name in presets.get("models", []):
        m = load_model(name)
        print(
            f"  {name:<14} {m.num_params / 1e9:6.1f} B params, {m.num_layers} layers, "
            f"KV {m.kv_bytes_per_token / 1024:.0f} KiB/token"
        )
    print("hardware:")
    for name in presets.get("hardware", []):
        h = load_hardware(name)
        cost = "" if h.cost_per_hour is None else f", ${h.cost_per_hour:.2f}/GPU-hour"
        print(
            f"  {name:<14} {h.peak_flops / 1e12:6.0f} TFLOP/s, "
            f"{h.hbm_bandwidth / 1e12:.2f} TB/s, {h.memory_bytes / 1e9:.0f} GB{cost}"
        )
    print("fitted cost models (cost_model: {type: fitted, path: NAME}):")
    for name in list_fitted():
        p = load_preset(name)
        print(f"  {name:<36} {p.model} on {p.tp} x {p.hardware}")
    return 0
