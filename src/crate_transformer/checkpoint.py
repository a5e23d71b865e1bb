"""The loaders by ``arch`` (the hub layer, above the registry's tables): ``from_pretrained`` (safetensors + JSON
config, written by ``model.save_pretrained``, any registered family) and ``from_official`` (the authors' ``.pth``
layouts, one :class:`~crate_transformer.official.OfficialFormat` per registered architecture).  The resolver the
commands share, ``load_model`` (which also reads run directories and training states), is
:mod:`crate_transformer.train.load`.

The file primitives (atomic writes, safe unpickling, checksummed safetensors) live in
:mod:`crate_transformer.io`, the folder reader every family shares in :mod:`crate_transformer.base`
(:func:`~crate_transformer.base.load_folder`); ``atomic_write``, ``load_pickle``, ``save_pretrained``,
``load_weights``, ``resolve_hub`` and ``CheckpointError`` are re-exported here for compatibility.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from ._hub import resolve_hub
from ._registry import arch_info, config_class, model_config, official_formats
from .base import Model, load_backbone, load_folder, load_weights
from .config import Config
from .io import (
    CONFIG_NAME,
    CheckpointError,
    atomic_write,
    load_pickle,
    load_safetensors,
    load_state,
    model_dir,
    read_config_dict,
    read_model_json,
    save_pretrained,
)
from .official import OfficialFormat, unwrap

__all__ = [
    "CheckpointError",
    "atomic_write",
    "load_pickle",
    "save_pretrained",
    "read_config",
    "config_from_dict",
    "from_pretrained",
    "from_official",
    "load_official",
    "load_weights",
    "resolve_hub",
]


def config_from_dict(data: Mapping) -> Config:
    """A stored config (``config.json``, a training state's ``model_config``) as the dataclass its ``arch`` names."""
    return config_class(data.get("arch")).from_dict(dict(data))


def read_config(directory: str | Path) -> Config:
    """The config of a ``save_pretrained`` folder, as the class its ``arch`` registered (older ``"extra"``
    layouts are converted)."""
    directory = model_dir(directory)
    try:
        return config_from_dict(read_config_dict(directory))
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(f"{directory / CONFIG_NAME}: {e}") from None


def from_pretrained(
    directory: str | Path, map_location: str | torch.device = "cpu", revision: str | None = None, **overrides: object
) -> Model:
    """Load a model written by ``model.save_pretrained``, whatever its family (the class its stored ``arch``
    registered): :func:`~crate_transformer.base.load_folder` — a folder, its ``model.safetensors`` or
    ``config.json``, a finished training run (``RUN/model``), or ``"hf-hub:ORG/NAME"`` (``revision``: a branch,
    tag or commit), checksums verified.  ``overrides`` change the stored config (timm's names too):
    ``from_pretrained(RUN, num_classes=3)`` keeps the backbone and gives a fresh 3-class head (logged),
    ``image_size=`` re-grids the position embedding, ``drop_path=`` / ``drop_path_rate=`` set stochastic depth."""
    return load_folder(directory, lambda arch: arch_info(arch).model_class, map_location, revision, **overrides)


def from_official(path_or_state: str | Path | Mapping, name: str, **overrides: object) -> Model:
    """Load the authors' checkpoint of a registered model as ``create_model(name, **overrides)``
    (:func:`load_official`; every weight must fit, the head included).

    ``name`` decides the format: the architecture's :class:`~crate_transformer.official.OfficialFormat`
    (``crate_*`` classifiers of the official ``model/crate.py``, ``crate_mae_*`` of ``model/crate_ae``,
    ``crate_bert_*`` of the authors' Hugging Face port, and whatever other families register).  Accepts the
    training containers (``{'state_dict': ...}`` written by the official ``main.py`` with keys prefixed
    ``module.``, ``{'model': ...}`` as the MAE codebase saves it), a bare state dict, a path to any of them
    (read with ``weights_only=True``), a ``.safetensors`` file as such, or a folder holding
    ``model.safetensors`` or ``pytorch_model.bin``.  Hyperparameters the authors' files do not store (η, λ)
    come from the registered config and ``overrides``; a format whose files describe themselves
    (``OfficialFormat.fields`` / ``config_file``: the language models, e.g. the released CRATE-GPT as
    ``from_official("ckpt-crate-12l-overparam-600000.pt", "crate_gpt_12l_pile")``, or a CRATE-BERT folder with
    its ``config.json``) replaces the registered sizes by the file's, and an override that contradicts the
    file is an error.
    """
    return load_official(path_or_state, name, overrides)


def load_official(
    path_or_state: str | Path | Mapping, name: str, overrides: Mapping[str, object], *, new_head: bool = False
) -> Model:
    """:func:`from_official`; with ``new_head`` a classifier that does not fit the file's (another
    ``num_classes``) stays fresh on the loaded backbone, logged (:func:`~crate_transformer.base.load_backbone`:
    ``create_model(name, pretrained=True, num_classes=3)``)."""
    config = model_config(name, **overrides)
    fmt = arch_info(config.arch).official
    if fmt is None:
        raise ValueError(f"{name!r} ({config.arch}) has no official checkpoint format; load it with from_pretrained")
    if fmt.check is not None:
        fmt.check(config)
    raw, source, folder = _read_official(path_or_state)
    sidecar = _sidecar(folder) if fmt.config_file is not None and folder is not None else None
    try:
        state = unwrap(raw)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    if not fmt.detect(state):
        raise CheckpointError(f"{source} is not a {fmt.name} checkpoint ({fmt.origin}){_format_hint(state)}")
    if fmt.fields is not None or (fmt.config_file is not None and sidecar is not None):
        config = _file_config(fmt, raw, sidecar, name, overrides, source)
    model = arch_info(config.arch).build(config)
    native = fmt.to_native(state, config)
    missing = sorted({p for p in fmt.optional if not any(k.startswith(p) for k in native)})
    if missing:
        warnings.warn(
            f"{source} has no {', '.join(p.rstrip('.') for p in missing)} weights; they keep their fresh "
            "initialisation",
            stacklevel=2,
        )
        native.update({k: v for k, v in model.state_dict().items() if k.startswith(tuple(missing))})
    if new_head:
        load_backbone(model, native, source)
    else:
        load_weights(model, native, source=source)
    return model


_OFFICIAL_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # what a folder may hold (Hugging Face's names)


def _read_official(path_or_state: str | Path | Mapping) -> tuple[object, str, Path | None]:
    """``(checkpoint object, a name for messages, the folder of the file or None)``: a ``.safetensors`` file
    (Hugging Face's format) or what ``torch.load(weights_only=True)`` reads; a folder's weights file."""
    if not isinstance(path_or_state, (str, Path)):
        return path_or_state, "official state dict", None
    path = Path(path_or_state)
    if path.is_dir():
        found = [path / f for f in _OFFICIAL_WEIGHTS if (path / f).is_file()]
        if not found:
            raise CheckpointError(
                f"{path} is a folder without {' or '.join(_OFFICIAL_WEIGHTS)}; pass the checkpoint file itself"
            )
        path = found[0]
    raw = load_safetensors(path)[0] if path.suffix == ".safetensors" else load_state(path)
    return raw, str(path), path.parent


def _sidecar(folder: Path) -> dict | None:
    """The JSON object of ``folder/config.json`` (a Hugging Face config saved beside the weights), or None."""
    if not (folder / CONFIG_NAME).is_file():
        return None
    _, data = read_model_json(folder, CONFIG_NAME)
    return data if isinstance(data, dict) else None


def _file_config(
    fmt: OfficialFormat, raw: object, sidecar: dict | None, name: str, overrides: Mapping[str, object], source: str
) -> Config:
    """``name``'s config with the values the file stores (``fmt.config_file`` of the JSON beside it, then
    ``fmt.fields`` of the tensors, which must agree) in place, then ``overrides``, which must agree with the
    file except for ``fmt.overridable`` keys."""
    try:
        found = fmt.config_file(sidecar) if fmt.config_file is not None and sidecar is not None else {}
        tensors = fmt.fields(raw) if fmt.fields is not None else {}
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    clash = [
        f"{k}: {found[k]!r} in config.json, {v!r} in the tensors" for k, v in tensors.items() if found.get(k, v) != v
    ]
    if clash:
        raise CheckpointError(f"{source} is inconsistent: {', '.join(clash)}; the file is corrupt")
    found.update(tensors)
    given = model_config(name, **overrides)
    conflicts = [
        f"{k}={getattr(given, k)!r} (checkpoint: {v!r})"
        for k, v in found.items()
        if k in overrides and k not in fmt.overridable and getattr(given, k) != v
    ]
    if conflicts:
        raise CheckpointError(f"{source} disagrees with the given overrides: {', '.join(conflicts)}; drop them")
    try:
        config = model_config(name, **{**found, **overrides})
        if fmt.check is not None:
            fmt.check(config)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return config


def _format_hint(state: Mapping[str, Tensor]) -> str:
    """Name the registered format(s) whose detector recognises ``state`` (or say that none does)."""
    others = [a.official for a in official_formats() if a.official.detect(state)]
    if not others:
        return "; it matches no format this package reads"
    return "".join(f"; it is a {f.name} checkpoint: pass a matching name, e.g. {f.example}" for f in others[:1])
