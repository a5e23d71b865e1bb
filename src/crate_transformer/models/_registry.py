"""The registry's tables (timm's ``_registry``): architectures, named models and released weights.

Nothing here builds, loads or downloads anything, and nothing here imports a model family: each family
module fills the tables when it is imported (its :func:`register_arch`, :func:`register_model` and
:func:`register_pretrained` lines sit at the bottom of the module), so a new family is one file plus those
lines.  Three tables:

* **architectures** — an ``arch`` name (a config's ``arch`` value) → the :class:`~crate_transformer.models.base.Model`
  subclass that builds it (its ``config_class`` parses the config) and the authors' checkpoint format, if any
  (:class:`~crate_transformer.loading.official.OfficialFormat`, read by ``ct.from_official``);
* **models** — a name → the config fields that define it (``create_model(name, **overrides)``);
* **released weights** — a model name → where its authors published the weights (:class:`PretrainedSource`,
  what ``create_model(name, pretrained=True)`` downloads).

The layers above read these tables: :mod:`~crate_transformer.loading.pipeline` (the loaders by ``arch``),
:mod:`~crate_transformer.loading.pretrained` (the zoo downloads) and :mod:`~crate_transformer.models.registry` (the
factory,
``create_model``, which imports every family so the tables are full).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from .._reads import reads
from ..config_utils import OBSERVED, default_of, field_about, field_place, fields_applicability
from ..errors import OptionError
from ..loading.official import OfficialFormat
from .contract import FamilyConfig

if TYPE_CHECKING:  # annotations only: the tables hold classes, they never need the base module's code
    from .base import Model

__all__ = [
    "Arch",
    "register_arch",
    "arch_info",
    "official_formats",
    "config_class",
    "config_classes",
    "register_model",
    "list_models",
    "registered_fields",
    "model_config",
    "model_kind",
    "model_fields",
    "build",
    "PretrainedSource",
    "register_pretrained",
    "ZOO",
    "list_pretrained",
    "pretrained_source",
]

# a stored config without an ``arch`` key predates the other families: it is a CRATE classifier
DEFAULT_ARCH = "crate"


@dataclass(frozen=True)
class Arch:
    """An architecture: the model class that builds it and the authors' checkpoint format, if any."""

    model_class: type[Model]
    official: OfficialFormat | None = None

    @property
    def config_class(self) -> type[FamilyConfig]:
        return self.model_class.config_class

    def build(self, config: FamilyConfig) -> Model:
        return self.model_class(config)


_ARCHS: dict[str, Arch] = {}
_MODELS: dict[str, dict] = {}


def register_arch(arch: str, model_class: type[Model], *, official: OfficialFormat | None = None) -> None:
    """Make ``arch`` (a config's ``arch`` value) buildable by ``model_class``, and readable from the authors'
    files when ``official`` is given."""
    _ARCHS[arch] = Arch(model_class, official)


