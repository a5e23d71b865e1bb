"""The one declaration of an option (:func:`option`), its numeric :class:`Range`, where it applies, and the
coercion of loosely typed values (YAML, ``KEY=VALUE`` pairs, JSON) to a dataclass's field types.

YAML 1.1 reads ``5e-2`` as a string and ``--model-args dim=64`` arrives as ``"64"``: :func:`coerce_fields` turns such
values into the declared types or raises one ``ValueError`` naming the field, the value and a valid example. By
type: ``int`` (also ``64.0``, ``"1e3"``; not bools or ``2.5``), ``float`` (numbers and numeric text; finiteness is
checked by the config), ``bool`` (``0``/``1``, ``true/false/yes/no/on/off``), ``str`` (numbers converted), ``X | None``
(``"none"``/``"null"`` unless ``X`` is ``str``), ``list``/``tuple`` (element-wise; ``"[1, 2]"`` or ``"0.5,0.5"``),
``dict`` (values coerced), a dataclass (an instance, or a mapping read by its ``from_dict``); anything else passes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .errors import OptionError, short_repr

__all__ = ["coerce_fields", "field_types", "field_place", "field_about", "option_name", "default_of", "Range"]
__all__ += ["POSITIVE", "NON_NEGATIVE", "option", "override", "fields_applicability", "ALWAYS", "OBSERVED", "ON"]
__all__ += ["applies_where", "applies_words"]

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"none", "null", "~"}


def option(default: Any, help: str, **meta: Any) -> Any:
    """The one declaration of an option: a dataclass field with its default, its type (the annotation) and what
    describes it to users, read by the checks (:func:`~crate_transformer.config.check_option`), the flags, the
    config files, the Python keywords and ``config.json`` alike.

    ``help`` says what it does; the keywords ``meta`` (those left ``None`` or ``False`` are not recorded):
    ``choices``, the values it may take; ``range`` (a :class:`Range`) the numbers; ``applies`` where it applies:
    :data:`ALWAYS`, or a condition (``{"optimizer": ("sgd", "lars")}``: read only while that field holds one of
    those; several fields: all must hold; a tuple of such mappings: any of them), absent where its class states it
    once (:func:`fields_applicability`); ``metavar`` and ``shown`` (the default in words) are for ``--help``;
    ``name`` its name in flat config files and on the command line, when it differs from the field's; ``path`` a
    file or folder (an empty string is refused); ``fixed`` a task option the checkpoint depends on (frozen on
    resume).  Any other keyword is a free-form entry for the command line (``basic``: shown by ``--help``;
    ``by_command``: set by the command, no flag); the library does not read them.  A family's other default for an
    inherited option is :func:`override`.
    """
    meta = {"help": help, **{k: v for k, v in meta.items() if v is not None and v is not False}}
    if isinstance(default, (dict, list)):  # every instance gets its own copy
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def override(cls: type, name: str, default: Any, **changes: Any) -> Any:
    """Option ``name`` of dataclass ``cls`` declared again with another default (and the entries of ``changes``,
    e.g. ``choices``), its help, range and choices otherwise kept: a family's own default for an option it
    inherits or shares (``lambd: float = override(LayerConfig, "lambd", 0.5)``, CRATE-MAE's λ)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields or "help" not in fields[name].metadata:
        raise ValueError(f"{cls.__name__} declares no option {name!r} to override; declare it with option()")
    meta = dict(fields[name].metadata)
    return option(default, **{**meta, **changes})


ALWAYS = "always"  # an option read whenever its class is used (an applicability statement)
OBSERVED = "observed"  # a model config's field: refused when the model built never reads it (models._registry.build)
ON = "on"  # a condition's value: the field is set (non-zero, non-empty, not None)


def fields_applicability(cls: type) -> dict[str, Any]:
    """Where each option of dataclass ``cls`` applies: its own ``applies`` declaration, else the statement its class
    makes once for all of them (``APPLIES``: :data:`ALWAYS` where every field of it is always read, :data:`OBSERVED`
    for a model config), else ``None``: undeclared, which the walking test refuses."""
    return {f.name: f.metadata.get("applies", getattr(cls, "APPLIES", None)) for f in dataclasses.fields(cls)}


def applies_where(applies: Any, values: Mapping[str, Any]) -> bool | None:
    """Whether an option declared ``applies`` is read where its fields hold ``values`` (field → value): True or
    False, or None where ``values`` lack a field that would decide it (an enclosing config decides)."""
    if applies is None or isinstance(applies, str):
        return True
    undecided = False
    for alternative in [applies] if isinstance(applies, Mapping) else applies:
        if not set(alternative) <= set(values):
            undecided = True
        elif all(bool(values[k]) if v == ON else values[k] in v for k, v in alternative.items()):
            return True
    return None if undecided else False


def applies_words(applies: Any, name: Callable[[str], str] = str) -> str:
    """A condition in words, fields named by ``name``: ``augment is crop-flip / randaugment, or task is mae``."""
    alternatives = [applies] if isinstance(applies, Mapping) else applies

    def one(k: str, v: Any) -> str:
        return f"{name(k)} is set" if v == ON else f"{name(k)} is {' / '.join(map(str, v))}"

    return ", or ".join(" and ".join(one(k, v) for k, v in alt.items()) for alt in alternatives)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one for a default factory; ``dataclasses.MISSING`` for none)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def option_name(f: dataclasses.Field) -> str:
    """A field's option name: its ``--flag`` (dashes for underscores) and its key in a flat config file."""
    return f.metadata.get("name", f.name)


