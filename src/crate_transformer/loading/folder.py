"""A model's source read once, and the one build from it: what every loader, ``Model.from_pretrained`` included,
ends with.

* :class:`Source` — what a path held, resolved once: its kind (``"folder"``, ``"state"``, ``"authors"``), the config
  (None for an authors' file until a model name gives it), the weights in this package's keys and what comes with
  them (a folder's extra files, a training state's tokenizer);
* :class:`Mode` — what the caller's model name and overrides mean for a file that stores its config;
* :func:`read_folder` — a ``save_pretrained`` folder (or ``hf-hub:ORG/NAME``) as a :class:`Source`;
* :func:`build` — the model of a :class:`Source`, with overrides applied (a fresh head, a re-gridded position
  table) and the weights loaded strictly;
* :func:`checked` — every file read from the Hugging Face cache is first checked against the hash the cache names
  it by (:func:`~crate_transformer.loading.hub.verify_cached`).

The registry-aware half (which class builds an ``arch``, the authors' formats, the run folders) is
:mod:`crate_transformer.loading.pipeline`; this half needs only the class that builds the stored ``arch``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..io import CONFIG_NAME, FILE_DIGESTS, WEIGHTS_NAME, CheckpointError, load_safetensors, model_dir, read_config_dict
from ..models.contract import FamilyConfig
from .hub import is_hub_spec, resolve_hub, verify_cached
from .values import check_build
from .weights import check_sizes, keep_dtypes, load_backbone, load_weights

__all__ = ["Mode", "Source", "checked", "read_folder", "build", "load_folder"]


class Mode(enum.Enum):
    """What a model name and overrides mean for a file that stores its own config (a folder, a training state).

    ``CHECK``: they describe the file and must agree with it (a command line that always passes ``--model``);
    ``APPLY``: they change the loaded model as timm's ``create_model(pretrained_file=...)`` does — another
    ``num_classes`` keeps the backbone under a fresh head, ``image_size`` re-grids the position table;
    ``CLASSIFIER``: the model becomes an image classifier to fine-tune (``model.as_classifier()``), and name and
    overrides are compared only when it stays the model it was."""

    CHECK = "check"
    APPLY = "apply"
    CLASSIFIER = "classifier"


@dataclasses.dataclass
class Source:
    """A model's file resolved once: ``kind`` (``"folder"``: a ``save_pretrained`` folder; ``"state"``: a training
    state; ``"authors"``: an authors' checkpoint), ``where`` (how messages name it), ``state`` (the weights, in this
    package's keys once converted), ``config`` and ``target`` (the class that builds it; None for an authors' file
    until a model name gives them) and ``extras``: what else the file carries (a folder's ``directory`` and
    weights' ``meta``, a state's ``files``, an authors' ``raw`` object and ``folder``, the weight prefixes to keep
    ``fresh``, the ``pretrained_cfg`` to record)."""

    kind: str
    where: str
    state: Mapping[str, Tensor]
    config: FamilyConfig | None = None
    target: Callable[[FamilyConfig], nn.Module] | None = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)

    def attach(self, model: nn.Module) -> None:
        """Give ``model`` what the file carries besides the weights."""
        if "directory" in self.extras:
            model.load_extra_files(self.extras["directory"], self.extras["meta"])
        if self.extras.get("files"):
            model.attach_files(self.extras["files"], self.where)
        if self.extras.get("pretrained_cfg"):
            model.pretrained_cfg = self.extras["pretrained_cfg"]


def checked(path: str | Path) -> Path:
    """``path``, after checking it against the hash the Hugging Face cache names its content by when it is a file
    of that cache (a snapshot link to ``blobs/<hash>``); any other path unchanged.  Every file a loader reads
    comes through here, so a damaged cached release is refused whichever way it is named."""
    path = Path(path)
    return verify_cached(path, str(path)) if path.is_file() else path


def read_folder(path: str | Path, choose: Callable[[object], type[nn.Module]], revision: str | None = None) -> Source:
    """A ``save_pretrained`` folder — or its ``model.safetensors`` / ``config.json``, or ``"hf-hub:ORG/NAME"``
    (``revision``: a branch, tag or commit) — as a :class:`Source` built by ``choose(arch)``.  Checksums are
    verified (the weights' SHA-256 in the safetensors header, the JSON files' beside it); the stored sizes are
    bounded by the weights (:func:`~crate_transformer.loading.weights.check_sizes`)."""
    directory = model_dir(resolve_hub(path, revision))
    for name in dict.fromkeys((CONFIG_NAME, WEIGHTS_NAME, *FILE_DIGESTS)):
        checked(directory / name)
    data = read_config_dict(directory)
    try:
        target = choose(data.get("arch"))
        config = target.config_class.from_dict(data)
    except ValueError as e:  # a value of the file, named as the file names it
        raise CheckpointError(f"{directory / CONFIG_NAME}: {e}") from None
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"no {WEIGHTS_NAME} in {directory}; the save was incomplete — re-save the model")
    state, meta = load_safetensors(weights)
    check_sizes(target, config, state, directory / CONFIG_NAME)
    hub = {"source": path, "revision": revision, "folder": str(directory)} if is_hub_spec(path) else None
    extras = {"directory": directory, "meta": meta, "pretrained_cfg": hub, "dtypes": True, "path": path}
    return Source("folder", str(weights), state, config, target, extras)


def build(source: Source, overrides: Mapping[str, Any] = {}, fresh_head: bool = False) -> nn.Module:
    """The model of ``source``, in eval mode: ``source.target`` built from its config with ``overrides`` (config
    field names: :func:`~crate_transformer.models.base.timm_overrides` translates timm's) and loaded from its weights.
    A
    ``num_classes`` other than the file's (or ``fresh_head``) keeps every weight but the classifier's, which stays
    fresh (logged); a new ``image_size`` re-grids the position embedding (``resize_pos_embed``); any other override
    must fit the weights.  Sizes given here are bounded before anything is allocated
    (:func:`~crate_transformer.loading.values.check_build`); a folder's model keeps the floating dtypes it was saved
    in."""
    overrides = dict(overrides)
    size = overrides.pop("image_size", None)
    config, target = source.config, source.target
    try:
        config = type(config).from_dict({**config.to_dict(), **overrides})
        probe = config if size is None else type(config).from_dict({**config.to_dict(), "image_size": size})
    except ValueError as e:
        raise CheckpointError(f"{source.where}: {e}") from None
    given = {**overrides, **({} if size is None else {"image_size": size})}
    check_build(target, probe, source.config, given, source.where)
    model = target(config)
    state = source.state
    fresh = source.extras.get("fresh", ())
    if fresh:  # weights the file lacks that keep their initialisation (the format says which may be missing)
        state = {**state, **{k: v for k, v in model.state_dict().items() if k.startswith(tuple(fresh))}}
    if fresh_head or "num_classes" in overrides:
        load_backbone(model, state, source.where)
    else:
        load_weights(model, state, source=source.where)
    if size is not None and size != getattr(config, "image_size", size):
        if not callable(getattr(model, "resize_pos_embed", None)):
            raise CheckpointError(f"{source.where}: this {config.arch} model cannot change its image_size; drop it")
        model.resize_pos_embed(int(size))
    if source.extras.get("dtypes"):
        keep_dtypes(model, state)
    source.attach(model)
    return model.eval()


def load_folder(
    path: str | Path,
    choose: Callable[[object], type[nn.Module]],
    map_location: str | torch.device = "cpu",
    revision: str | None = None,
    **overrides: object,
) -> nn.Module:
    """A model written by ``save_pretrained`` (:func:`read_folder`), built by ``choose(arch)`` with ``overrides``
    (:func:`build`), on ``map_location``, in eval mode and in the floating dtypes it was saved in.  A flipped byte
    in any of its files raises :class:`~crate_transformer.io.CheckpointError` ("... is corrupt"); older files
    without a checksum load."""
    return build(read_folder(path, choose, revision), overrides).to(map_location).eval()
