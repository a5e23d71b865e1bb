"""The model zoo: the authors' released weights of the registered models (the hub layer, above the registry).

* :data:`ZOO` — where the authors publish the weights of each registered model that has a release: the Hub
  repository and file (or the Google Drive page), the input and its normalisation, the classes, the licence
  and the ``from_official`` format that reads the file.  Each family registers its own releases
  (:func:`~crate_transformer.models._registry.register_pretrained` in its module); entries name registry models and
  loader formats by string.
* :func:`load_pretrained` — what ``create_model(name, pretrained=True, pretrained_file=None)`` calls:
  ``huggingface_hub.hf_hub_download`` (its cache, ``HF_HUB_CACHE`` / ``HF_HOME``, offline with
  ``HF_HUB_OFFLINE=1``), then :func:`~crate_transformer.loading.pipeline.from_official`.
* This package's own format on the Hub (:func:`hub_snapshot`, :func:`push_to_hub`, :func:`write_hub_folder`,
  :func:`model_card`) is :mod:`crate_transformer.loading.hub`, below the models (``Model.push_to_hub`` and
  ``Family.from_pretrained("hf-hub:...")`` need no registry); re-exported here.

``huggingface_hub`` is imported only inside the functions that use it (``import crate_transformer``
does not need it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..io import CheckpointError
from ..models._registry import ZOO, PretrainedSource, list_pretrained, official_formats, pretrained_source
from ..models.spec import IMAGENET_MEAN, IMAGENET_STD
from .hub import (
    CITATION,
    HUB_PREFIX,
    hub_failure,
    hub_offline,
    hub_snapshot,
    model_card,
    parse_hub_spec,
    push_to_hub,
    verify_cached,
    write_hub_folder,
)
from .pipeline import load_model

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
    "cache_status",
    "load_pretrained",
    "hub_snapshot",
    "parse_hub_spec",
    "model_card",
    "write_hub_folder",
    "push_to_hub",
    "CITATION",
]


def loader_formats() -> frozenset[str]:
    """The names of the checkpoint formats :func:`~crate_transformer.loading.pipeline.from_official` reads (the
    :class:`~crate_transformer.loading.official.OfficialFormat` of each registered architecture that has one)."""
    return frozenset(a.official.name for a in official_formats())


def _manual_fix(src: PretrainedSource) -> str:
    return f"download {src.page} and pass create_model({src.name!r}, pretrained=True, pretrained_file='PATH')"


def download(name: str, cache_dir: str | Path | None = None, force_download: bool = False) -> Path:
    """The local path of ``name``'s released file, downloaded into the Hugging Face cache if needed (again with
    ``force_download``), its content checked against the hash the cache names it by and the published checksum
    (:func:`~crate_transformer.loading.hub.verify_cached`) — the same for the files read beside it (``also``).

    Offline (``HF_HUB_OFFLINE=1`` or no network) and not cached, or a Google-Drive-only file, is one
    :class:`CheckpointError` line naming the address and the ``pretrained_file=`` fix; a corrupt cached file is one
    line naming it and how to fetch it again.
    """
    src = pretrained_source(name)
    if not src.on_hub:
        why = "the weights are on Google Drive, which is not downloaded automatically"
        raise CheckpointError(f"{name}: {why}; {_manual_fix(src)}")
    from huggingface_hub import hf_hub_download

    offline = hub_offline()
    where = dict(revision=src.revision, cache_dir=cache_dir, local_files_only=offline)
    try:
        found = {f: hf_hub_download(src.repo_id, f, force_download=force_download and not offline, **where)
                 for f in (*src.also, src.filename)}  # fmt: skip
    except Exception as e:  # noqa: BLE001 - huggingface_hub's and its HTTP client's errors, translated in one place
        what = f"{name}: {' + '.join((src.filename, *src.also))} of {src.repo_id}"
        raise (hub_failure(e, what, _manual_fix(src)) or e) from None
    for f, path in found.items():
        verify_cached(path, f"{name}: {f} of {src.repo_id}", src.sha256 if f == src.filename else "", _refetch(src))
    return Path(found[src.filename])


def _refetch(src: PretrainedSource) -> str:
    return (
        "delete it and load again to download it anew, or call "
        f"crate_transformer.loading.pretrained.download({src.name!r}, force_download=True)"
    )


def cached_file(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """``name``'s released file if it is in the Hugging Face cache and intact (with the files read beside it),
    else ``None`` (no network)."""
    status, detail = cache_status(name, cache_dir)
    return Path(detail) if status == "cached" else None


def cache_status(name: str, cache_dir: str | Path | None = None) -> tuple[str, str]:
    """Where ``name``'s release stands here, without the network, and a detail: ``("cached", path)`` (in the
    Hugging Face cache, its content checked as :func:`download` checks it), ``("corrupt", the one-line error
    naming the file and how to fetch it again)``, ``("download", "")`` (fetched on first use) or
    ``("manual", "")`` (a Google Drive page)."""
    src = pretrained_source(name)
    if not src.on_hub:
        return "manual", ""
    from huggingface_hub import try_to_load_from_cache

    found = {
        f: try_to_load_from_cache(src.repo_id, f, cache_dir=cache_dir, revision=src.revision)
        for f in (*src.also, src.filename)
    }
    if not all(isinstance(p, str) for p in found.values()):
        return "download", ""
    try:
        for f, path in found.items():
            verify_cached(path, f"{name}: {f} of {src.repo_id}", src.sha256 if f == src.filename else "", _refetch(src))
    except CheckpointError as e:
        return "corrupt", str(e)
    return "cached", found[src.filename]


def load_pretrained(
    name: str, pretrained_file: str | Path | None = None, cache_dir: str | Path | None = None, **overrides: object
) -> torch.nn.Module:
    """``create_model(name, **overrides)`` with released weights, in eval mode: the zoo's file (:func:`download`)
    or ``pretrained_file`` (an authors' file, a downloaded Hub folder of one, or this package's own model: a
    ``save_pretrained`` folder, a run, a training state), read by :func:`~crate_transformer.loading.pipeline.load_model`
    with ``new_head``: the overrides apply as timm's do — a ``num_classes`` other than the file's keeps the
    backbone and gives a fresh head (logged); a stored config must otherwise agree with ``name``'s."""
    if pretrained_file is None:
        path = download(name, cache_dir=cache_dir)
        model = load_model(path, name, new_head=True, **overrides)
    else:
        path = Path(pretrained_file).expanduser()
        if not path.exists():
            raise CheckpointError(
                f"pretrained_file not found: {path}; pass the downloaded file or folder (or a model saved by this "
                "package)"
            )
        model = load_model(path, name, new_head=True, **overrides)
    recorded = getattr(model.config, "data", None) is not None  # trained here: its own data config, not the zoo's
    entry = dataclasses.asdict(ZOO[name]) if name in ZOO and not recorded else {"name": name}
    model.pretrained_cfg = {**entry, "file": str(path)}
    return model
