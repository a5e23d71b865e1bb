"""Hugging Face ``transformers`` integration: this package's models behind ``AutoConfig`` / ``AutoModel*`` and
``pipeline`` (the ``hf`` extra: ``pip install "crate-transformer[hf]"``).

Importing this module registers two ``model_type`` values, the ones :meth:`~crate_transformer.models.base.Model.
save_pretrained` writes into ``config.json`` (a config class's ``MODEL_TYPE``):

* ``crate_transformer_lm`` — the language models (CRATE-GPT, the GPT-2 baseline, CRATE-BERT, ToST's LM) for
  ``AutoModel`` (the last layer's tokens), ``AutoModelForCausalLM`` (causal ones) and ``AutoModelForMaskedLM``
  (bidirectional ones), and ``AutoTokenizer`` (the folder's ``tokenizer.json``, :class:`CrateTokenizerFast`);
* ``crate_transformer_image`` — the image classifiers (CRATE, ViT, CRATE-α, ToST) for ``AutoModel`` (tokens and
  pooled features) and ``AutoModelForImageClassification``.

So, on a folder written by ``save_pretrained``::

    import crate_transformer.loading.transformers_hf  # noqa: F401  (registers the model types)
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    model = AutoModelForCausalLM.from_pretrained(folder)
    text = pipeline("text-generation", model=model, tokenizer=AutoTokenizer.from_pretrained(folder))

Each wrapper holds the package's model as ``.crate`` and computes exactly its ``forward`` (the same logits).  The
folder is read and written by this package's loader (checksums verified, ``ct.from_pretrained`` reads it
unchanged); ``transformers``' generation runs without a key-value cache (the whole context each step; the package's
own ``model.crate.generate`` keeps one).  An option the wrappers cannot honour is a one-line error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    import transformers
    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast
    from transformers.modeling_outputs import (
        BaseModelOutput,
        BaseModelOutputWithPooling,
        CausalLMOutputWithPast,
        ImageClassifierOutput,
        MaskedLMOutput,
    )
except ImportError:  # pragma: no cover - the optional extra
    raise ImportError(
        "the transformers integration needs the transformers package; pip install 'crate-transformer[hf]'"
    ) from None

from ..models._registry import build, config_class
from ..models.base import Model
from ..models.contract import IMAGE_CLASSIFIER, LANGUAGE_MODEL, FamilyConfig
from ..models.tokenizer import SPECIAL_TOKENS, TOKENIZER_NAME, Tokenizer
from .pipeline import from_pretrained as crate_from_pretrained

__all__ = [
    "CrateLMConfig",
    "CrateImageConfig",
    "CrateModel",
    "CrateForCausalLM",
    "CrateForMaskedLM",
    "CrateImageModel",
    "CrateForImageClassification",
    "CrateTokenizerFast",
    "hf_model",
    "hf_tokenizer",
]

_STORED = ("config_version", "crate_transformer_version")  # config.json's own keys besides the config's fields


class _CrateConfig(PretrainedConfig):
    """``transformers``' config around this package's: ``crate_config`` (the :class:`~crate_transformer.Config` the
    folder's ``config.json`` holds, its ``arch`` naming the class) and ``transformers``' standard names read off it."""

    default_arch: ClassVar[str]
    kind: ClassVar[str]

    def __init__(self, crate_config: FamilyConfig | Mapping | None = None, **kwargs: Any) -> None:
        """``crate_config``: the package's config (or its dict); else ``kwargs`` hold ``config.json``'s keys."""
        if isinstance(crate_config, Mapping):
            kwargs = {**crate_config, **kwargs}
            crate_config = None
        if crate_config is None:  # AutoConfig passes config.json's keys; transformers builds defaults with none
            klass = config_class(kwargs.get("arch", self.default_arch))
            fields = {f for f in klass.__dataclass_fields__} | set(_STORED)
            ours = {k: kwargs.pop(k) for k in list(kwargs) if k in fields}
            ours.pop("crate_transformer_version", None)
            crate_config = klass.from_dict({"arch": self.default_arch, **ours})
        if crate_config.kind != self.kind:
            raise ValueError(
                f"a {crate_config.kind} config cannot be a {type(self).__name__} ({self.kind}); load the folder with "
                "the Auto class of its kind"
            )
        kwargs.setdefault("tie_word_embeddings", False)  # the package's model ties its own head
        kwargs.setdefault("use_cache", False)
        super().__init__(**{**self.standard_names(crate_config), **kwargs})
        self.crate_config = crate_config  # after transformers' __init__, which resets the attributes

    @staticmethod
    def standard_names(c: FamilyConfig) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        """``transformers``' keys and the package config's fields (what ``print(config)`` and ``to_json_string``
        show); the folder itself is written by the package's ``save_pretrained``."""
        d = super().to_dict()
        d.pop("crate_config", None)
        return {**d, **self.crate_config.to_dict()}


class CrateLMConfig(_CrateConfig):
    """The language models' config (``model_type = "crate_transformer_lm"``)."""

    model_type = "crate_transformer_lm"
    default_arch = "crate_lm"
    kind = LANGUAGE_MODEL

    def __init__(self, crate_config: FamilyConfig | Mapping | None = None, **kwargs: Any) -> None:
        # its own __init__: transformers makes each config subclass a dataclass, generating one otherwise
        super().__init__(crate_config, **kwargs)

    @staticmethod
    def standard_names(c: FamilyConfig) -> dict[str, Any]:
        return {
            "vocab_size": c.vocab_size,
            "hidden_size": c.dim,
            "num_hidden_layers": c.depth,
            "num_attention_heads": c.heads,
            "max_position_embeddings": c.block_size,
            "is_decoder": c.causal,
        }


class CrateImageConfig(_CrateConfig):
    """The image classifiers' config (``model_type = "crate_transformer_image"``)."""

    model_type = "crate_transformer_image"
    default_arch = "crate"
    kind = IMAGE_CLASSIFIER

    def __init__(self, crate_config: FamilyConfig | Mapping | None = None, **kwargs: Any) -> None:
        # its own __init__: transformers makes each config subclass a dataclass, generating one otherwise
        super().__init__(crate_config, **kwargs)

    @staticmethod
    def standard_names(c: FamilyConfig) -> dict[str, Any]:
        n = max(int(c.num_classes), 1)
        return {"hidden_size": c.dim, "num_hidden_layers": c.depth, "image_size": c.image_size,
                "num_channels": c.in_chans, "id2label": {i: f"LABEL_{i}" for i in range(n)}}  # fmt: skip


# transformers' own keyword arguments of from_pretrained that a folder load may carry (the Auto classes pass some)
_LOAD_KWARGS = ("revision", "trust_remote_code", "adapter_kwargs", "local_files_only", "cache_dir", "token")


class _CrateWrapper(PreTrainedModel):
    """A ``PreTrainedModel`` holding this package's model as ``.crate``; loaded and saved by the package."""

    base_model_prefix = "crate"
    kind: ClassVar[str]

    def __init__(self, config: _CrateConfig, crate_model: Model | None = None) -> None:
        super().__init__(config)
        self.crate = crate_model if crate_model is not None else build(config.crate_config)
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: the package's model initialises (or loads) its own weights."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate recomputes the context: the package's caches are not transformers' Cache

    @classmethod
    def from_pretrained(cls, path: str | Path, *args: Any, config: _CrateConfig | None = None, **kwargs: Any):  # noqa: ANN206
        """The folder ``path`` (``save_pretrained``'s, a finished run, ``hf-hub:ORG/NAME``) read by
        :func:`crate_transformer.from_pretrained`; ``dtype`` / ``torch_dtype`` casts it."""
        dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
        revision = kwargs.get("revision")
        unknown = sorted(
            k for k, v in kwargs.items() if k not in _LOAD_KWARGS and not k.startswith("_") and v is not None
        )
        if args or unknown:
            raise ValueError(
                f"{cls.__name__}.from_pretrained takes the folder and dtype=; got {[*map(repr, args), *unknown]}: "
                "change the model with crate_transformer's overrides (ct.from_pretrained(folder, **overrides)) "
                "and wrap it with hf_model(model)"
            )
        model = crate_from_pretrained(path, revision=revision)
        _config_unchanged(config, cls.config_class(model.config))
        if dtype not in (None, "auto"):
            model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return cls.wrap(model, config)

    @classmethod
    def wrap(cls, model: Model, config: _CrateConfig | None = None) -> _CrateWrapper:
        """This wrapper around ``model`` (a one-line error for a model of another kind)."""
        if model.kind != cls.kind:
            raise ValueError(
                f"{cls.__name__} wraps a {cls.kind}, and this is a {model.kind} ({model.config.arch}); use "
                "hf_model(model) or the Auto class of its kind"
            )
        wrapper = cls(config or cls.config_class(model.config), model)
        return wrapper.eval() if not model.training else wrapper

    def save_pretrained(self, directory: str | Path, **kwargs: Any) -> None:  # type: ignore[override]
        """The package's ``save_pretrained`` (``config.json`` with its ``model_type``, checksummed weights, the
        tokenizer): what ``from_pretrained`` and ``ct.from_pretrained`` both read."""
        ignored = sorted(k for k, v in kwargs.items() if v not in (None, True) and k != "state_dict")
        if ignored or kwargs.get("state_dict") is not None:
            raise ValueError(f"save_pretrained writes the package's folder and takes no {ignored or ['state_dict']}")
        self.crate.save_pretrained(directory)


# what transformers records on a config it read (where from, its version), not a setting of the model
_READ_KEYS = ("_name_or_path", "_commit_hash", "transformers_version", "architectures")


def _config_unchanged(given: _CrateConfig | None, stored: _CrateConfig) -> None:
    """One line when the config ``from_pretrained`` was handed differs from the folder's (a setting passed to the
    Auto class, ``num_labels=3``, which the stored weights would not follow)."""
    if given is None:
        return
    a, b = given.to_dict(), stored.to_dict()
    changed = sorted(k for k in set(a) | set(b) if k not in _READ_KEYS and a.get(k) != b.get(k))
    if changed:
        raise ValueError(
            f"the folder's model is loaded as saved, and {changed} differ from its config.json; change the model "
            "with ct.from_pretrained(folder, **overrides) (num_classes=..., ...) and wrap it with hf_model(model)"
        )


def _no_extras(kwargs: Mapping[str, Any], allowed: tuple[str, ...] = ()) -> None:
    """One line for a ``forward`` keyword the wrappers cannot honour (attention maps, hidden states, caches)."""
    plumbing = ("return_dict", "use_cache", *allowed)  # what transformers' generate passes as a matter of course
    given = sorted(k for k, v in kwargs.items() if k not in plumbing and v not in (None, False))
    if kwargs.get("use_cache"):
        given.append("use_cache=True")
    if given:
        raise ValueError(
            f"the crate_transformer wrappers do not return {given}; use model.crate.forward_trace(x, "
            "return_attention=True) for every layer's tokens and attention"
        )


def _key_mask(attention_mask: Tensor | None, causal: bool) -> Tensor | None:
    """transformers' ``attention_mask`` as the package's ``key_mask`` (True at real tokens).  A causal model
    needs none for padding on the right (no real token attends to a later one); padding on the left would move
    the positions of the real tokens, refused in one line."""
    if attention_mask is None or bool(attention_mask.bool().all()):
        return None
    mask = attention_mask.bool()
    if causal:
        if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise ValueError(
                "attention_mask pads on the left, which moves the positions of the real tokens; pad on the right "
                "(tokenizer.padding_side = 'right') or pass prompts of one length"
            )
        return None
    return mask


class CrateModel(_CrateWrapper):
    """``AutoModel`` of a language model: ``last_hidden_state`` = ``crate.forward_features`` (b, n, d)."""

    config_class = CrateLMConfig
    kind = LANGUAGE_MODEL

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.crate.wte

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any) -> BaseModelOutput:
        _no_extras(kwargs)
        mask = _key_mask(attention_mask, self.crate.config.causal)
        return BaseModelOutput(last_hidden_state=self.crate.forward_features(input_ids, key_mask=mask))


