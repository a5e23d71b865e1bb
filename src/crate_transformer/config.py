"""One base for every model config (classifier, CRATE-MAE, language model, CRATE-α, ...): HF's
``PretrainedConfig`` idea as a dataclass mixin.

A family's config is a ``@dataclass`` that subclasses :class:`Config` and writes only what is its own —
its fields and a :meth:`Config.validate` method.  The base does the rest, once for every family:

* **coercion** — YAML, ``KEY=VALUE`` command-line pairs and JSON values become the declared types
  (``"5e-2"`` → 0.05, ``"64"`` → 64; :func:`~crate_transformer.config_utils.coerce_fields`);
* **numbers** — every ``float`` field must be finite (``eta=nan`` fails here, not after training) and
  obey its range in :attr:`Config.RULES`;
* **checks** for the common cases (:meth:`Config.check_choice`, :meth:`Config.check_positive`), each a
  one-line ``ValueError`` naming the field, the value and a valid example;
* **serialisation** — :meth:`to_dict` / :meth:`from_dict` with the unknown-key check and a format
  version (``config_version``), so a ``config.json`` from a newer release is refused with the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from .config_utils import coerce_fields, field_types

__all__ = ["Config"]

C = TypeVar("C", bound="Config")


class Config:
    """Base of the model configs; see the module docstring.  Subclasses are ``@dataclass``es."""

    VERSION: ClassVar[int] = 1  # config.json format; bumped when a stored field changes meaning
    # name -> (predicate, rule in words) for float fields with a range, e.g. {"eta": (lambda v: v > 0, " > 0")};
    # every other float field must merely be finite
    RULES: ClassVar[Mapping[str, tuple[Callable[[float], bool], str]]] = {}

    def __post_init__(self) -> None:
        current = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in coerce_fields(type(self), current).items():
            object.__setattr__(self, name, value)
        self.check_numbers()
        self.validate()

    def validate(self) -> None:
        """The family's own checks (called after coercion and :meth:`check_numbers`)."""

    # ---------------------------------------------------------------- checks
    def check_numbers(self) -> None:
        """Every ``float`` field is finite and obeys its :attr:`RULES` entry, if any."""
        for name, tp in field_types(type(self)).items():
            v = getattr(self, name)
            if not isinstance(v, float) or tp not in (float, float | None):
                continue
            ok, rule = self.RULES.get(name, (lambda _: True, ""))
            if not (math.isfinite(v) and ok(v)):
                raise ValueError(f"{name} must be a finite number{rule}, got {v!r}; e.g. {name}={self._example(name)}")

    def check_choice(self, name: str, allowed: Iterable[str]) -> None:
        """``getattr(self, name)`` is one of ``allowed``."""
        allowed = tuple(allowed)
        if getattr(self, name) not in allowed:
            raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of {allowed}")

    def check_positive(self, *names: str) -> None:
        """Each named integer field is > 0."""
        for name in names:
            v = getattr(self, name)
            if v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}; e.g. {name}={self._example(name)}")

    def _example(self, name: str) -> Any:
        field = {f.name: f for f in dataclasses.fields(self)}[name]
        return field.default if field.default is not dataclasses.MISSING else getattr(self, name)

    # ---------------------------------------------------------------- serialisation
    def to_dict(self) -> dict:
        """Every field as plain JSON values (nested dataclasses as dicts)."""
        return dataclasses.asdict(self)

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
