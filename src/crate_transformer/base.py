"""The contract every model of the package follows: timm's model API plus HF's save/load, written once.

A model family is a :class:`Model` subclass with a :class:`~crate_transformer.config.Config`; it gets
from the base:

* ``save_pretrained(dir)`` / ``Family.from_pretrained(path)`` — safetensors + ``config.json``;
  ``push_to_hub(repo_id)`` — those files and a model card on the Hugging Face Hub;
* ``num_params()``; ``no_weight_decay()`` — the parameter names the optimiser must not decay, which the
  training engine asks the model for (wrappers such as the DINO model prefix their backbone's);
* ``set_grad_checkpointing()`` — activation checkpointing of every layer through :meth:`Model.run_layers`;
* ``pretrained_cfg`` — where the released weights came from (the zoo entry), or None.

and implements the forward methods, each with one meaning across families:

* ``forward_features(x)`` → the encoder's output tokens ``(b, n, d)`` for the whole input, after the
  encoder's own final normalisation where the architecture has one (CRATE-MAE's ``norm``, GPT-2's
  ``ln_f``).  A LayerNorm that the official code applies *after pooling* (the CRATE classifier's
  ``mlp_head[0]``, timm's ``fc_norm``) belongs to the head;
* ``forward_head(z, pre_logits=False)`` → the task output from those tokens (class logits, token
  logits, reconstructed patches); ``pre_logits=True`` stops before the last linear map;
* ``forward_trace(x, return_attention=False)`` → every layer's tokens (:class:`Trace`);
* ``get_classifier()`` / ``reset_classifier(num_classes)`` — the final linear map, and a fresh one.

Pooling has one vocabulary (:data:`POOLS`, :func:`pool_tokens`) for the classifiers, the probes and DINO.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .config import Config
from .io import save_pretrained

__all__ = ["Model", "Trace", "POOLS", "pool_tokens"]

# "cls": the class token (eq. (80)); "mean": every token, class token included (the official CRATE
# classifier's ``x.mean(dim=1)``); "avg": the patch tokens only (global average pooling, eq. (72), p.40;
# timm's ``global_pool="avg"``)
POOLS = ("cls", "mean", "avg")


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
    # top-level parameters that are never decayed besides the vectors (norm weights, biases): position
    # tables and special tokens
    no_decay_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Config | None) -> None:
        super().__init__()
        if config is None:
            config = self.config_class()
        elif not isinstance(config, self.config_class):
            name = self.config_class.__name__
            raise ValueError(f"expected a {name}, got {type(config).__name__}; e.g. {name}(dim=64)")
        self.config = config
        self.grad_checkpointing = False
        self.pretrained_cfg: dict[str, Any] | None = None

    # ---------------------------------------------------------------- files
    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` + ``config.json`` to ``directory`` (atomically, checksummed)."""
        return save_pretrained(self, directory)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> Model:
        """Load a folder, file or ``hf-hub:ORG/NAME`` written by :meth:`save_pretrained`; it must hold a ``cls``."""
        from .checkpoint import CheckpointError, from_pretrained

        model = from_pretrained(path, **kwargs)
        if not isinstance(model, cls):
            raise CheckpointError(
                f"{path} holds a {type(model).__name__}, not a {cls.__name__}; load it with ct.from_pretrained"
            )
        return model

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """Upload this model (the :meth:`save_pretrained` files and a generated model card) to the Hugging
        Face Hub repository ``repo_id``; ``metrics``, ``dataset``, ``license``, ``private``, ``token``,
        ``revision``: see :func:`crate_transformer.pretrained.push_to_hub`.  Returns the commit URL."""
        from .pretrained import push_to_hub

        return push_to_hub(self, repo_id, **kwargs)

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
