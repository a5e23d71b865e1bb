"""CRATE-α (Yang et al., NeurIPS 2024, "Scaling White-Box Transformers for Vision", arXiv 2405.20299): the
image-classifier family and the authors' PyTorch checkpoint format.

CRATE-α is the CRATE classifier (JMLR eqs. (65)-(66)) with three changes to the layer, which is what let CRATE
scale to ImageNet-21K: the sparse-coding block is ODL — an overcomplete dictionary ``D ∈ R^{d×4d}``, two ISTA
steps started from zero on the non-negative LASSO (JMLR eq. (42)) and a separate decoder dictionary ``D1`` —
and it adds its input back (a residual); see :class:`~crate_transformer.operators.OvercompleteISTA`.  The
released PyTorch code (UCSC-VLAA/CRATE-alpha, ``torch_inference/model/crate_alpha.py``) also embeds patches
with a bare convolution (no LayerNorms around it), uses LayerNorm eps 1e-6 inside the layers and no bias on
the attention output ``W`` (JMLR eq. (37)).  The head is a LayerNorm (eps 1e-5) and a Linear on the class token.

This module is the whole family: :class:`CRATEAlpha` (fixes those choices), the official key map with its two
converters, and :func:`looks_like_alpha`, which tells the authors' files from the other official formats.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from torch import Tensor

from .io import rename_keys
from .model import ImageClassifier, ModelConfig, patch_conv_to_linear, patch_linear_to_conv

__all__ = [
    "ALPHA_CHOICES",
    "ALPHA_KEY_MAP",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CRATEAlpha",
    "alpha_config",
    "is_alpha_config",
    "alpha_official_to_native",
    "alpha_native_to_official",
    "looks_like_alpha",
]

# What makes a CRATE classifier CRATE-α (the official torch_inference/model/crate_alpha.py).  The official
# initialisation is the native one: torch.randn class token and position table, PyTorch's default Conv2d / Linear /
# LayerNorm initialisation (a p×p conv with stride p and the Linear on its flattened patch share the fan-in), and
# kaiming-uniform D, D1 (fan-in 4d).
ALPHA_CHOICES: dict[str, object] = {
    "arch": "crate",
    "mlp": "odl",
    "patch_norm": False,
    "attention": "mssa",
    "layer_form": "official",
    "scale_scores": True,
    "tied_output": False,
    "pool": "cls",
}
# The input normalisation of the released checkpoints (eval_in1k_cls.py: ToTensor, then these; after Resize 256
# and CenterCrop 224).
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

# Official → native names.  conv1 is the patch convolution (d, 3, p, p) ↔ the native Linear (d, p·p·3) on
# (p1, p2, c)-ordered patches; the official to_out has no bias; fn.D / fn.D1 are the ODL dictionaries.
ALPHA_KEY_MAP = [
    ("conv1.", "patch_embed.1."),
    ("pos_embedding", "pos_embed"),
    ("cls_token", "cls_token"),
    ("transformer.layers.{i}.0.norm.", "layers.{i}.norm1."),
    ("transformer.layers.{i}.0.fn.qkv.", "layers.{i}.attn.qkv."),
    ("transformer.layers.{i}.0.fn.to_out.0.", "layers.{i}.attn.proj."),
    ("transformer.layers.{i}.1.norm.", "layers.{i}.norm2."),
    ("transformer.layers.{i}.1.fn.D", "layers.{i}.mlp.D"),
    ("transformer.layers.{i}.1.fn.D1", "layers.{i}.mlp.D1"),
    ("mlp_head.0.", "head.0."),
    ("mlp_head.1.", "head.1."),
]


def alpha_config(config: ModelConfig | None = None) -> ModelConfig:
    """``config`` with the CRATE-α choices of :data:`ALPHA_CHOICES` (``None``: CRATE-α-B/16's sizes).

    A field left at its ModelConfig default is set to the CRATE-α value; a field set to anything else
    (e.g. ``attention="mhsa"``) is a one-line ValueError, since the result would not be CRATE-α.
    """
    if config is None:
        config = ModelConfig(dim=768, depth=12, heads=12)
    elif not isinstance(config, ModelConfig):
        raise ValueError(f"expected a ModelConfig, got {type(config).__name__}; e.g. ModelConfig(dim=768, heads=12)")
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    changes = {}
    for name, value in ALPHA_CHOICES.items():
        have = getattr(config, name)
        if have != value and have != defaults[name] and name != "arch":
            raise ValueError(
                f"CRATE-α has {name}={value!r}, but the config sets {name}={have!r}; drop {name} "
                "(or build a CRATE with create_model / build_model for that variant)"
            )
        changes[name] = value
    return dataclasses.replace(config, **changes)


def is_alpha_config(config: object) -> bool:
    """Whether ``config`` describes CRATE-α (its :data:`ALPHA_CHOICES`), e.g. a ``crate_alpha_*`` registry entry."""
    return isinstance(config, ModelConfig) and all(getattr(config, k) == v for k, v in ALPHA_CHOICES.items())


class CRATEAlpha(ImageClassifier):
    """The CRATE-α classifier: ``CRATEAlpha(ModelConfig(dim=768, depth=12, heads=12))`` (or ``CRATEAlpha()``).

    Patch conv (as a Linear on flattened patches) → class token + position table → L layers of
    ``Z + MSSA(LN(Z))`` then ``Z + ODL(LN(Z))`` → LayerNorm + Linear on the class token.  The config is
    passed through :func:`alpha_config`, so ``model.config`` always records the CRATE-α choices and a
    saved model reloads (``from_pretrained``) to the same computation.
    """

    arch = "crate"

    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__(alpha_config(config))


# --------------------------------------------------------------------------- the authors' checkpoint format
def looks_like_alpha(state: Mapping[str, Tensor]) -> bool:
    """Whether a (unwrapped) state dict is in the authors' CRATE-α layout: the patch conv ``conv1`` or the ODL
    decoder dictionaries ``transformer.layers.{i}.1.fn.D1``, which no other official CRATE format has."""
    return "conv1.weight" in state or any(k.startswith("transformer.layers.") and k.endswith(".fn.D1") for k in state)


def alpha_official_to_native(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official CRATE-α state dict (``torch_inference/model/crate_alpha.py``) → :class:`CRATEAlpha` keys
    and shapes (:data:`ALPHA_KEY_MAP`; the conv weight becomes the Linear on (p1, p2, c)-ordered patches)."""
    out = rename_keys(state, ALPHA_KEY_MAP, forward=True)
    w = out.get("patch_embed.1.weight")
    if w is not None and w.dim() == 4:
        out["patch_embed.1.weight"] = patch_conv_to_linear(w)
    return out


def alpha_native_to_official(state: Mapping[str, Tensor], in_chans: int = 3) -> dict[str, Tensor]:
    """A :class:`CRATEAlpha` state dict → the official CRATE-α keys, loadable with ``load_state_dict(strict=True)``
    by the authors' module (whose ``conv1`` takes 3 channels)."""
    out = rename_keys(state, ALPHA_KEY_MAP, forward=False)
    out["conv1.weight"] = patch_linear_to_conv(out["conv1.weight"], in_chans)
    return out
