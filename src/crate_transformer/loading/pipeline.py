"""The one loader pipeline (the hub layer, above the registry's tables): a source resolved once, one conversion
step, one build.

    source = resolve(path)                              # what the path is, read once: a Source
    model = materialize(source, name, overrides, mode)  # authors' files converted; name/overrides by Mode; built

* :func:`resolve` — a ``save_pretrained`` folder (or its files, or ``hf-hub:ORG/NAME``), a run folder (its final
  ``model/``, or its latest training state while it runs), a training state, or an authors' checkpoint (a ``.pth``,
  a ``.safetensors``, a downloaded Hub folder of one) → a :class:`~crate_transformer.loading.folder.Source`; every
  file of the Hugging Face cache is checked against its hash on the way;
* :func:`convert` — an authors' source with a model name → this package's keys and config (the architecture's
  :class:`~crate_transformer.loading.official.OfficialFormat`; the values the file stores, typed and bounded by
  :func:`~crate_transformer.loading.values.file_fields`);
* :func:`materialize` — the model, by one :class:`~crate_transformer.loading.folder.Mode`.

The public loaders are this pipeline with a mode: :func:`load_model` (what every command uses), :func:`from_pretrained`
and :func:`from_official`.  Every loader returns the model in evaluation mode, as timm and Hugging Face do.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path

import torch
from torch import Tensor

from ..config_utils import coerce_fields
from ..io import (
    CONFIG_NAME,
    FILE_DIGESTS,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    load_safetensors,
    load_state,
    model_dir,
    read_config_dict,
    read_model_json,
)
from ..models._registry import (
    ZOO,
    arch_info,
    config_class,
    model_config,
    official_formats,
    registered_fields,
)
from ..models.base import Model, timm_overrides
from ..models.contract import FamilyConfig
from .folder import Mode, Source, build, checked, read_folder
from .hub import resolve_hub
from .official import OfficialFormat, unwrap
from .runfiles import (
    MODEL_DIR,
    is_run_dir,
    is_saved_model_dir,
    is_training_state,
    run_model_source,
    state_model,
    state_tokenizer,
)
from .values import check_build, file_fields

__all__ = [
    "Mode",
    "Source",
    "resolve",
    "convert",
    "materialize",
    "load_model",
    "from_pretrained",
    "from_official",
    "config_from_dict",
    "read_config",
    "check_stored_config",
    "ArchitectureNeeded",
]

_OFFICIAL_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # what a folder may hold (Hugging Face's names)
_OWN_FIX = "load it with load_model(path), or from_pretrained(path) for a save_pretrained folder"


def config_from_dict(data: Mapping) -> FamilyConfig:
    """A stored config (``config.json``, a training state's ``model_config``) as the dataclass its ``arch`` names."""
    return config_class(data.get("arch")).from_dict(dict(data))


def read_config(directory: str | Path) -> FamilyConfig:
    """The config of a ``save_pretrained`` folder, as the class its ``arch`` registered (older ``"extra"``
    layouts are converted)."""
    directory = model_dir(directory)
    try:
        return config_from_dict(read_config_dict(directory))
    except CheckpointError:
        raise
    except ValueError as e:  # a value of the file, named as the file names it
        raise CheckpointError(f"{directory / CONFIG_NAME}: {e}") from None


def _registered_class(arch: object) -> type[Model]:
    return arch_info(arch).model_class


# --------------------------------------------------------------------------- resolve: what a path is, read once
def resolve(path: str | Path) -> Source:
    """What ``path`` holds, read once (see the module docstring); a folder that is none of them is one line."""
    path = run_model_source(Path(resolve_hub(str(path))))
    if _is_own_model(path):
        return read_folder(path, _registered_class)
    if path.is_dir() and not any((path / f).is_file() for f in _OFFICIAL_WEIGHTS):
        raise CheckpointError(
            f"{path} is neither a model directory (config.json + model.safetensors), nor a training run "
            f"directory, nor a downloaded checkpoint folder ({' or '.join(_OFFICIAL_WEIGHTS)})"
        )
    raw, where, folder = _read_file(path)  # a training state's checksum is verified here, as on resume
    exported = state_model(raw)
    if exported is None:
        return Source("authors", where, {}, extras={"raw": raw, "folder": folder})
    try:
        config = config_from_dict(dict(exported[0]))
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    tokenizer = state_tokenizer(raw)  # a language-model state's tokenizer: the family takes its files back
    files = {TOKENIZER_NAME: tokenizer} if tokenizer is not None else {}
    return Source("state", str(path), exported[1], config, _registered_class(config.arch), {"files": files})


def _is_own_model(path: Path) -> bool:
    """A ``save_pretrained`` folder, or its ``config.json`` / ``model.safetensors`` (a weights file without a
    config beside it too: :func:`from_pretrained` says what is missing)."""
    if path.is_dir():
        return is_saved_model_dir(path)
    return path.name in (CONFIG_NAME, WEIGHTS_NAME) and (
        is_saved_model_dir(path.parent) or not (path.parent / CONFIG_NAME).is_file()
    )


def _read_file(path_or_state: str | Path | Mapping) -> tuple[object, str, Path | None]:
    """``(checkpoint object, a name for messages, the folder of the file or None)``: a ``.safetensors`` file
    (Hugging Face's format) or what ``torch.load(weights_only=True)`` reads; a folder's weights file.  This
    package's own folders and safetensors are refused with the loader that reads them."""
    if not isinstance(path_or_state, (str, Path)):
        return path_or_state, "official state dict", None
    path = Path(path_or_state)
    if path.is_dir():
        if is_saved_model_dir(path) or is_run_dir(path):
            what = "a run folder" if is_run_dir(path) and not is_saved_model_dir(path) else "a save_pretrained folder"
            raise CheckpointError(f"{path} is {what} of this package, not an authors' checkpoint; {_OWN_FIX}")
        found = [path / f for f in _OFFICIAL_WEIGHTS if (path / f).is_file()]
        if not found:
            raise CheckpointError(
                f"{path} is a folder without {' or '.join(_OFFICIAL_WEIGHTS)}; pass the checkpoint file itself"
            )
        path = found[0]
    checked(path)
    if path.suffix == ".safetensors":
        raw, meta = load_safetensors(path)
        if FILE_DIGESTS[CONFIG_NAME] in meta:  # the config checksum only save_pretrained writes
            raise CheckpointError(f"{path} holds the weights of a save_pretrained folder of this package; {_OWN_FIX}")
    else:
        raw = load_state(path)
    return raw, str(path), path.parent


# --------------------------------------------------------------------------- convert: an authors' file → this package's
def convert(source: Source, name: str, overrides: Mapping[str, object]) -> Source:
    """An authors' ``source`` read as ``create_model(name, **overrides)``: the architecture's format converts the
    weights to this package's keys; a format whose files describe themselves (``OfficialFormat.fields`` /
    ``config_file``) replaces the registered sizes by the file's (typed and bounded:
    :func:`~crate_transformer.loading.values.file_fields`), and an override that contradicts the file is an
    error.  Hyperparameters the files do not store (η, λ) come from the registered config and ``overrides``."""
    raw, where, folder = source.extras["raw"], source.where, source.extras["folder"]
    config = model_config(name, **overrides)
    if is_training_state(raw):
        raise CheckpointError(f"{where} is a training state of this package, not an authors' file; {_OWN_FIX}")
    try:
        state = unwrap(raw)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None
    fmt = arch_info(config.arch).official
    if fmt is None or not fmt.detect(state):
        what = (
            f"a {fmt.name} checkpoint ({fmt.origin})"
            if fmt
            else f"readable as {name!r} ({config.arch} has no authors' format)"
        )
        raise CheckpointError(f"{where} is not {what}{_format_hint(state, name, config)}")
    try:
        if fmt.check is not None:
            fmt.check(config)
    except ValueError as e:
        raise CheckpointError(f"{where} as {name!r}: {e}") from None
    sidecar = _sidecar(folder) if fmt.config_file is not None and folder is not None else None
    found: Mapping[str, object] = {}
    if fmt.fields is not None or (fmt.config_file is not None and sidecar is not None):
        config, found = _file_config(fmt, raw, sidecar, name, overrides, where)
    _require_unstored(fmt, config, name, {**found, **overrides}, where)
    target = arch_info(config.arch).model_class
    check_build(target, config, config, {k: getattr(config, k) for k in overrides if hasattr(config, k)}, where)
    try:
        native = fmt.to_native(state, config)
    except ValueError as e:  # what the file holds that the config cannot take (DINOv2's LayerScale without one)
        raise CheckpointError(f"{where} as {name!r}: {e}") from None
    missing = sorted({p for p in fmt.optional if not any(k.startswith(p) for k in native)})
    if missing:
        warnings.warn(
            f"{where} has no {', '.join(p.rstrip('.') for p in missing)} weights; they keep their fresh initialisation",
            stacklevel=3,
        )
    record = {"name": name, **ZOO[name].preprocessing()} if name in ZOO else None  # what the release states
    extras = {"fresh": tuple(missing), "pretrained_cfg": record}
    return Source("authors", where, native, config, target, extras)


def _sidecar(folder: Path) -> dict | None:
    """The JSON object of ``folder/config.json`` (a Hugging Face config saved beside the weights), or None."""
    if not (folder / CONFIG_NAME).is_file():
        return None
    checked(folder / CONFIG_NAME)
    return read_model_json(folder, CONFIG_NAME)[1]


def _require_unstored(
    fmt: OfficialFormat, config: FamilyConfig, name: str, given: Mapping[str, object], source: str
) -> None:
    """Refuse a value the file does not store (``fmt.unstored``: the head count) taken from ``name`` for a file of
    another width than ``name``'s: it would be a guess, and a wrong one loads without a shape error."""
    registered = model_config(name)
    for field, fixes in fmt.unstored:
        other = [f"{f}={getattr(config, f)}" for f in fixes if getattr(config, f) != getattr(registered, f)]
        if field not in given and other:
            raise CheckpointError(
                f"{source} does not store {field}, and with {', '.join(other)} it is not {name!r}, whose "
                f"{field}={getattr(registered, field)} would be a guess; pass {field}=, the value it was trained with"
            )


def _file_values(
    fmt: OfficialFormat, raw: object, sidecar: dict | None, name: str, overrides: Mapping[str, object], source: str
) -> dict[str, object]:
    """The config values the file stores (``fmt.config_file`` of the JSON beside it, then ``fmt.fields`` of the
    tensors and the container, which must agree), each typed and bounded
    (:func:`~crate_transformer.loading.values.file_fields`); a value the caller overrides where the format allows
    it (``fmt.overridable``) is the caller's."""
    try:
        found = fmt.config_file(sidecar) if fmt.config_file is not None and sidecar is not None else {}
        tensors = fmt.fields(raw) if fmt.fields is not None else {}
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    cls = config_class(registered_fields(name).get("arch"))
    kept = set(overrides) & set(fmt.overridable)

    def fix(field: str) -> str:
        if field in fmt.overridable:
            return f"pass {field}= (the value it was trained with) to replace it"
        return f"the file is damaged or not a {fmt.name} checkpoint ({fmt.origin})"

    for part in (found, tensors):
        file_fields(cls, {k: v for k, v in part.items() if k not in kept}, source, fmt.file_names, fix)
    clash = [
        f"{k}: {found[k]!r} in config.json, {v!r} in the tensors" for k, v in tensors.items() if found.get(k, v) != v
    ]
    if clash:
        raise CheckpointError(f"{source} is inconsistent: {', '.join(clash)}; the file is corrupt")
    return {**found, **tensors}


def _file_config(
    fmt: OfficialFormat, raw: object, sidecar: dict | None, name: str, overrides: Mapping[str, object], source: str
) -> tuple[FamilyConfig, dict[str, object]]:
    """``name``'s config with the values the file stores (:func:`_file_values`) in place, then ``overrides``,
    which must agree with the file except for ``fmt.overridable`` keys; and the values the file stores."""
    found = _file_values(fmt, raw, sidecar, name, overrides, source)
    given = model_config(name, **overrides)
    conflicts = [
        f"{k}={getattr(given, k)!r} (checkpoint: {v!r})"
        for k, v in found.items()
        if k in overrides and k not in fmt.overridable and getattr(given, k) != v
    ]
    if conflicts:
        raise CheckpointError(f"{source} disagrees with the given overrides: {', '.join(conflicts)}; drop them")
    try:
        config = model_config(name, written=overrides, **{**found, **overrides})
        if fmt.check is not None:
            fmt.check(config)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return config, found


def _format_hint(state: Mapping[str, Tensor], name: str, config: FamilyConfig) -> str:
    """Name the registered format(s) whose detector recognises ``state``, or the loader of this package's own
    state dict of ``name`` (or say that none reads it)."""
    others = [a.official for a in official_formats() if a.official.detect(state)]
    if not others:
        if is_native_state(state, config):  # model.state_dict() of this package: load_state_dict reads it
            return (
                f"; it is this package's own state dict of {name} (model.state_dict()): load it with "
                f"ct.create_model({name!r}).load_state_dict(state), or save the model with save_pretrained and load "
                "the folder with ct.from_pretrained"
            )
        return "; it matches no format this package reads"
    return "".join(f"; it is a {f.name} checkpoint: pass a matching name, e.g. {f.example}" for f in others[:1])


def _key_patterns(keys: Collection[str]) -> set[str]:
    """State-dict keys with their layer numbers as ``#`` (``layers.3.attn.qkv.weight`` → ``layers.#.attn...``)."""
    return {re.sub(r"\.\d+\.", ".#.", k) for k in keys}


def is_native_state(state: Mapping[str, Tensor], config: FamilyConfig) -> bool:
    """Whether ``state`` holds this package's own keys (``model.state_dict()``) of the model ``config`` builds,
    layer numbers aside: the model is built on the ``meta`` device (no memory) to read its keys."""
    with torch.device("meta"):
        keys = arch_info(getattr(config, "arch", None)).build(config).state_dict().keys()
    wanted = _key_patterns([k.removeprefix("module.") for k in state])
    return bool(wanted) and wanted <= _key_patterns(keys)


# --------------------------------------------------------------------------- materialize: the one build
def materialize(source: Source, name: str | None, overrides: Mapping[str, object], mode: Mode) -> Model:
    """The model of a resolved ``source``, in eval mode.  An authors' file needs ``name`` and is converted
    (:func:`convert`, ``overrides`` included); a file that stores its config meets ``name`` and ``overrides`` as
    ``mode`` says (:class:`~crate_transformer.loading.folder.Mode`)."""
    named = source.extras.get("path", source.where)  # as the caller named it, for messages
    if source.kind == "authors":
        if name is None:
            raw = source.extras["raw"]
            kind = "a nanoGPT / crate-lm" if isinstance(raw, Mapping) and "model_args" in raw else "an authors'"
            raise ArchitectureNeeded(source.where, f"{kind} checkpoint", *_examples(raw))
        model = build(convert(source, name, overrides), fresh_head=mode is Mode.APPLY and "num_classes" in overrides)
    elif mode is Mode.APPLY:
        overrides = timm_overrides(overrides)
        check_stored_config(source.config, named, name, {}, free=overrides)
        model = build(source, overrides)
    else:
        if mode is Mode.CHECK:
            check_stored_config(source.config, named, name, overrides)
        model = build(source)
    if mode is Mode.CLASSIFIER:
        converted = model.as_classifier()
        if converted is not model:
            return converted.eval()
        check_stored_config(model.config, named, name, overrides)
    return model


def load_model(
    path: str | Path,
    name: str | None = None,
    *,
    as_classifier: bool = False,
    new_head: bool = False,
    **overrides: object,
) -> Model:
    """Load a model from whatever a user points at, in eval mode; the one resolver the commands share.

    * a ``save_pretrained`` directory (has ``config.json``), or its ``model.safetensors`` / ``config.json``,
      or ``hf-hub:ORG/NAME`` (a pushed one) → :func:`from_pretrained`;
    * a run directory of the ``crate`` commands → its final model, or its latest training state while it
      runs (:func:`~crate_transformer.loading.runfiles.run_model_source`);
    * a training-state file (the model it exports: :func:`~crate_transformer.loading.runfiles.state_model`);
    * an authors' checkpoint (a ``.pth``, or a downloaded Hub folder of one) → :func:`from_official` with
      ``name`` (required) and ``overrides``.

    For the first three the architecture comes from the checkpoint's own config: ``name`` and ``overrides`` may be
    given only when they agree with it (``Mode.CHECK``; e.g. a command line that always passes the model name); any
    difference raises :class:`CheckpointError` instead of being ignored.

    With ``as_classifier`` (``Mode.CLASSIFIER``) the model becomes an image classifier to fine-tune where its
    family can convert itself (:meth:`~crate_transformer.models.base.Model.as_classifier`: a CRATE-MAE's encoder with a
    fresh head, what the fine-tuning command uses), and ``name`` / ``overrides`` are then not checked against it.

    With ``new_head`` (``Mode.APPLY``; ``create_model(name, pretrained_file=...)``) the overrides change the loaded
    model, as timm's ``create_model`` applies them: a ``num_classes`` other than the file's keeps the backbone and
    gives a fresh classifier (logged), ``image_size`` re-grids the position table, ``drop_path`` applies; the other
    fields ``name`` registers must still agree with a stored config.
    """
    mode = Mode.CLASSIFIER if as_classifier else Mode.APPLY if new_head else Mode.CHECK
    return materialize(resolve(path), name, overrides, mode)


def from_pretrained(
    directory: str | Path, map_location: str | torch.device = "cpu", revision: str | None = None, **overrides: object
) -> Model:
    """Load a model written by ``model.save_pretrained``, whatever its family (the class its stored ``arch``
    registered): a folder, its ``model.safetensors`` or ``config.json``, a finished training run (its final
    ``model/``), or ``"hf-hub:ORG/NAME"`` (``revision``: a branch, tag or commit), checksums verified.
    ``overrides`` change the stored config (timm's names too): ``from_pretrained(RUN, num_classes=3)`` keeps the
    backbone and gives a fresh 3-class head (logged), ``image_size=`` re-grids the position embedding,
    ``drop_path=`` / ``drop_path_rate=`` set stochastic depth."""
    if isinstance(directory, (str, Path)) and is_run_dir(directory) and not is_saved_model_dir(directory):
        source = run_model_source(directory)
        if source.name != MODEL_DIR:
            raise CheckpointError(
                f"{directory} is a training run without its final {MODEL_DIR}/ yet (still training, or interrupted); "
                "load_model(RUN) loads its latest training state"
            )
        directory = source
    source = read_folder(directory, _registered_class, revision)
    return materialize(source, None, overrides, Mode.APPLY).to(map_location).eval()


def from_official(path_or_state: str | Path | Mapping, name: str, **overrides: object) -> Model:
    """Load the authors' checkpoint of a registered model as ``create_model(name, **overrides)``, in eval mode.

    ``name`` decides the format: the architecture's :class:`~crate_transformer.loading.official.OfficialFormat`
    (``crate_*`` classifiers of the official ``model/crate.py``, ``crate_mae_*`` of ``model/crate_ae``,
    ``crate_bert_*`` of the authors' Hugging Face port, and whatever other families register); a file of another
    registered format is refused naming a model of that format.  Accepts the training containers
    (``{'state_dict': ...}`` written by the official ``main.py`` with keys prefixed ``module.``, ``{'model': ...}``
    as the MAE codebase saves it), a bare state dict, a path to any of them (read with ``weights_only=True``), a
    ``.safetensors`` file as such, or a folder holding ``model.safetensors`` or ``pytorch_model.bin`` (a downloaded
    Hub repository).  This package's own files (a ``save_pretrained`` folder, a run, a training state) are refused
    with the loader that reads them (:func:`from_pretrained`, :func:`load_model`).  Hyperparameters the authors'
    files do not store (η, λ) come from the registered config and ``overrides``; a format whose files describe
    themselves (``OfficialFormat.fields`` / ``config_file``: the language models, e.g. the released CRATE-GPT as
    ``from_official("ckpt-crate-12l-overparam-600000.pt", "crate_gpt_12l_pile")``, or a CRATE-BERT folder with
    its ``config.json``) replaces the registered sizes by the file's, and an override that contradicts the
    file is an error.
    """
    raw, where, folder = _read_file(path_or_state)
    return materialize(Source("authors", where, {}, extras={"raw": raw, "folder": folder}), name, overrides, Mode.CHECK)


# --------------------------------------------------------------------------- a stored config against a name
class ArchitectureNeeded(CheckpointError):
    """An authors' file that does not store its architecture, loaded without a model name: the name is the fix.
    ``examples`` are model names that fit it; whoever shows the error says how its caller takes a name (the
    command line: whether the command takes a model name)."""

    def __init__(self, source: object, what: str, *examples: str) -> None:
        self.path, self.what, self.examples = source, what, examples
        super().__init__(
            f"{source} looks like {what}, which does not store its architecture; name its architecture: pass the "
            f"model name, e.g. {' or '.join(examples)}"
        )


def _examples(raw: object) -> tuple[str, ...]:
    """Model names of the registered official formats that recognise ``raw`` (else crate_small): one, or for a
    nanoGPT file no CRATE format recognises, the two families it may be."""
    try:
        state = unwrap(raw)
    except ValueError:
        return ("crate_small",)
    if isinstance(raw, Mapping) and "model_args" in raw:
        lm = [
            a.official.example for a in official_formats() if a.official.fields is not None and a.official.detect(state)
        ]
        return (lm[0],) if lm else ("crate_gpt_12l_pile", "gpt2_base")
    return (next((a.official.example for a in official_formats() if a.official.detect(state)), "crate_small"),)


def check_stored_config(
    config: FamilyConfig, path: object, name: str | None, overrides: Mapping[str, object], free: Collection[str] = ()
) -> None:
    """Refuse a model name / overrides that disagree with a checkpoint's stored config (equal values pass); the
    fields named in ``free`` are not compared (overrides that change the loaded model)."""
    if name is None and not overrides:
        return
    wanted = {k: v for k, v in registered_fields(name).items() if k not in free} if name is not None else {}
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
