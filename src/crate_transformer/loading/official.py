"""The authors' checkpoint formats: how a ``.pth`` of the official code becomes this package's weights.

An :class:`OfficialFormat` is what ``ct.from_official(path, name)`` needs to read one family's released
files: a converter to this package's keys and shapes, a detector (so a file of another family is refused
with the right model name), and the checks of the config it can fill.  Each model family defines its
format in its own module and registers it with its architecture (``register_arch(..., official=FORMAT)``).
The key maps of the official repository (Ma-Lab-Berkeley/CRATE ``model/crate.py`` and ``model/crate_ae``)
live here, with the shared pieces (:func:`rename` by a key map, :func:`unwrap` of the training containers,
:func:`conv_to_linear` for patch embeddings), and DINO's and DINOv2's ViT layout (:data:`DINO_VIT_KEY_MAP`, the end
of this module), which the ViT baseline reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

__all__ = [
    "OfficialFormat",
    "HEADS_NOT_STORED",
    "rename",
    "unwrap",
    "index_count",
    "conv_to_linear",
    "linear_to_conv",
    "CLASSIFIER_KEY_MAP",
    "MAE_KEY_MAP",
    "official_to_native",
    "native_to_official",
    "mae_official_to_native",
    "mae_native_to_official",
    "DINO_VIT_KEY_MAP",
    "backbone_state",
    "dino_vit_detect",
    "dino_vit_fields",
    "dino_vit_to_native",
]


@dataclass(frozen=True)
class OfficialFormat:
    """One family's released checkpoint format (see the module docstring): ``name`` as users know it,
    ``origin`` the authors' code that writes it (repository and path).

    ``to_native(state, config)`` maps an unwrapped state dict to this package's keys; ``detect(state)``
    says whether a state dict is of this format; ``check(config)`` refuses configs the format cannot
    fill (one-line ``ValueError``); ``example`` is a registered model name for error messages.

    ``fields(raw)``, for formats whose files describe themselves (sizes in the tensors, nanoGPT's
    ``model_args``), reads config values off the loaded file (the container as saved); they replace the
    registered model's values, and an override that contradicts one is an error, except for the keys in
    ``overridable`` (values the format implies but a user may know better).

    ``config_file(json)``, for formats saved with a JSON config beside the weights (Hugging Face's
    ``config.json``), reads config values off it, with the same precedence as ``fields`` (whose values, read
    off the tensors, must agree with it).  ``optional`` lists native key prefixes a checkpoint may lack (a
    fine-tuned classifier's file without the LM head): those weights keep their initialisation, with a warning.

    ``file_names`` says how the file names a field it stores outside the tensors (``{"image_size":
    "args.input_size"}``), for the one-line error when the value is not of the field's type or size
    (:func:`~crate_transformer.loading.values.file_fields`, which every value ``fields`` / ``config_file`` read
    passes).

    ``unstored`` lists the config fields the files cannot determine that change the computation, each with the fields
    that fix the shapes it splits (:data:`HEADS_NOT_STORED`: the head count, with the width).  Unless ``fields`` /
    ``config_file`` read one off the file, the registered model's value is used only while the file has the
    registered model's values of those fields; for any other, the value must be given, or the load is refused.
    """

    name: str
    origin: str
    to_native: Callable[[Mapping[str, Tensor], Any], dict[str, Tensor]]
    detect: Callable[[Mapping[str, Tensor]], bool]
    example: str
    check: Callable[[Any], None] | None = None
    fields: Callable[[object], dict[str, Any]] | None = None
    overridable: tuple[str, ...] = ()
    config_file: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    optional: tuple[str, ...] = ()
    unstored: tuple[tuple[str, tuple[str, ...]], ...] = ()
    file_names: Mapping[str, str] = field(default_factory=dict)


# The head count of MSSA: U = [U_1, ..., U_K] is stored as one (K·p × d) matrix, so no shape tells K from p when K·p
# is the same (a 3-head file of width 48 reads as 12 heads of 4).  The registered model's K is taken only while the
# file has its width (dim, dim_head); for another width it is required (OfficialFormat.unstored).
HEADS_NOT_STORED = (("heads", ("dim", "dim_head")),)


def conv_to_linear(w: Tensor) -> Tensor:
    """A patch-embedding conv weight ``(d, c, p, p)`` → the Linear on (p1, p2, c)-ordered patches ``(d, p·p·c)``."""
    return w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)


def linear_to_conv(w: Tensor, in_chans: int) -> Tensor:
    """Inverse of :func:`conv_to_linear`."""
    p = int(round((w.shape[1] / in_chans) ** 0.5))
    return w.reshape(w.shape[0], p, p, in_chans).permute(0, 3, 1, 2).contiguous()


# (official key prefix, native key prefix); "{i}" is a layer index.  One table serves both directions.
CLASSIFIER_KEY_MAP = [
    ("pos_embedding", "pos_embed"),
    ("cls_token", "cls_token"),
    ("to_patch_embedding.1.", "patch_embed.0."),  # index 0 of the official Sequential is the Rearrange
    ("to_patch_embedding.2.", "patch_embed.1."),
    ("to_patch_embedding.3.", "patch_embed.2."),
    ("transformer.layers.{i}.0.norm.", "layers.{i}.norm1."),
    ("transformer.layers.{i}.0.fn.qkv.", "layers.{i}.attn.qkv."),
    ("transformer.layers.{i}.0.fn.to_out.0.", "layers.{i}.attn.proj."),
    ("transformer.layers.{i}.1.norm.", "layers.{i}.norm2."),
    ("transformer.layers.{i}.1.fn.weight", "layers.{i}.ista.weight"),
    ("mlp_head.0.", "head.0."),
    ("mlp_head.1.", "head.1."),
]
# CRATE-MAE (Ma-Lab-Berkeley/CRATE model/crate_ae).  The official pos_embed (unused by its forward) and
# decoder_embed (never used) have no native counterpart; decoder_pos_embed is the table the forward adds.
MAE_KEY_MAP = [
    ("cls_token", "cls_token"),
    ("mask_token", "mask_token"),
    ("decoder_pos_embed", "pos_embed"),
    ("patch_embed.proj.", "patch_embed."),  # conv weight (d, c, p, p) ↔ linear (d, p·p·c): see below
    ("blocks.{i}.layers.0.0.norm.", "layers.{i}.norm1."),
    ("blocks.{i}.layers.0.0.fn.qkv.", "layers.{i}.attn.qkv."),
    ("blocks.{i}.layers.0.0.fn.to_out.0.", "layers.{i}.attn.proj."),
    ("blocks.{i}.layers.0.1.norm.", "layers.{i}.norm2."),
    ("blocks.{i}.layers.0.1.fn.weight", "layers.{i}.ista.weight"),
    ("norm.", "norm."),
    ("decoder_blocks.{i}.layers.0.0.norm.", "decoder_layers.{i}.norm1."),
    ("decoder_blocks.{i}.layers.0.0.fn.weight", "decoder_layers.{i}.weight"),
    ("decoder_blocks.{i}.layers.0.1.norm.", "decoder_layers.{i}.norm2."),
    ("decoder_blocks.{i}.layers.0.1.fn.qkv.", "decoder_layers.{i}.attn.qkv."),
    ("decoder_blocks.{i}.layers.0.1.fn.to_out.0.", "decoder_layers.{i}.attn.proj."),
    ("decoder_norm.", "decoder_norm."),
    ("decoder_pred.", "decoder_pred."),
]
_MAE_UNUSED = ("pos_embed", "decoder_embed.weight", "decoder_embed.bias")


def rename(state: Mapping[str, Tensor], key_map: list[tuple[str, str]], forward: bool) -> dict[str, Tensor]:
    """Rename keys by ``key_map`` official → native (``forward``) or native → official; unknown keys pass unchanged."""
    rules = []
    for official, native in key_map:
        src, dst = (official, native) if forward else (native, official)
        pattern = r"(\d+)".join(map(re.escape, src.split("{i}")))
        rules.append((re.compile("^" + pattern + ("" if src.endswith(".") else "$")), dst.replace("{i}", r"\1")))
    out = {}
    for key, value in state.items():
        for pattern, repl in rules:
            new, hits = pattern.subn(repl, key)
            if hits:
                key = new
                break
        out[key] = value
    return out


def index_count(state: Mapping[str, object], pattern: str, step: int = 1) -> int:
    """One more than the last index of the numbered blocks (layers, convolutions) whose keys match ``pattern`` (a
    regex whose first group is the index); 0 when none.  The indices must be ``0, step, 2·step, …``, each present:
    a size read from key names is bounded by the keys themselves (one key ``h.1000000000.…`` would otherwise build
    a billion layers before any weight is compared); a gap is a one-line ``ValueError``."""
    found = sorted({int(m.group(1)) for k in state if (m := re.match(pattern, k))})
    if found != list(range(0, step * len(found), step)):
        gap = next(i * step for i, n in enumerate(found) if n != i * step)
        shown = pattern.replace("(\\d+)", "N").replace("\\", "")
        raise ValueError(
            f"the file's keys {shown}… number {len(found)} blocks up to index {found[-1]:,}, and block {gap} is "
            "missing; the file is damaged or not of this format"
        )
    return found[-1] + 1 if found else 0


# the training containers whose entry is the model's state dict: the official main.py's, the MAE codebase's (and
# DINOv2's fvcore checkpoints), and DINO / SimDINO main_dino.py's {'student', 'teacher', ...}, of which the teacher is
# the model evaluated and released (SimDINOv2's teacher_checkpoint.pth holds {'teacher': ...} alone)
CONTAINERS = ("state_dict", "model", "teacher")


def unwrap(obj: object) -> dict[str, Tensor]:
    """The state dict of a checkpoint: a bare one, or the entry of a training container (:data:`CONTAINERS`), with
    DistributedDataParallel's ``module.`` prefix removed."""
    if isinstance(obj, Mapping):
        for container in CONTAINERS:
            if container in obj and isinstance(obj[container], Mapping):
                obj = obj[container]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(
            "not an official CRATE checkpoint: expected a state dict, {'state_dict': ...}, {'model': ...} or "
            "{'teacher': ...} (DINO's and SimDINO's checkpoint.pth) of tensors"
        )
    return {k.removeprefix("module."): v for k, v in obj.items()}


def official_to_native(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename an official ``model/crate.py`` state dict (after unwrapping) to this library's key names."""
    return rename(state, CLASSIFIER_KEY_MAP, forward=True)


def native_to_official(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename this library's CRATE state dict to the official ``model/crate.py`` key names."""
    return rename(state, CLASSIFIER_KEY_MAP, forward=False)


def mae_official_to_native(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official CRATE-MAE state dict (after unwrapping) → :class:`CRATEMAE` keys and shapes.

    Keys follow :data:`MAE_KEY_MAP`; the unused ``pos_embed`` and ``decoder_embed`` are dropped; the
    patch conv ``(d, c, p, p)`` becomes the linear map of (p1, p2, c)-ordered patches ``(d, p·p·c)``.
    """
    state = {k: v for k, v in state.items() if k not in _MAE_UNUSED}
    out = rename(state, MAE_KEY_MAP, forward=True)
    w = out.get("patch_embed.weight")
    if w is not None and w.dim() == 4:
        out["patch_embed.weight"] = conv_to_linear(w)
    return out


def mae_native_to_official(state: Mapping[str, Tensor], in_chans: int) -> dict[str, Tensor]:
    """A :class:`CRATEMAE` state dict → the official ``MaskedAutoencoderViT`` keys, loadable strictly.

    Writes both (identical) position tables and the never-used ``decoder_embed`` as zeros.
    """
    out = rename(state, MAE_KEY_MAP, forward=False)
    w = out["patch_embed.proj.weight"]
    out["patch_embed.proj.weight"] = linear_to_conv(w, in_chans)
    out["pos_embed"] = out["decoder_pos_embed"].clone()
    d = w.shape[0]
    out["decoder_embed.weight"], out["decoder_embed.bias"] = w.new_zeros(d, d), w.new_zeros(d)
    return out


# --------------------------------------------------------------------------- DINO's ViT
# DINO's and DINOv2's ViT checkpoints → the package's ViT (:class:`~crate_transformer.models.classifier.ViT`).
#
# DINO's layout is ``VisionTransformer`` of facebookresearch/dino ``vision_transformer.py`` (commit 7c446df), which
# RobinWu218/SimDINO's ``simdino/vision_transformer.py`` keeps (commit 8149fc4): ``cls_token``, ``pos_embed``,
# ``patch_embed.proj`` (a stride-p convolution), ``blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}``,
# ``norm`` (every LayerNorm eps 1e-6).  DINOv2's (``DinoVisionTransformer`` of SimDINO's
# ``simdinov2/models/vision_transformer.py``, facebookresearch/dinov2's with SimDINO's changes) adds
# ``register_tokens`` (``num_register_tokens``), LayerScale ``blocks.N.ls1.gamma`` / ``ls2.gamma``, the blocks
# chunked as ``blocks.C.N.`` (``block_chunks``, for FSDP) and ``mask_token`` (iBOT's masked-patch embedding, read
# in training only).  The files come as
#
# * the released backbones (DINO's ``dino_deitsmall16_pretrain.pth``, DINOv2's ``dinov2_vitb14_pretrain.pth``):
#   that state dict alone;
# * a training checkpoint of DINO's ``main_dino.py`` (DINO's ``*_full_checkpoint.pth``, SimDINO's
#   ``checkpoint.pth``): ``{'student', 'teacher', 'optimizer', 'epoch', 'args', ...}``, whose teacher is read (as
#   DINO's ``eval_knn.py`` reads it, ``--checkpoint_key teacher``; :func:`unwrap`), its keys ``backbone.*`` and
#   ``head.*`` (``MultiCropWrapper``), prefixed ``module.`` (DistributedDataParallel) and ``_orig_mod.``
#   (``torch.compile``, SimDINO's default);
# * SimDINOv2's ``eval/N/teacher_checkpoint.pth`` (``simdinov2/train/train.py``'s ``do_test``): ``{'teacher':
#   ...}`` of the teacher's ``ModuleDict``, keys ``backbone.*``, ``dino_head.*`` (and ``ibot_head.*``), which its
#   ``eval/setup.py`` reads with the keys ``("model", "teacher")``; and DINOv2's ``{'model': ...}`` of the whole
#   ``SSLMetaArch`` (fvcore's checkpointer), keys ``student.backbone.*`` and ``teacher.backbone.*``, of which the
#   teacher's are read.  The heads are dropped.
#
# What the code fixes and the tensors do not store (:func:`dino_vit_fields`): the last LayerNorm on every token
# (``final_norm="tokens"``: the class token after ``norm`` is the output), eps 1e-6, and how the position grid is
# resized: DINO's scale factor ``(h + 0.1) / grid`` (``interpolate_offset=0.1``), or, for a file with register
# tokens, DINOv2's antialiased resize to the size (``interpolate_antialias=True``, ``interpolate_offset=0.0``: the
# ``*_reg`` backbones of ``simdinov2/hub/backbones.py``, ``ssl_default_config.yaml`` under SimDINOv2's
# ``simdino_config.yaml``).  The head count is not stored (``qkv`` is one ``(3d × d)`` matrix), nor LayerScale's
# initial value (``layer_scale_init``; only the learned γ are): both come from the model name.

# (official key prefix, native key prefix); "{i}" a block index
DINO_VIT_KEY_MAP = [
    ("cls_token", "cls_token"),
    ("pos_embed", "pos_embed"),
    ("register_tokens", "register_tokens"),  # DINOv2's, (1, R, d)
    ("patch_embed.proj.", "patch_embed.0."),  # conv (d, c, p, p) → Linear (d, p·p·c): conv_to_linear below
    ("blocks.{i}.norm1.", "layers.{i}.norm1."),
    ("blocks.{i}.attn.qkv.", "layers.{i}.attn.qkv."),
    ("blocks.{i}.attn.proj.", "layers.{i}.attn.proj."),
    ("blocks.{i}.ls1.gamma", "layers.{i}.gamma1"),  # DINOv2's LayerScale
    ("blocks.{i}.norm2.", "layers.{i}.norm2."),
    ("blocks.{i}.mlp.fc1.", "layers.{i}.mlp.0."),
    ("blocks.{i}.mlp.fc2.", "layers.{i}.mlp.3."),
    ("blocks.{i}.ls2.gamma", "layers.{i}.gamma2"),
    ("norm.", "norm."),
    ("head.", "head.1."),  # a classifier Linear (VisionTransformer(num_classes > 0)); the released backbones have none
]
# the prefixes the training code adds in front of the backbone's keys: torch.compile's and DistributedDataParallel's
_WRAPPERS = ("_orig_mod.", "module.")
_BACKBONE = "backbone."  # DINO's MultiCropWrapper(backbone, head), SimDINOv2's ModuleDict(backbone=, dino_head=, ...)
_TEACHER = "teacher."  # DINOv2's SSLMetaArch: ModuleDict student and teacher
_CHUNKED = re.compile(r"^blocks\.\d+\.(\d+)\.")  # DINOv2's block_chunks: blocks.C.N.* for block N
_LAYER_SCALE = re.compile(r"^blocks\.\d+\.ls[12]\.gamma$")
# what DINOv2's code may build that the package's ViT does not (ffn_layer="swiglufused": ViT-g/14's MLP)
_NOT_BUILT = {r"^blocks\.\d+\.mlp\.w12\.": "a SwiGLU MLP (blocks.N.mlp.w12 / w3: DINOv2's ffn_layer='swiglufused')"}


def _strip(key: str) -> str:
    while key.startswith(_WRAPPERS):
        key = key.removeprefix("_orig_mod.").removeprefix("module.")
    return key


def backbone_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The ViT's own tensors of a state dict: the wrappers' prefixes stripped; of a teacher and student side by side
    (``teacher.backbone.*``, DINOv2's ``SSLMetaArch``) the teacher's; of a backbone beside its heads
    (``backbone.*``: DINO's ``MultiCropWrapper``, SimDINOv2's teacher) the backbone's.  DINOv2's chunked block keys
    (``blocks.C.N.``, its ``block_chunks``) are numbered by block, as its ``revert_block_chunk_weight`` does, and its
    ``mask_token`` (iBOT's embedding of masked patches, read only in training) is dropped."""
    stripped = {_strip(k): v for k, v in state.items()}
    if any(k.startswith(_TEACHER + _BACKBONE) for k in stripped):
        stripped = {k.removeprefix(_TEACHER): v for k, v in stripped.items() if k.startswith(_TEACHER)}
    wrapped = any(k.startswith(_BACKBONE) for k in stripped)
    out = {}
    for key, value in stripped.items():
        if wrapped and not key.startswith(_BACKBONE):
            continue  # the heads: DINO's projection and prototypes, SimDINO's projection, DINOv2's dino/ibot heads
        key = _CHUNKED.sub(r"blocks.\1.", key.removeprefix(_BACKBONE))
        if key != "mask_token":
            out[key] = value
    return out


def dino_vit_detect(state: Mapping[str, Tensor]) -> bool:
    """Whether a state dict holds a DINO-style ViT (its stem and first block), wrapped or not."""
    keys = backbone_state(state)
    return "cls_token" in keys and "patch_embed.proj.weight" in keys and "blocks.0.attn.qkv.weight" in keys


def _refuse_unbuilt(state: Mapping[str, Tensor]) -> None:
    """One line for what the package's ViT does not build: DINOv2's SwiGLU MLP, an attention without qkv bias."""
    for pattern, what in _NOT_BUILT.items():
        if any(re.match(pattern, k) for k in state):
            raise ValueError(
                f"it has {what}, which the package's ViT does not build (its MLP is fc1, GELU, fc2); only the "
                "vit_small / vit_base / vit_large factories' MLP (ffn_layer='mlp') loads"
            )
    if "blocks.0.attn.qkv.bias" not in state:
        raise ValueError(
            "its attention has no qkv bias (VisionTransformer(qkv_bias=False)), and the ViT's qkv has one; only "
            "the vit_tiny / vit_small / vit_base factories' layout (qkv_bias=True) loads"
        )


def _layout(state: Mapping[str, Tensor], dim: int) -> dict[str, Any]:
    """What DINO's or DINOv2's code fixes for this file: the register count (read off ``register_tokens``), the
    position resize that goes with it, and no LayerScale where the file has none (its initial value, where it has
    one, is the model name's: the file stores only the learned γ)."""
    reg = state.get("register_tokens")
    if reg is not None and (reg.dim() != 3 or reg.shape[0] != 1 or reg.shape[-1] != dim):
        raise ValueError(f"its register_tokens {tuple(reg.shape)} are not (1, R, {dim}) for its width {dim}")
    registers = 0 if reg is None else reg.shape[1]
    found: dict[str, Any] = {"final_norm": "tokens", "norm_eps": 1e-6, "registers": registers}
    # DINOv2 with registers resizes to the size, antialiased (its *_reg backbones, SimDINOv2's config); DINO by the
    # scale factor (h + 0.1) / grid, as DINOv2's backbones without registers do
    found.update(interpolate_antialias=bool(registers), interpolate_offset=0.0 if registers else 0.1)
    if not any(_LAYER_SCALE.match(k) for k in state):
        found["layer_scale_init"] = None
    return found


def dino_vit_fields(raw: object) -> dict[str, Any]:
    """The ViT config values a DINO / DINOv2 file fixes (``OfficialFormat.fields``): the sizes from the tensors,
    and what the authors' code fixes (:func:`_layout`, the module docstring).  What the ViT does not build (a
    SwiGLU MLP, an attention without the qkv bias) is refused in one line."""
    state = backbone_state(unwrap(raw))
    _refuse_unbuilt(state)
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
    return {**found, **_layout(state, dim)}


def dino_vit_to_native(state: Mapping[str, Tensor], config: Any = None) -> dict[str, Tensor]:
    """A DINO / DINOv2 ViT state dict (after :func:`unwrap`) → the ViT's keys and shapes (:data:`DINO_VIT_KEY_MAP`;
    the patch convolution becomes the Linear on (p1, p2, c)-ordered patches).  A file with LayerScale read into a
    config without it (``layer_scale_init=None``: a DINO name) is one line naming the fix."""
    state = backbone_state(state)
    if config is not None and config.layer_scale_init is None and any(_LAYER_SCALE.match(k) for k in state):
        raise ValueError(
            "it has LayerScale (blocks.N.ls1.gamma / ls2.gamma), and the config has none; pass layer_scale_init= "
            "(its initial value: SimDINOv2's 0.1, DINOv2's 1e-5; the learned scales load whatever it is) or load it "
            "as a DINOv2 name such as simdinov2_vitb16"
        )
    out = rename(state, DINO_VIT_KEY_MAP, forward=True)
    w = out.get("patch_embed.0.weight")
    if w is not None and w.dim() == 4:
        out["patch_embed.0.weight"] = conv_to_linear(w)
    return out
