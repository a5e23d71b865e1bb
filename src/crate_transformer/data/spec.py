"""What a model was trained on, saved with it: :class:`DataSpec` (``config.json`` → ``"data"``).

The one place every command (``crate eval``, ``crate analyze``, ``crate finetune``) reads a model's
input normalisation, class names and the data source to evaluate it on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DataSpec", "fit_normalization"]


@dataclass
class DataSpec:
    """The data a model was trained on: enough to feed it new images exactly as in training.

    ``source`` is what :func:`crate_transformer.data.open_source` takes to get the data back (a
    built-in name or an absolute path); ``kind`` the resolved source type; ``mean``/``std`` the
    per-channel input normalisation on the [0, 1] scale, in the model's channel count.
    """

    source: str = ""
    kind: str = ""
    name: str = ""
    classes: list[str] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.classes = [str(c) for c in self.classes]
        self.mean = [float(v) for v in self.mean]
        self.std = [float(v) for v in self.std]
        if len(self.mean) != len(self.std):
            raise ValueError(f"data normalisation has {len(self.mean)} means but {len(self.std)} stds")
        if any(not np.isfinite(v) for v in self.mean + self.std) or any(s <= 0 for s in self.std):
            raise ValueError(f"data normalisation must be finite with std > 0, got mean={self.mean} std={self.std}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> DataSpec | None:
        """Read a ``"data"`` entry; also the free-form ``"extra"`` dict of configs written before 0.2."""
        if not d:
            return None
        d = dict(d)
        if "normalization" in d or "dataset" in d:  # the legacy ``extra`` layout
            norm = d.get("normalization") or {}
            d = {
                "source": d.get("data", d.get("dataset", "")),
                "name": d.get("dataset", ""),
                "classes": d.get("classes", []),
                "mean": norm.get("mean", d.get("mean", [])),
                "std": norm.get("std", d.get("std", [])),
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


def resolve_normalization(model_or_config: Any, dataset: Any = None) -> tuple[list[float], list[float]] | None:
    """TEMP (hardening branch): the model's recorded normalisation, else the dataset's, adapted to in_chans."""
    config = getattr(model_or_config, "config", model_or_config)
    spec = getattr(config, "data", None)
    if spec is not None and spec.normalization(config.in_chans) is not None:
        return spec.normalization(config.in_chans)
    if dataset is not None and getattr(dataset, "mean", None) is not None:
        return fit_normalization(dataset.mean, dataset.std, config.in_chans)
    return None
