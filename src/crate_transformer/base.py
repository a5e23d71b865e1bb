"""The contract every model of the package follows: timm's model API plus HF's save/load, written once.

A model family is a :class:`Model` subclass with a :class:`~crate_transformer.config.Config`; it gets
from the base:

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
model is (``kind``, ``white_box``, ``sparse_output``, ``layer_blocks``, ``pipeline_tag``: see
:mod:`crate_transformer.config`); the model says what only the built model knows, each with a default here:

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
  names (:mod:`crate_transformer.model`).

Pooling has one vocabulary (:data:`POOLS`, :func:`pool_tokens`) for the classifiers, the probes and DINO.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ._hub import is_hub_spec, push_to_hub, resolve_hub
from .config import Config
from .errors import python_message
from .io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    load_safetensors,
    model_dir,
    read_config_dict,
    save_pretrained,
)
from .official import index_count

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
    "load_folder",
    "load_weights",
    "check_values",
    "load_backbone",
    "apply_overrides",
    "check_sizes",
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


def take_indices(depth: int, indices: int | Sequence[int] | None) -> list[int]:
    """timm's ``feature_take_indices``: the 0-based layers to return — all (None), the last ``n`` (an int), or
    those listed (negative from the end); a layer the model does not have is a one-line error."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} layers of {depth}; pass 1..{depth}")
        return list(range(depth - indices, depth))
    out = []
    for i in indices:
        if not -depth <= i < depth:
            raise ValueError(f"layer index {i} does not exist in a model of {depth} layers; pass 0..{depth - 1}")
        out.append(i % depth)
    return out


def pool_tokens(z: Tensor, pool: str) -> Tensor:
    """``(b, 1 + N, d)`` tokens → ``(b, d)`` by one of :data:`POOLS`."""
    if pool == "cls":
        return z[:, 0]
    if pool == "mean":
        return z.mean(dim=1)
    if pool == "avg":
        return z[:, 1:].mean(dim=1)
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
            z, zh, attn = layer(z, return_attention=return_attention)
            tokens.append(z)
            half.append(zh)
            if attention is not None:
                attention.append(attn)
        return cls(tokens, half, attention)


class Model(nn.Module):
    """Base of every model family; see the module docstring for the contract."""

    config_class: ClassVar[type[Config]]
    # the config ``arch`` this class builds; None for a family's common base, whose subclasses each build one
    arch: ClassVar[str | None] = None
    # top-level parameters that are never decayed besides the vectors (norm weights, biases): position
    # tables and special tokens
    no_decay_names: ClassVar[tuple[str, ...]] = ()
    # tokens before the content tokens (timm's name): a class token, 0 for a language model
    num_prefix_tokens: ClassVar[int] = 0

    def __init__(self, config: Config | None) -> None:
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
        e.g. ``num_classes=3`` for a fresh head on the loaded backbone.  See :func:`load_folder`."""
        return load_folder(path, cls.class_for, map_location=map_location, revision=revision, **overrides)

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
        ``revision``: see :func:`crate_transformer.pretrained.push_to_hub`.  Returns the commit URL."""
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
        """The preprocessing this model expects (image models: :meth:`~crate_transformer.model.ImageInput.data_cfg`);
        none for a model of tokens."""
        return {}

    # ---------------------------------------------------------------- capabilities (what consumers ask)
    @property
    def kind(self) -> str:
        """What this model is (``self.config.kind``, one of :data:`~crate_transformer.config.KINDS`)."""
        return self.config.kind

    @property
    def trace_prefix_tokens(self) -> int:
        """Tokens before the content in the sequences ``self.layers`` process (``forward_trace``'s tokens and
        attention, the code sites' outputs): ``num_prefix_tokens`` unless the family's layers see no class token
        (ToST adds its class token after them)."""
        return self.num_prefix_tokens

    def code_sites(self) -> list[tuple[nn.Module, str]]:
        """Per layer, where its sparse code (or MLP units) is read: the ``(module, unit kind)`` each of ``self.layers``
        gives by its ``code_site()`` (:meth:`~crate_transformer.operators.EncoderLayer.code_site`; any layer class
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

    def reset_classifier(self, num_classes: int) -> None:
        raise ValueError(f"{type(self).__name__} has no classifier to reset")

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
        """``z`` through ``layers`` (default ``self.layers``), each returning ``(z, ...)``; checkpointed when
        :meth:`set_grad_checkpointing` is on and gradients are being recorded."""
        layers = self.layers if layers is None else layers
        for layer in layers:
            if self.grad_checkpointing and self.training and z.requires_grad:
                z = checkpoint(_output_of(layer), z, use_reentrant=False, **kwargs)
            else:
                z = _output_of(layer)(z, **kwargs)
        return z


def _output_of(layer: nn.Module) -> Callable[..., Tensor]:
    """``layer`` as a map to its output tokens (encoder layers also return ``Z^{ℓ+1/2}`` and attention)."""

    def run(z: Tensor, **kwargs: Any) -> Tensor:
        out = layer(z, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return run


def load_weights(model: nn.Module, state: Mapping[str, Tensor], source: str = "checkpoint") -> None:
    """Strictly load ``state`` into ``model``; any missing, unexpected or mis-shaped key is one clear error
    (with the model's :meth:`Model.size_hint`), and so is a tensor of the wrong kind or with NaN / inf values
    (:func:`check_values`): every loader goes through here."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(
        f"{k}: checkpoint {list(state[k].shape)} vs model {list(own[k].shape)}"
        for k in set(own) & set(state)
        if tuple(state[k].shape) != tuple(own[k].shape)
    )
    if missing or unexpected or shapes:
        parts = []
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
            if items:
                parts.append(f"{label}: {_first(items)}")
        hint = model.size_hint(state) if isinstance(model, Model) else ""
        raise CheckpointError(f"{source} does not fit the model ({'; '.join(parts)}){hint}")
    check_values(own, state, source)
    model.load_state_dict(state, strict=True)


