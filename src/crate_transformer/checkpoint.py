"""Model files: ``from_pretrained`` (safetensors + JSON config, written by ``model.save_pretrained``),
``from_official`` (the authors' ``.pth`` layouts, one :class:`~crate_transformer.official.OfficialFormat`
per registered architecture) and ``load_weights``.  The resolver the commands share, ``load_model`` (which
also reads run directories and training states), is :mod:`crate_transformer.train.load`.

The file primitives (atomic writes, safe unpickling, checksummed safetensors) live in
:mod:`crate_transformer.io`; ``atomic_write``, ``load_pickle``, ``save_pretrained`` and
``CheckpointError`` are re-exported here for compatibility.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from .base import Model
from .config import Config
from .errors import TaskError
from .io import (
    CONFIG_NAME,
    FILE_DIGESTS,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    atomic_write,
    load_pickle,
    load_safetensors,
    load_state,
    read_model_json,
    save_pretrained,
)
from .lm import LanguageModel, LMConfig
from .mae import CRATEMAE, MAEConfig
from .model import ImageClassifier, ModelConfig
from .official import OfficialFormat, unwrap
from .registry import arch_info, build, config_class, model_config, official_formats

__all__ = [
    "CheckpointError",
    "atomic_write",
    "load_pickle",
    "save_pretrained",
    "read_config",
    "config_from_dict",
    "from_pretrained",
    "from_official",
    "load_weights",
    "resolve_hub",
]


# --------------------------------------------------------------------------- native format
def _model_dir(path: str | Path) -> Path:
    """The ``save_pretrained`` folder of ``path``: the folder itself, or the folder of its
    ``model.safetensors`` / ``config.json`` when one of those files is given."""
    path = Path(path)
    if path.is_file():
        if path.name in (WEIGHTS_NAME, CONFIG_NAME):
            return path.parent
        raise CheckpointError(
            f"{path} is a file; pass the folder written by model.save_pretrained (with {CONFIG_NAME} and "
            f"{WEIGHTS_NAME}), or load an official .pth with from_official / load_model"
        )
    if not path.is_dir():
        raise CheckpointError(f"model directory not found: {path}")
    return path


def resolve_hub(path: str | Path, revision: str | None = None) -> str | Path:
    """``"hf-hub:ORG/NAME"`` → its local snapshot folder; any other path unchanged (``revision`` is Hub-only)."""
    if isinstance(path, str) and path.startswith("hf-hub:"):
        from .pretrained import hub_snapshot

        return hub_snapshot(path, revision=revision)
    if revision is not None:
        raise ValueError(f"revision={revision!r} applies to hf-hub:ORG/NAME models only, not to the path {path}")
    return path


def config_from_dict(data: Mapping) -> ModelConfig | MAEConfig | LMConfig:
    """A stored config (``config.json``, a training state's ``model_config``) as the dataclass its ``arch`` names."""
    return config_class(data.get("arch")).from_dict(dict(data))


def read_config(directory: str | Path) -> ModelConfig | MAEConfig | LMConfig:
    """The config of a ``save_pretrained`` folder (:class:`ModelConfig`, :class:`MAEConfig` or :class:`LMConfig`
    by its ``arch``; older ``"extra"`` layouts are converted)."""
    directory = _model_dir(directory)
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(
            f"no {CONFIG_NAME} in {directory}; expected a directory written by model.save_pretrained(...)"
        )
    _, data = read_model_json(directory, CONFIG_NAME)  # verified against the checksum beside the weights
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object of model settings; the file is corrupt")
    data.pop("crate_transformer_version", None)
    try:
        return config_from_dict(data)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def from_pretrained(
    directory: str | Path, map_location: str | torch.device = "cpu", revision: str | None = None
) -> ImageClassifier | CRATEMAE | LanguageModel:
    """Load a model written by :meth:`ImageClassifier.save_pretrained`.

    ``directory`` is that folder, or its ``model.safetensors`` or ``config.json``, or ``"hf-hub:ORG/NAME"``:
    a Hub repository written by ``model.push_to_hub`` (``revision``: a branch, tag or commit), fetched
    through the Hugging Face cache (:func:`crate_transformer.pretrained.hub_snapshot`).  The weights'
    SHA-256 (stored in the safetensors header since 0.2) and the checksums of ``config.json`` and
    ``tokenizer.json`` stored beside it are verified: a flipped byte in any of them raises
    :class:`CheckpointError` ("... is corrupt"); older files without a checksum load.
    """
    hub = isinstance(directory, str) and directory.startswith("hf-hub:")
    spec, directory = directory, _model_dir(resolve_hub(directory, revision))
    config = read_config(directory)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"no {WEIGHTS_NAME} in {directory}; the save was incomplete — re-save the model")
    state, meta = load_safetensors(weights)
    model = build(config)
    load_weights(model, state, source=str(weights))
    if isinstance(model, LanguageModel):
        tokenizer = _read_tokenizer(directory, meta)
        try:
            model.tokenizer = tokenizer
        except TaskError as e:  # a vocabulary larger than the embedding (its fix names a task: the CLI words it)
            raise TaskError(f"{directory / TOKENIZER_NAME}: ", *e.parts) from None
    if hub:
        model.pretrained_cfg = {"source": spec, "revision": revision, "folder": str(directory)}
    return model.to(map_location)


