"""Typed fields from untyped text: coerce a dataclass's values to its declared field types.

Options arrive as strings from the command line and from YAML (``lr: 1e-3`` is a *string* in YAML 1.1,
as is ``--model-args lambd=5e-2``).  :func:`coerce_fields` converts them by the field's annotation and
raises a one-line ``ValueError`` naming the field and an example when a value cannot be one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

__all__ = ["coerce_fields", "coerce_value"]

_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def coerce_value(name: str, value: Any, annotation: Any) -> Any:
    """``value`` as the type ``annotation`` (``int``, ``float``, ``bool``, ``str``, ``X | None``, ``list``,
    ``dict``, a dataclass); numeric strings become numbers, ``"none"``/``"null"`` becomes None where allowed."""
    members = _members(annotation)
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null") and str not in members):
        if type(None) in members:
            return None
        raise ValueError(f"{name} cannot be empty; give a value of type {_name(annotation)}")
    errors = []
    for typ in (m for m in members if m is not type(None)):
        try:
            return _coerce_one(value, typing.get_origin(typ) or typ)
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    example = {int: "e.g. 64", float: "e.g. 0.1", bool: "true or false"}.get(members[0], "")
    raise ValueError(f"{name} must be {_name(annotation)}, got {value!r}" + (f" ({example})" if example else ""))


def _coerce_one(value: Any, typ: type) -> Any:
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise TypeError
    if typ is int:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, str):
            value = float(value.strip()) if any(c in value.lower() for c in ".e") else int(value.strip())
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise TypeError
        if not isinstance(value, (int, float)):
            raise TypeError
        return int(value)
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError
        return float(value.strip()) if isinstance(value, str) else float(value)
    if typ is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise TypeError
    if typ in (list, tuple):
        if isinstance(value, (list, tuple)):
            return list(value)
        raise TypeError
    if typ is dict:
        if isinstance(value, dict):
            return value
        raise TypeError
    if dataclasses.is_dataclass(typ):
        if isinstance(value, typ):
            return value
        if isinstance(value, dict) and hasattr(typ, "from_dict"):
            return typ.from_dict(value)
        raise TypeError
    return value  # Any and other annotations: as given


def _name(annotation: Any) -> str:
    names = [getattr(m, "__name__", str(m)) for m in _members(annotation)]
    return " or ".join(
        "None" if n == "NoneType" else {"int": "an integer", "float": "a number"}.get(n, n) for n in names
    )


def coerce_fields(instance: Any) -> None:
    """Coerce every field of a dataclass ``instance`` in place to its declared type (see :func:`coerce_value`)."""
    hints = _hints(type(instance))
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        new = coerce_value(f.name, value, hints[f.name])
        if new is not value:
            object.__setattr__(instance, f.name, new)