class CrateForCausalLM(_CrateWrapper, GenerationMixin):
    """``AutoModelForCausalLM``: ``crate.forward``'s logits and, with ``labels``, the next-token loss (labels =
    input_ids, shifted inside; ``-100`` ignored).  ``generate`` and ``pipeline("text-generation")`` are
    ``transformers``' own, stopping at the tokenizer's end-of-text token."""

    config_class = CrateLMConfig
    kind = LANGUAGE_MODEL

    def __init__(self, config: CrateLMConfig, crate_model: Model | None = None) -> None:
        super().__init__(config, crate_model)
        if not self.crate.config.causal:
            raise ValueError(
                f"{self.crate.config.arch} here is bidirectional (a masked LM); load it with AutoModelForMaskedLM"
            )
        self.generation_config.use_cache = False
        tok = getattr(self.crate, "tokenizer", None)
        if tok is not None:  # transformers' models stop at their end token; the package's generate only if asked
            self.generation_config.eos_token_id = tok.eos_id
            self.generation_config.pad_token_id = tok.pad_id

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.crate.wte

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """The logits of ``crate.forward`` (b, n, V); with ``logits_to_keep`` (generation: the last token's only) a
        prompt longer than the context is read through its last ``block_size`` tokens, as the package's
        ``generate`` slides its window."""
        _no_extras(kwargs)
        _key_mask(attention_mask, causal=True)
        block = self.crate.config.block_size
        if logits_to_keep and labels is None and input_ids.shape[1] > block:
            input_ids = input_ids[:, -block:]
        if labels is None:
            logits = self.crate(input_ids)
            return CausalLMOutputWithPast(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)
        out = self.crate(input_ids, labels=labels)
        return CausalLMOutputWithPast(loss=out.loss, logits=out.logits)


