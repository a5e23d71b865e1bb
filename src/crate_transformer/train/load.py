"""``load_model``: the one resolver the commands share — a model from whatever a user points at (a
``save_pretrained`` folder, ``hf-hub:ORG/NAME``, a run directory, a training state, an authors' checkpoint).

It lives with the trainer because two of those sources are the trainer's own layout (a run directory and a
training state, read through :mod:`crate_transformer.train.rundir`); the model files themselves are read by
:mod:`crate_transformer.checkpoint`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..base import Model
from ..checkpoint import (
    CheckpointError,
    config_from_dict,
    from_official,
    from_pretrained,
    load_weights,
    resolve_hub,
)
from ..config import LANGUAGE_MODEL, Config
from ..config_utils import coerce_fields
from ..errors import Opt
from ..io import CONFIG_NAME, WEIGHTS_NAME, load_state
from ..official import unwrap
from ..registry import build, official_formats, registered_fields
from ..tokenizer import Tokenizer
from .rundir import run_model_source, state_model, state_tokenizer

__all__ = ["load_model"]


def load_model(path: str | Path, name: str | None = None, *, as_classifier: bool = False, **overrides: object) -> Model:
    """Load a model from whatever a user points at; the one resolver the commands share.

    * a ``save_pretrained`` directory (has ``config.json``), or its ``model.safetensors`` / ``config.json``,
      or ``hf-hub:ORG/NAME`` (a pushed one) → :func:`from_pretrained`;
    * a run directory of the ``crate`` commands → its final model, or its latest training state while it
      runs (:func:`~crate_transformer.train.rundir.run_model_source`);
    * a training-state file (the model it exports: :func:`~crate_transformer.train.rundir.state_model`);
    * an official ``.pth`` checkpoint → :func:`from_official` with ``name`` (required) and ``overrides``.

    For the first three the architecture comes from the checkpoint's own config: ``name`` and
    ``overrides`` may be given only when they agree with it (e.g. a command line that always passes
    ``--model``); any difference raises :class:`CheckpointError` instead of being ignored.

    With ``as_classifier`` the model becomes an image classifier to fine-tune where its family can convert itself
    (:meth:`~crate_transformer.base.Model.as_classifier`: a CRATE-MAE's encoder with a fresh head, what the
    fine-tuning command uses), and ``name`` / ``overrides`` are then not checked against it (the classifier is new).
    """
    path = Path(resolve_hub(str(path)))
    model = _load_any(path, name, overrides, check=not as_classifier)
    if as_classifier:
        converted = model.as_classifier()
        if converted is not model:
            return converted
        _check_overrides(model.config, path, name, overrides)
    return model


def _load_any(path: Path, name: str | None, overrides: Mapping[str, object], check: bool) -> Model:
    """:func:`load_model` without the classifier conversion; ``check``: compare name/overrides with a stored config."""
    path = run_model_source(path)
    if path.is_dir() or (path.is_file() and path.name in (CONFIG_NAME, WEIGHTS_NAME)):
        if not (path.is_file() or (path / CONFIG_NAME).is_file()):
            raise CheckpointError(
                f"{path} is neither a model directory (config.json + model.safetensors) nor a training run directory"
            )
        model = from_pretrained(path)
        if check:
            _check_overrides(model.config, path, name, overrides)
        return model
    raw = load_state(path)  # a training state's checksum is verified here, as on resume
    exported = state_model(raw)
    if exported is not None:
        try:
            config = config_from_dict(dict(exported[0]))
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        if check:
            _check_overrides(config, path, name, overrides)
        model = build(config)
        load_weights(model, exported[1], source=str(path))
        if model.kind == LANGUAGE_MODEL and state_tokenizer(raw) is not None:  # a language-model state's tokenizer
            model.tokenizer = Tokenizer.from_str(state_tokenizer(raw))
        return model
    if name is None and isinstance(raw, Mapping) and "model_args" in raw:
        raise CheckpointError(
            f"{path} looks like a nanoGPT / crate-lm checkpoint; name its architecture, e.g. ",
            Opt("model", "crate_gpt_12l_pile"), " (CRATE) or ", Opt("model", "gpt2_base"), " (GPT-2)",
        )  # fmt: skip
    if name is None:
        raise CheckpointError(
            f"{path} looks like an official CRATE checkpoint; name its architecture, e.g. ", Opt("model", _example(raw))
        )
    return from_official(raw, name, **overrides)


def _example(raw: object) -> str:
    """The example model name of the registered official format that recognises ``raw`` (else crate_small)."""
    try:
        state = unwrap(raw)
    except ValueError:
        return "crate_small"
    return next((a.official.example for a in official_formats() if a.official.detect(state)), "crate_small")


def _check_overrides(config: Config, path: Path, name: str | None, overrides: Mapping[str, object]) -> None:
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