def _read_tokenizer(directory: Path, meta: Mapping[str, str]) -> object | None:
    """The model's verified ``tokenizer.json`` (None when it was saved without one)."""
    from .tokenizer import Tokenizer

    path = directory / TOKENIZER_NAME
    if not path.is_file():
        if FILE_DIGESTS[TOKENIZER_NAME] in meta:
            raise CheckpointError(f"no {TOKENIZER_NAME} in {directory}, but the model was saved with one; re-save it")
        return None
    text, _ = read_model_json(directory, TOKENIZER_NAME)
    try:
        return Tokenizer.from_str(text, source=str(path))
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def load_weights(model: torch.nn.Module, state: Mapping[str, Tensor], source: str = "checkpoint") -> None:
    """Strictly load ``state`` into ``model``; any missing, unexpected or mis-shaped key is one clear error."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(
        f"{k}: checkpoint {list(state[k].shape)} vs model {list(own[k].shape)}"
        for k in set(own) & set(state)
        if tuple(state[k].shape) != tuple(own[k].shape)
    )
    if missing or unexpected or shapes:
        parts = []
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
            if items:
                shown = ", ".join(items[:6]) + (f", … (+{len(items) - 6} more)" if len(items) > 6 else "")
                parts.append(f"{label}: {shown}")
        raise CheckpointError(f"{source} does not fit the model ({'; '.join(parts)}){_fix_hint(state, model)}")
    model.load_state_dict(state, strict=True)


def _fix_hint(state: Mapping[str, Tensor], model: torch.nn.Module) -> str:
    """Read the architecture off the checkpoint's shapes and name the overrides that would fit it."""
    c = getattr(model, "config", None)
    if isinstance(c, LMConfig) and "wte.weight" in state and state["wte.weight"].shape[-1] != c.dim:
        return f"; pass dim={state['wte.weight'].shape[-1]} and heads=H, the head count it was trained with"
    if not isinstance(c, ModelConfig):
        return ""
    found: dict[str, int] = {}
    proj = state.get("patch_embed.1.weight" if c.arch == "crate" else "patch_embed.0.weight")
    p = c.patch_size
    if proj is not None and proj.dim() == 2:
        found["dim"] = proj.shape[0]
        side = (proj.shape[1] / c.in_chans) ** 0.5
        if side.is_integer():
            p = found["patch_size"] = int(side)
    if "pos_embed" in state and state["pos_embed"].dim() == 3:
        g = (state["pos_embed"].shape[1] - 1) ** 0.5
        if g.is_integer():
            found["image_size"] = int(g) * p
    if "head.1.weight" in state:
        found["num_classes"] = state["head.1.weight"].shape[0]
    layer_ids = {int(m.group(1)) for k in state if (m := re.match(r"layers\.(\d+)\.", k))}
    if layer_ids:
        found["depth"] = max(layer_ids) + 1
    fixes = [f"{k}={v}" for k, v in found.items() if getattr(c, k) != v]
    return f"; pass {', '.join(fixes)}" if fixes else "; pass the model name and overrides it was trained with"


def from_official(path_or_state: str | Path | Mapping, name: str, **overrides: object) -> Model:
    """Load the authors' checkpoint of a registered model as ``create_model(name, **overrides)``.

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
    model = build(config)
    native = fmt.to_native(state, config)
    missing = sorted({p for p in fmt.optional if not any(k.startswith(p) for k in native)})
    if missing:
        warnings.warn(
            f"{source} has no {', '.join(p.rstrip('.') for p in missing)} weights; they keep their fresh "
            "initialisation",
            stacklevel=2,
        )
        native.update({k: v for k, v in model.state_dict().items() if k.startswith(tuple(missing))})
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
