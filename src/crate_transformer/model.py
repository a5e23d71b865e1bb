"""The CRATE image classifier (JMLR §4.1.1, eqs. (65)-(66), Alg. 6, p.113) and a standard ViT
baseline, both configured by one dataclass.

The CRATE classifier matches the official ``model/crate.py`` computation exactly (same patch
flattening order, LayerNorms, class token, head), plus what the official code cannot do:
position-embedding interpolation for other image sizes and a one-pass trace of every layer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data.spec import DataSpec
from .operators import ISTA_MODES, LAYER_FORMS, EncoderLayer

__all__ = ["ModelConfig", "Trace", "ImageClassifier", "CRATE", "ViT", "build_model"]

ARCHS = ("crate", "vit")
POOLS = ("cls", "mean")


@dataclass
class ModelConfig:
    """Every hyperparameter of an image classifier; round-trips through ``config.json``."""

    arch: str = "crate"
    image_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    dim: int = 384
    depth: int = 12
    heads: int = 6
    dim_head: int | None = None  # None → dim // heads (what every paper config uses)
    pool: str = "cls"
    dropout: float = 0.0
    emb_dropout: float = 0.0
    # CRATE operators (ignored by arch="vit")
    eta: float = 0.1  # ISTA step size η
    lambd: float = 0.1  # ISTA sparsity weight λ
    ista_mode: str = "relu"  # relu | soft | mm | none
    layer_form: str = "official"  # official (skip from Z) | jmlr (skip from LN(Z), Alg. 4)
    scale_scores: bool = True  # MSSA scores × p^-1/2 (official) or unscaled (eq. (35))
    tied_output: bool = False  # MSSA output β[U_1..U_K] (eq. (36)) instead of trainable W
    tied_beta: float = 1.0
    eps: float = 0.1  # ε of the MM step (ista_mode="mm")
    # ViT baseline
    mlp_ratio: float = 4.0
    extra: dict = field(default_factory=dict)  # free-form metadata (e.g. dataset normalisation)
    data: DataSpec | None = None  # TEMP shim until the hardening branch lands

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; choose one of {ARCHS}")
        if self.pool not in POOLS:
            raise ValueError(f"unknown pool {self.pool!r}; choose one of {POOLS}")
        if self.ista_mode not in ISTA_MODES:
            raise ValueError(f"unknown ista_mode {self.ista_mode!r}; choose one of {ISTA_MODES}")
        if self.layer_form not in LAYER_FORMS:
            raise ValueError(f"unknown layer_form {self.layer_form!r}; choose one of {LAYER_FORMS}")
        for name in ("image_size", "patch_size", "in_chans", "num_classes", "dim", "depth", "heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.dim_head is None and self.dim % self.heads:
            raise ValueError(
                f"dim={self.dim} is not divisible by heads={self.heads}; "
                f"choose heads dividing dim (e.g. {_divisors_hint(self.dim)}) or set dim_head explicitly"
            )
        if self.arch == "vit" and self.dim % self.heads:
            raise ValueError(
                f"dim={self.dim} is not divisible by heads={self.heads}; the ViT baseline needs dim % heads == 0"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}; "
                f"use an image size that is a multiple of {self.patch_size}"
            )
        if not 0.0 <= self.dropout < 1.0 or not 0.0 <= self.emb_dropout < 1.0:
            raise ValueError("dropout and emb_dropout must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.dim_head if self.dim_head is not None else self.dim // self.heads

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; valid keys: {sorted(known)}")
        d = dict(d)
        if isinstance(d.get("data"), dict):
            d["data"] = DataSpec.from_dict(d["data"])
        return cls(**d)


def _divisors_hint(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0 and k <= 32)


@dataclass
class Trace:
    """Every layer's tokens from one forward pass (JMLR indexing, eq. (20)).

    ``tokens[ℓ]`` is ``Z^{ℓ+1}`` for ℓ = 0..L: ``tokens[0]`` is the embedding ``f_pre(X)`` and
    ``tokens[-1]`` the encoder output.  ``half[ℓ]`` is ``Z^{ℓ+1/2}`` (after MSSA, before ISTA) of layer
    ℓ.  ``attention[ℓ]`` is that layer's ``(b, K, n, n)`` attention (row-softmax), when requested.
    """

    tokens: list[Tensor]
    half: list[Tensor]
    attention: list[Tensor] | None = None


# --------------------------------------------------------------------------- ViT baseline blocks
class _MHSA(nn.Module):
    """Standard multi-head self-attention with separate Q, K, V (the ViT baseline)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        p_drop = self.dropout if self.training else 0.0
        if return_attention:
            attn = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
            out = F.dropout(attn, p_drop, self.training) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)
        out = self.proj(out.transpose(1, 2).reshape(b, n, d))
        return (out, attn) if return_attention else out


