"""The model zoo: the authors' released weights of the registered models (the hub layer, above the registry).

* :data:`ZOO` — where the authors publish the weights of each registered model that has a release: the Hub
  repository and file (or a direct download link, or the Google Drive page), the input and its normalisation, the
  classes, the licence and the ``from_official`` format that reads the file.  Each family registers its own releases
  (:func:`~crate_transformer.models._registry.register_pretrained` in its module); entries name registry models and
  loader formats by string.
* :func:`load_pretrained` — what ``create_model(name, pretrained=True, pretrained_file=None)`` calls:
  ``huggingface_hub.hf_hub_download`` (its cache, ``HF_HUB_CACHE`` / ``HF_HOME``, offline with
  ``HF_HUB_OFFLINE=1``), then :func:`~crate_transformer.loading.pipeline.from_official`.
* This package's own format on the Hub (:func:`hub_snapshot`, :func:`push_to_hub`, :func:`write_hub_folder`,
  :func:`model_card`) is :mod:`crate_transformer.loading.hub`, below the models (``Model.push_to_hub`` and
  ``Family.from_pretrained("hf-hub:...")`` need no registry); re-exported here.
* :func:`probe_sources` — which of a release's known addresses answer now (``crate models --pretrained
  --check``), and :func:`no_source_fix`, what to do when none does.

``huggingface_hub`` is imported only inside the functions that use it (``import crate_transformer``
does not need it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import urllib.error
import urllib.request
from pathlib import Path

import torch

from ..io import CheckpointError
from ..models._registry import ZOO, PretrainedSource, list_pretrained, official_formats, pretrained_source
from ..models.spec import IMAGENET_MEAN, IMAGENET_STD
from .hub import (
    CITATION,
    HUB_PREFIX,
    _offline_setting,
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
    "download_direct",
    "direct_path",
    "cached_file",
    "cache_status",
    "SourceAnswer",
    "source_addresses",
    "probe_sources",
    "no_source_fix",
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
    """The local path of ``name``'s released file, downloaded into the Hugging Face cache if needed (a ``direct``
    link's into torch's hub cache: :func:`download_direct`) (again with
    ``force_download``), its content checked against the hash the cache names it by and the published checksum
    (:func:`~crate_transformer.loading.hub.verify_cached`) — the same for the files read beside it (``also``).

    Offline (``HF_HUB_OFFLINE=1`` or no network) and not cached, or a Google-Drive-only file, is one
    :class:`CheckpointError` line naming the address and the ``pretrained_file=`` fix; a corrupt cached file is one
    line naming it and how to fetch it again.
    """
    src = pretrained_source(name)
    if src.direct:
        return download_direct(src, cache_dir, force_download)
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


def direct_path(src: PretrainedSource, cache_dir: str | Path | None = None) -> Path:
    """Where a ``direct`` release's file is kept: ``cache_dir``, else torch's hub cache (``torch.hub.get_dir()``,
    moved by ``TORCH_HOME``) ``checkpoints/``, under the link's file name — where ``torch.hub.load_state_dict_from_url``
    keeps it, so a file the authors' ``torch.hub.load`` fetched is found there."""
    root = Path(cache_dir) if cache_dir is not None else Path(torch.hub.get_dir()) / "checkpoints"
    return root / src.filename


