"""This package's own format on the Hugging Face Hub: fetching a ``save_pretrained`` repository
(``from_pretrained("hf-hub:ORG/NAME")``) and pushing one (``model.push_to_hub(repo_id)``: the
``save_pretrained`` files plus a generated model card).

It knows no model family: the card reads what the model says of itself (``model.config.pipeline_tag``,
``model.config.to_dict()``), so :class:`~crate_transformer.models.base.Model` can push and load without the registry.
The authors' releases (the zoo) are :mod:`crate_transformer.loading.pretrained`, above the registry.
``huggingface_hub`` is imported only inside the functions that use it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import tempfile
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..io import CONFIG_NAME, FILE_DIGESTS, WEIGHTS_NAME, CheckpointError, atomic_write, file_digest

__all__ = [
    "HUB_PREFIX",
    "is_hub_spec",
    "parse_hub_spec",
    "hub_snapshot",
    "resolve_hub",
    "hub_offline",
    "hub_failure",
    "hub_answer",
    "unreachable",
    "verify_cached",
    "CITATION",
    "model_card",
    "write_hub_folder",
    "push_to_hub",
]

HUB_PREFIX = "hf-hub:"


def is_hub_spec(path: object) -> bool:
    """Whether ``path`` names a Hub repository (``"hf-hub:ORG/NAME"``) rather than a local path."""
    return isinstance(path, str) and path.startswith(HUB_PREFIX)


def parse_hub_spec(spec: str) -> str:
    """``"hf-hub:ORG/NAME"`` → ``"ORG/NAME"``; anything else is one line naming the expected form."""
    repo_id = spec[len(HUB_PREFIX) :] if spec.startswith(HUB_PREFIX) else ""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"{spec!r} is not a Hub model; write hf-hub:ORG/NAME, e.g. hf-hub:my-org/crate-small-cifar10")
    return repo_id


# seconds one connection to the Hub may take before the machine counts as offline
PROBE_SECONDS = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}
# names of the transport errors of the HTTP clients huggingface_hub uses (httpx, requests): no answer at all
_NETWORK_ERRORS = {"ConnectError", "ConnectTimeout", "NetworkError", "TransportError", "TimeoutException",
                   "ConnectionError", "ProxyError", "SSLError"}  # fmt: skip


def _offline_setting() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_offline() -> bool:
    """Whether the Hub must not be asked: ``HF_HUB_OFFLINE=1``, or one connection to its endpoint failed within
    :data:`PROBE_SECONDS` (tried once per process and endpoint).  The loaders then read the cache only
    (``local_files_only``), so an offline machine fails in seconds instead of after huggingface_hub's five
    retries (about 25 s of warnings)."""
    from huggingface_hub import constants

    return _offline_setting() or not _endpoint_answers(constants.ENDPOINT)


@functools.cache
def _endpoint_answers(endpoint: str) -> bool:
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # through a proxy the host need not resolve here: let the client try
    url = urllib.parse.urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=PROBE_SECONDS):
            return True
    except OSError:  # no DNS, refused, unreachable, timed out
        return False


def _network_error(e: BaseException) -> bool:
    return isinstance(e, (ConnectionError, socket.gaierror, TimeoutError)) or any(
        c.__name__ in _NETWORK_ERRORS for c in type(e).__mro__
    )


def hub_failure(e: BaseException, what: str, fix: str, *, cache: bool = True) -> CheckpointError | None:
    """The one translation of a Hub failure into a one-line :class:`CheckpointError`: ``what`` failed (e.g.
    ``"hf-hub:ORG/NAME"``), ``fix`` says what to do instead; ``cache``: whether the Hugging Face cache could
    have answered (a download, not an upload).  None when ``e`` is no Hub or network failure (re-raise it)."""
    from huggingface_hub import errors

    e = hub_answer(e) or e  # a failed lookup wraps the Hub's HTTP answer: the answer, not "offline", is the reason
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if isinstance(e, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)) or _network_error(e):
        why = "HF_HUB_OFFLINE=1" if _offline_setting() else "no network" if hub_offline() else first
        cached = " is not in the Hugging Face cache and" if cache else ":"
        return CheckpointError(f"{what}{cached} the Hub cannot be reached ({why}); {fix}")
    if isinstance(e, errors.RevisionNotFoundError):
        return CheckpointError(f"{what}: the Hub has no such revision; check the revision, or {fix}")
    if isinstance(e, errors.RepositoryNotFoundError):
        return CheckpointError(
            f"{what}: the Hub has no such repository (or it is private and no token was given); check the name, or "
            f"{fix}"
        )
    if isinstance(e, errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if isinstance(status, int) and status >= 500:
            cached = " is not in the Hugging Face cache, and" if cache else ":"
            return CheckpointError(
                f"{what}{cached} the Hub answered HTTP {status}, a server error (it is reachable but failing: try "
                f"again later); {fix}"
            )
        answered = f"the Hub answered {status}" if status else "the Hub refused"
        return CheckpointError(f"{what}: {answered} ({first}); {fix}")
    return None


def hub_answer(e: BaseException) -> BaseException | None:
    """The Hub's HTTP answer (an ``HfHubHTTPError``) in ``e``'s chain — ``e``, what it was raised from or while
    handling — or None: huggingface_hub reports a lookup the Hub answered with an error (HTTP 500, 401) as a
    missing cache entry, and ``datasets`` wraps that again."""
    from huggingface_hub import errors

    return next((x for x in _chain(e) if isinstance(x, errors.HfHubHTTPError)), None)


def unreachable(e: BaseException) -> bool:
    """Whether ``e``'s chain holds a network failure (no answer at all: no DNS, refused, timed out)."""
    return any(_network_error(x) for x in _chain(e))


