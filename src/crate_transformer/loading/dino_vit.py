"""DINO's ViT checkpoints → the package's ViT (:class:`~crate_transformer.models.classifier.ViT`).

The layout is ``VisionTransformer`` of facebookresearch/dino ``vision_transformer.py`` (commit 7c446df), which
RobinWu218/SimDINO's ``simdino/vision_transformer.py`` keeps (commit 8149fc4): ``cls_token``, ``pos_embed``,
``patch_embed.proj`` (a stride-p convolution), ``blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}``,
``norm`` (every LayerNorm eps 1e-6).  The files come as

* the released backbones (``dino_deitsmall16_pretrain.pth``, ...): that state dict alone;
* a training checkpoint of ``main_dino.py`` (DINO's ``*_full_checkpoint.pth``, SimDINO's ``checkpoint.pth``):
  ``{'student', 'teacher', 'optimizer', 'epoch', 'args', ...}``, whose teacher is read (as DINO's ``eval_knn.py``
  and ``eval_linear.py`` read it, ``--checkpoint_key teacher``; :func:`~.official.unwrap`), its keys
  ``backbone.*`` and ``head.*`` (``MultiCropWrapper``), prefixed ``module.`` (DistributedDataParallel) and
  ``_orig_mod.`` (``torch.compile``, SimDINO's default).  The projection head (``head.*``) is dropped.

What DINO's code fixes and the tensors do not store (:func:`dino_vit_fields`): the last LayerNorm on every token
(``final_norm="tokens"``: the class token after ``norm`` is DINO's output), eps 1e-6, and the position grid resized
by the scale factor ``(h + 0.1) / grid`` (``interpolate_offset=0.1``).  The head count is not stored (``qkv`` is one
``(3d × d)`` matrix): it comes from the model name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from .official import conv_to_linear, index_count, rename, unwrap

__all__ = ["DINO_VIT_KEY_MAP", "backbone_state", "dino_vit_detect", "dino_vit_fields", "dino_vit_to_native"]

# (official key prefix, native key prefix); "{i}" a block index
DINO_VIT_KEY_MAP = [
    ("cls_token", "cls_token"),
    ("pos_embed", "pos_embed"),
    ("patch_embed.proj.", "patch_embed.0."),  # conv (d, c, p, p) → Linear (d, p·p·c): conv_to_linear below
    ("blocks.{i}.norm1.", "layers.{i}.norm1."),
    ("blocks.{i}.attn.qkv.", "layers.{i}.attn.qkv."),
    ("blocks.{i}.attn.proj.", "layers.{i}.attn.proj."),
    ("blocks.{i}.norm2.", "layers.{i}.norm2."),
    ("blocks.{i}.mlp.fc1.", "layers.{i}.mlp.0."),
    ("blocks.{i}.mlp.fc2.", "layers.{i}.mlp.3."),
    ("norm.", "norm."),
    ("head.", "head.1."),  # a classifier Linear (VisionTransformer(num_classes > 0)); the released backbones have none
]
# the prefixes the training code adds in front of the backbone's keys: torch.compile's and DistributedDataParallel's
_WRAPPERS = ("_orig_mod.", "module.")
_BACKBONE = "backbone."  # MultiCropWrapper(backbone, head)
# DINOv2's ViT (SimDINOv2's simdinov2/models/vision_transformer.py): what this layout never has
_DINOV2 = {
    "register tokens (register_tokens)": r"register_tokens$",
    "LayerScale (blocks.N.ls1 / ls2)": r"blocks\.\d+\.ls[12]\.",
}
_CHUNKED = re.compile(r"^blocks\.\d+\.(\d+)\.")  # DINOv2's block_chunks: blocks.C.N.* for block N


def _strip(key: str) -> str:
    while key.startswith(_WRAPPERS):
        key = key.removeprefix("_orig_mod.").removeprefix("module.")
    return key


def backbone_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The ViT's own tensors of a state dict: the wrappers' prefixes stripped, and of a ``MultiCropWrapper``'s
    (``backbone.*`` keys) the projection head dropped.  DINOv2's chunked block keys (``blocks.C.N.``, its
    ``block_chunks``) are numbered by block, as its ``revert_block_chunk_weight`` does, and its ``mask_token``
    (iBOT's embedding of masked patches, read only in training) is dropped."""
    stripped = {_strip(k): v for k, v in state.items()}
    wrapped = any(k.startswith(_BACKBONE) for k in stripped)
    out = {}
    for key, value in stripped.items():
        if wrapped and not key.startswith(_BACKBONE):
            continue  # the MultiCropWrapper's head: DINO's projection and prototypes, SimDINO's projection
        key = _CHUNKED.sub(r"blocks.\1.", key.removeprefix(_BACKBONE))
        if key != "mask_token":
            out[key] = value
    return out


def dino_vit_detect(state: Mapping[str, Tensor]) -> bool:
    """Whether a state dict holds a DINO-style ViT (its stem and first block), wrapped or not."""
    keys = backbone_state(state)
    return "cls_token" in keys and "patch_embed.proj.weight" in keys and "blocks.0.attn.qkv.weight" in keys


def dino_vit_fields(raw: object) -> dict[str, Any]:
    """The ViT config values a DINO file fixes (``OfficialFormat.fields``): the sizes from the tensors, and what
    DINO's code fixes (see the module docstring).  A DINOv2-layout file (register tokens, LayerScale) or an
    attention without the qkv bias is refused in one line."""
    state = backbone_state(unwrap(raw))
    v2 = [what for what, pattern in _DINOV2.items() if any(re.match(pattern, k) for k in state)]
    if v2:
        raise ValueError(
            f"it is a DINOv2-layout ViT (it has {' and '.join(v2)}), which the package's ViT does not build; only "
            "DINO's layout (facebookresearch/dino vision_transformer.py) loads"
        )
    if "blocks.0.attn.qkv.bias" not in state:
        raise ValueError(
            "its attention has no qkv bias (VisionTransformer(qkv_bias=False)), and the ViT's qkv has one; only "
            "the vit_tiny / vit_small / vit_base factories' layout (qkv_bias=True) loads"
        )
    conv, dim = state["patch_embed.proj.weight"], state["cls_token"].shape[-1]
    patch, grid = conv.shape[-1], (state["pos_embed"].shape[1] - 1) ** 0.5
    if conv.dim() != 4 or conv.shape[-2] != patch or not grid.is_integer():
        raise ValueError(
            f"its patch convolution {tuple(conv.shape)} and position table {tuple(state['pos_embed'].shape)} are not "
            "a square grid of square patches"
        )
    found: dict[str, Any] = {
        "dim": dim,
        "depth": index_count(state, r"blocks\.(\d+)\."),
        "patch_size": patch,
        "in_chans": conv.shape[1],
        "image_size": int(grid) * patch,
        "mlp_ratio": state["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        "num_classes": state["head.weight"].shape[0] if "head.weight" in state else 0,
    }
    return {**found, "final_norm": "tokens", "norm_eps": 1e-6, "interpolate_offset": 0.1}


def dino_vit_to_native(state: Mapping[str, Tensor], config: Any = None) -> dict[str, Tensor]:
    """A DINO ViT state dict (after :func:`~.official.unwrap`) → the ViT's keys and shapes (:data:`DINO_VIT_KEY_MAP`;
    the patch convolution becomes the Linear on (p1, p2, c)-ordered patches)."""
    out = rename(backbone_state(state), DINO_VIT_KEY_MAP, forward=True)
    w = out.get("patch_embed.0.weight")
    if w is not None and w.dim() == 4:
        out["patch_embed.0.weight"] = conv_to_linear(w)
    return out
