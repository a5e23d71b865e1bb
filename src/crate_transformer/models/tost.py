"""ToST, the Token Statistics Transformer (Wu et al., "Token Statistics Transformer: Linear-Time Attention via
Variational Rate Reduction", ICLR 2025; code RobinWu218/ToST): the image classifiers and the language model, and
the authors' checkpoint formats.

ToST is a white-box transformer whose attention, TSSA (:class:`~crate_transformer.layers.TSSA`), is a
gradient step on a variational form of CRATE's compression term
(:func:`~crate_transformer.objectives.variational_coding_rate`): it reads per-head second moments of the
tokens, weighted by each token's soft membership Π in the heads, instead of pairwise similarities, so its time
and memory grow linearly with the number of tokens.  Its layers keep a transformer's shape: pre-norm TSSA and a
GELU MLP, each residual and scaled by a learned per-channel factor (LayerScale, ``gamma1`` / ``gamma2``).

* :class:`ToST` — ``tost_vision/tost.py``'s ``VisionTransformer`` with ``AttentionTSSA`` (the ``tost_cab_*``
  models): a convolutional patch embedding (stride-2 3×3 convolutions with batch norm and GELU, one per halving
  of the patch size), a Fourier position encoding (computed for any grid, so any image size divisible by the
  patch size works), ``depth`` TSSA blocks on the patch tokens, then a class token and CaiT's class-attention
  blocks (only the class token queries), a final LayerNorm and a linear head on the class token.
  ``forward_features`` returns the class-attention output after that norm, class token first; ``forward_trace``
  the TSSA blocks' tokens, which hold no class token (:attr:`Model.trace_prefix_tokens` is 0).
* :class:`ToSTLanguageModel` — ``tost_lang/model_TSSA.py`` (nanoGPT with ``CausalSelfAttention_TSSA``): the
  language-model family of :mod:`crate_transformer.models.lm` with causal TSSA blocks; generation caches three running
  sums per layer, a constant size whatever the length of the text.
* :data:`TOST_FORMAT` reads the container ``tost_vision/main.py`` writes (``{'model': state_dict, 'args':
  Namespace, ...}``, the Namespace allow-listed by :func:`~crate_transformer.io.load_pickle`) or a bare state
  dict; :data:`TOST_LM_FORMAT` ``tost_lang/train.py``'s ``ckpt.pt`` (``{'model', 'model_args', ...}``).  Sizes
  are read off the tensors.

Where this differs from the authors' code, without changing what a forward pass computes: the patch embedding
takes ``in_chans`` channels and any power-of-two patch size (theirs: 3 channels, patches of 8 or 16); batch
norm is ``BatchNorm2d`` (theirs ``SyncBatchNorm``: the same parameters and, on one process, the same function);
the MLPs drop once, after the GELU (timm's ``Mlp`` also drops after ``fc2``, nanoGPT's only after ``c_proj``;
every model here has dropout 0 by default); in training the classifier returns its logits once (theirs
``(x, x)``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config_utils import Range, option, override
from ..layers import DIM_HEAD, MLP, TSSA, EncoderLayer, LayerConfig
from ..loading.official import OfficialFormat, index_count, rename, unwrap
from ._registry import register_arch, register_model
from .base import Model, Trace
from .classifier import NUM_CLASSES, ModelConfig, classifier_layer
from .contract import IMAGE_CLASSIFIER, FamilyConfig
from .image_input import ImageEncoderGeometry, ImageInput
from .lm import GPT2_KEY_MAP, LanguageModel, LMConfig, lm_checkpoint_fields, lm_state
from .spec import DataSpec

__all__ = [
    "TOST_ARCH",
    "TOST_LM_ARCH",
    "ToSTConfig",
    "ToSTLMConfig",
    "ToSTBlock",
    "ClassAttention",
    "ClassAttentionBlock",
    "FourierPositions",
    "ConvPatchEmbed",
    "ToST",
    "ToSTLanguageModel",
    "TOST_KEY_MAP",
    "TOST_LM_KEY_MAP",
    "TOST_FORMAT",
    "TOST_LM_FORMAT",
]

TOST_ARCH = "tost"
TOST_LM_ARCH = "tost_lm"


# --------------------------------------------------------------------------- configs
@dataclass
class ToSTConfig(ImageEncoderGeometry, FamilyConfig):
    """A ToST image classifier (``tost_vision/tost.py``); defaults: ToST-S12/16 (``tost_cab_small_12_p16``).

    ``layer_scale`` is the initial value of the blocks' per-channel scales (the authors' ``eta``: 1 for the
    12-layer models, 1e-5 for the 24-layer ones); ``cls_layers`` the class-attention blocks; ``drop_path`` the
    stochastic-depth rate of every TSSA block (the authors use one rate for all of them); ``tokens_norm``: the
    class-attention blocks normalise every token, not only the class token, before their MLP (the authors' models:
    yes).  ``patch_size`` is a power of two (one stride-2 convolution per halving).
    """

    APPLIES = "observed"  # where each field applies: the build records what it reads (models._registry.build)

    arch: str = option(TOST_ARCH, "the family: tost", choices=(TOST_ARCH,))
    image_size: int = override(ModelConfig, "image_size", 224, applies="always")  # the input pipeline reads it
    patch_size: int = option(16, "side of a patch in pixels: a power of two >= 2 (one stride-2 conv per halving)")
    in_chans: int = override(ModelConfig, "in_chans", 3)
    num_classes: int = override(ModelConfig, "num_classes", 1000)
    dim: int = override(ModelConfig, "dim", 384)
    depth: int = option(12, "TSSA layers L")
    heads: int = override(ModelConfig, "heads", 8)
    dim_head: int | None = override(ModelConfig, "dim_head", None)
    cls_layers: int = option(2, "class-attention blocks after the TSSA layers")
    mlp_ratio: float = option(4.0, "hidden width of the GELU MLPs, × dim", range=Range(0, lo_open=True))
    layer_scale: float = option(
        1.0, "initial per-channel scale of the blocks (the authors' eta: 1 at 12 layers, 1e-5 at 24)",
        range=Range(0, lo_open=True),
    )  # fmt: skip
    qkv_bias: bool = option(True, "biases on the query / key / value projections")
    dropout: float = option(0.0, "dropout of the blocks' outputs", range=Range(0, 1, hi_open=True))
    attn_dropout: float = option(0.0, "dropout of the class-attention weights", range=Range(0, 1, hi_open=True))
    drop_path: float = option(
        0.0, "stochastic depth of every TSSA block (the authors use one rate for all)", range=Range(0, 1, hi_open=True)
    )
    use_pos: bool = option(True, "add the Fourier position encoding to the patch tokens", applies="always")
    tokens_norm: bool = option(True, "class-attention blocks normalise every token before their MLP (the authors')")
    data: DataSpec | None = override(ModelConfig, "data", None)

    kind = IMAGE_CLASSIFIER
    MODEL_TYPE = (
        "crate_transformer_image"  # config.json's model_type: transformers' AutoConfig (loading.transformers_hf)
    )
    BLOCK_COUNTS = {"depth": "layers", "cls_layers": "cls_layers"}  # the numbered blocks these fields count
    pipeline_tag = "image-classification"
    white_box = True  # TSSA descends the variational compression term; the analysis measures it
    sparse_output = False  # the layers end with a GELU MLP: no exact zeros
    layer_blocks = ("tssa", "mlp")

    def validate(self) -> None:
        self.check_geometry(positive=("cls_layers",))
        NUM_CLASSES.check("num_classes", self.num_classes)
        self.check_data()
        p = self.patch_size
        if p < 2 or p & (p - 1):
            raise ValueError(f"patch_size must be a power of two >= 2 (one stride-2 convolution per halving), got {p}")
        stages = p.bit_length() - 1
        if self.dim % 2 ** (stages - 1) or self.dim % self.heads:
            raise ValueError(
                f"dim={self.dim} must be divisible by heads={self.heads} (class attention) and by "
                f"{2 ** (stages - 1)} (the patch embedding's widths for patch_size={p}); e.g. dim=384"
            )
        if int(self.dim * self.mlp_ratio) < 1:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} gives an empty MLP for dim={self.dim}; e.g. mlp_ratio=4.0")


@dataclass
class ToSTLMConfig(LMConfig):
    """A ToST language model (``tost_lang/model_TSSA.py``): :class:`~crate_transformer.models.lm.LMConfig`'s sizes, a
    causal GPT with a learned position table and a final LayerNorm; ``bias`` puts biases in every Linear and
    LayerNorm (nanoGPT's ``bias``; ``tost_lang/train.py`` defaults to none); ``layer_scale`` initialises the
    blocks' per-channel scales (the authors' 1e-5).  The CRATE fields of ``LMConfig`` (``eta``, ``mlp``, ...) are
    not used."""

    arch: str = override(LMConfig, "arch", TOST_LM_ARCH, help="the family: tost_lm", choices=(TOST_LM_ARCH,))
    final_norm: bool = override(LMConfig, "final_norm", True)
    bias: bool = option(True, "biases in every Linear and LayerNorm (nanoGPT's bias)")
    layer_scale: float = option(
        1e-5, "initial per-channel scale of the blocks (the authors' 1e-5)", range=Range(0, lo_open=True)
    )

    @property
    def sparse_output(self) -> bool:
        return False

    @property
    def layer_blocks(self) -> tuple[str, str]:
        return ("tssa", "mlp")

    def validate(self) -> None:
        self.check_positive("vocab_size", "block_size", "dim", "depth", "heads")
        wrong = [f"{k}={getattr(self, k)!r}" for k, v in _LM_FIXED.items() if getattr(self, k) != v]
        if wrong:
            raise ValueError(
                f"a ToST language model is a causal GPT with learned positions and a final LayerNorm, not "
                f"{', '.join(wrong)}; drop those overrides"
            )
        if self.dim_head is not None:
            DIM_HEAD.check("dim_head", self.dim_head)
        if self.dim_head is None and self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}; set dim_head or change heads")
        if int(self.dim * self.mlp_ratio) < 1:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} gives an empty MLP for dim={self.dim}; e.g. mlp_ratio=4.0")


_LM_FIXED = {"causal": True, "pos_embed": "learned", "final_norm": True, "num_labels": 0, "gelu": "exact"}


# --------------------------------------------------------------------------- layers
class ToSTBlock(EncoderLayer):
    """One ToST layer (``Block`` of ``tost_vision/tost.py`` and of ``tost_lang/model_TSSA.py``): the CRATE layer
    :class:`~crate_transformer.layers.EncoderLayer` with ``attention="tssa"``, ``mlp="mlp"`` and layer scale::

        Z_half = Z + γ1 ⊙ TSSA(LN1(Z));   Z_next = Z_half + γ2 ⊙ MLP(LN2(Z_half))

    ``γ1, γ2`` are learned per-channel scales initialised to ``layer_scale``; ``drop_path`` drops both residual
    branches per sample in training.  What a :class:`~crate_transformer.layers.LayerConfig` does not hold is given
    built: the TSSA with its qkv bias, attention dropout and causal context, the MLP and LayerNorms with or without
    biases (``bias``, nanoGPT's), the norms' ``ln_eps``.  Its keys are the released ones (``gamma1``, ``norm1``,
    ``attn``, ``norm2``, ``mlp``); its features are the MLP's GELU units (``code_site``).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        *,
        mlp_ratio: float = 4.0,
        layer_scale: float = 1.0,
        qkv_bias: bool = True,
        bias: bool = True,
        ln_eps: float = 1e-6,
        causal: bool = False,
        block_size: int | None = None,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
    ) -> None:
        attn = TSSA(
            dim, heads, dim_head, dropout, attn_dropout=attn_dropout, qkv_bias=qkv_bias, proj_bias=bias,
            causal=causal, block_size=block_size,
        )  # fmt: skip
        settings = LayerConfig(attention="tssa", mlp="mlp", dropout=dropout, mlp_ratio=mlp_ratio)
        super().__init__(
            dim, heads, dim_head, settings, causal=causal, drop_path=drop_path, norm_eps=ln_eps, norm_bias=bias,
            layer_scale=layer_scale, attn=attn, block=MLP(dim, mlp_ratio, dropout, bias=bias),
        )  # fmt: skip


