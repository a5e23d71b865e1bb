"""One base for every option class (:class:`Config`): the model configs (HF's ``PretrainedConfig`` idea as a
dataclass mixin), the training option groups, the tasks' options and the data description saved with a model.

A subclass is a ``@dataclass`` of :func:`~crate_transformer.config_utils.option` fields and a :meth:`Config.validate`
for checks across fields; the base coerces values to the declared types, checks every field (:func:`check_option`:
choices, :class:`~crate_transformer.config_utils.Range`, every float finite; :func:`check_applicable`: where it
applies) and reads and writes ``config.json`` (:meth:`~Config.to_dict` / :meth:`~Config.from_dict`, versioned).
A model family's config extends it through :class:`~crate_transformer.models.contract.FamilyConfig`, which adds the
capability contract (``kind``, ``white_box``, ``sparse_output``, ``layer_blocks``, ``pipeline_tag``,
``BLOCK_COUNTS``); an option class of a training, a task or a command has none of it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, TypeVar

from .config_utils import (
    ON,
    POSITIVE,
    Range,
    applies_where,
    applies_words,
    coerce_fields,
    default_of,
    field_about,
    field_place,
)
from .errors import OptionError, short_repr

__all__ = ["Config", "check_option", "check_value", "check_applicable", "from_given", "pop_version", "inapplicable"]

C = TypeVar("C", bound="Config")
T = TypeVar("T")
Given = Collection[str] | None  # the options the user gave, by name; None: those away from their default


def check_option(cls: type, name: str, value: Any) -> None:
    """The one check of an option's value, for :class:`Config` and any dataclass of options (``TrainConfig``):
    each value (lists element-wise; ``None`` = unset) is one of the choices and within the
    :class:`~crate_transformer.config_utils.Range` its declaration (``option(..., choices=, range=)``) gives, the
    field's metadata and nothing else; a float without a range is finite; a ``path`` is not empty (``--out ""``
    would otherwise be an auto-named folder, silently).  A one-line ``ValueError`` with an example."""
    meta = _fields(cls)[name].metadata
    choices, rule = meta.get("choices"), meta.get("range")
    if meta.get("path") and isinstance(value, str) and not value.strip():
        where = field_place(cls, name)
        raise OptionError(f"{where} is an empty path; give a folder or file, or leave it out", **field_about(cls, name))
    for x in value if isinstance(value, (list, tuple)) else [value]:
        if x is None:
            continue
        if choices is not None and x not in choices:
            raise ValueError(f"unknown {name} {short_repr(x)}; choose one of {tuple(choices)}")
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            continue
        r = rule or (Range() if isinstance(x, float) else None)  # every float is at least finite
        if r is not None and not r.ok(x):
            raise _out_of_range(cls, name, r, x)


def check_value(cls: type, name: str, value: Any) -> None:
    """One value of field ``name`` of dataclass ``cls`` alone (``--model-args eta=inf``, a ``--config`` file's key,
    before any model or run exists), coerced to the field's type, then checked by :func:`check_option`."""
    check_option(cls, name, coerce_fields(cls, {name: value})[name])


def _out_of_range(cls: type, name: str, rule: Range, value: Any) -> OptionError:
    """The one-line error of ``value`` outside ``rule`` (``Range.requirement``), the default as its example."""
    default = _field_default(cls, name, value)
    example = f"; e.g. {field_place(cls, name, default)}" if default not in (None, [], ()) else ""
    return OptionError(f"{field_place(cls, name)}{rule.requirement(value)}{example}", **field_about(cls, name))


def _field_default(cls: type, name: str, fallback: Any = None) -> Any:
    """Field ``name``'s default (a fresh one for a default factory), else ``fallback``."""
    value = default_of(_fields(cls)[name])
    return fallback if value is dataclasses.MISSING else value


