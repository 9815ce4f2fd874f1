"""A pydantic ``ValidationError`` on a scenario as one line a user can act on: every failing
field as the dotted key they wrote, an unknown key with the key it was probably meant to be,
and a value that is not a number called that (not "should be greater than 0")."""

from __future__ import annotations

import difflib
import math
import types
import typing
from typing import Any, Union

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

__all__ = ["fields_at", "format_validation_error"]


def format_validation_error(
    err: ValidationError, source: str, data: Any, model: type[BaseModel]
) -> str:
    """One line: ``source: key: why`` for each failing field, ``;``-separated.

    Unknown keys come first: a misspelt required key also makes the right one "missing", and
    the misspelling is what the user has to fix; its "missing" twin is then left out."""
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    meant = {_suggestion(e, errors, data, model) for e in unknown}
    rest = [
        e
        for e in errors
        if e["type"] != "extra_forbidden"
        and not (e["type"] == "missing" and _key(e["loc"]) in meant)
    ]
    parts = [_describe(e, errors, data, model) for e in unknown + rest]
    return f"{source}: " + "; ".join(dict.fromkeys(parts))


def _key(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    return tuple(str(p) for p in loc)


def _describe(
    error: ErrorDetails, errors: list[ErrorDetails], data: Any, model: type[BaseModel]
) -> str:
    """``key: why`` for one error."""
    where = _field_path(tuple(error["loc"]), data) or "<top level>"
    value = error.get("input")
    if error["type"] == "extra_forbidden":
        close = _suggestion(error, errors, data, model)
        hint = f" (did you mean {close[-1]}?)" if close else ""
        return f"{where}: {error['msg']}{hint}"
    if _is_nan(value):
        return f"{where}: {value!r} is not a number"
    if error["type"] == "value_error":  # our own validators' reason, without pydantic's label
        return f"{where}: {error['ctx']['error']}"
    return f"{where}: {error['msg']}"


def _is_nan(value: Any) -> bool:
    """NaN as YAML (``.nan``) or as text pydantic reads as a float (``nan``, ``NaN``)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, float) and math.isnan(value)


def _suggestion(
    error: ErrorDetails, errors: list[ErrorDetails], data: Any, model: type[BaseModel]
) -> tuple[str, ...]:
    """The loc of the key an unknown key was probably meant to be, or ``()``: the closest
    known key beside it (a missing required one first)."""
    loc = tuple(error["loc"])
    parent, wrong = loc[:-1], str(loc[-1])
    missing = [
        str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == parent
    ]
    known = missing + sorted(fields_at(model, parent, data) - set(missing))
    close = difflib.get_close_matches(wrong, known, n=1)
    return (*_key(parent), close[0]) if close else ()


def fields_at(model: type[BaseModel], loc: tuple[int | str, ...], data: Any) -> set[str]:
    """The keys of every config model that may sit at ``loc`` (unions: each variant's)."""
    models = [model]
    node = data
    for part in loc:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            continue  # an item of a list: the models of its items are the list's
        if isinstance(node, dict) and part not in node and part in node.values():
            continue  # a union's tag pydantic put in the loc
        node = node.get(part) if isinstance(node, dict) else None
        nxt: list[type[BaseModel]] = []
        for m in models:
            field = m.model_fields.get(str(part))
            if field is not None:
                nxt.extend(_models_in(field.annotation))
        models = nxt
    return {name for m in models for name in m.model_fields}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Config models a field's type names (unwrapping Optional, unions, Annotated, lists)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Annotated, Union, types.UnionType, list, dict):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _field_path(loc: tuple[int | str, ...], data: Any) -> str:
    """The dotted key a user wrote: union tags pydantic adds to ``loc`` are not in the data."""
    parts: list[str] = []
    node = data
    for part in loc:
        is_key = isinstance(node, dict) and part in node
        is_item = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if is_key or is_item:
            node = node[part]
        elif isinstance(node, dict) and parts and part in node.values():
            continue  # a discriminator tag such as "linear" or "lognormal"
        parts.append(str(part))
    return ".".join(parts)
