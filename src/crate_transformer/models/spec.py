"""What a model was trained on, saved with it: :class:`DataSpec` (``config.json`` → ``"data"``).

The one place every command (``crate eval``, ``crate analyze``, ``crate finetune``) reads a model's
input normalisation, class names and the data source to evaluate it on::

    model.config.data = DataSpec(source="mnist", kind="mnist", name="mnist", classes=[...], mean=[0.13], std=[0.31])
    mean, std = resolve_normalization(model, dataset)   # the model's record, else the dataset's statistics

This module imports nothing from the model (``model.py`` imports :class:`DataSpec`); :class:`DataSpec` is an option
class on :class:`~crate_transformer.config.Config`, like every other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..config import Config
from ..config_utils import Range, option

__all__ = [
    "DataSpec",
    "fit_normalization",
    "resolve_normalization",
    "resolve_data_config",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DEFAULT_NORMALIZATION",
    "INTERPOLATIONS",
]

# the ImageNet statistics every released ImageNet model normalises its input with
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# a model's ``pretrained_cfg["normalization"]`` when neither its training data nor its released weights state one
DEFAULT_NORMALIZATION = "ImageNet's (none recorded)"
# how images are resized (``pretrained_cfg["interpolation"]``)
INTERPOLATIONS = ("bilinear", "bicubic")
# the centre crop's share of the resized shorter side (timm's crop_pct)
CROP_PCT = Range(0, 1, lo_open=True, note="the crop's share of the resized shorter side")
# a channel's normalisation, on pixel values scaled to [0, 1]: a mean among them, a spread no wider than they are
MEAN = Range(0, 1, note="a channel's mean pixel value, pixels scaled to [0, 1]")
STD = Range(0, 1, lo_open=True, note="a channel's standard deviation, pixels scaled to [0, 1]")
# timm's data-config keys, which resolve_data_config takes as overrides
_DATA_KEYS = ("input_size", "img_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")

_LEGACY_KEYS = ("normalization", "mean", "std", "classes", "dataset", "data")


@dataclass
class DataSpec(Config):
    """The data a model was trained on: enough to feed it new images exactly as in training.

    ``source`` is what :func:`crate_transformer.data.open_source` takes to get the data back (a
    built-in name, an absolute path or a dataset id); ``kind`` the resolved source type; ``mean``/``std`` the
    per-channel input normalisation on the [0, 1] scale, in the model's channel count; ``image_column`` /
    ``label_column`` a Hugging Face dataset's columns when they were named (``--image-column``), else empty.
    """

    APPLIES = "always"  # a record: every field is read where the model is fed or described
    GIVEN_IN: ClassVar[str | None] = None  # a record of the data, not options: messages say DataSpec.mean

    source: str = option("", "what open_source takes to get the data back: a built-in name, a path or a dataset id")
    kind: str = option("", "the resolved source type")
    name: str = option("", "the data's name")
    classes: list[str] = option([], "the class names, in label order")
    mean: list[float] = option([], "per-channel input mean on the [0, 1] scale, in the model's channel count")
    std: list[float] = option([], "per-channel input standard deviation, as mean")
    image_column: str = option("", "a Hugging Face dataset's image column, when it was named")
    label_column: str = option("", "a dataset's label column, when it was named")

    def __post_init__(self) -> None:
        for name in ("source", "kind", "name", "image_column", "label_column"):
            v = getattr(self, name)
            if v is None:
                setattr(self, name, "")
            elif not isinstance(v, str):
                raise ValueError(f"DataSpec.{name} must be a string, got {v!r}")
        if isinstance(self.classes, (str, bytes)) or not isinstance(self.classes, Sequence):
            raise ValueError(f"DataSpec.classes must be a list of class names, got {self.classes!r}")
        self.classes = [str(c) for c in self.classes]
        self.mean, self.std = _floats("mean", self.mean), _floats("std", self.std)
        super().__post_init__()  # Config: the declared types, then validate()

    def validate(self) -> None:
        if len(self.mean) != len(self.std):
            raise ValueError(f"data normalisation has {len(self.mean)} means but {len(self.std)} stds")
        if any(not np.isfinite(v) for v in self.mean + self.std) or any(s <= 0 for s in self.std):
            raise ValueError(f"data normalisation must be finite with std > 0, got mean={self.mean} std={self.std}")

    def to_dict(self) -> dict:
        columns = ("image_column", "label_column")  # written only when named: older releases read the file too
        return {k: v for k, v in dataclasses.asdict(self).items() if v or k not in columns}

    def columns_for(self, source: str) -> dict[str, str]:
        """The named columns (``open_source``'s ``image_column`` / ``label_column``) when ``source`` is the
        recorded one, else none: another dataset has its own columns."""
        if not source or str(source) != self.source:
            return {}
        return {k: v for k, v in (("image_column", self.image_column), ("label_column", self.label_column)) if v}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *, legacy: bool | None = None) -> DataSpec | None:
        """Read a ``"data"`` entry (None or empty → None); also the free-form ``"extra"`` dict of configs
        written before 0.2 (``{"normalization": {"mean", "std"}, "classes", "dataset", "data"}``).

        ``legacy=None`` recognises the old layout by its ``normalization``/``dataset`` keys; ``legacy=True``
        reads ``d`` as an old ``extra`` dict, whose entries other than those (and top-level ``mean``/``std``)
        were free-form and never read by the library, so they are dropped.  A legacy dict with none of
        those entries gives None.
        """
        if isinstance(d, DataSpec):
            return d
        if not d:
            return None
        if not isinstance(d, Mapping):
            raise ValueError(f"a data description must be a mapping of DataSpec fields, got {type(d).__name__}")
        d = dict(d)
        if legacy or (legacy is None and ("normalization" in d or "dataset" in d)):
            if not any(k in d for k in _LEGACY_KEYS):
                return None
            norm = d.get("normalization") or {}
            d = {
                "source": d.get("data") or d.get("dataset") or "",
                "name": d.get("dataset") or "",
                "classes": d.get("classes") or [],
                "mean": norm.get("mean", d.get("mean")) or [],
                "std": norm.get("std", d.get("std")) or [],
            }
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown data description keys {unknown}; valid keys: {sorted(known)}")
        return cls(**d)

    def normalization(self, channels: int) -> tuple[list[float], list[float]] | None:
        """The recorded mean/std adapted to ``channels`` (see :func:`fit_normalization`), or None."""
        if not self.mean:
            return None
        return fit_normalization(self.mean, self.std, channels)


def _floats(name: str, values: Any) -> list[float]:
    """A list of floats from a number, a sequence of numbers or numeric strings; else a one-line error."""
    try:
        return [float(v) for v in np.ravel(np.asarray(values, dtype=object)).tolist()]
    except (TypeError, ValueError):
        raise ValueError(f"DataSpec.{name} must be a list of numbers (one per channel), got {values!r}") from None


def fit_normalization(
    mean: Sequence[float] | float, std: Sequence[float] | float, channels: int
) -> tuple[list[float], list[float]] | None:
    """Per-channel statistics for images converted to ``channels`` (as ``match_channels`` converts them).

    Matching statistics are kept, one value is repeated, RGB statistics for grey images are averaged;
    anything else cannot be adapted and gives None.
    """
    mean, std = (
        np.ravel(np.asarray(mean, dtype=np.float64)).tolist(),
        np.ravel(np.asarray(std, dtype=np.float64)).tolist(),
    )
    if len(mean) == channels and len(std) == channels:
        return mean, std
    if len(mean) == 1 and len(std) == 1:
        return mean * channels, std * channels
    if channels == 1:
        return [sum(mean) / len(mean)], [sum(std) / len(std)]
    return None


def resolve_normalization(config_or_model: Any, dataset: Any = None) -> tuple[list[float], list[float]] | None:
    """The per-channel ``(mean, std)`` on the [0, 1] scale to feed images to a model; the one resolver.

    ``config_or_model`` is a ``ModelConfig`` or anything with a ``.config`` (a model).  In order:
    the normalisation recorded in ``config.data`` (a :class:`DataSpec`), adapted to ``config.in_chans``
    by :func:`fit_normalization`; else the one a model's released weights state (its ``pretrained_cfg``, from the
    zoo entry it was loaded from); else ``dataset``'s ``mean``/``std`` (its training-pool statistics)
    adapted likewise; else None (no normalisation known).  Statistics that cannot be adapted to the
    channel count are skipped.
    """
    config = getattr(config_or_model, "config", config_or_model)
    channels = getattr(config, "in_chans", None)
    if not isinstance(channels, int):
        raise ValueError(f"resolve_normalization needs a model or a ModelConfig, got {type(config_or_model).__name__}")
    spec = DataSpec.from_dict(getattr(config, "data", None))
    if spec is not None:
        fit = spec.normalization(channels)
        if fit is not None:
            return fit
    stated = getattr(config_or_model, "pretrained_cfg", None) or {}
    if stated.get("normalization") == "released weights":  # the zoo entry the model was loaded from
        return list(stated["mean"]), list(stated["std"])
    mean, std = getattr(dataset, "mean", None), getattr(dataset, "std", None)
    if mean is not None and std is not None:
        return fit_normalization(mean, std, channels)
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _check_given(args: Mapping[str, Any], channels: int) -> None:
    """One line for an override that cannot feed this model: an ``input_size`` that is not ``(C, H, W)`` of
    positive whole numbers with the model's ``C`` channels, an ``img_size`` that is not a positive whole number, a
    ``mean`` / ``std`` of another channel count (one value, or one per channel; none is averaged)."""
    size = args.get("input_size")
    if size is not None:
        if not isinstance(size, Sequence) or len(size) != 3 or not all(_whole(v) for v in size):
            raise ValueError(f"input_size must be (channels, height, width) of positive whole numbers, got {size!r}")
        if size[0] != channels:
            raise ValueError(
                f"input_size has {size[0]} channels and the model takes {channels}; pass ({channels}, H, W)"
            )
    if args.get("img_size") is not None and not _whole(args["img_size"]):
        raise ValueError(f"img_size must be a positive whole number (pixels), got {args['img_size']!r}")
    for name in ("mean", "std"):
        given = args.get(name)
        n = None if given is None else len(np.ravel(given))
        if n is not None and n not in (1, channels):
            raise ValueError(
                f"{name} has {n} values and the model takes {channels}-channel images; pass one value per channel "
                f"({channels})"
            )


def resolve_data_config(model: Any, **args: Any) -> dict[str, Any]:
    """timm's ``resolve_data_config(model=model)``: how to turn images into this model's inputs, from its
    ``pretrained_cfg`` (:meth:`~crate_transformer.models.image_input.ImageInput.data_cfg`) with ``args`` (timm's names:
    ``input_size``, ``img_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``) overriding.
    Returns ``{"input_size": (C, H, W), "interpolation", "mean", "std", "crop_pct", "crop_mode"}``;
    :func:`crate_transformer.data.image_transform` turns it into a transform (aspect-preserving resize, centre
    crop, normalisation)."""
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    if "input_size" not in cfg:
        raise ValueError(f"{type(model).__name__} takes no images: it has no data config (input_size, mean, std)")
    unknown = sorted(set(args) - set(_DATA_KEYS))
    if unknown:
        raise ValueError(f"unknown data config key(s) {unknown}; valid: {list(_DATA_KEYS)}")
    out = {k: cfg[k] for k in ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")}
    channels = out["input_size"][0]
    _check_given(args, channels)
    if args.get("img_size") is not None:
        out["input_size"] = (channels, int(args["img_size"]), int(args["img_size"]))
    out.update({k: tuple(v) if k == "input_size" else v for k, v in args.items() if k != "img_size" and v is not None})
    fit = fit_normalization(out["mean"], out["std"], channels)
    if fit is None:
        raise ValueError(f"mean/std of {len(np.ravel(out['mean']))} values cannot feed {channels}-channel images")
    out["mean"], out["std"] = tuple(fit[0]), tuple(fit[1])
    for name, rule in (("mean", MEAN), ("std", STD)):
        for value in out[name]:
            rule.check(name, value)
    if out["interpolation"] not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {out['interpolation']!r}; choose one of {INTERPOLATIONS}")
    CROP_PCT.check("crop_pct", float(out["crop_pct"]))
    return out