def check_values(own: Mapping[str, Tensor], state: Mapping[str, Tensor], source: str) -> None:
    """Refuse what ``load_state_dict`` would silently convert or keep: a tensor of another kind than the model's
    (integers or booleans for floating-point weights, and the reverse) and NaN or ±inf in floating-point weights.
    One line naming the tensors; float16/bfloat16/float64 weights are cast as usual."""
    kinds = [
        f"{k} ({state[k].dtype}; the model's is {own[k].dtype})"
        for k in own
        if state[k].is_floating_point() != own[k].is_floating_point() or state[k].is_complex() != own[k].is_complex()
    ]
    if kinds:
        raise CheckpointError(
            f"{source} holds tensors of the wrong kind: {_first(kinds)}; it is not this model's weights, or was "
            "converted wrongly — save the weights as floating-point tensors"
        )
    bad = [f"{k} ({n} of {state[k].numel()})" for k in own if (n := _non_finite(state[k]))]
    if bad:
        raise CheckpointError(
            f"{source} holds NaN or infinite weights: {_first(bad)}; the file is corrupt or the run that wrote it "
            "diverged — use an earlier checkpoint"
        )


def _non_finite(t: Tensor) -> int:
    """How many NaN / ±inf values ``t`` holds; one ``aminmax`` pass (NaN and ±inf reach its ends), counted only
    when it finds one (a count of every tensor costs 30 times more)."""
    if not (t.is_floating_point() or t.is_complex()) or not t.numel():
        return 0
    t = torch.view_as_real(t) if t.is_complex() else t
    lo, hi = torch.aminmax(t)
    return 0 if bool(torch.isfinite(lo) & torch.isfinite(hi)) else int((~torch.isfinite(t)).sum())