class _ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _MHSA(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, return_attention: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        attn = None
        if return_attention:
            m, attn = self.attn(self.norm1(x), return_attention=True)
        else:
            m = self.attn(self.norm1(x))
        half = x + m
        return half + self.mlp(self.norm2(half)), half, attn


# --------------------------------------------------------------------------- classifier
class ImageClassifier(nn.Module):
    """Patch embedding → class token + position embedding → L layers → pool → LayerNorm + Linear.

    ``forward(x)`` takes float images ``(b, c, h, w)`` (any size divisible by the patch size; the
    position embedding is interpolated) and returns logits.  ``forward_features`` returns the
    encoder's tokens, ``forward_head`` maps tokens to logits, ``forward_trace`` returns every
    layer's tokens in one pass.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = c = config
        patch_dim = c.in_chans * c.patch_size**2
        if c.arch == "crate":
            # Official order (p1 p2 c) flatten → LN → Linear → LN (Alg. 6).
            self.patch_embed = nn.Sequential(nn.LayerNorm(patch_dim), nn.Linear(patch_dim, c.dim), nn.LayerNorm(c.dim))
            self.layers = nn.ModuleList(
                EncoderLayer(
                    c.dim,
                    c.heads,
                    c.head_dim,
                    dropout=c.dropout,
                    eta=c.eta,
                    lambd=c.lambd,
                    ista_mode=c.ista_mode,
                    form=c.layer_form,
                    scale_scores=c.scale_scores,
                    tied_output=c.tied_output,
                    tied_beta=c.tied_beta,
                    eps=c.eps,
                )
                for _ in range(c.depth)
            )
            init_std = 1.0  # official: torch.randn
        else:
            self.patch_embed = nn.Sequential(nn.Linear(patch_dim, c.dim))
            self.layers = nn.ModuleList(_ViTBlock(c.dim, c.heads, c.mlp_ratio, c.dropout) for _ in range(c.depth))
            init_std = 0.02  # timm ViT
        self.cls_token = nn.Parameter(torch.randn(1, 1, c.dim) * init_std)
        self.pos_embed = nn.Parameter(torch.randn(1, c.grid**2 + 1, c.dim) * init_std)
        self.emb_drop = nn.Dropout(c.emb_dropout)
        self.head = nn.Sequential(nn.LayerNorm(c.dim), nn.Linear(c.dim, c.num_classes))

    # ---------------------------------------------------------------- input checks
    def check_images(self, x: Tensor) -> None:
        """Raise a ValueError naming the problem (and the fix) for input the model cannot take."""
        c, p = self.config, self.config.patch_size
        if not isinstance(x, Tensor):
            raise ValueError(f"expected a torch.Tensor of images, got {type(x).__name__}")
        if x.dim() != 4:
            hint = "; add a batch dimension with x.unsqueeze(0)" if x.dim() == 3 else ""
            raise ValueError(
                f"expected images of shape (batch, channels, height, width), got shape {tuple(x.shape)}{hint}"
            )
        if not x.is_floating_point():
            raise ValueError(
                f"expected floating-point images, got dtype {x.dtype}; convert with x.float() / 255 and normalise"
            )
        if x.shape[1] != c.in_chans:
            raise ValueError(
                f"model expects {c.in_chans}-channel images (in_chans={c.in_chans}), got {x.shape[1]} channels; "
                "convert the images or create the model with in_chans matching your data"
            )
        h, w = x.shape[-2:]
        if h % p or w % p:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {p}; resize or crop to a multiple of {p} "
                f"(e.g. {max(p, h // p * p)}x{max(p, w // p * p)})"
            )
        if not torch.isfinite(x).all():
            raise ValueError("input images contain NaN or Inf values; clean the data before the forward pass")

    # ---------------------------------------------------------------- embedding
    def patchify(self, x: Tensor) -> Tensor:
        """``(b, c, H, W)`` → ``(b, N, p·p·c)``, per-patch flatten in the official (p1, p2, c) order."""
        b, ch, H, W = x.shape
        p = self.config.patch_size
        x = x.reshape(b, ch, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, (H // p) * (W // p), p * p * ch)

    def interpolate_pos_embed(self, h: int, w: int) -> Tensor:
        """Position embedding for an ``h × w`` patch grid (bicubic interpolation of the learned grid)."""
        g = self.config.grid
        if (h, w) == (g, g):
            return self.pos_embed
        cls_pos, grid_pos = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        grid_pos = grid_pos.reshape(1, g, g, -1).permute(0, 3, 1, 2)
        grid_pos = F.interpolate(grid_pos.float(), size=(h, w), mode="bicubic", align_corners=False).to(cls_pos.dtype)
        return torch.cat([cls_pos, grid_pos.permute(0, 2, 3, 1).reshape(1, h * w, -1)], dim=1)

    def embed(self, x: Tensor) -> Tensor:
        """``f_pre`` of eq. (65): ``[z_cls, W_pre X] + E_pos`` → ``(b, N+1, d)``."""
        self.check_images(x)
        p = self.config.patch_size
        tokens = self.patch_embed(self.patchify(x))
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        return self.emb_drop(tokens + self.interpolate_pos_embed(x.shape[-2] // p, x.shape[-1] // p))

    # ---------------------------------------------------------------- forward
    def forward_features(self, x: Tensor) -> Tensor:
        z = self.embed(x)
        for layer in self.layers:
            z = layer(z)[0]
        return z

    def forward_trace(self, x: Tensor, return_attention: bool = False) -> Trace:
        z = self.embed(x)
        tokens, half, attention = [z], [], [] if return_attention else None
        for layer in self.layers:
            z, zh, attn = layer(z, return_attention=return_attention)
            tokens.append(z)
            half.append(zh)
            if attention is not None:
                attention.append(attn)
        return Trace(tokens, half, attention)

    def pool(self, z: Tensor) -> Tensor:
        # Official mean pooling includes the class token.
        return z.mean(dim=1) if self.config.pool == "mean" else z[:, 0]

    def forward_head(self, z: Tensor) -> Tensor:
        return self.head(self.pool(z))

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    # ---------------------------------------------------------------- utilities
    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def reset_head(self, num_classes: int) -> None:
        """Replace the classifier head with a freshly initialised one for ``num_classes`` classes."""
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        ref = self.head[1].weight
        self.head = nn.Sequential(nn.LayerNorm(self.config.dim), nn.Linear(self.config.dim, num_classes)).to(
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

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` + ``config.json`` to ``directory`` (atomically); see :func:`from_pretrained`."""
        from .checkpoint import save_pretrained

        return save_pretrained(self, directory)


class CRATE(ImageClassifier):
    """The CRATE classifier; ``CRATE(ModelConfig(arch="crate", ...))``."""


class ViT(ImageClassifier):
    """The ViT baseline (separate Q, K, V; GELU MLP); ``ViT(ModelConfig(arch="vit", ...))``."""


def build_model(config: ModelConfig) -> ImageClassifier:
    return (CRATE if config.arch == "crate" else ViT)(config)