def field_place(cls: type, name: str, *value: Any) -> str:
    """How a message names field ``name`` of dataclass ``cls`` (suggesting ``value`` when given), by what
    ``cls.GIVEN_IN`` says its fields are: ``""`` options of their own and an option's name, entries of that
    option, both as their Python argument (``epochs``, ``dim=384``; :func:`field_about` tells the CLI which);
    absent or None, no option (``DataSpec.mean``)."""
    if getattr(cls, "GIVEN_IN", None) is not None:
        name = next((option_name(f) for f in dataclasses.fields(cls) if f.name == name), name)
    elif not value:
        return f"{cls.__name__}.{name}"
    return f"{name}={value[0]!r}" if value else name


def field_about(cls: type, *names: str) -> dict[str, Any]:
    """The ``option=`` / ``within=`` keywords of an :class:`~.errors.OptionError` naming fields ``names`` of
    ``cls`` as :func:`field_place` does (``{}`` where they are no options)."""
    within = getattr(cls, "GIVEN_IN", None)
    if within is None:
        return {}
    fields = {f.name: option_name(f) for f in dataclasses.fields(cls)}
    return {"option": tuple(fields.get(n, n) for n in names), "within": within}


@functools.lru_cache(maxsize=64)
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of every field of dataclass ``cls`` (string annotations evaluated)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"field_types needs a dataclass type, got {cls!r}")
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def coerce_fields(cls: type, mapping: Mapping[str, Any], *, allow_unknown: bool = False) -> dict[str, Any]:
    """A copy of ``mapping`` with every value coerced to the type of ``cls``'s field of that name (the module
    docstring); an unknown key is a ``ValueError`` listing the valid ones (passed through with ``allow_unknown``), a
    value that cannot be coerced a one-line :class:`~.errors.OptionError` naming the field (:func:`field_place`):
    ``epochs must be an integer, got 'x' (str); e.g. epochs=40``."""
    types_ = field_types(cls)
    unknown = sorted(set(mapping) - set(types_))
    if unknown and not allow_unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys: {sorted(types_)}")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}  # an example for the message (not factories)
    out = {}
    for key, value in mapping.items():
        if key not in types_:
            out[key] = value
            continue
        try:
            out[key] = _coerce(value, types_[key])
        except _CoerceError as e:
            shown = defaults[key] not in (None, dataclasses.MISSING)
            example = f"; e.g. {field_place(cls, key, defaults[key])}" if shown else ""
            got = f"must be {e.args[0]}, got {short_repr(value)} ({type(value).__name__})"
            raise OptionError(f"{field_place(cls, key)} {got}{example}", **field_about(cls, key)) from None
    return out


# --------------------------------------------------------------------------- internals
class _CoerceError(Exception):
    """What a value must be (``"an integer"``), for the message :func:`coerce_fields` writes."""


def _coerce(value: Any, tp: Any) -> Any:
    if tp is Any or tp is object:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None and len(inner) < len(args):  # Optional[X] / X | None
            return None
        if len(inner) != 1 or len(args) != 2:
            return value  # a union of several types: not ours to decide
        if isinstance(value, str) and value.strip().lower() in _NONE and inner[0] is not str:
            return None
        try:
            return _coerce(value, inner[0])
        except _CoerceError as e:
            raise _CoerceError(f"{e.args[0]} or None") from None
    if tp is bool:
        return _to_bool(value)
    if tp is int:
        return _to_int(value)
    if tp is float:
        return float(_number(value, "a number"))
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _CoerceError("a string")
    if tp in (list, tuple) or origin in (list, tuple):
        return _to_sequence(value, tp, origin or tp)
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise _CoerceError("a mapping (dict)")
        return {k: _coerce(v, args[1]) for k, v in value.items()} if len(args) == 2 else dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            reader = getattr(tp, "from_dict", None)
            return reader(value) if callable(reader) else tp(**value)
        raise _CoerceError(f"a {tp.__name__} or a mapping of its fields")
    return value