def _chain(e: BaseException | None) -> list[BaseException]:
    out: list[BaseException] = []
    while e is not None and all(e is not x for x in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


# the length of a cache blob's name → the hash it is: huggingface_hub stores each file under its etag, the SHA-256 of
# an LFS file and git's blob id (SHA-1) of any other
_BLOB_DIGESTS = {64: "sha256", 40: "git-sha1"}
REFETCH = "delete it and load again to download it anew"


# (file, size, modification time, algorithm) → digest: a file checked by the download and again by the loader that reads
# it is hashed once (a release is hundreds of MB); any rewrite of the file changes the key
_DIGESTS: dict[tuple[str, int, int, str], str] = {}


def _digest(path: Path, algorithm: str) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, algorithm)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path, algorithm)
    return _DIGESTS[key]


def verify_cached(path: str | Path, what: str, sha256: str = "", fix: str = REFETCH) -> Path:
    """``path`` (a file huggingface_hub returned from its cache) after checking its content before anything reads it.

    The cache keeps each file as ``blobs/<hash of its content>`` (SHA-256 for LFS files, git's blob id for the
    others), with ``snapshots/<commit>/<path>`` a link to it: the bytes must hash to the blob's name.  ``sha256``, a
    checksum published for the file, must match too; it is the only check of a cache without links (copies,
    Windows without developer mode).  A mismatch is one :class:`CheckpointError` line naming ``what``, the file and
    ``fix`` (how to fetch it again)."""
    blob = Path(os.path.realpath(path))
    checks = []
    if blob.parent.name == "blobs" and len(blob.name) in _BLOB_DIGESTS and re.fullmatch("[0-9a-f]+", blob.name):
        checks.append((_BLOB_DIGESTS[len(blob.name)], blob.name, "the Hub's"))
    if sha256:
        checks.append(("sha256", sha256.lower(), "the published one"))
    for algorithm, want, whose in checks:
        got = _digest(blob, algorithm)
        if got != want:
            raise CheckpointError(
                f"{what} in the Hugging Face cache is corrupt: {blob} has {algorithm} {got[:12]}…, {whose} is "
                f"{want[:12]}…; {fix}"
            )
    return Path(path)


def hub_snapshot(spec: str, revision: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """The local folder of a Hub repository saved by ``save_pretrained`` / :func:`push_to_hub`.

    Only ``config.json``, ``model.safetensors`` and the checksummed extra files (``tokenizer.json``) are fetched
    (``snapshot_download(allow_patterns=...)``); offline (:func:`hub_offline`), the cached snapshot is used.  Each
    file's content is checked against the hash the cache names it by (:func:`verify_cached`).
    """
    repo_id = parse_hub_spec(spec)
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, *FILE_DIGESTS],
            local_files_only=hub_offline(),
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - huggingface_hub's and its HTTP client's errors, translated in one place
        at = f" at revision {revision!r}" if revision else ""
        fix = f"download https://huggingface.co/{repo_id} to a folder and pass that folder instead"
        raise (hub_failure(e, f"{spec}{at}", fix) or e) from None
    folder = Path(folder)
    for name in dict.fromkeys((CONFIG_NAME, WEIGHTS_NAME, *FILE_DIGESTS)):
        if (folder / name).is_file():
            verify_cached(folder / name, f"{spec}: {name}")
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"{spec} has no {CONFIG_NAME}: it is not a crate_transformer save_pretrained repository; for the "
            "authors' releases use create_model(name, pretrained=True) (ct.list_pretrained() names them)"
        )
    return folder


def resolve_hub(path: str | Path, revision: str | None = None) -> str | Path:
    """``"hf-hub:ORG/NAME"`` → its local snapshot folder; any other path unchanged (``revision`` is Hub-only).  An
    empty path is refused: ``Path("")`` would quietly be the current folder."""
    if os.fspath(path) == "":
        raise CheckpointError("an empty path names no model; pass a model folder, a run folder or a checkpoint file")
    if is_hub_spec(path):
        return hub_snapshot(path, revision=revision)
    if revision is not None:
        raise ValueError(f"revision={revision!r} applies to hf-hub:ORG/NAME models only, not to the path {path}")
    return path


CITATION = """@article{yu2024white,
  title   = {White-Box Transformers via Sparse Rate Reduction: Compression Is All There Is?},
  author  = {Yu, Yaodong and Buchanan, Sam and Pai, Druv and Chu, Tianzhe and Wu, Ziyang and Tong, Shengbang
             and Bai, Hao and Zhai, Yuexiang and Haeffele, Benjamin D. and Ma, Yi},
  journal = {Journal of Machine Learning Research},
  volume  = {25},
  number  = {300},
  year    = {2024}
}"""  # as in README.md and CITATION.cff


