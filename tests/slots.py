"""A class's ``__slots__`` as its source declares them: mypyc's compiled classes
(simulator/native.py) keep their fields in C and have no ``__slots__`` at run time."""

from __future__ import annotations

import ast

from tests.paths import ROOT


def slots_of(cls: type) -> tuple[str, ...]:
    """The names in ``cls.__slots__`` in its module's source."""
    tree = ast.parse((ROOT / (cls.__module__.replace(".", "/") + ".py")).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
                ):
                    return tuple(ast.literal_eval(stmt.value))
    raise LookupError(f"{cls.__qualname__} declares no __slots__")
