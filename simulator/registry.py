"""Named extension points (policies, cost models, routers, trace readers): each is one
``Registry`` of the built-in entries, and a scenario may name any other by its import path,
``package.module:Name``, without editing servesim (docs/architecture.md, "Adding things")."""

from __future__ import annotations

import importlib
from typing import TypeVar

T = TypeVar("T")


def is_import_path(name: str) -> bool:
    """Whether ``name`` is ``module:attribute`` rather than a registered name."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr)


def import_object(path: str) -> object:
    """The object ``module:attribute`` names (ValueError saying why it cannot be had)."""
    module, _, attr = path.partition(":")
    try:
        found: object = importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"cannot import {module!r} of {path!r}: {err}") from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ValueError(f"module {module!r} has no {attr!r}")
        found = getattr(found, part)
    return found


class Registry(dict[str, T]):
    """Built-in entries by name (a dict: add yours with ``REGISTRY[name] = entry``);
    ``resolve`` also takes an import path to anything else."""

    def __init__(self, kind: str, entries: dict[str, T], check: type | None = None) -> None:
        super().__init__(entries)
        self.kind = kind
        """What an entry is, for messages (``router``, ``policy``...)."""
        self._check = check

    def resolve(self, name: str) -> T:
        """The entry ``name`` (registered, or ``module:attribute``); ValueError naming the
        known ones otherwise."""
        if name in self:
            return self[name]
        if not is_import_path(name):
            known = ", ".join(self)
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {known} (or an import path module:Name)"
            )
        found = import_object(name)
        check = self._check
        if check is not None and not (isinstance(found, type) and issubclass(found, check)):
            article = "an" if check.__name__[0] in "AEIOU" else "a"
            raise ValueError(f"{name!r} is not {article} {check.__name__} subclass")
        return found  # type: ignore[return-value]

    def validate(self, name: str) -> str:
        """``name`` if ``resolve`` can have it (for a config field validator)."""
        self.resolve(name)
        return name