class Config:
    """Base of every option class (the module docstring); subclasses are ``@dataclass``es."""

    VERSION: ClassVar[int] = 1  # config.json format; bumped when a stored field changes meaning
    # fields added after their format was in use, left out of to_dict() while at their default: the files of
    # every model that does not use them (config.json, the checksums over it) stay byte-identical
    OMIT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()
    # the order of the keys in to_dict() (config.json) where it is not the fields' (a config whose fields moved into
    # a shared base keeps its files byte-identical); keys not named here follow in field order
    KEY_ORDER: ClassVar[tuple[str, ...]] = ()
    # how messages name the fields (config_utils.field_place): "" options of their own (--epochs); a model
    # config's are entries of "model_args" (--model-args dim=384); None for a record no option gives
    GIVEN_IN: ClassVar[str | None] = ""

    def __post_init__(self) -> None:
        current = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in coerce_fields(type(self), current).items():
            object.__setattr__(self, name, value)
        self.check_fields()
        self.validate()

    def validate(self) -> None:
        """The class's own checks across fields (called after coercion and :meth:`check_fields`)."""

    # ---------------------------------------------------------------- checks: the one rule for every option class
    def check_fields(self) -> None:
        """Every field obeys its declaration (:func:`check_option`) and applies where it is set."""
        for f in dataclasses.fields(self):
            check_option(type(self), f.name, getattr(self, f.name))
        self.check_applicable()

    def check_applicable(self) -> None:
        """:func:`check_applicable` on this class's own fields (conditions on fields outside it are the enclosing
        config's, ``TrainConfig``'s): ``--momentum 0.5`` with ``--optimizer adamw`` is refused, not ignored."""
        owners = dict.fromkeys(_fields(type(self)), type(self))
        check_applicable({n: getattr(self, n) for n in owners}, owners)

    def check_positive(self, *names: str) -> None:
        """Each named integer field is > 0 (:data:`~crate_transformer.config_utils.POSITIVE`)."""
        for name in names:
            if not POSITIVE.ok(v := getattr(self, name)):
                raise _out_of_range(type(self), name, POSITIVE, v)

    # ---------------------------------------------------------------- serialisation
    def to_dict(self) -> dict:
        """Every field as plain JSON values (nested dataclasses as dicts, by their own ``to_dict`` where they have
        one), less :attr:`OMIT_AT_DEFAULT` fields at their default (:meth:`from_dict` restores those)."""
        d = dataclasses.asdict(self)
        for f in dataclasses.fields(self):  # a nested record that writes itself (DataSpec) decides its own keys
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value) and hasattr(value, "to_dict"):
                d[f.name] = value.to_dict()
        for name in self.OMIT_AT_DEFAULT:
            if d[name] == _field_default(type(self), name):
                del d[name]
        if self.KEY_ORDER:
            rest = {k: v for k, v in d.items() if k not in self.KEY_ORDER}
            d = {**{k: d[k] for k in self.KEY_ORDER if k in d}, **rest}
        return d

    @classmethod
    def from_dict(cls: type[C], d: Mapping[str, Any]) -> C:
        """Read :meth:`to_dict` output (``config.json``); unknown keys and newer format versions are refused."""
        d = dict(cls.upgrade(dict(d)))
        pop_version(d, cls.VERSION)
        return cls(**coerce_fields(cls, d))  # an unknown key: one line naming the valid ones

    @classmethod
    def upgrade(cls, d: dict) -> dict:
        """Convert an older stored layout to the current fields (the default: nothing to convert)."""
        return d

    def replace(self: C, **changes: Any) -> C:
        """A validated copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


def from_given(cls: type[T], **values: Any) -> T:
    """``cls(**values)`` (any dataclass of options), ``values`` being what the user wrote: one that cannot apply is
    refused at any value, its default too (issue 48), where building ``cls`` refuses those away from their default."""
    built, owners = cls(**values), dict.fromkeys(_fields(cls), cls)
    check_applicable({n: getattr(built, n) for n in owners}, owners, given=set(values))
    return built


def pop_version(d: dict, newest: int) -> int:
    """``d``'s ``config_version`` (1 where it has none), taken out of it; a newer one than ``newest`` is refused."""
    version = d.pop("config_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version > newest:
        raise ValueError(
            f"config_version {version!r} is newer than this crate_transformer reads ({newest}); "
            "upgrade crate_transformer (pip install -U crate-transformer)"
        )
    return version


@functools.lru_cache(maxsize=256)
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def inapplicable(values: Mapping, owners: Mapping[str, type], seen: Mapping = {}, given: Given = None) -> list[str]:
    """The fields of ``owners`` (name → the options class declaring it) that were ``given`` (by name, at any value;
    None: set away from their default in ``values``, name → value) where their ``applies`` condition does not hold (on
    ``values`` updated with ``seen``: a value as the conditions see it, e.g. ``augment`` ``auto`` resolved)."""
    seen, out = {**values, **seen}, []
    for name, cls in owners.items():
        f = _fields(cls)[name]
        applies = f.metadata.get("applies")
        if applies is None or isinstance(applies, str):
            continue
        if name not in given if given is not None else values[name] == default_of(f):
            continue
        if applies_where(applies, seen) is False:
            out.append(name)
    return out


def applied(cls: type, values: Mapping[str, Any], given: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """``values`` (field of dataclass ``cls`` → value) less those that cannot apply there and are not in ``given``: a
    saved run's option that the options given now leave unread goes back to its default, which changes nothing."""
    out, defaults = dict(values), {n: default_of(f) for n, f in _fields(cls).items()}
    while dropped := inapplicable({**defaults, **out}, dict.fromkeys(defaults, cls), given=set(out) - set(given)):
        out = {k: v for k, v in out.items() if k not in dropped}
    return out


def check_applicable(values: Mapping, owners: Mapping[str, type], seen: Mapping = {}, given: Given = None) -> None:
    """The one enforcement of ``option(..., applies=...)``: the first of :func:`inapplicable` is a one-line
    :class:`~.errors.OptionError` naming the option, the condition and the fix: ``crop_scale applies only when
    augment is crop-flip or randaugment; augment is translate: drop crop_scale or pass augment='crop-flip'``."""

    def place(name: str, *value: Any) -> str:
        return field_place(owners[name], name, *value)

    def now(k: str) -> str:
        shown = _plain(values[k])
        return f"{shown} ({seen[k]!r} here)" if k in seen and seen[k] != values[k] else shown

    for name in inapplicable(values, owners, seen, given)[:1]:
        applies = _fields(owners[name])[name].metadata["applies"]
        alternatives = [applies] if isinstance(applies, Mapping) else list(applies)
        keys = list(dict.fromkeys(k for alt in alternatives for k in alt))
        state = ", ".join(f"{place(k)} is {now(k)}" for k in keys)
        unmet = {k: v for k, v in alternatives[0].items() if applies_where({k: v}, {**values, **seen}) is False}
        to_set = [place(k) for k, v in unmet.items() if v == ON]
        to_pass = " ".join(place(k, v[0]) for k, v in unmet.items() if v != ON)
        message = f"{place(name)} applies only when {applies_words(applies, place)}; {state}: drop {place(name)}"
        about = field_about(owners[name], name)
        if about:
            # the task is a command's choice, not a flag of it: the CLI leaves the word "task" as it is
            named = [name, *(k for k in keys if k != "task")]
            about["option"] = tuple(field_about(owners[k], k).get("option", (k,))[0] for k in named)
        if to_pass:
            raise OptionError(f"{message} or pass {to_pass}", **about)
        raise OptionError(f"{message} or set {' and '.join(to_set)}", **about)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) and value else short_repr(value)