def arch_info(arch: object) -> Arch:
    """The :class:`Arch` of an architecture name (one-line error naming the known ones)."""
    arch = DEFAULT_ARCH if arch is None else arch
    if not isinstance(arch, str) or arch not in _ARCHS:
        close = difflib.get_close_matches(str(arch), list(_ARCHS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown arch {str(arch)[:40]!r}{hint}; choose one of {tuple(_ARCHS)}")
    return _ARCHS[arch]


def official_formats() -> list[Arch]:
    """The registered architectures that have an authors' checkpoint format."""
    return [a for a in _ARCHS.values() if a.official is not None]


def config_class(arch: object) -> type[FamilyConfig]:
    """The config class of an architecture name (``None``: a stored config from before ``arch`` existed)."""
    return arch_info(arch).config_class


def config_classes() -> list[type[FamilyConfig]]:
    """The config class of every registered architecture, each once, in registration order."""
    return list(dict.fromkeys(a.config_class for a in _ARCHS.values()))


def register_model(name: str, **fields: object) -> None:
    """Register ``name`` as the config with ``fields`` (validated now, so typos fail at import)."""
    config_class(fields.get("arch"))(**fields)
    _MODELS[name] = dict(fields)  # as given; the config coerces them again on every use


def list_models(pattern: str = "*") -> list[str]:
    """Names of registered models matching a shell-style ``pattern`` (e.g. ``"crate_*"``), sorted."""
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def registered_fields(name: str) -> dict:
    """The config fields a registered model name sets (a copy; the others are the config class's defaults)."""
    if name not in _MODELS:
        close = difflib.get_close_matches(name, _MODELS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} Available: {', '.join(list_models())}")
    return dict(_MODELS[name])


def model_config(name: str, *, written: Collection[str] = (), **overrides: object) -> FamilyConfig:
    """The config (the class its ``arch`` registered) of a registered model with ``overrides`` applied
    (values are coerced and validated, e.g. ``lambd="5e-2"`` → 0.05).  The fields the user wrote (``written``:
    keywords, ``--model-args``), at any value, and the other overrides away from their default (a saved
    config.json's full record) are remembered on the config, for :func:`build` to refuse those the model it builds
    never reads."""
    registered = registered_fields(name)
    cls = config_class(registered.get("arch"))
    valid = {f.name for f in fields(cls)}
    bad = sorted(set(overrides) - valid)
    if bad:
        close = difflib.get_close_matches(bad[0], valid, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        known = ", ".join(sorted(model_fields(name)))
        raise OptionError(f"unknown override(s) {bad} for {name!r}{hint}; {name} reads: {known}", option=tuple(bad))
    config = cls(**{**registered, **overrides})
    defaults = {f.name: default_of(f) for f in fields(cls)}
    given = tuple(k for k in overrides if k in written or getattr(config, k) != defaults[k])
    if given:
        object.__setattr__(config, "_given", (name, given))  # not a field: to_dict and config.json never see it
    return config


def model_fields(name: str) -> list[str]:
    """The config fields the registered model ``name`` reads: those its build reads (observed on a build on the
    meta device) and those its class declares read elsewhere."""
    import torch

    config = model_config(name)
    try:
        with torch.device("meta"), reads(config) as seen:
            arch_info(getattr(config, "arch", None)).build(config)
    except Exception:  # a family whose build needs real tensors: every field
        seen = {f.name for f in fields(config)}
    where = fields_applicability(type(config))
    return sorted(k for k in where if k in (seen or ()) or where[k] != OBSERVED)


def model_kind(name: str) -> str:
    """What the registered model ``name`` is (its config class's ``kind``: ``"image classifier"``,
    ``"language model"``, ...), without building it."""
    return config_class(registered_fields(name).get("arch")).kind


def build(config: FamilyConfig) -> Model:
    """The model a config describes (by its ``arch``).  A field :func:`model_config` was given away from its
    default that the build never reads (``eta`` with ``mlp="mlp"``: no ISTA step is built) is refused in one line:
    the build records the fields it reads (:func:`~crate_transformer._reads.reads`), so no family keeps a table."""
    name, given = config.__dict__.get("_given", ("", ()))
    if not given:
        return arch_info(getattr(config, "arch", None)).build(config)
    with reads(config) as seen:  # arch is read too: it picks the family
        model = arch_info(getattr(config, "arch", None)).build(config)
    where = fields_applicability(type(config))
    unread = [k for k in given if seen is not None and k not in seen and where[k] == OBSERVED]
    if unread:
        blocks = " + ".join(b for b in getattr(config, "layer_blocks", ()) if b)
        built = f"{name} (layers {blocks!r})" if blocks else name
        place = field_place(type(config), unread[0])
        raise OptionError(
            f"{place} applies only where the model built reads it, and {built} never reads it: drop {place} (or "
            f"change the field that leaves it unread)",
            **field_about(type(config), unread[0]),
        )
    return model


# --------------------------------------------------------------------------- released weights
@dataclass(frozen=True)
class PretrainedSource:
    """Where one registered model's released weights live and how to feed the model.

    ``repo_id`` set: the file is on the Hugging Face Hub (downloaded automatically); ``direct``: ``url`` is the file
    itself (a plain download link, as torch.hub's ``load_state_dict_from_url`` takes; downloaded automatically into
    torch's hub cache); else ``url`` is a page (Google Drive) the user downloads from by hand and passes as
    ``pretrained_file=``.
    """

    name: str  # the registry name create_model builds
    title: str  # the authors' name for the model
    loader: str  # the name of the OfficialFormat (registered with the model's arch) that reads the file
    filename: str
    repo_id: str = ""
    url: str = ""
    revision: str | None = None  # None: the repository's main branch
    also: tuple[str, ...] = ()  # files of the same repository the loader reads beside ``filename``
    # the SHA-256 the authors or the Hub publish for ``filename`` ("": none stated); checked besides the cache's own
    # hash (the name of its blob), and the only check of a cache without links
    sha256: str = ""
    input: str = ""
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    # the authors' evaluation crop (timm's crop_pct: the share of the shorter side after an aspect-preserving
    # resize; resize 256 + centre crop 224 is 0.875) and resize interpolation, where their code states them
    crop_pct: float | None = None
    interpolation: str | None = None
    classes: str = ""
    licence: str = ""
    reference: str = ""  # where these facts were read
    size: str = ""  # the file's size where known, or what its tensors imply (saying which)
    sources: tuple[str, ...] = ()  # every other known place the file was offered (pages, issues, mirrors)
    status: str = ""  # what is known about the source's availability, e.g. a link reported dead (with the report)
    direct: bool = False  # url is the file itself, not a page (DINO's dl.fbaipublicfiles.com links)

    @property
    def on_hub(self) -> bool:
        return bool(self.repo_id)

    @property
    def page(self) -> str:
        """The address a person opens to download the file: on the Hub its download link (``resolve/``, which a
        browser and ``curl -L`` both follow; a ``blob/`` address is the Hub's HTML viewer of the file), else the
        ``url``: the file itself (``direct``) or the page it is shared on (Google Drive)."""
        if self.on_hub:
            return f"https://huggingface.co/{self.repo_id}/resolve/{self.revision or 'main'}/{self.filename}"
        return self.url

    def preprocessing(self) -> dict:
        """What the release states about feeding the model (``mean``, ``std``, ``crop_pct``, ``interpolation``):
        the part of a model's ``pretrained_cfg`` its data config reads."""
        keys = ("mean", "std", "crop_pct", "interpolation")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    @property
    def source(self) -> str:
        if self.direct:
            return self.url.split("/")[2]  # the host of the link
        return f"hf-hub:{self.repo_id}" if self.on_hub else "Google Drive"


ZOO: dict[str, PretrainedSource] = {}


def register_pretrained(source: PretrainedSource) -> None:
    """Add a release to the zoo (``create_model(source.name, pretrained=True)``)."""
    ZOO[source.name] = source


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
