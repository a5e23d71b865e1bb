"""The CRATE image classifier (JMLR §4.1.1, eqs. (65)-(66), Alg. 6, p.113) and a standard ViT
baseline, both configured by one dataclass.

The CRATE classifier matches the official ``model/crate.py`` computation exactly (same patch
flattening order, LayerNorms, class token, head), plus what the official code cannot do:
position-embedding interpolation for other image sizes and a one-pass trace of every layer.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config_utils import Range, option
from ..layers import EncoderLayer, LayerConfig, drop_path_rates
from ..loading.official import (
    HEADS_NOT_STORED,
    OfficialFormat,
    dino_vit_detect,
    dino_vit_fields,
    dino_vit_to_native,
    official_to_native,
)
from ._registry import register_arch
from .base import POOLS, Model, Trace, pool_name, pool_tokens
from .contract import IMAGE_CLASSIFIER, FamilyConfig
from .image_input import ImageEncoderGeometry, ImageInput, bicubic_matrix, patchify, unpatchify
from .spec import DataSpec

__all__ = [
    "ModelConfig",
    "ImageEncoderGeometry",
    "Trace",
    "POOLS",
    "ImageInput",
    "ImageClassifier",
    "CRATE",
    "ViT",
    "build_model",
    "patchify",
    "unpatchify",
    "CLASSIFIER_FORMAT",
    "DINO_VIT_FORMAT",
]

ARCHS = ("crate", "vit")
# where the encoder's last LayerNorm sits: on the pooled vector, as the head's first map (the CRATE classifier's
# mlp_head[0], timm's fc_norm) | on every token, as forward_features' last map (DINO's and timm's ViT ``norm``)
FINAL_NORMS = ("pooled", "tokens")
_VIT_ONLY = {"arch": ("vit",)}  # the options of DINO's ViT layout (facebookresearch/dino vision_transformer.py)
NUM_CLASSES = Range(0, integer=True, note="0: no classifier, the model returns its pooled features")


@dataclass
class ModelConfig(ImageEncoderGeometry, LayerConfig, FamilyConfig):
    """Every hyperparameter of an image classifier; round-trips through ``config.json``.

    Values are coerced to the declared types (``"5e-2"`` → 0.05 for a float field, ``"64"`` → 64 for
    an int field, see :func:`~crate_transformer.config_utils.coerce_fields`) and validated, so a bad
    value fails here with a one-line ``ValueError`` naming the field, not at the first forward pass.
    ``data`` records what the model was trained on (:class:`~crate_transformer.data.DataSpec`:
    normalisation, class names, data source); training fills it in.
    """

    arch: str = option("crate", "the family: crate | vit (the ViT baseline, Table 17)", choices=ARCHS)
    image_size: int = option(224, "side of the (square) input images in pixels")
    patch_size: int = option(16, "side of a patch in pixels (image_size must be a multiple)")
    in_chans: int = option(3, "input channels (1 for grey images)")
    num_classes: int = option(1000, "classes of the head (0: no classifier, the model returns its pooled features)")
    dim: int = option(384, "token width d")
    depth: int = option(12, "layers L")
    heads: int = option(6, "attention heads K")
    dim_head: int | None = option(None, "width p of a head (None: dim // heads, what every paper config uses)")
    pool: str = option(
        "cls",
        "cls | mean (every token: official) | avg (patch tokens), see base.POOLS",
        choices=POOLS,
        applies="always",
    )
    emb_dropout: float = option(0.0, "dropout of the embedded tokens", range=Range(0, 1, hi_open=True))
    drop_path: float = option(
        0.0,
        "stochastic depth of the last layer, rising linearly from 0 (timm / DeiT); 0 = off",
        range=Range(0, 1, hi_open=True),
    )
    # the layers' settings (eta, lambd, ista_mode, layer_form, attention, mlp, odl_ratio, mlp_ratio, ...) are
    # LayerConfig's (layers/config.py), the same fields for every family of CRATE layers; arch="vit" reads dropout
    # and mlp_ratio only
    patch_norm: bool = option(
        True,
        "LayerNorms around the patch projection (official classifier, Alg. 6); False: a plain linear projection, "
        "the conv PatchEmbed of CRATE-MAE (a model fine-tuned from a CRATE-MAE encoder)",
    )
    final_norm: str = option(
        "pooled",
        "the last LayerNorm: pooled (on the pooled vector, the head's first map: CRATE's mlp_head[0], timm's "
        "fc_norm) | tokens (on every token, the end of forward_features: DINO's norm)",
        choices=FINAL_NORMS,
        applies=_VIT_ONLY,
    )
    norm_eps: float | None = option(
        None,
        "eps of the layers' and the last LayerNorms (None: PyTorch's 1e-5; DINO's ViT: 1e-6)",
        range=Range(0, lo_open=True),
        applies=_VIT_ONLY,
    )
    interpolate_offset: float = option(
        0.0,
        "resizing the position grid to h x w patches: 0 resizes to that size; DINO's 0.1 resizes by the scale "
        "factor (h + 0.1) / grid, which places the samples slightly differently (facebookresearch/dino#8)",
        range=Range(0, 1, hi_open=True),
        applies=_VIT_ONLY,
    )
    interpolate_antialias: bool = option(
        False,
        "resizing the position grid with PyTorch's antialiased bicubic (DINOv2's interpolate_antialias): PIL's "
        "cubic kernel (a = -0.5; plain bicubic's is -0.75), widened by the scale where the grid shrinks",
        applies=_VIT_ONLY,
    )
    registers: int = option(
        0,
        "register tokens (DINOv2's num_register_tokens, Darcet et al. 2024): learned tokens after the class token, "
        "without a position; the tokens are then [class, registers, patches]",
        range=Range(0, integer=True),
        applies=_VIT_ONLY,
    )
    layer_scale_init: float | None = option(
        None,
        "LayerScale (CaiT; DINOv2's layerscale): learned per-channel scales of both residual branches, "
        "initialised to this value (None: none, no parameters)",
        range=Range(0, lo_open=True),
        applies=_VIT_ONLY,
    )
    data: DataSpec | None = option(
        None, "what the model was trained on (normalisation, classes, source), or None", applies="always"
    )

    OMIT_AT_DEFAULT = (
        "drop_path",
        "gelu",
        "proj_bias",
        "final_norm",
        "norm_eps",
        "interpolate_offset",
        "interpolate_antialias",
        "registers",
        "layer_scale_init",
    )  # added later: configs without them stay byte-identical
    KEY_ORDER = ("arch", "image_size", "patch_size", "in_chans", "num_classes", "dim", "depth", "heads", "dim_head",
                 "pool", "dropout", "emb_dropout", "drop_path", "eta", "lambd", "ista_mode", "layer_form",
                 "scale_scores", "tied_output", "tied_beta", "eps", "patch_norm", "attention", "mlp", "odl_ratio",
                 "mlp_ratio", "final_norm", "norm_eps", "interpolate_offset", "interpolate_antialias", "registers",
                 "layer_scale_init", "data")  # fmt: skip
    kind = IMAGE_CLASSIFIER
    MODEL_TYPE = (
        "crate_transformer_image"  # config.json's model_type: transformers' AutoConfig (loading.transformers_hf)
    )
    BLOCK_COUNTS = {"depth": "layers"}  # the numbered blocks of the weights these fields count
    pipeline_tag = "image-classification"

    def validate(self) -> None:
        self.check_positive("odl_ratio")
        if self.arch == "crate":
            self.check_layer()
        self.check_geometry()
        NUM_CLASSES.check("num_classes", self.num_classes)
        if self.arch == "vit" and self.dim % self.heads:
            raise ValueError(
                f"dim={self.dim} is not divisible by heads={self.heads}; the ViT baseline needs dim % heads == 0"
            )
        if (self.arch == "vit" or self.mlp == "mlp") and int(self.dim * self.mlp_ratio) < 1:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} gives an empty MLP for dim={self.dim}; e.g. mlp_ratio=4.0")
        self.check_data()

    @property
    def white_box(self) -> bool:
        return self.arch != "vit"  # CRATE, its Table 17 hybrids, CRATE-α

    def layer_config(self) -> LayerConfig:
        """CRATE's layer settings, or the ViT block's (MHSA + GELU MLP, both residual: Table 17's ViT row), which
        reads ``dropout`` and ``mlp_ratio`` only."""
        if self.arch != "vit":
            return super().layer_config()
        return LayerConfig(attention="mhsa", mlp="mlp", dropout=self.dropout, mlp_ratio=self.mlp_ratio)

    @classmethod
    def upgrade(cls, d: dict) -> dict:
        """Configs written before ``data`` existed: their free-form ``"extra"`` dict
        (``{"normalization": {"mean", "std"}, "classes", "dataset", "data"}``) becomes ``data``."""
        if "extra" in d:
            extra = d.pop("extra")
            if d.get("data") is not None and extra:
                raise ValueError("config has both 'data' and the legacy 'extra'; keep only 'data'")
            if d.get("data") is None:
                d["data"] = DataSpec.from_dict(extra, legacy=True)
        return d


# --------------------------------------------------------------------------- classifier
def _crate_patch_embed(c: ModelConfig) -> tuple[nn.Module, float]:
    """CRATE: official patch order (p1 p2 c) flatten → LN → Linear → LN (Alg. 6); class token and positions
    ``torch.randn`` as the official code."""
    patch_dim = c.in_chans * c.patch_size**2
    if c.patch_norm:
        return nn.Sequential(nn.LayerNorm(patch_dim), nn.Linear(patch_dim, c.dim), nn.LayerNorm(c.dim)), 1.0
    # CRATE-MAE's PatchEmbed (a conv ≡ a linear map of the flattened patch); same key patch_embed.1
    return nn.Sequential(nn.Identity(), nn.Linear(patch_dim, c.dim), nn.Identity()), 1.0


def _vit_patch_embed(c: ModelConfig) -> tuple[nn.Module, float]:
    """ViT: a linear patch embedding; class token and positions at timm's std 0.02."""
    return nn.Sequential(nn.Linear(c.in_chans * c.patch_size**2, c.dim)), 0.02


_PATCH_EMBEDS = {"crate": _crate_patch_embed, "vit": _vit_patch_embed}


def final_layer_norm(c: ModelConfig) -> nn.LayerNorm:
    """The encoder's last LayerNorm (``norm_eps``, default PyTorch's 1e-5), wherever ``final_norm`` places it."""
    return nn.LayerNorm(c.dim, eps=1e-5 if c.norm_eps is None else c.norm_eps)


def classifier_layer(dim: int, num_classes: int) -> nn.Module:
    """The last linear map of a classifier head: ``dim`` → ``num_classes``, or none (``nn.Identity``) for 0 classes."""
    return nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()


class ImageClassifier(ImageInput, Model):
    """Patch embedding → class token + position embedding → L layers → pool → LayerNorm + Linear (with
    ``final_norm="tokens"``: LayerNorm on every token → pool → Linear, DINO's order).

    ``forward(x)`` takes float images ``(b, c, h, w)`` (any size divisible by the patch size; the
    position embedding is interpolated) and returns logits.  The :class:`~crate_transformer.models.base.Model`
    contract: ``forward_features`` returns the last layer's tokens (the official head normalises after
    pooling, so its LayerNorm is part of the head), ``forward_head`` pools and maps them to logits,
    ``forward_trace`` returns every layer's tokens in one pass.

    The tokens are ``[class, patches]``, or with ``registers=R`` (the ViT only) ``[class, R registers, patches]``
    as DINOv2 orders them: of ``forward_features(x)`` (after the last norm with ``final_norm="tokens"``),
    ``[:, 0]`` is DINOv2's ``x_norm_clstoken``, ``[:, 1:1 + R]`` its ``x_norm_regtokens`` and ``[:, 1 + R:]`` its
    ``x_norm_patchtokens``; :attr:`num_prefix_tokens` is ``1 + R``, and the ``avg`` pooling and
    ``forward_intermediates`` read the patches after it.

    The architecture is the class's: :class:`CRATE` and :class:`ViT` build their own and record it
    in ``config.arch`` whatever the given config says; ``ImageClassifier(config)`` itself (like
    :func:`build_model`) builds ``config.arch``.
    """

    config_class = ModelConfig
    no_decay_names = ("pos_embed", "cls_token", "register_tokens")

    def __init__(self, config: ModelConfig | None = None) -> None:
        if config is None:
            config = ModelConfig(arch=self.arch or "crate")
        if isinstance(config, ModelConfig) and self.arch is not None and config.arch != self.arch:
            config = dataclasses.replace(config, arch=self.arch)
        super().__init__(config)
        c = self.config
        self.patch_embed, self.layers, init_std = self.build_encoder(c)
        self.cls_token = nn.Parameter(torch.randn(1, 1, c.dim) * init_std)
        self.pos_embed = nn.Parameter(torch.randn(1, c.grid**2 + 1, c.dim) * init_std)
        # DINOv2's register tokens, drawn after the table so that a model without them draws what it always drew
        self.register_tokens = nn.Parameter(torch.randn(1, c.registers, c.dim) * init_std) if c.registers else None
        self.emb_drop = nn.Dropout(c.emb_dropout)
        # the last LayerNorm (final_norm): on every token (DINO's ``norm``), or the head's first map
        self.norm = final_layer_norm(c) if c.final_norm == "tokens" else None
        self.head = nn.Sequential(self.head_norm(c), classifier_layer(c.dim, c.num_classes))

    @property
    def num_prefix_tokens(self) -> int:
        """The tokens before the patches: the class token and the ``registers`` (timm's ``num_prefix_tokens``)."""
        return 1 + self.config.registers

    @staticmethod
    def head_norm(c: ModelConfig) -> nn.Module:
        """The head's first map: the last LayerNorm when it normalises the pooled vector, else none (the tokens
        were normalised by ``norm``)."""
        return final_layer_norm(c) if c.final_norm == "pooled" else nn.Identity()

    def finish_features(self, z: Tensor) -> Tensor:
        """The last layer's tokens → ``forward_features``' output: normalised by ``norm`` where the last LayerNorm
        is on the tokens (``final_norm="tokens"``), else as they are (the head normalises after pooling)."""
        return z if self.norm is None else self.norm(z)

    def norm_tokens(self, z: Tensor) -> Tensor:
        """Intermediates with ``norm=True``: the tokens' own final LayerNorm where the model has one (DINO's
        ``get_intermediate_layers`` applies ``norm`` to each), else none."""
        return z if self.norm is None else self.norm(z)

    def build_encoder(self, c: ModelConfig) -> tuple[nn.Module, nn.ModuleList, float]:
        """The patch embedding (by ``c.arch``), the layers (:meth:`ModelConfig.layer_config`: CRATE's, or the ViT
        block) and the init std of the class token and position table; a family that is this classifier with other
        layers overrides it (CRATE-α, ``alpha.py``)."""
        patch_embed, init_std = _PATCH_EMBEDS[c.arch](c)
        rates = drop_path_rates(c.drop_path, c.depth)
        scale = c.layer_scale_init  # LayerScale (the ViT's option): γ1, γ2 of each layer
        layers = nn.ModuleList(
            EncoderLayer.from_config(c, drop_path=r, norm_eps=c.norm_eps, layer_scale=scale) for r in rates
        )
        return patch_embed, layers, init_std

    def interpolate_pos_embed(self, h: int, w: int) -> Tensor:
        """Position embedding for an ``h × w`` patch grid (bicubic interpolation of the learned grid).

        Bicubic resizing is separable, so it is two matrix products with the 1-D interpolation matrices
        (:func:`bicubic_matrix`): the values of ``F.interpolate(mode="bicubic")``, with a backward that is a
        matrix product too — deterministic on a GPU, where bicubic upsampling's own backward is not
        (``--deterministic`` with DINO's smaller crops, or fine-tuning at another resolution).  Computed in float32,
        or float64 for a float64 table; ``interpolate_offset`` (DINO's 0.1) resizes by DINO's scale factor,
        ``interpolate_antialias`` (DINOv2's) with the antialiased kernel.
        """
        g = self.config.grid
        if (h, w) == (g, g):
            return self.pos_embed
        work = torch.promote_types(self.pos_embed.dtype, torch.float32)  # float32 at least, float64 stays float64
        cls_pos, grid_pos = self.pos_embed[:, :1], self.pos_embed[:, 1:].reshape(g, g, -1).to(work)
        offset, antialias = self.config.interpolate_offset, self.config.interpolate_antialias
        rows, cols = (bicubic_matrix(g, n, grid_pos.device, offset, work, antialias) for n in (h, w))
        grid_pos = torch.einsum("ia,abd,jb->ijd", rows, grid_pos, cols).to(cls_pos.dtype)
        return torch.cat([cls_pos, grid_pos.reshape(1, h * w, -1)], dim=1)

    def embed(self, x: Tensor) -> Tensor:
        """``f_pre`` of eq. (65): ``[z_cls, W_pre X] + E_pos`` → ``(b, N+1, d)``; with ``registers=R`` the register
        tokens after the class token, unpositioned (DINOv2's ``prepare_tokens_with_masks``) → ``(b, 1+R+N, d)``.

        Input of another floating dtype (float64, float16, bfloat16) is cast to the parameters' dtype;
        under autocast it is left to autocast.  Only metadata is checked here (no NaN check: that
        would be a device sync per forward pass; see :meth:`check_images`).
        """
        x = self.model_images(x)
        p = self.config.patch_size
        tokens = self.patch_embed(self.patchify(x))
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        tokens = tokens + self.interpolate_pos_embed(x.shape[-2] // p, x.shape[-1] // p)
        if self.register_tokens is not None:
            registers = self.register_tokens.expand(x.shape[0], -1, -1)
            tokens = torch.cat([tokens[:, :1], registers, tokens[:, 1:]], dim=1)
        return self.emb_drop(tokens)

    # ---------------------------------------------------------------- forward
    def forward_features(self, x: Tensor) -> Tensor:
        return self.finish_features(self.run_layers(self.embed(x)))

    def forward_trace(self, x: Tensor, return_attention: bool = False) -> Trace:
        return Trace.of(self.layers, self.embed(x), return_attention)

    def pool(self, z: Tensor) -> Tensor:
        return pool_tokens(z, self.config.pool, self.num_prefix_tokens)

    def forward_head(self, z: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool, then the head: LayerNorm (``pre_logits`` stops here) and the Linear to classes."""
        z = self.head[0](self.pool(z))
        return z if pre_logits else self.head[1](z)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    # ---------------------------------------------------------------- utilities
    def size_hint(self, state: Mapping[str, Tensor]) -> str:
        """Read the architecture off a checkpoint's shapes and name the overrides that would fit it."""
        c = self.config
        found: dict[str, int] = {}
        proj = state.get("patch_embed.1.weight" if c.arch == "crate" else "patch_embed.0.weight")
        p = c.patch_size
        if proj is not None and proj.dim() == 2:
            found["dim"] = proj.shape[0]
            side = (proj.shape[1] / c.in_chans) ** 0.5
            if side.is_integer():
                p = found["patch_size"] = int(side)
        if "pos_embed" in state and state["pos_embed"].dim() == 3:
            g = (state["pos_embed"].shape[1] - 1) ** 0.5
            if g.is_integer():
                found["image_size"] = int(g) * p
        if "head.1.weight" in state:
            found["num_classes"] = state["head.1.weight"].shape[0]
        layer_ids = {int(m.group(1)) for k in state if (m := re.match(r"layers\.(\d+)\.", k))}
        if layer_ids:
            found["depth"] = max(layer_ids) + 1
        fixes = [f"{k}={v}" for k, v in found.items() if getattr(c, k) != v]
        if "dim" in found and found["dim"] != c.dim:  # U's (K·p × d) shape does not tell K
            fixes.append("heads=K, the head count it was trained with (no shape stores it)")
        return f"; pass {', '.join(fixes)}" if fixes else "; pass the model name and overrides it was trained with"

    def get_classifier(self) -> nn.Module:
        return self.head[1]

    @property
    def num_classes(self) -> int:
        """The classes of the head (timm's attribute; 0: no classifier)."""
        return int(self.config.num_classes)

    def reset_classifier(self, num_classes: int, pool: str | None = None, global_pool: str | None = None) -> None:
        """A freshly initialised head (LayerNorm + Linear; the Linear alone with ``final_norm="tokens"``, whose
        LayerNorm is the backbone's and is kept) for ``num_classes`` classes — 0: no Linear, the model
        returns the normalised pooled features (timm's headless ``reset_classifier(0)``); ``pool`` (or timm's
        ``global_pool``: ``"token"``, ``"avg"``) changes the pooling."""
        if pool == "" or global_pool == "":
            raise ValueError(
                "global_pool='' is timm's no pooling (a logit per token), and this head reads one pooled vector; pass "
                f"one of {POOLS} (timm's 'token', 'avg'), or leave it out to keep {self.config.pool!r}"
            )
        pool = pool_name(pool or global_pool or self.config.pool)
        self.config = dataclasses.replace(self.config, num_classes=num_classes, pool=pool)
        ref = self.cls_token
        self.head = nn.Sequential(self.head_norm(self.config), classifier_layer(self.config.dim, num_classes)).to(
            ref.device, ref.dtype
        )

    def resize_pos_embed(self, image_size: int) -> None:
        """Permanently re-grid the position embedding for a new training image size (fine-tuning)."""
        if image_size % self.config.patch_size:
            raise ValueError(f"image_size={image_size} is not divisible by patch_size={self.config.patch_size}")
        g = image_size // self.config.patch_size
        with torch.no_grad():
            new = self.interpolate_pos_embed(g, g).detach().clone()
        self.pos_embed = nn.Parameter(new)
        self.config = dataclasses.replace(self.config, image_size=image_size)


class CRATE(ImageClassifier):
    """The CRATE classifier: ``CRATE(ModelConfig(dim=384, ...))`` (or ``CRATE()`` for the defaults).

    Always builds CRATE: a config with another ``arch`` is copied with ``arch="crate"`` (the class
    name decides), so ``model.config.arch`` is always ``"crate"``.
    """

    arch = "crate"


class ViT(ImageClassifier):
    """The ViT baseline (separate Q, K, V; GELU MLP): ``ViT(ModelConfig(dim=192, heads=3, ...))``.

    With ``final_norm="tokens"``, ``norm_eps=1e-6`` and ``interpolate_offset=0.1`` it is DINO's ViT (the
    ``dino_vit*`` / ``simdino_vit*`` names); with ``registers=4``, ``layer_scale_init`` and
    ``interpolate_antialias=True``, ``interpolate_offset=0.0`` besides, DINOv2's (``simdinov2_vit*``,
    ``dinov2_vit*_reg``).  :data:`DINO_VIT_FORMAT` reads the checkpoints of both.

    Always builds a ViT: a config with another ``arch`` (e.g. the default ``"crate"``) is copied with
    ``arch="vit"``, so ``ViT(ModelConfig())`` is a ViT and ``model.config.arch == "vit"``.
    """

    arch = "vit"


_CLASSES = {"crate": CRATE, "vit": ViT}


def build_model(config: ModelConfig) -> ImageClassifier:
    """The classifier ``config.arch`` names (:class:`CRATE` or :class:`ViT`)."""
    return _CLASSES[config.arch](config)


# --------------------------------------------------------------------------- the authors' checkpoint format
def _check_classifier(config: Any) -> None:
    if config.arch != "crate" or (config.attention, config.mlp) != ("mssa", "ista"):
        raise ValueError(
            f"official CRATE checkpoints have MSSA + ISTA layers, not arch={config.arch!r}, "
            f"attention={config.attention!r}, mlp={config.mlp!r}; pass a CRATE classifier name such as crate_small, "
            "without overrides of arch, attention or mlp"
        )


def classifier_to_native(state: Mapping[str, Tensor], config: Any = None) -> dict[str, Tensor]:
    """An official ``model/crate.py`` state dict → this library's keys (:func:`~.official.official_to_native`).

    The emergence demo's ``crate-demo.pth`` (``CRATEFeat(crate_arch="demo")`` in crate.py of
    LeslieTrue/crate-emergence-notebooks, commit d62ec79) stores besides ``mlp_head`` (LN + Linear(768, 768)) a
    ``head`` Linear(768, 21842) that its ``forward`` never calls (it returns ``mlp_head(x)``): that ``head`` is
    dropped, so the file loads as ``crate_base_demo`` whose output is the demo's (768 values)."""
    state = dict(state)
    if "head.weight" in state and "mlp_head.1.weight" in state:  # the demo's unused 21K projection
        state.pop("head.weight")
        state.pop("head.bias", None)
    return official_to_native(state)


CLASSIFIER_FORMAT = OfficialFormat(
    name="CRATE classifier",
    origin="Ma-Lab-Berkeley/CRATE model/crate.py",
    to_native=classifier_to_native,
    detect=lambda state: any(k.startswith("to_patch_embedding.") for k in state),
    example="crate_small",
    check=_check_classifier,
    unstored=HEADS_NOT_STORED,
)


# DINO's ViT (facebookresearch/dino vision_transformer.py; SimDINO's is the same layout) and DINOv2's (SimDINOv2's
# simdinov2/models/vision_transformer.py: registers, LayerScale, chunked blocks): loading/official.py
DINO_VIT_FORMAT = OfficialFormat(
    name="DINO ViT",
    origin="facebookresearch/dino vision_transformer.py, SimDINO's simdino/ and simdinov2/models/vision_transformer.py",
    to_native=dino_vit_to_native,
    detect=dino_vit_detect,
    example="dino_vitb16",
    fields=dino_vit_fields,
    # the resize the layout implies, which a user may know better; a backbone (0 classes) given a fresh head
    overridable=("interpolate_offset", "interpolate_antialias", "num_classes"),
    unstored=HEADS_NOT_STORED,
)


# --------------------------------------------------------------------------- registry entries
register_arch("crate", CRATE, official=CLASSIFIER_FORMAT)
register_arch("vit", ViT, official=DINO_VIT_FORMAT)
# the classifiers' named models and released weights: classifier_zoo.py (models.registry imports it)
