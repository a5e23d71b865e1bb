"""The model zoo and the Hugging Face Hub.

* :data:`ZOO` — where the authors publish the weights of each registered model that has a release: the Hub
  repository and file (or the Google Drive page), the input and its normalisation, the classes, the licence
  and the ``from_official`` format that reads the file.  Entries name registry models and loader formats
  by string, so an entry can be listed before its loader is installed.
* :func:`load_pretrained` — what ``create_model(name, pretrained=True, pretrained_file=None)`` calls:
  ``huggingface_hub.hf_hub_download`` (its cache, ``HF_HUB_CACHE`` / ``HF_HOME``, offline with
  ``HF_HUB_OFFLINE=1``), then :func:`~crate_transformer.checkpoint.from_official`.
* :func:`hub_snapshot` — ``from_pretrained("hf-hub:ORG/NAME", revision=...)``: a Hub repository in this
  package's own format (``config.json`` + ``model.safetensors``) as a local folder.
* :func:`push_to_hub` / :func:`write_hub_folder` / :func:`model_card` — ``model.push_to_hub(repo_id)``:
  the ``save_pretrained`` files plus a generated model card ``README.md``.

``huggingface_hub`` is imported only inside the functions that use it (``import crate_transformer``
does not need it).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import from_official
from .errors import hub_failure
from .io import CONFIG_NAME, WEIGHTS_NAME, CheckpointError, atomic_write
from .registry import official_formats

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
    "model_card",
    "write_hub_folder",
    "push_to_hub",
    "CITATION",
]

HUB_PREFIX = "hf-hub:"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_TOKENIZER_NAME = "tokenizer.json"


@dataclass(frozen=True)
class PretrainedSource:
    """Where one registered model's released weights live and how to feed the model.

    ``repo_id`` set: the file is on the Hugging Face Hub (downloaded automatically); else ``url`` is a page
    (Google Drive) the user downloads from by hand and passes as ``pretrained_file=``.
    """

    name: str  # the registry name create_model builds
    title: str  # the authors' name for the model
    loader: str  # the name of the OfficialFormat (registered with the model's arch) that reads the file
    filename: str
    repo_id: str = ""
    url: str = ""
    revision: str | None = None  # None: the repository's main branch
    also: tuple[str, ...] = ()  # files of the same repository the loader reads beside ``filename``
    input: str = ""
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    classes: str = ""
    licence: str = ""
    reference: str = ""  # where these facts were read

    @property
    def on_hub(self) -> bool:
        return bool(self.repo_id)

    @property
    def page(self) -> str:
        """The address a person opens to download the file."""
        if self.on_hub:
            return f"https://huggingface.co/{self.repo_id}/blob/{self.revision or 'main'}/{self.filename}"
        return self.url

    @property
    def source(self) -> str:
        return f"hf-hub:{self.repo_id}" if self.on_hub else "Google Drive"


_CRATE_README = "github.com/Ma-Lab-Berkeley/CRATE README.md, main.py (commit 674408f)"
_IMAGENET_224 = "image 224 (resize 256, centre crop 224)"
ZOO: dict[str, PretrainedSource] = {
    s.name: s
    for s in (
        PretrainedSource(
            name="crate_small",
            title="CRATE-S/16, ImageNet-1K supervised",
            loader="CRATE classifier",
            filename="",  # a Drive share page: the user saves the file under any name
            url="https://drive.google.com/file/d/1hYgDJl4EKHYfKprwhEjmWmWHuxnK6_h8/view?usp=share_link",
            input=_IMAGENET_224,
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            classes="ImageNet-1K (1000)",
            licence="MIT (the repository's)",
            reference=_CRATE_README,
        ),
        PretrainedSource(
            name="crate_mae_base",
            title="CRATE-MAE-B/16, ImageNet-1K masked autoencoding",
            loader="CRATE-MAE",
            filename="",
            url="https://drive.google.com/file/d/11i5BMwymqOsunq44WD3omN5mS6ZREQPO/view?usp=sharing",
            input="image 224",
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            classes="none (masked-patch reconstruction)",
            licence="MIT (the repository's)",
            reference=_CRATE_README + ", model/crate_ae/crate_ae.py",
        ),
        PretrainedSource(
            name="crate_alpha_base16",
            title="CRATE-α-B/16, ImageNet-21K pre-trained, ImageNet-1K fine-tuned (81.2% top-1)",
            loader="CRATE-α",
            filename="torch/crate_alpha_B16.pth",
            repo_id="UCSC-VLAA/CRATE-alpha",
            input=_IMAGENET_224,
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            classes="ImageNet-1K (1000)",
            licence="Apache-2.0 (Hub model card)",
            reference="github.com/UCSC-VLAA/CRATE-alpha README.md, torch_inference/eval_in1k_cls.py (commit edbd624)",
        ),
        PretrainedSource(
            name="crate_alpha_large14",
            title="CRATE-α-L/14, ImageNet-21K pre-trained, ImageNet-1K fine-tuned (83.9% top-1)",
            loader="CRATE-α",
            filename="torch/crate_alpha_L14.pth",
            repo_id="UCSC-VLAA/CRATE-alpha",
            input=_IMAGENET_224,
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            classes="ImageNet-1K (1000)",
            licence="Apache-2.0 (Hub model card)",
            reference="github.com/UCSC-VLAA/CRATE-alpha README.md, torch_inference/eval_in1k_cls.py (commit edbd624)",
        ),
        PretrainedSource(
            name="crate_bert_base",
            title="CRATE-BERT-Base (transformers-format port)",
            loader="CRATE-BERT",
            filename="pytorch_model.bin",
            repo_id="jackbai/crate-base",
            also=("config.json",),  # the port's sizes, read by the loader beside the weights
            input="RoBERTa BPE tokens, context 510 (512 position rows)",
            classes="masked tokens (vocabulary 50,265)",
            licence="not stated",
            reference="configuration_crate.py of the CRATE-BERT transformers port (jackbai/crate-base)",
        ),
        PretrainedSource(
            name="crate_gpt_12l_pile",
            title="CRATE-GPT 12 layers, overcomplete ISTA, the Pile (600k steps)",
            loader="CRATE-GPT (crate-lm)",
            filename="ckpt-crate-12l-overparam-600000.pt",
            repo_id="JackBAI/CRATE-GPT-12L-Pile-600000steps",
            input="GPT-2 BPE tokens, context 1024",
            classes="next token (vocabulary 50,304)",
            licence="not stated (the training code is MIT)",
            reference="github.com/crate-lm/crate-lm README.md (commit 3d5027b)",
        ),
    )
}


def loader_formats() -> frozenset[str]:
    """The names of the checkpoint formats :func:`~crate_transformer.checkpoint.from_official` reads (the
    :class:`~crate_transformer.official.OfficialFormat` of each registered architecture that has one)."""
    return frozenset(a.official.name for a in official_formats())


def list_pretrained(pattern: str = "*") -> list[str]:
    """Zoo names matching ``pattern`` (shell style), sorted."""
    return sorted(n for n in ZOO if fnmatch.fnmatch(n, pattern))


def pretrained_source(name: str) -> PretrainedSource:
    """The zoo entry of ``name``; an unknown name is one line listing the zoo."""
    if name in ZOO:
        return ZOO[name]
    close = difflib.get_close_matches(name, ZOO, n=2)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(
        f"no released weights for {name!r}; {hint}models with weights: {', '.join(list_pretrained())} "
        f"(or pass your own file: create_model({name!r}, pretrained_file='PATH'))"
    )


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
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        for extra in src.also:
            hf_hub_download(src.repo_id, extra, revision=src.revision, cache_dir=cache_dir)
        path = hf_hub_download(src.repo_id, src.filename, revision=src.revision, cache_dir=cache_dir)
    except LocalEntryNotFoundError as e:
        raise CheckpointError(
            f"{name}: {' + '.join((src.filename, *src.also))} of {src.repo_id} is not in the Hugging Face cache, and "
            f"{hub_failure(e)}; {_manual_fix(src)}"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{name}: cannot download {src.page} ({first}); {_manual_fix(src)}") from None
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


# --------------------------------------------------------------------------- this package's format on the Hub
def parse_hub_spec(spec: str) -> str:
    """``"hf-hub:ORG/NAME"`` → ``"ORG/NAME"``; anything else is one line naming the expected form."""
    repo_id = spec[len(HUB_PREFIX) :] if spec.startswith(HUB_PREFIX) else ""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"{spec!r} is not a Hub model; write hf-hub:ORG/NAME, e.g. hf-hub:my-org/crate-small-cifar10")
    return repo_id


def hub_snapshot(spec: str, revision: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """The local folder of a Hub repository saved by ``save_pretrained`` / :func:`push_to_hub`.

    Only ``config.json``, ``model.safetensors`` and ``tokenizer.json`` are fetched
    (``snapshot_download(allow_patterns=...)``); offline, the cached snapshot is used.
    """
    repo_id = parse_hub_spec(spec)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, _TOKENIZER_NAME]
        )
    except LocalEntryNotFoundError as e:
        at = f" at revision {revision!r}" if revision else ""
        raise CheckpointError(
            f"{spec}{at} is not in the Hugging Face cache, and {hub_failure(e)}; download "
            f"https://huggingface.co/{repo_id} to a folder and pass that folder instead"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"cannot fetch {spec} ({first}); check the repository name and revision") from None
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"{spec} has no {CONFIG_NAME}: it is not a crate_transformer save_pretrained repository; for the "
            f"authors' releases use create_model(name, pretrained=True) (see crate models --pretrained)"
        )
    return folder


# --------------------------------------------------------------------------- pushing this package's format
CITATION = """@article{yu2024white,
  title   = {White-Box Transformers via Sparse Rate Reduction: Compression Is All There Is?},
  author  = {Yu, Yaodong and Buchanan, Sam and Pai, Druv and Chu, Tianzhe and Wu, Ziyang and Tong, Shengbang
             and Bai, Hao and Zhai, Yuexiang and Haeffele, Benjamin D. and Ma, Yi},
  journal = {Journal of Machine Learning Research},
  volume  = {25},
  number  = {300},
  year    = {2024}
}"""  # as in README.md and CITATION.cff


def _task(config: object) -> str:
    """The Hub pipeline tag of a model config."""
    from .lm import LMConfig
    from .mae import MAEConfig

    if isinstance(config, LMConfig):
        return "fill-mask" if not config.causal and config.num_labels == 0 else "text-generation"
    return "image-feature-extraction" if isinstance(config, MAEConfig) else "image-classification"


def model_card(
    model: torch.nn.Module,
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
    task = _task(config)
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
        "---", data.to_yaml(), "---", "",
        f"# {repo_id.split('/')[-1]}", "",
        f"A `{config.arch}` model (dim {config.dim}, depth {config.depth}, heads {config.heads}, "
        f"{n_params:,} parameters) saved by [crate_transformer](https://github.com/Ma-Lab-Berkeley/CRATE)'s "
        "`push_to_hub`: CRATE, the white-box transformer of Yu et al. (JMLR 2024), whose layers are "
        "unrolled steps on the sparse rate reduction objective.", "",
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
    model: torch.nn.Module,
    folder: str | Path,
    repo_id: str,
    metrics: Mapping[str, float] | None = None,
    dataset: str | None = None,
    license: str | None = None,
) -> Path:
    """Write what :func:`push_to_hub` uploads: ``model.save_pretrained(folder)`` plus the model card ``README.md``."""
    folder = Path(model.save_pretrained(folder))
    card = model_card(model, repo_id, metrics, dataset, license).encode("utf-8")
    atomic_write(folder / "README.md", lambda tmp: Path(tmp).write_bytes(card))
    return folder


def push_to_hub(
    model: torch.nn.Module,
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
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_hub_folder(model, tmp, repo_id, metrics=metrics, dataset=dataset, license=license)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision, commit_message=message)
        except OfflineModeIsEnabled:
            raise ValueError(
                f"cannot push {repo_id}: HF_HUB_OFFLINE=1 disables the Hub; unset it, or write the files with "
                "crate_transformer.pretrained.write_hub_folder(model, folder, repo_id) and upload them later"
            ) from None
    return str(commit)
