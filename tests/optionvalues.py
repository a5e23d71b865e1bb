"""Values for the tests that walk every training option: a field's default, and a value of its kind away from it."""

from __future__ import annotations

import dataclasses
import types
import typing

from crate_transformer.config_utils import field_types


def default(f: dataclasses.Field) -> object:
    """``f``'s default (a fresh one for a default factory)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def other_value(f: dataclasses.Field, tp: object) -> object:
    """A value of ``f``'s kind (``tp``, its type) other than its default."""
    choices = f.metadata.get("choices")
    if choices:
        return next(c for c in choices if c != default(f))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin, d = typing.get_origin(tp) or tp, default(f)
    if origin is bool:
        return not d
    if origin is int:
        return (d or 0) + 1
    if origin is float:
        return (d or 0.0) / 2 + 0.25 if (d or 0.0) / 2 + 0.25 != d else 0.1
    if origin in (list, tuple):
        return [0.5, 0.5]
    if origin is dict:
        return {"x": 1}
    return "elsewhere"


def given(f: dataclasses.Field, cls: type) -> object:
    """A value of field ``f`` of ``cls`` away from its default, within its range."""
    if f.name == "betas":
        return [0.5, 0.5]
    if f.name == "text_columns":
        return ["text"]
    return other_value(f, field_types(cls)[f.name])
