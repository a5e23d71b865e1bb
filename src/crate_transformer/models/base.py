"""The contract every model of the package follows: timm's model API plus HF's save/load, written once.

A model family is a :class:`Model` subclass with a config that extends
:class:`~crate_transformer.models.contract.FamilyConfig`; it gets from the base:

* ``save_pretrained(dir)`` / ``Family.from_pretrained(path)`` — safetensors + ``config.json``;
  ``push_to_hub(repo_id)`` — those files and a model card on the Hugging Face Hub;
* ``num_params()``; ``no_weight_decay()`` — the parameter names the optimiser must not decay, which the
  training engine asks the model for (wrappers such as the DINO model prefix their backbone's);
* ``set_grad_checkpointing()`` — activation checkpointing of every layer through :meth:`Model.run_layers`;
* ``pretrained_cfg`` — where the weights came from (the zoo entry, the file) and how to feed the model (mean,
  std, input size, crop, interpolation: ``data_cfg()``), timm's dict, never None.

``Family.from_pretrained`` needs no registry: the class (or the subclass whose :attr:`Model.arch` is the
stored ``arch``) parses the config with its ``config_class`` and builds itself.

**The capability contract.**  Consumers (the tasks, the analysis, the features, the CLI, the loaders) ask a
model what it is and what it supports — never its class, never its ``arch`` name.  Its config says what the
model is (``kind``, one of :data:`~crate_transformer.models.contract.KINDS`, ``white_box``, ``sparse_output``,
``layer_blocks``, ``pipeline_tag``, ``BLOCK_COUNTS``: :class:`~crate_transformer.models.contract.FamilyConfig`, the
base of every family's config); the model says what only the built model knows, each with a default here:

* ``kind`` — ``self.config.kind``; ``num_prefix_tokens`` — tokens before the content (a class token) in
  ``forward_features``; ``trace_prefix_tokens`` — the same in the layers' own sequences (``forward_trace``);
* :meth:`Model.code_sites` — where each layer's sparse code (or MLP units) is read;
* :meth:`Model.as_classifier` — an image classifier made from it, for fine-tuning (CRATE-MAE's encoder);
* :meth:`Model.extra_files` / :meth:`Model.load_extra_files` — JSON files saved and checksummed beside the
  weights (a language model's ``tokenizer.json``); :meth:`Model.size_hint` — the overrides that would fit a
  checkpoint of other sizes; :meth:`Model.official_num_params` — the authors' parameter count.

and implements the forward methods, each with one meaning across families:

* ``forward_features(x)`` → the encoder's output tokens ``(b, n, d)`` for the whole input, after the
  encoder's own final normalisation where the architecture has one (CRATE-MAE's ``norm``, GPT-2's
  ``ln_f``).  A LayerNorm that the official code applies *after pooling* (the CRATE classifier's
  ``mlp_head[0]``, timm's ``fc_norm``) belongs to the head;
* ``forward_head(z, pre_logits=False)`` → the task output from those tokens (class logits, token
  logits, reconstructed patches); ``pre_logits=True`` stops before the last linear map;
* ``forward_trace(x, return_attention=False)`` → every layer's tokens (:class:`Trace`);
* ``get_classifier()`` / ``reset_classifier(num_classes)`` — the final linear map, and a fresh one (0 classes:
  none, the model returns the pooled features, as timm's ``reset_classifier(0)``);
* ``num_features``, ``group_matcher()`` and, for image models, ``forward_intermediates()``: timm's backbone
  names (:mod:`crate_transformer.models.classifier`);
* ``hook_names()``, ``run_with_cache(x, names)``, ``with intervene({name: edit})`` — the layers' values read and
  replaced by name (:mod:`crate_transformer.models.hooks`, ``docs/hooks.md``).

Pooling has one vocabulary (:data:`POOLS`, :func:`pool_tokens`) for the classifiers, the probes and DINO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..io import CheckpointError, save_pretrained
from ..layers import trace_layer
from ..loading.folder import load_folder
from ..loading.hub import push_to_hub
from .contract import FamilyConfig
from .hooks import Hooked

__all__ = [
    "Model",
    "Trace",
    "POOLS",
    "TIMM_POOLS",
    "pool_name",
    "pool_tokens",
    "take_indices",
    "STEM",
    "BLOCKS",
    "timm_overrides",
    "TIMM_ARGS",
]

# "cls": the class token (eq. (80)); "mean": every token, class token included (the official CRATE
# classifier's ``x.mean(dim=1)``); "avg": the patch tokens only (global average pooling, eq. (72), p.40;
# timm's ``global_pool="avg"``)
POOLS = ("cls", "mean", "avg")
# timm's ``global_pool`` words for the same poolings
TIMM_POOLS = {"token": "cls", "avg": "avg"}
# the parameter names of the input side (layer id 0 of layer-wise lr decay: MAE's rule) and of the layers
STEM = r"^(?:cls_token|pos_embed)$|^patch_embed\."  # no capture group: timm reads groups as layer numbers
BLOCKS = r"^layers\.(\d+)"


def pool_name(pool: str) -> str:
    """A pooling of :data:`POOLS`, or timm's word for one (``"token"`` → ``"cls"``), as one of :data:`POOLS`."""
    pool = TIMM_POOLS.get(pool, pool)
    if pool not in POOLS:
        timm = ", ".join(f"{k!r} ({v})" for k, v in TIMM_POOLS.items())
        raise ValueError(f"unknown pooling {pool!r}; choose one of {POOLS} or timm's {timm}")
    return pool


