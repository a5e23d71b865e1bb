"""One base for every option class: the model configs (classifier, CRATE-MAE, language model, CRATE-α, ...; HF's
``PretrainedConfig`` idea as a dataclass mixin), the training option groups, the tasks' options and the data
description saved with a model.

An option class is a ``@dataclass`` that subclasses :class:`Config` and writes only what is its own — its
fields, each declared once with :func:`~crate_transformer.config_utils.option` (default, type, help, range or
choices, where it applies), and a :meth:`Config.validate` method for checks across fields.  The base
does the rest, once for every class:

* **coercion** — YAML, ``KEY=VALUE`` command-line pairs and JSON values become the declared types
  (``"5e-2"`` → 0.05, ``"64"`` → 64; :func:`~crate_transformer.config_utils.coerce_fields`);
* **checks**, one rule for every option class — a field's declared choices and range
  (:class:`~crate_transformer.config_utils.Range`), every float finite (``eta=nan`` fails here, not after
  training): each a one-line ``ValueError`` naming the field, the value and a valid example
  (:meth:`Config.check_fields`);
* **serialisation** — :meth:`to_dict` / :meth:`from_dict` with the unknown-key check and a format
  version (``config_version``), so a ``config.json`` from a newer release is refused with the fix.

A model config also says what its model is and what can be measured in it — the capability contract the
tasks, the analysis, the loaders and the CLI ask instead of checking a class or an ``arch`` name:
:attr:`Config.kind` (one of :data:`KINDS`), :attr:`~Config.white_box`, :attr:`~Config.sparse_output` (JMLR
Figs. 14-15), :attr:`~Config.layer_blocks` and :attr:`~Config.pipeline_tag`, each described where it is
defined.  The model adds what only the built model knows (``Model.code_sites``: where its sparse codes are, its
extra files); see :mod:`crate_transformer.models.base`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from .config_utils import POSITIVE, Range, coerce_fields, field_about, field_place
from .errors import OptionError, short_repr

__all__ = ["Config", "check_option", "KINDS", "IMAGE_CLASSIFIER", "MASKED_AUTOENCODER", "LANGUAGE_MODEL"]

# what a model is (``Config.kind``): the question a training task, the analysis or a loader asks of it
IMAGE_CLASSIFIER = "image classifier"  # images → class logits; the classification (and dino) task trains it
MASKED_AUTOENCODER = "masked autoencoder"  # images → reconstructed patches; the mae task trains it
LANGUAGE_MODEL = "language model"  # token ids → token logits; the lm task trains it
KINDS = (IMAGE_CLASSIFIER, MASKED_AUTOENCODER, LANGUAGE_MODEL)

C = TypeVar("C", bound="Config")


def check_option(cls: type, name: str, value: Any) -> None:
    """The one check of an option's value, for :class:`Config` and any dataclass of options (``TrainConfig``):
    each value (lists element-wise; ``None`` = unset) is one of the choices and within the
    :class:`~crate_transformer.config_utils.Range` its declaration (``option(..., choices=, range=)``) gives, the
    field's metadata and nothing else; a float without a range is finite.  A one-line ``ValueError`` with an
    example."""
    meta = {f.name: f for f in dataclasses.fields(cls)}[name].metadata
    choices, rule = meta.get("choices"), meta.get("range")
    for x in value if isinstance(value, (list, tuple)) else [value]:
        if x is None:
            continue
        if choices is not None and x not in choices:
            raise ValueError(f"unknown {name} {short_repr(x)}; choose one of {tuple(choices)}")
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            continue
        r = rule or (Range() if isinstance(x, float) else None)  # every float is at least finite
        if r is not None and not r.ok(x):
            default = _field_default(cls, name, x)
            example = f"; e.g. {field_place(cls, name, default)}" if default not in (None, [], ()) else ""
            raise OptionError(f"{field_place(cls, name)}{r.requirement(x)}{example}", **field_about(cls, name))


def _field_default(cls: type, name: str, fallback: Any = None) -> Any:
    """Field ``name``'s default (a fresh one for a default factory), else ``fallback``."""
    value = _default({f.name: f for f in dataclasses.fields(cls)}[name])
    return fallback if value is dataclasses.MISSING else value


