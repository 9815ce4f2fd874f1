"""The scenario reference (docs/scenarios.md) rendered from the config models themselves,
so every key's type, default and meaning come from the one place that validates it."""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import typing
from functools import cache
from typing import Any, Union

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

BEGIN = "<!-- BEGIN GENERATED: servesim reference -->"
END = "<!-- END GENERATED -->"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Config models named by a field's type (unwrapping Optional, unions, Annotated)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType, list):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


@cache
def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of ``model`` and of the models it inherits from. Read
    here, not by pydantic (``use_attribute_docstrings``): parsing every model's source took a
    tenth of the start-up of every run, for this page alone."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not issubclass(cls, BaseModel) or cls is BaseModel:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        args = typing.get_args(annotation)
        models = _models_in(annotation)
        if len(models) > 1:
            tags = [(_discriminator_value(m) or m.__name__).split(": ")[-1] for m in models]
            named = "mapping, one of " + ", ".join(f"`{t}`" for t in tags)
            return named + (" \\| null" if type(None) in args else "")
        return " \\| ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    value = field.default
    if value is PydanticUndefined:
        return "-"
    return "null" if value is None else f"`{value}`"


def _discriminator_value(model: type[BaseModel]) -> str | None:
    for key in ("type", "dist"):
        field = model.model_fields.get(key)
        if field is not None and typing.get_origin(field.annotation) is typing.Literal:
            return f"{key}: {typing.get_args(field.annotation)[0]}"
    return None


def render(root: type[BaseModel], prefix: str = "") -> str:
    """Markdown tables for ``root`` and every config model under it, depth first."""
    out: list[str] = []
    # A model is shown where it first appears and again only beside it (prompt_len and
    # output_len); elsewhere (a cluster group's scheduler) its first table says it all.
    first_parent: dict[type[BaseModel], str] = {}
    seen: set[tuple[str, type[BaseModel]]] = set()

    def walk(model: type[BaseModel], path: str) -> None:
        parent = path.rpartition(".")[0]
        if first_parent.setdefault(model, parent) != parent or (path, model) in seen:
            return
        seen.add((path, model))
        tag = _discriminator_value(model)
        title = f"`{path}`" if path else "top level"
        if tag:
            title += f" with `{tag}`"
        doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        out.extend([f"### {title}", "", doc, "", "| key | type | default | meaning |"])
        out.append("|---|---|---|---|")
        children: list[tuple[str, type[BaseModel]]] = []
        for name, field in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            desc = field.description or field_docs(model).get(name, "")
            desc = desc.replace("\n", " ").replace("|", "\\|")
            kind, default = _type_name(field.annotation), _default(field)
            out.append(f"| `{name}` | {kind} | {default} | {desc} |")
            children.extend((key, m) for m in _models_in(field.annotation))
        out.append("")
        for key, child in children:
            walk(child, key)

    walk(root, prefix)
    return "\n".join(out)


def scenario_reference() -> str:
    """The generated part of docs/scenarios.md."""
    from simulator.scenario.config import ScenarioConfig

    return f"{BEGIN}\n\n{render(ScenarioConfig)}\n{END}"


def splice(document: str, generated: str) -> str:
    """Replace the generated block of ``document`` with ``generated``."""
    head, sep, rest = document.partition(BEGIN)
    if not sep:
        raise ValueError("no generated block marker in the document")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError("generated block is not closed")
    return head + generated + tail


if __name__ == "__main__":
    import sys
    from pathlib import Path

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/scenarios.md")
    path.write_text(splice(path.read_text(), scenario_reference()))
    print(f"updated {path}")
