"""Reading the YAML files users write (scenarios, presets): UTF-8 only, and a key given twice in
one mapping is an error naming the line, where PyYAML would silently keep the last one; a
number in exponent notation (``1e6``, ``2.5e3``) is a number, as YAML 1.2 reads it, where
PyYAML (YAML 1.1: a dot and a signed exponent) would read the string "1e6"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import InputError


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice (first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats with an exponent that YAML 1.1 lacks: no dot, or no sign (``1e6``, ``2.5e3``)
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def parse_yaml(text: str) -> Any:
    """A YAML document given as text, read as a scenario file is (``yaml.YAMLError`` if it is
    not YAML)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)


def read_yaml_file(path: str | Path) -> Any:
    """The YAML document in ``path``, or an InputError ``FILE[:LINE]: reason``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory, not a YAML file") from None
    except OSError as err:
        raise InputError(f"{p}: cannot read: {err.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(f"{p}:{line}: not UTF-8 text (byte {raw[err.start]:#04x})") from None
    try:
        return parse_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise InputError(f"{p}{where}: invalid YAML: {' '.join(str(problem).split())}") from None