# timm's ``create_model`` arguments under this package's config names
TIMM_ARGS = {"img_size": "image_size", "drop_path_rate": "drop_path", "drop_rate": "dropout", "global_pool": "pool"}


def timm_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` with timm's names (:data:`TIMM_ARGS`: ``img_size``, ``drop_path_rate``, ``drop_rate``,
    ``global_pool`` with its words ``"token"``/``"avg"``) as this package's config fields; one name given both
    ways is a one-line error."""
    out = dict(overrides)
    for timm, ours in TIMM_ARGS.items():
        if timm in out:
            if ours in out:
                raise ValueError(f"{timm} and {ours} name the same option; pass one of them")
            value = out.pop(timm)
            out[ours] = pool_name(str(value)) if ours == "pool" else value
    return out


def take_indices(depth: int, indices: int | Sequence[int] | None) -> list[int]:
    """timm's ``feature_take_indices``: the 0-based layers to return — all (None), the last ``n`` (an int), or
    those listed (negative from the end); a layer the model does not have is a one-line error."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} layers of {depth}; pass 1..{depth}")
        return list(range(depth - indices, depth))
    if not isinstance(indices, Sequence):
        raise ValueError(f"indices must be a layer count or a list of layer indices, got {indices!r}; e.g. [0, -1]")
    out = []
    for i in indices:
        if isinstance(i, bool) or not hasattr(i, "__index__"):  # 0.5: timm takes no fractions of the depth
            raise ValueError(
                f"layer indices are whole numbers (0-based, negative from the end), got {i!r}; e.g. indices=[0, -1]"
            )
        i = i.__index__()
        if not -depth <= i < depth:
            raise ValueError(f"layer index {i} does not exist in a model of {depth} layers; pass 0..{depth - 1}")
        out.append(i % depth)
    return out


def pool_tokens(z: Tensor, pool: str, prefix: int = 1) -> Tensor:
    """``(b, prefix + N, d)`` tokens → ``(b, d)`` by one of :data:`POOLS`; ``prefix``: the tokens before the patches
    (the class token, and a ViT's register tokens), which ``avg`` leaves out."""
    if pool == "cls":
        return z[:, 0]
    if pool == "mean":
        return z.mean(dim=1)
    if pool == "avg":
        return z[:, prefix:].mean(dim=1)
    raise ValueError(f"unknown pooling {pool!r}; choose one of {POOLS}")


@dataclass
class Trace:
    """Every layer's tokens from one forward pass (JMLR indexing, eq. (20)).

    ``tokens[ℓ]`` is ``Z^{ℓ+1}`` for ℓ = 0..L: ``tokens[0]`` is the embedding ``f_pre(X)`` and
    ``tokens[-1]`` the last layer's output.  ``half[ℓ]`` is ``Z^{ℓ+1/2}`` (after MSSA, before ISTA) of
    layer ℓ.  ``attention[ℓ]`` is that layer's ``(b, K, n, n)`` attention (row-softmax), when requested.
    """

    tokens: list[Tensor]
    half: list[Tensor]
    attention: list[Tensor] | None = None

    @classmethod
    def of(cls, layers: nn.ModuleList, z: Tensor, return_attention: bool = False) -> Trace:
        """Run ``z`` (the embedded tokens) through ``layers`` and keep every layer's output."""
        tokens, half, attention = [z], [], [] if return_attention else None
        for layer in layers:
            z, zh, attn = trace_layer(layer, z, return_attention)
            tokens.append(z)
            half.append(zh)
            if attention is not None:
                attention.append(attn)
        return cls(tokens, half, attention)


class Model(Hooked, nn.Module):
    """Base of every model family; see the module docstring for the contract, and :mod:`.hooks` for
    ``hook_names`` / ``run_with_cache`` / ``intervene``."""

    config_class: ClassVar[type[FamilyConfig]]
    # the config ``arch`` this class builds; None for a family's common base, whose subclasses each build one
    arch: ClassVar[str | None] = None
    # top-level parameters that are never decayed besides the vectors (norm weights, biases): position
    # tables and special tokens
    no_decay_names: ClassVar[tuple[str, ...]] = ()
    # tokens before the content tokens (timm's name): a class token, 0 for a language model
    num_prefix_tokens: ClassVar[int] = 0

    def __init__(self, config: FamilyConfig | None) -> None:
        super().__init__()
        if config is None:
            config = self.config_class()
        elif not isinstance(config, self.config_class):
            name = self.config_class.__name__
            raise ValueError(f"expected a {name}, got {type(config).__name__}; e.g. {name}(dim=64)")
        self.config = config
        self.grad_checkpointing = False
        self._weights_cfg: dict[str, Any] = {}

    # ---------------------------------------------------------------- files
    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` + ``config.json`` to ``directory`` (atomically, checksummed)."""
        return save_pretrained(self, directory)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        map_location: str | torch.device = "cpu",
        revision: str | None = None,
        **overrides: object,
    ) -> Model:
        """Load a folder (or its ``model.safetensors`` / ``config.json``) or ``hf-hub:ORG/NAME`` written by
        :meth:`save_pretrained`; it must hold this class's ``arch`` (or a
        subclass's).  ``revision``: a branch, tag or commit of a Hub repository; ``overrides``: config changes,
        e.g. ``num_classes=3`` for a fresh head on the loaded backbone (timm's names too).  See
        :func:`~crate_transformer.loading.folder.load_folder`."""
        return load_folder(path, cls.class_for, map_location, revision, **timm_overrides(overrides))

    @classmethod
    def class_for(cls, arch: object) -> type[Model]:
        """The class that builds ``arch``: this one, or its nearest subclass whose :attr:`arch` it is."""
        if arch is None:  # a config stored before ``arch`` existed: the config class's default
            arch = cls.config_class.__dataclass_fields__["arch"].default
        queue: list[type[Model]] = [cls]
        while queue:
            klass = queue.pop(0)
            if klass.arch == arch:
                return klass
            queue.extend(klass.__subclasses__())
        raise CheckpointError(f"it holds a {arch!r} model, not a {cls.__name__}; load it with ct.from_pretrained")

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """Upload this model (the :meth:`save_pretrained` files and a generated model card) to the Hugging
        Face Hub repository ``repo_id``; ``metrics``, ``dataset``, ``license``, ``private``, ``token``,
        ``revision``: see :func:`crate_transformer.loading.pretrained.push_to_hub`.  Returns the commit URL."""
        return push_to_hub(self, repo_id, **kwargs)

    # ---------------------------------------------------------------- where the weights came from, how to feed them
    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's ``pretrained_cfg``, never None: where the weights came from (what the loaders record: the zoo
        entry and file, the Hub repository, the folder) and, for an image model, how to feed it
        (:meth:`data_cfg`: ``input_size``, ``mean``, ``std``, ``crop_pct``, ``interpolation``, ...)."""
        return {**self._weights_cfg, **self.data_cfg()}

    @pretrained_cfg.setter
    def pretrained_cfg(self, value: Mapping[str, Any] | None) -> None:
        self._weights_cfg = dict(value or {})

    def data_cfg(self) -> dict[str, Any]:
        """The preprocessing this model expects (image models:
        :meth:`~crate_transformer.models.image_input.ImageInput.data_cfg`);
        none for a model of tokens."""
        return {}

    # ---------------------------------------------------------------- capabilities (what consumers ask)
    @property
    def kind(self) -> str:
        """What this model is (``self.config.kind``, one of :data:`~crate_transformer.models.contract.KINDS`)."""
        return self.config.kind

    @property
    def trace_prefix_tokens(self) -> int:
        """Tokens before the content in the sequences ``self.layers`` process (``forward_trace``'s tokens and
        attention, the code sites' outputs): ``num_prefix_tokens`` unless the family's layers see no class token
        (ToST adds its class token after them)."""
        return self.num_prefix_tokens

    def code_sites(self) -> list[tuple[nn.Module, str]]:
        """Per layer, where its sparse code (or MLP units) is read: the ``(module, unit kind)`` each of ``self.layers``
        gives by its ``code_site()`` (:meth:`~crate_transformer.layers.EncoderLayer.code_site`; any layer class
        may have one, e.g. ToST's blocks: their MLP units).  One-line
        ``ValueError`` for a layer without one; a family with other layers overrides this."""
        layers = getattr(self, "layers", None)
        if not isinstance(layers, nn.ModuleList) or not len(layers):
            raise ValueError(f"{type(self).__name__} has no encoder layers (model.layers) to read codes from")
        sites = []
        for i, layer in enumerate(layers):
            site = layer.code_site() if callable(getattr(layer, "code_site", None)) else None
            if site is None:
                raise ValueError(
                    f"layer {i + 1} of this {self.config.arch} model has no sparse code or MLP units "
                    f"({type(layer).__name__}, ista_mode='none'?); features need ISTA, an overcomplete ISTA or an MLP"
                )
            sites.append(site)
        return sites

    def official_num_params(self) -> int | None:
        """The parameter count of the authors' layout where it differs from :meth:`num_params` (the paper's
        tables count it), else None."""
        return None

    def as_classifier(self) -> Model:
        """This model as an image classifier to fine-tune: itself when it is one; a family whose encoder can
        become one (CRATE-MAE) converts itself.  Other kinds are returned unchanged (the task refuses them)."""
        return self

    # ---------------------------------------------------------------- a family's files
    def extra_files(self) -> dict[str, str]:
        """JSON files saved beside the weights, ``{name: text}`` (checksummed in the weights' header); a
        language model writes its ``tokenizer.json``.  The default: none."""
        return {}

    def load_extra_files(self, directory: Path, meta: Mapping[str, str]) -> None:
        """Read back what :meth:`extra_files` wrote (``meta``: the weights' header, holding the checksums)."""

    def attach_files(self, files: Mapping[str, str], source: str) -> None:
        """Take back the texts of :meth:`extra_files` that a training state carries beside its weights (a language
        model's ``tokenizer.json``); ``source`` names the state in errors.  The default: none to take."""

    def size_hint(self, state: Mapping[str, Tensor]) -> str:
        """When ``state`` does not fit this model: the overrides that would build a model it fits, read off its
        shapes (``"; pass dim=768"``), or ``""``."""
        return ""

    # ---------------------------------------------------------------- the contract
    def forward_features(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward_head(self, z: Tensor, pre_logits: bool = False) -> Tensor:
        raise NotImplementedError

    def forward_trace(self, x: Tensor, return_attention: bool = False) -> Trace:
        raise NotImplementedError

    def get_classifier(self) -> nn.Module | None:
        """The final linear map to classes (None for a model without one)."""
        return None

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """timm's signature: a fresh head for ``num_classes`` classes, ``global_pool`` the pooling before it (a family
        that pools one way only refuses another in one line)."""
        raise ValueError(f"{type(self).__name__} has no classifier to reset")

    def refuse_pool(self, global_pool: str | None, kept: str) -> None:
        """One line for a ``global_pool`` that this family's head cannot read (it pools as ``kept`` only)."""
        if global_pool not in (None, kept):  # "" is timm's "no pooling": per-token outputs, which no head here gives
            raise ValueError(
                f"{type(self).__name__} pools its features as {kept!r} only, got global_pool={global_pool!r}; "
                f"leave global_pool out (or pass {kept!r})"
            )

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @property
    def num_features(self) -> int:
        """The width of the features the head reads (timm's name): ``config.dim``."""
        return int(self.config.dim)

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups by name (what its layer-wise lr decay and ``group_parameters`` read): the
        input side (:data:`STEM`), then one group per layer ``layers.{i}``, then the rest (a final norm, the head)
        — the groups of this package's ``--layer-decay`` (MAE's rule, :func:`~crate_transformer.train.optim.layer_id`;
        timm's ViT files a final norm with the last layer instead).  ``coarse``: the same as plain patterns."""
        if coarse:
            return {"stem": STEM, "blocks": BLOCKS}
        return {"stem": STEM, "blocks": [(BLOCKS, None)]}

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters that weight decay skips: every vector (norms, biases) and
        :attr:`no_decay_names` (position tables, special tokens)."""
        return {n for n, p in self.named_parameters() if p.ndim < 2 or n in self.no_decay_names}

    # ---------------------------------------------------------------- activation checkpointing
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each layer's activations in the backward pass instead of storing them (memory for time)."""
        self.grad_checkpointing = enable

    def run_layers(self, z: Tensor, layers: nn.ModuleList | None = None, **kwargs: Any) -> Tensor:
        """``z`` through ``layers`` (default ``self.layers``); checkpointed when :meth:`set_grad_checkpointing` is
        on and gradients are being recorded."""
        layers = self.layers if layers is None else layers
        for layer in layers:
            if self.grad_checkpointing and self.training and z.requires_grad:
                z = checkpoint(layer, z, use_reentrant=False, **kwargs)
            else:
                z = layer(z, **kwargs)
        return z
