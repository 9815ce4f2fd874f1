"""What the user is told: the one exception type that the CLI turns into a one-line message and
exit code 2, and one-line warnings."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")
_A = TypeVar("_A")


class InputError(ValueError):
    """Bad user input: the message names the file, field or key and the reason, on one line."""


def in_field(field: str, load: Callable[[_A], _T], arg: _A) -> _T:
    """``load(arg)``, an ``InputError`` from it prefixed by the scenario key that named
    ``arg`` (a preset loader knows the name it was given, not which key gave it)."""
    try:
        return load(arg)
    except InputError as err:
        raise InputError(f"{field}: {err}") from None


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"servesim: warning: {message}", file=sys.stderr)