class Config:
    """Base of every option class — the model configs, the training groups, the tasks' options, the data
    description; see the module docstring.  Subclasses are ``@dataclass``es."""

    VERSION: ClassVar[int] = 1  # config.json format; bumped when a stored field changes meaning
    # fields added after their format was in use, left out of to_dict() while at their default: the files of
    # every model that does not use them (config.json, the checksums over it) stay byte-identical
    OMIT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()
    # the order of the keys in to_dict() (config.json) where it is not the fields' (a config whose fields moved into
    # a shared base keeps its files byte-identical); keys not named here follow in field order
    KEY_ORDER: ClassVar[tuple[str, ...]] = ()
    # what a model of this config is (one of KINDS; "" for option classes that describe no model)
    kind: ClassVar[str] = ""
    # how messages name the fields (config_utils.field_place): "" options of their own (--epochs); a model
    # config's are entries of "model_args" (--model-args dim=384); None for a record no option gives
    GIVEN_IN: ClassVar[str | None] = ""
    # a model config's counts of numbered blocks → the blocks' key prefix in its weights ({"depth": "layers"}): a
    # count read from a file is bounded by the keys of the weights beside it (loading.weights.check_sizes)
    BLOCK_COUNTS: ClassVar[Mapping[str, str]] = {}

    # ---------------------------------------------------------------- the capability contract (module docstring)
    @property
    def pipeline_tag(self) -> str:
        """The Hugging Face Hub pipeline tag of a model of this config (its model card's task)."""
        return ""

    @property
    def white_box(self) -> bool:
        """Whether the layers are CRATE layers (MSSA, then a sparsification step) the analysis measures."""
        return False

    @property
    def sparse_output(self) -> bool:
        """Whether every layer ends with CRATE's ISTA step (outputs with exact zeros, JMLR Figs. 14-15)."""
        return False

    @property
    def layer_blocks(self) -> tuple[str, str]:
        """The layer's two blocks: attention (``"mssa"``, ``"mhsa"``) and the second block (``"ista"``, ``"mlp"``,
        ``"odl"``, ``"ista_overcomplete"``); ``("", "")`` for a config that describes no layers."""
        return ("", "")

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
        """Every field obeys its declared choices and range (lists element-wise); every other float is finite.
        One-line ``ValueError``."""
        for f in dataclasses.fields(self):
            check_option(type(self), f.name, getattr(self, f.name))
        self.check_applicable()

    def check_applicable(self) -> None:
        """A field declared ``option(..., applies={"other": values})`` is read only while field ``other`` holds one
        of ``values``; set away from its default while ``other`` holds another, it is refused in one line rather
        than accepted and ignored (``--momentum 0.5`` with ``--optimizer adamw``).  Every option class goes
        through here, whether its values came from flags, a config file or Python."""
        for f in dataclasses.fields(self):
            applies = f.metadata.get("applies")
            if not applies or getattr(self, f.name) == _default(f):
                continue
            for other, allowed in applies.items():
                now = getattr(self, other)
                if now not in allowed:
                    raise OptionError(
                        f"{field_place(type(self), f.name)} applies only with {other} {' / '.join(allowed)}, not "
                        f"{now!r}: drop it, or pass {field_place(type(self), other, allowed[0])}",
                        **field_about(type(self), f.name, other),
                    )

    @classmethod
    def check_field(cls, name: str, value: Any) -> None:
        """One value of field ``name`` alone (``--model-args eta=inf`` before any model or run folder exists),
        coerced to the field's type, then checked as :meth:`check_fields` checks it."""
        check_option(cls, name, coerce_fields(cls, {name: value})[name])

    def check_positive(self, *names: str) -> None:
        """Each named integer field is > 0 (:data:`~crate_transformer.config_utils.POSITIVE`)."""
        for name in names:
            v = getattr(self, name)
            if not POSITIVE.ok(v):
                example = field_place(type(self), name, _field_default(type(self), name, v))
                message = f"{field_place(type(self), name)}{POSITIVE.requirement(v)}; e.g. {example}"
                raise OptionError(message, **field_about(type(self), name))

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
        version = d.pop("config_version", 1)
        if not isinstance(version, int) or version > cls.VERSION:
            raise ValueError(
                f"config_version {version!r} is newer than this crate_transformer reads ({cls.VERSION}); "
                "upgrade crate_transformer (pip install -U crate-transformer)"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys: {sorted(known)}")
        return cls(**d)

    @classmethod
    def upgrade(cls, d: dict) -> dict:
        """Convert an older stored layout to the current fields (the default: nothing to convert)."""
        return d

    def replace(self: C, **changes: Any) -> C:
        """A validated copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


def _default(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one for a default factory)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default