def _number(value: Any, what: str) -> float | int:
    if isinstance(value, bool):
        raise _CoerceError(what)
    if isinstance(value, (int, float)):
        return value
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:  # numpy / torch scalar
        return _number(value.item(), what)
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            return int(text) if text.lstrip("+-").isdigit() else float(text)
        except ValueError:
            raise _CoerceError(what) from None
    raise _CoerceError(what)


def _to_int(value: Any) -> int:
    v = _number(value, "an integer")
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        raise _CoerceError("an integer")
    return int(v)


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = value.strip().lower() if isinstance(value, str) else None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise _CoerceError("a boolean (true/false)")


def _to_sequence(value: Any, tp: Any, kind: type) -> list | tuple:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import yaml

            from .io.sidecars import load_yaml

            try:
                value = load_yaml(text)
            except (yaml.YAMLError, ValueError):
                raise _CoerceError("a list") from None
        else:
            value = [part.strip() for part in text.split(",")] if text else []
    if not isinstance(value, (list, tuple)):
        raise _CoerceError("a list")
    args = typing.get_args(tp)
    fixed = kind is tuple and args and args[-1] is not Ellipsis  # tuple[X, Y]: one type per place
    if fixed and len(args) != len(value):
        raise _CoerceError(f"a tuple of {len(args)} values")
    try:  # list[X], tuple[X, ...]: X for each; a bare list: any
        items = [_coerce(v, t) for v, t in zip(value, args if fixed else [args[0] if args else Any] * len(value))]
    except _CoerceError as e:
        raise _CoerceError(f"a list whose items are each {e.args[0]}") from None
    return tuple(items) if kind is tuple else items


# --------------------------------------------------------------------------- numeric ranges
@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric option may take: finite, and within ``lo``/``hi`` (``None``: unbounded; a bound is
    excluded when ``lo_open``/``hi_open``).  The one rule behind every numeric option: a field carries it as
    ``option(..., range=...)`` (checked when its config is built, shown by ``--help``) and an API function calls
    :meth:`check` itself, so the CLI and the API refuse the same values with the same words."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    note: str = ""  # what a special value means, e.g. "0 = greedy"

    def words(self) -> str:
        """``in (0, 1]``, ``> 0``, ``>= 0``, or ``""`` (any finite number)."""
        if self.lo is not None and self.hi is not None:
            return f" in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f" {'>' if self.lo_open else '>='} {self.lo:g}"
        if self.hi is not None:
            return f" {'<' if self.hi_open else '<='} {self.hi:g}"
        return ""

    def ok(self, value: float) -> bool:
        """Whether ``value`` is finite (an ``int``, for integer ranges: ``8.0`` is a float, as torch and ``range``
        see it; text such as ``"8"`` is coerced before it is checked) and within the bounds."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return not (self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi))

    def message(self, name: str, value: Any) -> str:
        """``top_p must be a finite number in (0, 1] (1 = off), got 1.5``; ``depth must be a positive integer,
        got 0``."""
        return name + self.requirement(value)

    def requirement(self, value: Any) -> str:
        """What follows the name in :meth:`message`, `` must be a positive integer, got 0`` (an ``OptionError``
        puts the option's name before it and says ``option=name``, so the command line names the flag)."""
        kind, words = ("an integer" if self.integer else "a finite number"), self.words()
        if self.integer and self.lo == 0 and self.hi is None:
            kind, words = ("a positive integer" if self.lo_open else "a non-negative integer"), ""
        note = f" ({self.note})" if self.note else ""
        looks_whole = isinstance(value, bool) or (isinstance(value, float) and value.is_integer())  # 8.0, True
        of_type = f" ({type(value).__name__})" if self.integer and looks_whole else ""
        return f" must be {kind}{words}{note}, got {short_repr(value)}{of_type}"

    def check(self, name: str, value: Any, fix: str = "") -> None:
        """Raise a one-line ``ValueError`` (:meth:`message`, then ``; fix`` when given) unless :meth:`ok`."""
        if not self.ok(value):
            raise ValueError(self.message(name, value) + (f"; {fix}" if fix else ""))


POSITIVE = Range(0, lo_open=True, integer=True)  # counts and sizes: 1, 2, ...
NON_NEGATIVE = Range(0, integer=True)  # counts where 0 means none or off
