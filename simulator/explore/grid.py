"""A sweep's grid: dotted scenario keys and their values, run as a cartesian product. Keys
given together (``--grid 'a.b,c.d=1,2;3,4'``) vary together, one variant per ``;``, so a
sweep can hold a sum fixed (GPUs = data-parallel ranks x tensor parallelism); one of them
may be a bare name that is no scenario key, which labels the variants (``layout,...``)."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

from simulator.errors import InputError
from simulator.scenario.config import ScenarioConfig, parse_value


@dataclass(frozen=True)
class GridPoint:
    """One run of a sweep: its position, its folder name, the scenario keys it sets
    (``values``) and its row's grid columns (``cells``: those and its variants' names)."""

    index: int
    name: str
    values: dict[str, Any]
    cells: dict[str, Any]


def is_variant_name(key: str) -> bool:
    """Whether a key of a zipped ``--grid`` names its variants (a bare word that is no
    top-level scenario key) rather than setting a scenario key."""
    return "." not in key and key not in ScenarioConfig.model_fields


def parse_grid(items: list[str], zipped: bool = False) -> dict[str, list[Any]]:
    """``["a.b=1,2", "c=x,y"]`` -> ``{"a.b": [1, 2], "c": ["x", "y"]}`` (YAML scalars). With
    ``zipped``, ``"a.b,c=1,x;2,y"`` -> ``{"a.b,c": [[1, "x"], [2, "y"]]}``: keys that vary
    together, each variant one value per key."""
    grid: dict[str, list[Any]] = {}
    seen: set[str] = set()
    for item in items:
        key, sep, values = item.partition("=")
        keys = [k.strip() for k in key.split(",")]
        if not sep or not key.strip():
            raise InputError(f"--grid {item!r}: expected dotted.key=v1,v2,...")
        joined = ",".join(keys)
        for k in keys:
            if k in seen:
                raise InputError(f"--grid {k}: given twice")
            seen.add(k)
        if len(keys) == 1:
            grid[joined] = _values(joined, values)
        elif not zipped:
            raise InputError(f"--grid {joined}: keys that vary together are for servesim sweep")
        else:
            grid[joined] = _variants(keys, values)
    return grid


def _values(key: str, text: str) -> list[Any]:
    """One key's values: ``1,2,abc``."""
    parsed = [parse_value(v.strip()) for v in text.split(",") if v.strip()]
    if not parsed:
        raise InputError(f"--grid {key}: no values")
    if len({json.dumps(v, sort_keys=True) for v in parsed}) != len(parsed):
        raise InputError(f"--grid {key}: repeated values")
    return parsed


def _variants(keys: list[str], text: str) -> list[Any]:
    """Zipped keys' variants: ``1,x;2,y`` -> ``[[1, "x"], [2, "y"]]``."""
    joined = ",".join(keys)
    if not all(keys):
        raise InputError(f"--grid {joined}: an empty key")
    names = [k for k in keys if is_variant_name(k)]
    if len(names) > 1:
        raise InputError(
            f"--grid {joined}: {names[0]} and {names[1]} are no scenario keys (one may name "
            "the variants)"
        )
    if len(names) == len(keys):
        raise InputError(f"--grid {joined}: no scenario key to vary")
    variants = []
    for i, part in enumerate(p for p in text.split(";") if p.strip()):
        values = [parse_value(v.strip()) for v in part.split(",")]
        if len(values) != len(keys):
            raise InputError(
                f"--grid {joined}: variant {i + 1} ({part.strip()!r}) has {len(values)} "
                f"values for {len(keys)} keys"
            )
        variants.append(values)
    if not variants:
        raise InputError(f"--grid {joined}: no values")
    if len({json.dumps(v, sort_keys=True) for v in variants}) != len(variants):
        raise InputError(f"--grid {joined}: repeated variants")
    if names:
        at = keys.index(names[0])
        if len({str(v[at]) for v in variants}) != len(variants):
            raise InputError(f"--grid {joined}: repeated {names[0]} names")
    return variants


def axis_keys(axis: str) -> list[str]:
    """The keys of one grid entry (several when they vary together)."""
    return axis.split(",")


def cell_keys(grid: dict[str, list[Any]]) -> list[str]:
    """Every grid column, in order: each scenario key and variant name."""
    return [k for axis in grid for k in axis_keys(axis)]


def plot_keys(grid: dict[str, list[Any]]) -> list[str]:
    """One column per grid entry for the figures: a zipped entry's name, else its first key
    (its other keys follow from it)."""
    out = []
    for axis in grid:
        keys = axis_keys(axis)
        named = [k for k in keys if len(keys) > 1 and is_variant_name(k)]
        out.append(named[0] if named else keys[0])
    return out


def label_keys(grid: dict[str, list[Any]]) -> list[str]:
    """The columns that tell points apart in a figure's labels: a zipped entry's name, else
    every key of the entry (a search's Pareto points)."""
    out = []
    for axis in grid:
        keys = axis_keys(axis)
        named = [k for k in keys if len(keys) > 1 and is_variant_name(k)]
        out.extend(named[:1] or keys)
    return out


def axis_text(axis: str, values: list[Any]) -> str:
    """A grid entry as ``--grid`` spells it."""
    if len(axis_keys(axis)) == 1:
        return f"{axis}={','.join(map(str, values))}"
    return f"{axis}={';'.join(','.join(map(str, v)) for v in values)}"


def grid_points(grid: dict[str, list[Any]]) -> list[GridPoint]:
    """The cartesian product in a fixed order (first entry slowest; zipped keys step
    together), each with a folder name (a named variant by its name alone)."""
    axes = list(grid)
    points = []
    for i, combo in enumerate(itertools.product(*(grid[a] for a in axes))):
        cells: dict[str, Any] = {}
        shown: dict[str, Any] = {}
        values: dict[str, Any] = {}
        for axis, value in zip(axes, combo, strict=True):
            keys = axis_keys(axis)
            row = dict(zip(keys, value, strict=True)) if len(keys) > 1 else {axis: value}
            cells.update(row)
            # only a zipped entry has a name: a lone bare key is set (and fails validation)
            named = {k: v for k, v in row.items() if len(keys) > 1 and is_variant_name(k)}
            shown.update(named or row)
            values.update({k: v for k, v in row.items() if k not in named})
        label = "_".join(f"{k.split('.')[-1]}={v}" for k, v in shown.items())
        name = f"{i:03d}_{re.sub(r'[^A-Za-z0-9_.=-]+', '-', label)}"
        points.append(GridPoint(i, name, values, cells))
    return points


def seeded_grid(grid: dict[str, list[Any]], seeds: int, first: int) -> dict[str, list[Any]]:
    """The grid a sweep runs: with ``seeds`` > 1, every point once per seed ``first``,
    ``first + 1``, ... (a ``seed`` column last, which the plots aggregate over)."""
    if seeds < 1:
        raise InputError(f"--seeds {seeds}: must be >= 1")
    if seeds == 1:
        return grid
    if "seed" in cell_keys(grid):
        raise InputError("--seeds: seed is also a --grid key; give it in one of the two")
    return {**grid, "seed": [first + i for i in range(seeds)]}