class ClassAttention(nn.Module):
    """CaiT's class attention (Touvron et al. 2021), ``ClassAttention`` of ``tost_vision/tost.py``: only the
    class token (token 0) queries, ``softmax(q_cls kᵀ / √p) v``, projected; the other tokens pass unchanged."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool = True, dropout: float = 0.0, attn_dropout: float = 0.0):
        super().__init__()
        self.heads, self.dropout, self.attn_dropout = heads, dropout, attn_dropout
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q[:, :, :1] * k).sum(-1) * self.scale  # (b, K, n): the class token's query against every key
        attn = F.dropout(scores.softmax(-1), self.attn_dropout, self.training)
        cls = self.proj((attn.unsqueeze(2) @ v).transpose(1, 2).reshape(b, 1, d))
        return torch.cat([F.dropout(cls, self.dropout, self.training), x[:, 1:]], dim=1)


class ClassAttentionBlock(nn.Module):
    """CaiT's class-attention block as ``tost_vision/tost.py`` has it: ``Z + γ1 ⊙ CA(LN1(Z))``, then LN2 (of
    every token with ``tokens_norm``, else of the class token) and ``+ γ2 ⊙ MLP`` of the class token only.  With
    ``tokens_norm`` the other tokens come out as ``2·LN2(·)`` (the residual adds the normalised tokens to
    themselves): the authors' code, kept; only the class token is read after these blocks."""

    def __init__(self, dim: int, heads: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = True, layer_scale: float = 1.0,
                 tokens_norm: bool = True, dropout: float = 0.0, attn_dropout: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        self.tokens_norm = tokens_norm
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ClassAttention(dim, heads, qkv_bias, dropout, attn_dropout)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLP(dim, mlp_ratio, dropout)
        self.gamma1 = nn.Parameter(torch.full((dim,), float(layer_scale)))
        self.gamma2 = nn.Parameter(torch.full((dim,), float(layer_scale)))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.gamma1 * self.attn(self.norm1(x))
        if self.tokens_norm:
            x = self.norm2(x)
        else:
            x = torch.cat([self.norm2(x[:, :1]), x[:, 1:]], dim=1)
        cls = self.gamma2 * self.mlp(x[:, :1])
        return x + torch.cat([cls, x[:, 1:]], dim=1)


# --------------------------------------------------------------------------- embedding
class FourierPositions(nn.Module):
    """DETR's sine position encoding of a patch grid, projected to ``dim`` by a 1×1 convolution
    (``PositionalEncodingFourier`` of ``tost_vision/tost.py``): ``hidden`` frequencies per axis, coordinates
    scaled to ``(0, 2π]``.  Computed for the grid at hand, so it fits any image size."""

    def __init__(self, dim: int, hidden: int = 32, temperature: float = 10000.0) -> None:
        super().__init__()
        self.hidden, self.temperature = hidden, temperature
        self.token_projection = nn.Conv2d(2 * hidden, dim, kernel_size=1)

    def forward(self, h: int, w: int) -> Tensor:
        """``(1, h·w, dim)`` for an ``h × w`` grid (row-major, as the patch tokens)."""
        weight = self.token_projection.weight
        dtype, device = weight.dtype, weight.device
        scale, eps = 2 * math.pi, 1e-6
        ys = torch.arange(1, h + 1, dtype=dtype, device=device) / (h + eps) * scale
        xs = torch.arange(1, w + 1, dtype=dtype, device=device) / (w + eps) * scale
        freq = self.temperature ** (2 * (torch.arange(self.hidden, dtype=dtype, device=device) // 2) / self.hidden)

        def embed(t: Tensor) -> Tensor:  # (m,) → (m, hidden): sin of the even, cos of the odd frequencies
            t = t[:, None] / freq
            return torch.stack((t[:, 0::2].sin(), t[:, 1::2].cos()), dim=2).flatten(1)

        pos_y, pos_x = embed(ys)[:, None].expand(h, w, -1), embed(xs)[None].expand(h, w, -1)
        grid = torch.cat((pos_y, pos_x), dim=-1).permute(2, 0, 1).unsqueeze(0)  # (1, 2·hidden, h, w)
        return self.token_projection(grid).flatten(2).transpose(1, 2)


class ConvPatchEmbed(nn.Sequential):
    """``ConvPatchEmbed`` of ``tost_vision/tost.py``: ``log2(patch_size)`` stride-2 3×3 convolutions (no bias),
    each followed by batch norm, GELU between them; widths ``dim / 2^(s−1), …, dim / 2, dim``.  The authors' keys
    (``proj.{2j}.0`` the convolution, ``proj.{2j}.1`` the norm) are this ``Sequential``'s."""

    def __init__(self, in_chans: int, dim: int, patch_size: int) -> None:
        stages = patch_size.bit_length() - 1
        widths = [in_chans] + [dim // 2 ** (stages - 1 - s) for s in range(stages)]
        parts: list[nn.Module] = []
        for s in range(stages):
            if s:
                parts.append(nn.GELU())
            conv = nn.Conv2d(widths[s], widths[s + 1], kernel_size=3, stride=2, padding=1, bias=False)
            parts.append(nn.Sequential(conv, nn.BatchNorm2d(widths[s + 1])))
        super().__init__(*parts)


# --------------------------------------------------------------------------- the classifier
class ToST(ImageInput, Model):
    """The ToST image classifier (module docstring): ``ToST(ToSTConfig(...))`` or ``ct.create_model("tost_*")``."""

    config_class = ToSTConfig
    arch = TOST_ARCH
    no_decay_names = ("cls_token",)
    num_prefix_tokens = 1  # forward_features: the class token, then the patches
    trace_prefix_tokens = 0  # the TSSA blocks see the patches only

    def __init__(self, config: ToSTConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.patch_embed = ConvPatchEmbed(c.in_chans, c.dim, c.patch_size)
        self.pos_embed = FourierPositions(c.dim)
        self.pos_drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            ToSTBlock(
                c.dim, c.heads, c.head_dim, mlp_ratio=c.mlp_ratio, layer_scale=c.layer_scale, qkv_bias=c.qkv_bias,
                dropout=c.dropout, attn_dropout=c.attn_dropout, drop_path=c.drop_path,
            )
            for _ in range(c.depth)
        )  # fmt: skip
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.cls_layers = nn.ModuleList(
            ClassAttentionBlock(
                c.dim, c.heads, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias, layer_scale=c.layer_scale,
                tokens_norm=c.tokens_norm, dropout=c.dropout, attn_dropout=c.attn_dropout,
            )
            for _ in range(c.cls_layers)
        )  # fmt: skip
        self.norm = nn.LayerNorm(c.dim, eps=1e-6)
        self.head = classifier_layer(c.dim, c.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """The authors' initialisation: Linear weights truncated normal (std 0.02), biases 0, the class token
        likewise; LayerNorms 1 and 0; convolutions and batch norms PyTorch's defaults."""
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def embed(self, x: Tensor) -> Tensor:
        """The patch tokens ``(b, N, d)``: convolutional embedding plus the Fourier position encoding.  Input of
        another floating dtype is cast to the parameters' (under autocast it is left to autocast)."""
        z = self.patch_embed(self.model_images(x))
        h, w = z.shape[-2:]
        z = z.flatten(2).transpose(1, 2)
        if self.config.use_pos:
            z = z + self.pos_embed(h, w)
        return self.pos_drop(z)

    def forward_features(self, x: Tensor) -> Tensor:
        """The class token and the patches after the class-attention blocks and the final norm ``(b, 1 + N, d)``."""
        return self.finish_features(self.run_layers(self.embed(x)))

    def finish_features(self, z: Tensor) -> Tensor:
        """The TSSA blocks' patches → the class token prepended, the class-attention blocks, the final norm."""
        z = torch.cat([self.cls_token.expand(z.shape[0], -1, -1), z], dim=1)
        for block in self.cls_layers:
            z = block(z)
        return self.norm(z)

    def norm_tokens(self, z: Tensor) -> Tensor:
        return self.norm(z)

    def forward_trace(self, x: Tensor, return_attention: bool = False) -> Trace:
        """The TSSA blocks' tokens (patches only) in one pass; ``attention``: each block's membership weights."""
        return Trace.of(self.layers, self.embed(x), return_attention)

    def forward_head(self, z: Tensor, pre_logits: bool = False) -> Tensor:
        """The class token (already normalised), then the linear head."""
        return z[:, 0] if pre_logits else self.head(z[:, 0])

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head

    @property
    def num_classes(self) -> int:
        """The classes of the head (timm's attribute; 0: no classifier)."""
        return int(self.config.num_classes)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh head (truncated normal, std 0.02) for ``num_classes`` classes (0: none, the class token's
        features); the features are the class token's after the class-attention blocks, so ``global_pool`` can
        only be ``"token"`` (timm's name for it)."""
        self.refuse_pool(global_pool, "token")
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        ref = self.norm.weight
        self.head = classifier_layer(self.config.dim, num_classes).to(ref.device, ref.dtype)
        if num_classes > 0:
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def size_hint(self, state: Mapping[str, Tensor]) -> str:
        """The sizes of a checkpoint of other sizes, read off its shapes (``"; pass dim=384, depth=12"``)."""
        c, found = self.config, {}
        if "cls_token" in state:
            found["dim"] = state["cls_token"].shape[-1]
        try:
            found["depth"] = index_count(state, r"layers\.(\d+)\.")
            found["cls_layers"] = index_count(state, r"cls_layers\.(\d+)\.")
        except ValueError:  # numbered with gaps: the hint leaves the depth out
            pass
        if "layers.0.attn.temp" in state:
            found["heads"] = state["layers.0.attn.temp"].shape[0]
        if "head.weight" in state:
            found["num_classes"] = state["head.weight"].shape[0]
        fixes = [f"{k}={v}" for k, v in found.items() if v and getattr(c, k) != v]
        return f"; pass {', '.join(fixes)}" if fixes else ""

    def resize_pos_embed(self, image_size: int) -> None:
        """Train at another image size: the Fourier encoding fits any grid, so only the config changes."""
        if image_size % self.config.patch_size:
            raise ValueError(f"image_size={image_size} is not divisible by patch_size={self.config.patch_size}")
        self.config = dataclasses.replace(self.config, image_size=image_size)


# --------------------------------------------------------------------------- the language model
class ToSTLanguageModel(LanguageModel):
    """The ToST language model (``tost_lang/model_TSSA.py``): :class:`~crate_transformer.models.lm.LanguageModel`'s
    embedding, tied head, generation and files around causal :class:`ToSTBlock` layers."""

    config_class = ToSTLMConfig
    arch = TOST_LM_ARCH

    def __init__(self, config: ToSTLMConfig | None = None) -> None:
        super().__init__(config if config is not None else ToSTLMConfig())
        if not self.config.bias:
            self.norm = nn.LayerNorm(self.config.dim, bias=False)

    def build_layers(self, c: ToSTLMConfig) -> nn.ModuleList:
        return nn.ModuleList(
            ToSTBlock(
                c.dim, c.heads, c.head_dim, mlp_ratio=c.mlp_ratio, layer_scale=c.layer_scale, qkv_bias=c.bias,
                bias=c.bias, ln_eps=1e-5, causal=True, block_size=c.block_size, dropout=c.dropout,
            )
            for _ in range(c.depth)
        )  # fmt: skip

    def no_weight_decay(self) -> set[str]:
        """Every vector, and the heads' temperatures and position offsets (``tost_lang/model_TSSA.py``'s
        ``configure_optimizers`` exempts ``temp`` and ``denom_bias``)."""
        return super().no_weight_decay() | {
            n for n, _ in self.named_parameters() if n.endswith((".temp", ".denom_bias"))
        }


# --------------------------------------------------------------------------- the authors' checkpoints
# (official key prefix, native key prefix); "{i}" a block index.  tost_vision/tost.py:
TOST_KEY_MAP = [
    ("patch_embed.proj.", "patch_embed."),
    ("blocks.{i}.attn.to_out.0.", "layers.{i}.attn.proj."),
    ("blocks.{i}.mlp.fc1.", "layers.{i}.mlp.0."),
    ("blocks.{i}.mlp.fc2.", "layers.{i}.mlp.3."),
    ("blocks.{i}.", "layers.{i}."),
    ("cls_attn_blocks.{i}.mlp.fc1.", "cls_layers.{i}.mlp.0."),
    ("cls_attn_blocks.{i}.mlp.fc2.", "cls_layers.{i}.mlp.3."),
    ("cls_attn_blocks.{i}.", "cls_layers.{i}."),
    ("pos_embeder.", "pos_embed."),
]
# tost_lang/model_TSSA.py, after lm_state strips the "transformer." / "module." / "_orig_mod." prefixes: nanoGPT's
# names, then TSSA's and the block's own tensors under the layer's
TOST_LM_KEY_MAP = GPT2_KEY_MAP + [("h.{i}.", "layers.{i}.")]  # attn.temp, attn.denom_bias, gamma1, gamma2


def _tost_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k.removeprefix("module."): v for k, v in state.items()}


def tost_fields(raw: object) -> dict[str, Any]:
    """The :class:`ToSTConfig` values a ``tost_vision`` file fixes (``OfficialFormat.fields``): the sizes from the
    tensors, and the image size from ``args.input_size`` of the container ``main.py`` writes."""
    state = _tost_state(unwrap(raw))
    if "cls_token" not in state or "blocks.0.attn.temp" not in state:
        raise ValueError("not a ToST classifier: no cls_token / blocks.0.attn.temp")
    dim = state["cls_token"].shape[-1]
    convs = index_count(state, r"patch_embed\.proj\.(\d+)\.0\.weight", step=2)
    found: dict[str, Any] = {
        "dim": dim,
        "depth": index_count(state, r"blocks\.(\d+)\."),
        "cls_layers": index_count(state, r"cls_attn_blocks\.(\d+)\."),
        "heads": state["blocks.0.attn.temp"].shape[0],
        "patch_size": 2 ** ((convs + 1) // 2),  # convolutions at indices 0, 2, 4, ... with GELUs between
        "in_chans": state["patch_embed.proj.0.0.weight"].shape[1],
        "mlp_ratio": state["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        "qkv_bias": "blocks.0.attn.qkv.bias" in state,
        "dim_head": state["blocks.0.attn.qkv.weight"].shape[0] // state["blocks.0.attn.temp"].shape[0],
    }
    if found["dim_head"] * found["heads"] == dim:
        found["dim_head"] = None
    if "head.weight" in state:
        found["num_classes"] = state["head.weight"].shape[0]
    args = raw.get("args") if isinstance(raw, Mapping) else None
    if getattr(args, "input_size", None) is not None:  # as stored: the loader types and bounds it (file_fields)
        found["image_size"] = args.input_size
    return found


def tost_lm_fields(raw: object) -> dict[str, Any]:
    """The :class:`ToSTLMConfig` values a ``tost_lang`` ``ckpt.pt`` fixes: nanoGPT's (:func:`~.lm.lm_checkpoint_fields`:
    vocabulary, context, depth, heads from ``model_args``) and, from the tensors, the heads (``temp``) and biases."""
    state = lm_state(unwrap(raw))
    found = {
        k: v for k, v in lm_checkpoint_fields(raw).items() if k in ("vocab_size", "dim", "block_size", "depth", "heads")
    }
    temp = state.get("h.0.attn.temp")
    if temp is None:
        raise ValueError("not a ToST language model: no h.0.attn.temp")
    if found.get("heads", temp.shape[0]) != temp.shape[0]:
        raise ValueError(
            f"the checkpoint's model_args say n_head={found['heads']} but its tensors have {temp.shape[0]} heads; "
            "the file is inconsistent"
        )
    found.update(heads=temp.shape[0], dim=state["wte.weight"].shape[-1], bias="h.0.ln_1.bias" in state)
    return found


TOST_FORMAT = OfficialFormat(
    name="ToST classifier",
    origin="RobinWu218/ToST tost_vision/tost.py (main.py's checkpoint.pth / best_model.pth)",
    to_native=lambda state, config: rename(_tost_state(state), TOST_KEY_MAP, forward=True),
    detect=lambda state: any(k.endswith("attn.temp") for k in state) and any("cls_attn_blocks." in k for k in state),
    example="tost_cab_small_12_p16",
    fields=tost_fields,
    overridable=("image_size",),
    file_names={"image_size": "args.input_size"},
)
TOST_LM_FORMAT = OfficialFormat(
    name="ToST language model",
    origin="RobinWu218/ToST tost_lang/model_TSSA.py (train.py's ckpt.pt)",
    to_native=lambda state, config: rename(lm_state(state), TOST_LM_KEY_MAP, forward=True),
    detect=lambda state: any(k.endswith("attn.denom_bias") for k in state),
    example="tost_gpt_base",
    fields=tost_lm_fields,
    file_names={"heads": "model_args.n_head"},
)


# --------------------------------------------------------------------------- registry entries
register_arch(TOST_ARCH, ToST, official=TOST_FORMAT)
register_arch(TOST_LM_ARCH, ToSTLanguageModel, official=TOST_LM_FORMAT)
# tost_vision/tost.py's tost_cab_* factories (image 224, 1000 classes, MLP ratio 4, qkv bias, two class-attention
# blocks, class attention over every token's norm): (dim, depth, heads, layer scale).  Parameter counts: docs/tost.md.
_VISION = {
    "tiny_12": (192, 12, 4, 1.0),
    "small_12": (384, 12, 8, 1.0),
    "tiny_24": (192, 24, 4, 1e-5),
    "small_24": (384, 24, 8, 1e-5),
    "medium_24": (512, 24, 8, 1e-5),
    "large_24": (768, 24, 16, 1e-5),
}
for _size, (_dim, _depth, _heads, _scale) in _VISION.items():
    for _patch in (16, 8):
        register_model(
            f"tost_cab_{_size}_p{_patch}", arch=TOST_ARCH, patch_size=_patch, dim=_dim, depth=_depth, heads=_heads,
            layer_scale=_scale,
        )  # fmt: skip
# The bundled digits at crate_mnist_p4's geometry (24 px, a 6x6 grid of 4-pixel patches): d = 64, 3 TSSA blocks of
# 4 heads, 2 class-attention blocks.
register_model(
    "tost_mnist", arch=TOST_ARCH, image_size=24, patch_size=4, in_chans=1, num_classes=10, dim=64, depth=3, heads=4
)
# tost_lang/config/train_tost_{base,medium,large}_ls.py on train.py's defaults (GPT-2 vocabulary padded to 50,304,
# context 1,024, no biases); the authors' README gives 110M / 304M / 655M parameters.  tost_gpt_mini: the lm
# task's laptop size (crate_gpt_mini's: byte tokenizer, context 128, d = 128, 4 layers, 4 heads).
_LANG = dict(arch=TOST_LM_ARCH, vocab_size=50304, block_size=1024, bias=False)
register_model("tost_gpt_base", **_LANG, dim=768, depth=12, heads=12)
register_model("tost_gpt_medium", **_LANG, dim=1024, depth=24, heads=16)
register_model("tost_gpt_large", **_LANG, dim=1280, depth=36, heads=20)
register_model(
    "tost_gpt_mini", arch=TOST_LM_ARCH, vocab_size=262, block_size=128, dim=128, depth=4, heads=4, bias=False
)