def check_sizes(target: type[Model], config: Config, state: Mapping[str, Tensor], path: Path) -> None:
    """The sizes ``path`` (a ``config.json``) gives, bounded by the weights beside it before anything is allocated
    (an edited file of a folder saved before its checksum was stored is read as it is): each count of numbered
    blocks (``config.BLOCK_COUNTS``, ``depth`` → ``layers.N``) is the number of blocks their keys number
    (:func:`~crate_transformer.official.index_count`, the rule for a size read from key names); then the model
    built on the meta device (no memory) has the weights' shapes.  A size no stored tensor holds (the context of a
    sinusoidal position table, which is not saved) is not bounded here."""
    fix = "the file was edited, or is not the one saved with these weights: restore the file saved with them"
    for field, prefix in config.BLOCK_COUNTS.items():
        try:
            count = index_count(state, rf"{re.escape(prefix)}\.(\d+)\.")
        except ValueError as e:
            raise CheckpointError(f"{path.parent / WEIGHTS_NAME}: {e}") from None
        if getattr(config, field) != count:
            raise CheckpointError(
                f"{path}: {field}={getattr(config, field):,} does not fit the weights beside it: their keys number "
                f"{count} block{'s' * (count != 1)} {prefix}.N; {fix}"
            )
    widest = max((n for t in state.values() for n in t.shape), default=0)
    try:
        with torch.device("meta"):
            probe = target(config)
    except (RuntimeError, OverflowError):  # a tensor too large to describe ("storage size calculation overflowed")
        raise CheckpointError(f"{path}: {_named(config, widest)} not fit the weights beside it; {fix}") from None
    own = probe.state_dict()
    bad = [k for k, t in own.items() if k in state and state[k].shape != t.shape]  # missing keys: load_weights'
    if bad:
        key, shape, there = bad[0], list(own[bad[0]].shape), list(state[bad[0]].shape)
        raise CheckpointError(
            f"{path}: {_named(config, widest, shape, there)} not fit the weights beside it ({key}: {there} in "
            f"{WEIGHTS_NAME}, {shape} by {path.name}); {fix}"
        )


def _named(config: Config, widest: int, shape: Sequence[int] = (), there: Sequence[int] = ()) -> str:
    """``dim=1,000,000 does``: the integer fields whose values are the offending sizes of ``shape`` (not of the
    weights' ``there``), else those larger than every size of the weights (``widest``); ``its sizes do``."""
    ints = {
        f.name: v
        for f in dataclasses.fields(config)
        if isinstance(v := getattr(config, f.name), int) and not isinstance(v, bool) and v > 1
    }
    sizes = [f"{n}={v:,}" for n, v in ints.items() if v in shape and v not in there]
    sizes = sizes or [f"{n}={v:,}" for n, v in ints.items() if v > widest]
    return f"{', '.join(sizes)} {'does' if len(sizes) == 1 else 'do'}" if sizes else "its sizes do"


def _first(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f", … (+{len(items) - n} more)" if len(items) > n else "")