# the line that marks a README.md as a card written here: write_hub_folder replaces such a file, never another
CARD_MARKER = "<!-- model card written by crate_transformer (push_to_hub / write_hub_folder) -->"


def model_card(
    model: Any,
    repo_id: str,
    metrics: Mapping[str, float] | None = None,
    dataset: str | None = None,
    license: str | None = None,
) -> str:
    """The ``README.md`` of a pushed model: Hub metadata (library, tags, task, licence, and ``model-index``
    results when ``metrics`` and ``dataset`` are given), how to load it, its config, the run's metrics
    and the paper's BibTeX."""
    from huggingface_hub import EvalResult, ModelCardData

    config = model.config
    task = config.pipeline_tag
    results = [
        EvalResult(task_type=task, dataset_type=dataset, dataset_name=dataset, metric_type=k, metric_value=float(v))
        for k, v in (metrics or {}).items()
    ]
    data = ModelCardData(
        library_name="crate-transformer",
        tags=["crate", "white-box-transformer", "sparse-rate-reduction"],
        pipeline_tag=task,
        license=license,
        datasets=[dataset] if dataset else None,
        model_name=repo_id.split("/")[-1],
        eval_results=results if dataset and results else None,
    )
    n_params = sum(p.numel() for p in model.parameters())
    lines = [
        "---", data.to_yaml(), "---", CARD_MARKER, "",
        f"# {repo_id.split('/')[-1]}", "",
        f"A `{config.arch}` model (dim {config.dim}, depth {config.depth}, heads {config.heads}, "
        f"{n_params:,} parameters) saved by the `crate_transformer` package's `push_to_hub`. CRATE is the "
        "white-box transformer of Yu et al. (JMLR 2024), whose layers are unrolled steps on the sparse rate "
        "reduction objective; the authors' code, https://github.com/Ma-Lab-Berkeley/CRATE, is the reference "
        "the package's layers are checked against.", "",
        "## Use", "", "```python", "import crate_transformer as ct", "",
        f'model = ct.from_pretrained("{HUB_PREFIX}{repo_id}")', "```", "",
        "## Configuration", "", "```json", json.dumps(config.to_dict(), indent=2, default=str), "```", "",
    ]  # fmt: skip
    if metrics:
        where = f" on {dataset}" if dataset else ""
        lines += [f"## Metrics{where}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {float(v):.6g} |" for k, v in metrics.items()] + [""]
    lines += ["## Citation", "", "```bibtex", CITATION, "```", ""]
    return "\n".join(lines)


def write_hub_folder(
    model: Any,
    folder: str | Path,
    repo_id: str,
    metrics: Mapping[str, float] | None = None,
    dataset: str | None = None,
    license: str | None = None,
) -> Path:
    """Write what :func:`push_to_hub` uploads: ``model.save_pretrained(folder)`` plus the model card ``README.md``.

    A ``README.md`` already in ``folder`` is replaced only when it is a card written here (:data:`CARD_MARKER`);
    one of the user's is refused before anything is written."""
    readme = Path(folder) / "README.md"
    if readme.is_file() and CARD_MARKER not in readme.read_text(encoding="utf-8", errors="replace"):
        raise ValueError(
            f"{readme} exists and is not a model card written by this package; write_hub_folder would replace it "
            "with the generated card: move it, or write to another folder"
        )
    folder = Path(model.save_pretrained(folder))
    card = model_card(model, repo_id, metrics, dataset, license).encode("utf-8")
    atomic_write(folder / "README.md", lambda tmp: Path(tmp).write_bytes(card))
    return folder


def push_to_hub(
    model: Any,
    repo_id: str,
    *,
    metrics: Mapping[str, float] | None = None,
    dataset: str | None = None,
    license: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    message: str = "Upload crate_transformer model",
) -> str:
    """Upload ``model`` in this package's format (config.json, model.safetensors, README.md model card) to
    the Hub repository ``repo_id`` (created if missing); returns the commit URL.  Load it back with
    ``ct.from_pretrained("hf-hub:" + repo_id)``."""
    parse_hub_spec(HUB_PREFIX + repo_id)
    from huggingface_hub import HfApi
    from huggingface_hub.errors import OfflineModeIsEnabled

    api = HfApi(token=token)
    fix = (
        "write the files with crate_transformer.loading.pretrained.write_hub_folder(model, folder, repo_id) "
        "to upload later"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_hub_folder(model, tmp, repo_id, metrics=metrics, dataset=dataset, license=license)
        try:
            if hub_offline():  # one quick probe, not the client's retries
                raise OfflineModeIsEnabled("the Hub cannot be reached")
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision, commit_message=message)
        except Exception as e:  # noqa: BLE001 - huggingface_hub's and its HTTP client's errors, translated in one place
            raise (hub_failure(e, f"cannot push {repo_id}", fix, cache=False) or e) from None
    return str(commit)
