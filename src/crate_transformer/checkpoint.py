"""Model files: ``from_pretrained`` (safetensors + JSON config, written by ``model.save_pretrained``),
``from_official`` (the official repository's ``.pth`` layouts: the classifier ``model/crate.py`` and
CRATE-MAE ``model/crate_ae``, see shared/notes/anchors.md §1.2 and §1.5) and ``load_model``, the one
resolver the commands share.  ``config.json`` with ``arch == "crate_mae"`` loads a :class:`CRATEMAE`.

The file primitives (atomic writes, safe unpickling, checksummed safetensors) live in
:mod:`crate_transformer.io`; ``atomic_write``, ``load_pickle``, ``save_pretrained`` and
``CheckpointError`` are re-exported here for compatibility.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from .bert import CRATEBert, bert_config_overrides, bert_official_to_native, is_bert_state
from .config_utils import coerce_fields
from .io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    atomic_write,
    load_pickle,
    load_safetensors,
    rename_keys,
    save_pretrained,
)
from .lm import LanguageModel, LMConfig
from .mae import CRATEMAE, MAE_ARCH, MAEConfig, mae_to_classifier
from .model import ImageClassifier, ModelConfig
from .registry import build, config_class, model_config, registered_fields

__all__ = [
    "CheckpointError",
    "atomic_write",
    "load_pickle",
    "save_pretrained",
    "read_config",
    "config_from_dict",
    "from_pretrained",
    "from_official",
    "official_to_native",
    "native_to_official",
    "mae_official_to_native",
    "mae_native_to_official",
    "load_weights",
    "load_model",
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
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); the file is corrupt") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read {path} ({e}); the file is corrupt or unreadable") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object of model settings; the file is corrupt")
    data.pop("crate_transformer_version", None)
    try:
        return config_from_dict(data)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def from_pretrained(
    directory: str | Path, map_location: str | torch.device = "cpu"
) -> ImageClassifier | CRATEMAE | LanguageModel:
    """Load a model written by :meth:`ImageClassifier.save_pretrained`.

    ``directory`` is that folder, or its ``model.safetensors`` or ``config.json``.  The weights'
    SHA-256 (stored in the safetensors header since 0.2) is verified: flipped bytes raise
    :class:`CheckpointError` ("... is corrupt: checksum mismatch"); older files without a checksum load.
    """
    directory = _model_dir(directory)
    config = read_config(directory)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"no {WEIGHTS_NAME} in {directory}; the save was incomplete — re-save the model")
    state, _ = load_safetensors(weights)
    model = build(config)
    load_weights(model, state, source=str(weights))
    if isinstance(model, LanguageModel) and (directory / "tokenizer.json").is_file():
        from .tokenizer import Tokenizer

        model.tokenizer = Tokenizer.from_file(directory / "tokenizer.json")
    return model.to(map_location)


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


# --------------------------------------------------------------------------- official format
# (official key prefix, native key prefix); "{i}" is a layer index.  One table serves both directions.
CLASSIFIER_KEY_MAP = [
    ("pos_embedding", "pos_embed"),
    ("cls_token", "cls_token"),
    ("to_patch_embedding.1.", "patch_embed.0."),  # index 0 of the official Sequential is the Rearrange
    ("to_patch_embedding.2.", "patch_embed.1."),
    ("to_patch_embedding.3.", "patch_embed.2."),
    ("transformer.layers.{i}.0.norm.", "layers.{i}.norm1."),
    ("transformer.layers.{i}.0.fn.qkv.", "layers.{i}.attn.qkv."),
    ("transformer.layers.{i}.0.fn.to_out.0.", "layers.{i}.attn.proj."),
    ("transformer.layers.{i}.1.norm.", "layers.{i}.norm2."),
    ("transformer.layers.{i}.1.fn.weight", "layers.{i}.ista.weight"),
    ("mlp_head.0.", "head.0."),
    ("mlp_head.1.", "head.1."),
]
# CRATE-MAE (model/crate_ae, anchors.md §1.5).  The official pos_embed (unused by its forward) and
# decoder_embed (never used) have no native counterpart; decoder_pos_embed is the table the forward adds.
MAE_KEY_MAP = [
    ("cls_token", "cls_token"),
    ("mask_token", "mask_token"),
    ("decoder_pos_embed", "pos_embed"),
    ("patch_embed.proj.", "patch_embed."),  # conv weight (d, c, p, p) ↔ linear (d, p·p·c): see below
    ("blocks.{i}.layers.0.0.norm.", "layers.{i}.norm1."),
    ("blocks.{i}.layers.0.0.fn.qkv.", "layers.{i}.attn.qkv."),
    ("blocks.{i}.layers.0.0.fn.to_out.0.", "layers.{i}.attn.proj."),
    ("blocks.{i}.layers.0.1.norm.", "layers.{i}.norm2."),
    ("blocks.{i}.layers.0.1.fn.weight", "layers.{i}.ista.weight"),
    ("norm.", "norm."),
    ("decoder_blocks.{i}.layers.0.0.norm.", "decoder_layers.{i}.norm1."),
    ("decoder_blocks.{i}.layers.0.0.fn.weight", "decoder_layers.{i}.weight"),
    ("decoder_blocks.{i}.layers.0.1.norm.", "decoder_layers.{i}.norm2."),
    ("decoder_blocks.{i}.layers.0.1.fn.qkv.", "decoder_layers.{i}.attn.qkv."),
    ("decoder_blocks.{i}.layers.0.1.fn.to_out.0.", "decoder_layers.{i}.attn.proj."),
    ("decoder_norm.", "decoder_norm."),
    ("decoder_pred.", "decoder_pred."),
]
_MAE_UNUSED = ("pos_embed", "decoder_embed.weight", "decoder_embed.bias")


def _unwrap(obj: object) -> dict[str, Tensor]:
    if isinstance(obj, Mapping):
        for container in ("state_dict", "model"):
            if container in obj and isinstance(obj[container], Mapping):
                obj = obj[container]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(
            "not an official CRATE checkpoint: expected a state dict, {'state_dict': ...} or {'model': ...} of tensors"
        )
    return {k.removeprefix("module."): v for k, v in obj.items()}


def official_to_native(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename an official ``model/crate.py`` state dict (after unwrapping) to this library's key names."""
    return rename_keys(state, CLASSIFIER_KEY_MAP, forward=True)