def _keep_dtypes(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Give ``model`` the floating dtypes of the weights it was loaded from (``load_state_dict`` casts to the
    model's float32): a model saved in float16 or bfloat16 comes back in it, non-persistent buffers included;
    weights saved in several dtypes keep each its own."""
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())
        return
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if name in state and state[name].is_floating_point() and t.dtype != state[name].dtype:
            t.data = t.data.to(state[name].dtype)


def load_folder(
    path: str | Path,
    choose: Callable[[object], type[Model]],
    map_location: str | torch.device = "cpu",
    revision: str | None = None,
    **overrides: object,
) -> Model:
    """A model written by :meth:`Model.save_pretrained`, built by ``choose(arch)`` (the class for the stored
    ``arch``: :meth:`Model.class_for` of the class asked, or the registry's for ``ct.from_pretrained``).

    ``path`` is that folder, or its ``model.safetensors`` or ``config.json``, or ``"hf-hub:ORG/NAME"``: a Hub
    repository written by ``model.push_to_hub`` (``revision``: a
    branch, tag or commit), fetched through the Hugging Face cache.  The weights' SHA-256 (stored in the
    safetensors header since 0.2) and the checksums of ``config.json`` and the extra files stored beside it are
    verified: a flipped byte in any of them raises :class:`~crate_transformer.io.CheckpointError` ("... is
    corrupt"); older files without a checksum load.  ``overrides`` change the stored config as
    :func:`apply_overrides` does (timm's names too): a new ``num_classes`` gives a fresh head on the loaded
    backbone, a new ``image_size`` re-grids the position embedding, others (``drop_path``, ``dropout``) just apply.
    The model comes back in eval mode, as from every loader, and in the floating dtypes it was saved in (a
    float16 or bfloat16 model stays one).
    """
    directory = model_dir(resolve_hub(path, revision))
    data = read_config_dict(directory)
    try:
        target = choose(data.get("arch"))
        config = target.config_class.from_dict(data)
    except ValueError as e:  # a value of the file, named as the file names it
        raise CheckpointError(f"{directory / CONFIG_NAME}: {python_message(e)}") from None
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"no {WEIGHTS_NAME} in {directory}; the save was incomplete — re-save the model")
    state, meta = load_safetensors(weights)
    check_sizes(target, config, state, directory / CONFIG_NAME)
    model = apply_overrides(target, config, state, str(weights), overrides)
    _keep_dtypes(model, state)
    model.load_extra_files(directory, meta)
    if is_hub_spec(path):
        model.pretrained_cfg = {"source": path, "revision": revision, "folder": str(directory)}
    return model.to(map_location).eval()


# timm's ``create_model`` arguments under this package's config names
TIMM_ARGS = {"img_size": "image_size", "drop_path_rate": "drop_path", "drop_rate": "dropout", "global_pool": "pool"}
# what ``ct.create_model`` / ``ct.from_pretrained`` log to (a fresh head on a loaded backbone)
logger = logging.getLogger("crate_transformer")


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


def apply_overrides(
    target: type[Model], config: Config, state: Mapping[str, Tensor], source: str, overrides: Mapping[str, Any]
) -> Model:
    """``target`` built from ``config`` with ``overrides`` and loaded from ``state`` (the file's weights for
    ``config``).  A ``num_classes`` other than the file's keeps the file's backbone and gives the model a fresh
    classifier, with one logged line (timm's and Hugging Face's fine-tuning start); a new ``image_size`` re-grids
    the position embedding (``resize_pos_embed``); any other override must fit the file's weights."""
    overrides = timm_overrides(overrides)
    size = overrides.pop("image_size", None)
    try:
        config = type(config).from_dict({**config.to_dict(), **overrides})
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    model = target(config)
    if "num_classes" in overrides:
        load_backbone(model, state, source)
    else:
        load_weights(model, state, source=source)
    if size is not None and size != getattr(config, "image_size", size):
        if not callable(getattr(model, "resize_pos_embed", None)):
            raise CheckpointError(f"{source}: this {config.arch} model cannot change its image_size; drop it")
        model.resize_pos_embed(int(size))
    return model


def load_backbone(model: Model, state: Mapping[str, Tensor], source: str) -> list[str]:
    """:func:`load_weights` of every weight but the classifier's (``model.get_classifier()``) when those do not
    fit (another number of classes): the model keeps its fresh classifier and a line is logged.  Returns the
    names of the classifier weights left fresh."""
    head = model.get_classifier()
    prefix = next((f"{name}." for name, m in model.named_modules() if head is not None and m is head and name), None)
    own = model.state_dict()
    if prefix is None:
        load_weights(model, state, source=source)
        return []
    mine = {k for k in own if k.startswith(prefix)}
    theirs = {k for k in state if k.startswith(prefix)}
    if mine == theirs and all(state[k].shape == own[k].shape for k in mine):
        load_weights(model, state, source=source)
        return []
    kept = {k: v for k, v in state.items() if not k.startswith(prefix)}
    load_weights(model, {**kept, **{k: own[k] for k in mine}}, source=source)
    weight = state.get(f"{prefix}weight")
    was = f"{weight.shape[0]} classes" if weight is not None and weight.dim() == 2 else "another classifier"
    classes = getattr(model.get_classifier(), "out_features", 0)
    now, then = (
        (f"a fresh {classes}-class", "train the new head before using its outputs")
        if classes
        else ("no", "the model returns its pooled features")
    )
    logger.warning(
        f"{source}: {now} classifier ({prefix.rstrip('.')}) instead of the file's ({was}); every other weight is "
        f"loaded from the file — {then}"
    )
    return sorted(mine)
