"""What pydantic's lax mode lets through and a user never means: ``true`` where a number is
expected (it becomes 1) and a number where a flag is expected (it becomes a bool)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def find_loose_scalar(raw: Any, value: Any, path: str = "") -> str | None:
    """The dotted key of the first place where validating ``raw`` (plain YAML data) turned a
    boolean into a number or a number into a boolean in ``value`` (the validated model), with
    the reason; None if there is none."""
    if isinstance(raw, bool):
        if not isinstance(value, bool):
            return f"{path}: expected a number, got the boolean {str(raw).lower()}"
        return None
    if isinstance(raw, int | float) and isinstance(value, bool):
        return f"{path}: expected true or false, got the number {raw}"
    if isinstance(raw, dict) and isinstance(value, BaseModel | dict):
        for key, sub in raw.items():
            child = value.get(key) if isinstance(value, dict) else getattr(value, str(key), None)
            found = find_loose_scalar(sub, child, f"{path}.{key}" if path else str(key))
            if found:
                return found
    if isinstance(raw, list) and isinstance(value, list | tuple) and len(raw) == len(value):
        for i, (sub, child) in enumerate(zip(raw, value, strict=True)):
            found = find_loose_scalar(sub, child, f"{path}.{i}")
            if found:
                return found
    return None