def native_to_official(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename this library's CRATE state dict to the official ``model/crate.py`` key names."""
    return rename_keys(state, CLASSIFIER_KEY_MAP, forward=False)


def mae_official_to_native(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official CRATE-MAE state dict (after unwrapping) → :class:`CRATEMAE` keys and shapes.

    Keys follow :data:`MAE_KEY_MAP`; the unused ``pos_embed`` and ``decoder_embed`` are dropped; the
    patch conv ``(d, c, p, p)`` becomes the linear map of (p1, p2, c)-ordered patches ``(d, p·p·c)``.
    """
    state = {k: v for k, v in state.items() if k not in _MAE_UNUSED}
    out = rename_keys(state, MAE_KEY_MAP, forward=True)
    w = out.get("patch_embed.weight")
    if w is not None and w.dim() == 4:
        out["patch_embed.weight"] = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)
    return out


def mae_native_to_official(state: Mapping[str, Tensor], in_chans: int) -> dict[str, Tensor]:
    """A :class:`CRATEMAE` state dict → the official ``MaskedAutoencoderViT`` keys, loadable strictly.

    Writes both (identical) position tables and the never-used ``decoder_embed`` as zeros.
    """
    out = rename_keys(state, MAE_KEY_MAP, forward=False)
    w = out["patch_embed.proj.weight"]
    p = int(round((w.shape[1] / in_chans) ** 0.5))
    out["patch_embed.proj.weight"] = w.reshape(w.shape[0], p, p, in_chans).permute(0, 3, 1, 2).contiguous()
    out["pos_embed"] = out["decoder_pos_embed"].clone()
    d = w.shape[0]
    out["decoder_embed.weight"], out["decoder_embed.bias"] = w.new_zeros(d, d), w.new_zeros(d)
    return out


def load_model(
    path: str | Path, name: str | None = None, *, as_classifier: bool = False, **overrides: object
) -> ImageClassifier | CRATEMAE | LanguageModel:
    """Load a model from whatever a user points at; the one resolver the CLI commands share.

    * a ``save_pretrained`` directory (has ``config.json``), or its ``model.safetensors`` / ``config.json``
      → :func:`from_pretrained`;
    * a ``crate train`` run directory (has ``model/config.json``) → its final/latest model;
    * a training-state file written by ``crate train`` (a dict with ``model_config`` and ``model``; a task
      that trains a wrapper of that model stores its weights as ``task["export_model"]``, e.g. the DINO
      teacher backbone of ``crate pretrain dino``);
    * an official ``.pth`` checkpoint → :func:`from_official` with ``name`` (required) and ``overrides``.

    For the first three the architecture comes from the checkpoint's own config: ``name`` and
    ``overrides`` may be given only when they agree with it (e.g. a command line that always passes
    ``--model``); any difference raises :class:`CheckpointError` instead of being ignored.

    A CRATE-MAE (``arch == "crate_mae"``, an MAE run directory or training state, or an official
    ``.pth`` with a ``crate_mae_*`` name) loads as :class:`CRATEMAE`; with ``as_classifier`` it is
    converted by :func:`~crate_transformer.mae.mae_to_classifier` (what ``crate finetune`` uses), and
    ``name`` / ``overrides`` are then not checked against it (the classifier is new).
    """
    path = Path(path)
    model = _load_any(path, name, overrides, check=not as_classifier)
    if as_classifier and isinstance(model, CRATEMAE):
        return mae_to_classifier(model)
    if as_classifier:
        _check_overrides(model.config, path, name, overrides)
    return model


def _load_any(path: Path, name: str | None, overrides: Mapping[str, object], check: bool) -> ImageClassifier | CRATEMAE:
    """:func:`load_model` without the classifier conversion; ``check``: compare name/overrides with a stored config."""
    if path.is_dir() and not (path / CONFIG_NAME).is_file() and not (path / "model" / CONFIG_NAME).is_file():
        if (path / "checkpoints" / "last.pt").is_file():  # a run that has not finished: its latest training state
            path = path / "checkpoints" / "last.pt"
    if path.is_dir() or (path.is_file() and path.name in (CONFIG_NAME, WEIGHTS_NAME)):
        if path.is_file() or (path / CONFIG_NAME).is_file():
            model = from_pretrained(path)
        elif (path / "model" / CONFIG_NAME).is_file():
            model = from_pretrained(path / "model")
        else:
            raise CheckpointError(
                f"{path} is neither a model directory (config.json + model.safetensors) nor a crate train run directory"
            )
        if check:
            _check_overrides(model.config, path, name, overrides)
        return model
    raw = load_pickle(path)
    if isinstance(raw, Mapping) and "model_config" in raw and "model" in raw:
        try:
            config = config_from_dict(dict(raw["model_config"]))
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        if check:
            _check_overrides(config, path, name, overrides)
        model = build(config)
        task = raw.get("task")
        weights = raw["model"]
        if isinstance(task, Mapping) and isinstance(task.get("export_model"), Mapping):
            weights = task["export_model"]  # the task trains a wrapper of this model (DINO: the teacher backbone)
        load_weights(model, weights, source=str(path))
        return model
    if name is None:
        raise CheckpointError(
            f"{path} looks like an official CRATE checkpoint; name its architecture, e.g. --model crate_small"
        )
    return from_official(raw, name, **overrides)


def _check_overrides(
    config: ModelConfig | MAEConfig | LMConfig, path: Path, name: str | None, overrides: Mapping[str, object]
) -> None:
    """Refuse a model name / overrides that disagree with a checkpoint's stored config (equal values pass)."""
    if name is None and not overrides:
        return
    wanted = dict(registered_fields(name)) if name is not None else {}
    try:
        wanted.update(coerce_fields(type(config), overrides))
    except ValueError as e:
        raise CheckpointError(f"{e}") from None
    stored = config.to_dict()
    diffs = []
    for key, value in wanted.items():
        have = stored.get(key)
        if key == "data" and value is not None:
            value = value.to_dict() if hasattr(value, "to_dict") else value
        if have != value:
            diffs.append(f"{key}={value!r} (checkpoint: {have!r})")
    if diffs:
        given = f"model name {name!r} and overrides" if name is not None else "overrides"
        raise CheckpointError(
            f"{path} stores its architecture in its config, which differs from the given {given}: "
            f"{', '.join(diffs)}; drop them — the architecture comes from the checkpoint's config, and a model name "
            "and overrides apply only to official .pth files"
        )


def from_official(
    path_or_state: str | Path | Mapping, name: str, **overrides: object
) -> ImageClassifier | CRATEMAE | CRATEBert:
    """Load an official CRATE classifier, CRATE-MAE or CRATE-BERT checkpoint as ``create_model(name, **overrides)``.

    ``name`` decides the format: ``crate_*`` classifiers (``model/crate.py``), ``crate_mae_*``
    (``model/crate_ae``, e.g. the released CRATE-MAE-B as ``from_official(path, "crate_mae_base")``) or
    ``crate_bert_*`` (the authors' Hugging Face port, see :func:`_bert_from_official`).

    Accepts the ``{'state_dict': ...}`` container written by the official ``main.py`` (keys
    prefixed ``module.``), ``{'model': ...}``, a bare state dict, or a path to any of them (read with
    ``weights_only=True``).  η and λ are not stored by the official code; pass them as overrides if
    the checkpoint was trained with non-default values.
    """
    if overrides.get("arch", registered_fields(name).get("arch")) == "crate_bert":
        return _bert_from_official(path_or_state, name, overrides)
    config = model_config(name, **overrides)
    if config.arch not in ("crate", MAE_ARCH):
        raise ValueError(
            f"from_official loads CRATE classifiers, CRATE-MAEs and CRATE-BERTs; {name!r} is a {config.arch} model"
        )
    if config.arch == "crate" and (config.attention, config.mlp) != ("mssa", "ista"):
        raise ValueError(
            f"official CRATE checkpoints have MSSA + ISTA layers, not attention={config.attention!r}, "
            f"mlp={config.mlp!r}; drop those --model-args"
        )
    raw = load_pickle(path_or_state) if isinstance(path_or_state, (str, Path)) else path_or_state
    source = str(path_or_state) if isinstance(path_or_state, (str, Path)) else "official state dict"
    state = _unwrap(raw)
    if is_bert_state(state):
        raise CheckpointError(f"{source} is a CRATE-BERT checkpoint but {name!r} is not; pass e.g. crate_bert_base")
    is_mae = any(k.startswith(("decoder_blocks.", "mask_token")) for k in state)
    if is_mae != (config.arch == MAE_ARCH):
        kind, fix = ("a CRATE-MAE", "crate_mae_base") if is_mae else ("a CRATE classifier", "crate_small")
        raise CheckpointError(f"{source} is {kind} checkpoint but {name!r} is not; pass a matching name, e.g. {fix}")
    model = build(config)
    load_weights(model, mae_official_to_native(state) if is_mae else official_to_native(state), source=source)
    return model


# --------------------------------------------------------------------------- the released CRATE-BERT
def _bert_files(path: Path) -> tuple[Path, dict]:
    """The weights file of a port checkpoint (``path`` itself, or a folder's ``model.safetensors`` /
    ``pytorch_model.bin``) and the LMConfig fields of the ``config.json`` beside it, if it is the port's."""
    weights = path
    if path.is_dir():
        found = [path / f for f in ("model.safetensors", "pytorch_model.bin") if (path / f).is_file()]
        if not found:
            raise CheckpointError(
                f"{path} holds neither model.safetensors nor pytorch_model.bin; pass the folder of the authors' "
                "CRATE-BERT checkpoint or its weights file"
            )
        weights = found[0]
    hf_config = weights.parent / CONFIG_NAME
    if not hf_config.is_file():
        return weights, {}
    try:
        data = json.loads(hf_config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {hf_config} ({e}); the file is corrupt or unreadable") from None
    is_port = isinstance(data, dict) and data.get("model_type") == "crate"
    return weights, bert_config_overrides(data, str(hf_config)) if is_port else {}


def _bert_from_official(path_or_state: str | Path | Mapping, name: str, overrides: Mapping[str, object]) -> CRATEBert:
    """The authors' Hugging Face CRATE-BERT (``CrateForMaskedLM``, ``CrateForSequenceClassification`` or
    ``CrateModel`` weights) as ``create_model(name, **overrides)``.

    ``path_or_state``: a state dict, a ``pytorch_model.bin`` / ``.pth`` (read with ``weights_only=True``), a
    ``model.safetensors``, or the folder holding one.  The port's ``config.json`` beside the weights sets the sizes
    (width, depth, heads, vocabulary, positions, LayerNorm eps, padding id); ``overrides`` win over it.  A
    sequence-classification head sets ``num_labels``; a checkpoint without the masked-LM head (a classifier or a bare
    ``CrateModel``) keeps a freshly initialised one, with a warning.  The model is returned in eval mode.
    """
    if isinstance(path_or_state, Mapping):
        raw, found, source = path_or_state, {}, "official state dict"
    else:
        weights, found = _bert_files(Path(path_or_state))
        source = str(weights)
        raw = load_safetensors(weights)[0] if weights.suffix == ".safetensors" else load_pickle(weights)
    state = _unwrap(raw)
    if not is_bert_state(state):
        raise CheckpointError(
            f"{source} is not a CRATE-BERT checkpoint (no crate.embeddings.* / crate.encoder.* keys); pass the "
            "authors' CrateForMaskedLM weights, or load other checkpoints with their own model name"
        )
    state = bert_official_to_native(state)
    if "classifier.out_proj.weight" in state:
        found["num_labels"] = state["classifier.out_proj.weight"].shape[0]
    model = build(model_config(name, **{**found, **overrides}))
    if not any(k.startswith("lm_head.") for k in state):
        warnings.warn(
            f"{source} has no masked-LM head (a CrateForSequenceClassification or CrateModel checkpoint); the "
            "LM head is freshly initialised: classify() is the trained model, its token logits are not",
            stacklevel=3,
        )
        state.update({k: v for k, v in model.state_dict().items() if k.startswith("lm_head.")})
    load_weights(model, state, source=source)
    return model.eval()  # as transformers' from_pretrained: the release trains with dropout 0.1