class CrateForMaskedLM(_CrateWrapper):
    """``AutoModelForMaskedLM`` (a bidirectional model): the masked-LM logits and, with ``labels`` (``-100`` where
    not masked), the loss of eq. (85)."""

    config_class = CrateLMConfig
    kind = LANGUAGE_MODEL

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        _no_extras(kwargs)
        if self.crate.config.causal:
            raise ValueError(f"{self.crate.config.arch} here is causal; load it with AutoModelForCausalLM")
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        z = self.crate.forward_features(input_ids, key_mask=_key_mask(attention_mask, causal=False), **extra)
        logits = self.crate.forward_head(z)
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten().long())
        return MaskedLMOutput(loss=loss, logits=logits)


class CrateImageModel(_CrateWrapper):
    """``AutoModel`` of an image classifier: ``last_hidden_state`` = ``crate.forward_features`` and
    ``pooler_output`` = the head's features before the last linear map (``forward_head(z, pre_logits=True)``)."""

    config_class = CrateImageConfig
    kind = IMAGE_CLASSIFIER
    main_input_name = "pixel_values"

    def forward(self, pixel_values: Tensor, **kwargs: Any) -> BaseModelOutputWithPooling:
        _no_extras(kwargs)
        z = self.crate.forward_features(pixel_values)
        return BaseModelOutputWithPooling(last_hidden_state=z, pooler_output=self.crate.forward_head(z, True))