def download_direct(src: PretrainedSource, cache_dir: str | Path | None = None, force_download: bool = False) -> Path:
    """A ``direct`` release's file (:func:`direct_path`), downloaded from its link if it is not there (again with
    ``force_download``; torch.hub's ``download_url_to_file``, which writes a temporary file and renames it when the
    download is complete), its SHA-256 checked where one is published.  ``HF_HUB_OFFLINE=1`` (the package's one
    offline switch) and not there, or a failed download, is one :class:`CheckpointError` line naming the link and the
    ``pretrained_file=`` fix."""
    path = direct_path(src, cache_dir)
    if not path.is_file() or force_download:
        if _offline_setting():
            raise CheckpointError(
                f"{src.name}: {src.filename} is not in torch's hub cache ({path.parent}) and downloads are off "
                f"(HF_HUB_OFFLINE=1); unset HF_HUB_OFFLINE, or {_manual_fix(src)}"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(src.url, str(path), progress=False)
        except Exception as e:  # noqa: BLE001 - urllib's and http.client's errors, translated in one place
            reason = (str(getattr(e, "reason", e)).splitlines() or [type(e).__name__])[0][:120]
            raise CheckpointError(f"{src.name}: downloading {src.url} failed ({reason}); {_manual_fix(src)}") from None
    return _check_direct(src, path)


def _check_direct(src: PretrainedSource, path: Path) -> Path:
    if src.sha256:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        got = digest.hexdigest()
        if got != src.sha256.lower():
            raise CheckpointError(
                f"{src.name}: {path} is corrupt: it has sha256 {got[:12]}…, the published one is {src.sha256[:12]}…; "
                f"{_refetch(src)}"
            )
    return path


def _refetch(src: PretrainedSource) -> str:
    return (
        "delete it and load again to download it anew, or call "
        f"crate_transformer.loading.pretrained.download({src.name!r}, force_download=True)"
    )


def cached_file(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """``name``'s released file if it is in the Hugging Face cache (a direct link's: torch's hub cache) and intact
    (with the files read beside it), else ``None`` (no network)."""
    status, detail = cache_status(name, cache_dir)
    return Path(detail) if status == "cached" else None


def cache_status(name: str, cache_dir: str | Path | None = None) -> tuple[str, str]:
    """Where ``name``'s release stands here, without the network, and a detail: ``("cached", path)`` (in the
    Hugging Face cache or, for a direct link, torch's hub cache, its content checked as :func:`download` checks it),
    ``("corrupt", the one-line error naming the file and how to fetch it again)``, ``("download", "")`` (fetched on
    first use) or ``("manual", "")`` (a Google Drive page)."""
    src = pretrained_source(name)
    if src.direct:
        path = direct_path(src, cache_dir)
        if not path.is_file():
            return "download", ""
        try:
            return "cached", str(_check_direct(src, path))
        except CheckpointError as e:
            return "corrupt", str(e)
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


PROBE_TIMEOUT = 5.0  # seconds one address may take to answer


@dataclasses.dataclass(frozen=True)
class SourceAnswer:
    """One known address of a release and whether it answered: ``detail`` is the HTTP status, the local file, or
    why not (refused, timed out, offline, HTTP 404).  An address that answers serves a page or a file; a share
    page (Google Drive, Colab) answering does not prove the file behind it is still shared."""

    address: str
    answered: bool
    detail: str


def source_addresses(src: PretrainedSource) -> list[str]:
    """Every address a release is known at, in the order tried: the Hub download link (or the page), then each
    entry of ``sources`` that starts with an address (``https://``, ``http://``, ``file://`` or ``github.com/``,
    which is given ``https://``; the words after it are the entry's description)."""
    out = [src.page] if src.page else []
    for entry in src.sources:
        first = entry.split()[0].rstrip(",;.") if entry.split() else ""
        if first.startswith("github.com/"):
            first = "https://" + first
        if first.startswith(("https://", "http://", "file://")) and first not in out:
            out.append(first)
    return out


def _ask(address: str, timeout: float) -> SourceAnswer:
    """A HEAD request (a GET where HEAD is refused with 405); no body is read."""
    for method in ("HEAD", "GET"):
        try:
            with urllib.request.urlopen(urllib.request.Request(address, method=method), timeout=timeout) as r:
                status = getattr(r, "status", None)
                return SourceAnswer(address, True, f"HTTP {status}" if status else "the file is there")
        except urllib.error.HTTPError as e:
            if e.code == 405 and method == "HEAD":
                continue
            return SourceAnswer(address, False, f"HTTP {e.code} {e.reason}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            return SourceAnswer(address, False, str(reason).splitlines()[0][:120] or type(e).__name__)
    return SourceAnswer(address, False, "HEAD and GET refused")  # not reached: GET never continues


def probe_sources(name: str, timeout: float = PROBE_TIMEOUT, offline: bool | None = None) -> list[SourceAnswer]:
    """Ask each of ``name``'s addresses (:func:`source_addresses`) whether it answers, first the Hugging Face cache
    for a Hub release, torch's hub cache for a direct link (intact there: it answers without the network).
    ``offline`` (default: ``HF_HUB_OFFLINE=1``) tries local ``file://`` addresses only; the rest are reported as not
    tried."""
    src = pretrained_source(name)
    offline = _offline_setting() if offline is None else offline
    answers = []
    if src.on_hub or src.direct:
        status, detail = cache_status(name)
        cache = "torch's hub cache" if src.direct else "the Hugging Face cache"
        answers.append(SourceAnswer(cache, status == "cached", detail or f"not cached ({status})"))
    for address in source_addresses(src):
        if offline and not address.startswith("file://"):
            answers.append(SourceAnswer(address, False, "not tried: offline (HF_HUB_OFFLINE=1)"))
        else:
            answers.append(_ask(address, timeout))
    return answers


def no_source_fix(name: str) -> str:
    """What to do when none of ``name``'s addresses answers, in one line: where else the file was offered, what is
    known about it, and how to load a copy found elsewhere."""
    src = pretrained_source(name)
    file = src.filename or "the file"
    where = "; ".join(src.sources) if src.sources else "no other source is known"
    known = f" ({src.status})" if src.status else ""
    return (
        f"{name}: none of its sources answered{known}; other places it was offered: {where}. Find {file} "
        f"(size {src.size or 'not stated'}) there or from someone who has it and load it with "
        f"create_model({name!r}, pretrained=True, pretrained_file='PATH')"
    )
