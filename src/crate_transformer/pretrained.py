"""The model zoo: the authors' released weights of the registered models (the hub layer, above the registry).

* :data:`ZOO` — where the authors publish the weights of each registered model that has a release: the Hub
  repository and file (or the Google Drive page), the input and its normalisation, the classes, the licence
  and the ``from_official`` format that reads the file.  Each family registers its own releases
  (:func:`~crate_transformer._registry.register_pretrained` in its module); entries name registry models and
  loader formats by string.
* :func:`load_pretrained` — what ``create_model(name, pretrained=True, pretrained_file=None)`` calls:
  ``huggingface_hub.hf_hub_download`` (its cache, ``HF_HUB_CACHE`` / ``HF_HOME``, offline with
  ``HF_HUB_OFFLINE=1``), then :func:`~crate_transformer.checkpoint.from_official`.
* This package's own format on the Hub (:func:`hub_snapshot`, :func:`push_to_hub`, :func:`write_hub_folder`,
  :func:`model_card`) is :mod:`crate_transformer._hub`, below the models (``Model.push_to_hub`` and
  ``Family.from_pretrained("hf-hub:...")`` need no registry); re-exported here.

``huggingface_hub`` is imported only inside the functions that use it (``import crate_transformer``
does not need it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ._hub import (
    CITATION,
    HUB_PREFIX,
    hub_failure,
    hub_offline,
    hub_snapshot,
    model_card,
    parse_hub_spec,
    push_to_hub,
    write_hub_folder,
)
from ._registry import ZOO, PretrainedSource, list_pretrained, official_formats, pretrained_source
from .checkpoint import from_official
from .io import CheckpointError
from .spec import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "HUB_PREFIX",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PretrainedSource",
    "ZOO",
    "list_pretrained",
    "pretrained_source",
    "download",
    "cached_file",
    "load_pretrained",
    "hub_snapshot",
    "parse_hub_spec",
    "model_card",
    "write_hub_folder",
    "push_to_hub",
    "CITATION",
]


def loader_formats() -> frozenset[str]:
    """The names of the checkpoint formats :func:`~crate_transformer.checkpoint.from_official` reads (the
    :class:`~crate_transformer.official.OfficialFormat` of each registered architecture that has one)."""
    return frozenset(a.official.name for a in official_formats())


def _manual_fix(src: PretrainedSource) -> str:
    return f"download {src.page} and pass create_model({src.name!r}, pretrained=True, pretrained_file='PATH')"


def download(name: str, cache_dir: str | Path | None = None) -> Path:
    """The local path of ``name``'s released file, downloaded into the Hugging Face cache if needed.

    Offline (``HF_HUB_OFFLINE=1`` or no network) and not cached, or a Google-Drive-only file, is one
    :class:`CheckpointError` line naming the address and the ``pretrained_file=`` fix.
    """
    src = pretrained_source(name)
    if not src.on_hub:
        why = "the weights are on Google Drive, which is not downloaded automatically"
        raise CheckpointError(f"{name}: {why}; {_manual_fix(src)}")
    from huggingface_hub import hf_hub_download

    where = dict(revision=src.revision, cache_dir=cache_dir, local_files_only=hub_offline())
    try:
        for extra in src.also:
            hf_hub_download(src.repo_id, extra, **where)
        path = hf_hub_download(src.repo_id, src.filename, **where)
    except Exception as e:  # noqa: BLE001 - huggingface_hub's and its HTTP client's errors, translated in one place
        what = f"{name}: {' + '.join((src.filename, *src.also))} of {src.repo_id}"
        raise (hub_failure(e, what, _manual_fix(src)) or e) from None
    return Path(path)


def cached_file(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """``name``'s released file if it is already in the Hugging Face cache, else ``None`` (no network)."""
    src = pretrained_source(name)
    if not src.on_hub:
        return None
    from huggingface_hub import try_to_load_from_cache

    found = [
        try_to_load_from_cache(src.repo_id, f, cache_dir=cache_dir, revision=src.revision)
        for f in (src.filename, *src.also)
    ]
    return Path(found[0]) if all(isinstance(f, str) for f in found) else None


def load_pretrained(
    name: str, pretrained_file: str | Path | None = None, cache_dir: str | Path | None = None, **overrides: object
) -> torch.nn.Module:
    """``create_model(name, **overrides)`` with released weights: ``pretrained_file`` if given, else the
    zoo's file (:func:`download`), read by ``from_official(file, name, **overrides)``."""
    if pretrained_file is None:
        path = download(name, cache_dir=cache_dir)
    else:
        path = Path(pretrained_file).expanduser()
        if not path.is_file():
            raise CheckpointError(f"pretrained_file not found: {path}; pass the path of the downloaded file")
    model = from_official(path, name, **overrides)
    entry = dataclasses.asdict(ZOO[name]) if name in ZOO and pretrained_file is None else {"name": name}
    model.pretrained_cfg = {**entry, "file": str(path)}
    return model