class CrateForImageClassification(_CrateWrapper):
    """``AutoModelForImageClassification``: ``crate.forward``'s logits and, with ``labels`` (class ids), the
    cross-entropy."""

    config_class = CrateImageConfig
    kind = IMAGE_CLASSIFIER
    main_input_name = "pixel_values"

    def forward(self, pixel_values: Tensor, labels: Tensor | None = None, **kwargs: Any) -> ImageClassifierOutput:
        _no_extras(kwargs)
        logits = self.crate(pixel_values)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels.long())
        return ImageClassifierOutput(loss=loss, logits=logits)


class CrateTokenizerFast(PreTrainedTokenizerFast):
    """The package's :class:`~crate_transformer.models.tokenizer.Tokenizer` (a ``tokenizer.json``) as
    ``transformers``' fast tokenizer, its special tokens named: end of text (also the beginning), padding, mask,
    classification, separator, unknown."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        eos, pad, mask, cls, sep, unk = SPECIAL_TOKENS
        for key, token in (("eos_token", eos), ("bos_token", eos), ("pad_token", pad), ("mask_token", mask),
                           ("cls_token", cls), ("sep_token", sep), ("unk_token", unk)):  # fmt: skip
            kwargs.setdefault(key, token)
        super().__init__(*args, **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | Path, *args: Any, **kwargs: Any) -> CrateTokenizerFast:  # type: ignore[override]
        """The ``tokenizer.json`` of a saved language model's folder, read by the package's :class:`Tokenizer`
        (``AutoTokenizer.from_pretrained(folder)`` comes here); ``padding_side`` and ``truncation_side`` apply."""
        sides = {k: kwargs.pop(k) for k in ("padding_side", "truncation_side") if k in kwargs}
        unknown = sorted(k for k, v in kwargs.items() if k not in _LOAD_KWARGS and not k.startswith("_") and v)
        if args or unknown:
            raise ValueError(f"CrateTokenizerFast.from_pretrained takes the folder (and padding_side=); got {unknown}")
        return cls(tokenizer_object=Tokenizer.from_file(Path(path) / TOKENIZER_NAME).hf, **sides)


def hf_tokenizer(source: Model | Tokenizer | str | Path) -> CrateTokenizerFast:
    """The ``transformers`` tokenizer of a language model, of a :class:`Tokenizer`, or of a saved folder."""
    if isinstance(source, (str, Path)):
        return CrateTokenizerFast.from_pretrained(source)
    tok = getattr(source, "tokenizer", source)
    if not isinstance(tok, Tokenizer):
        raise ValueError("this model has no tokenizer attached; train it with one, or pass a Tokenizer")
    return CrateTokenizerFast(tokenizer_object=tok.hf)


def hf_model(model: Model) -> _CrateWrapper:
    """The ``transformers`` wrapper of its kind for a model of this package: a causal LM → :class:`CrateForCausalLM`,
    a bidirectional one → :class:`CrateForMaskedLM`, an image classifier → :class:`CrateForImageClassification`."""
    if model.kind == LANGUAGE_MODEL:
        return (CrateForCausalLM if model.config.causal else CrateForMaskedLM).wrap(model)
    if model.kind == IMAGE_CLASSIFIER:
        return CrateForImageClassification.wrap(model)
    raise ValueError(f"no transformers class wraps a {model.kind}; the language models and image classifiers do")


def register() -> None:
    """Register the model types with ``AutoConfig``, the ``AutoModel*`` classes and ``AutoTokenizer`` (done on
    import; again is a no-op)."""
    auto = transformers
    if CrateLMConfig.model_type in auto.CONFIG_MAPPING:
        return
    for config in (CrateLMConfig, CrateImageConfig):
        auto.AutoConfig.register(config.model_type, config)
    auto.AutoModel.register(CrateLMConfig, CrateModel)
    auto.AutoModelForCausalLM.register(CrateLMConfig, CrateForCausalLM)
    auto.AutoModelForMaskedLM.register(CrateLMConfig, CrateForMaskedLM)
    auto.AutoModel.register(CrateImageConfig, CrateImageModel)
    auto.AutoModelForImageClassification.register(CrateImageConfig, CrateForImageClassification)
    auto.AutoTokenizer.register(CrateLMConfig, fast_tokenizer_class=CrateTokenizerFast)


register()
