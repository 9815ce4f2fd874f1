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


class DoesNotFit(InputError):
    """A deployment whose weights, activations and KV cache exceed its GPUs' memory: one
    that cannot exist (a search marks it infeasible rather than failed)."""


class MissingFile(InputError):
    """A file a scenario names is not there (or is a folder): a search or sweep refuses it
    before anything runs rather than failing every point."""


def in_field(field: str, load: Callable[[_A], _T], arg: _A) -> _T:
    """``load(arg)``, an ``InputError`` from it prefixed by the scenario key that named
    ``arg`` (a preset loader knows the name it was given, not which key gave it)."""
    try:
        return load(arg)
    except InputError as err:
        raise InputError(f"{field}: {err}") from None


def reason_of(err: BaseException) -> str:
    """Why ``err`` happened, on one line and without the path (messages name it themselves):
    an OSError's reason, else the first line of its message, else its type's name."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = str(err).strip().splitlines()
    return " ".join(text[0].split()) if text else type(err).__name__


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"servesim: warning: {message}", file=sys.stderr)
