"""CRATE-MAE: the white-box masked autoencoder (JMLR §3.6 and §4.2, eqs. (69)-(71), pp.38-40; Table 9, p.96).

The encoder is CRATE layers (eq. (45), p.25), the decoder is CRATE *decoder* layers (structured
diffusion, eqs. (62)-(64), p.34; :class:`~crate_transformer.layers.DecoderLayer`) with the same
``L, d, K``.  The computation matches the official ``model/crate_ae/crate_ae.py`` (Ma-Lab-Berkeley/CRATE):

1. patches → linear projection (the official ``PatchEmbed`` conv, here a Linear on the patches in
   the (p1, p2, c) order of :func:`~crate_transformer.models.image_input.patchify`);
2. per-sample random masking (``mask_ratio`` = 0.75 by default: argsort of uniform noise, the
   first ``int(N·(1 − r))`` positions kept) — masked patch tokens are **replaced by a learned mask
   token before the encoder**, so the encoder sees all ``N + 1`` tokens (official; unlike He et al.);
3. class token prepended, fixed 2-D sin-cos position embedding added;
4. ``L`` CRATE encoder layers (λ = 0.5, η = 0.1 as in ``crate_encoder.py``) → LayerNorm (eps 1e-6);
5. ``L`` decoder layers → LayerNorm (eps 1e-6) → Linear to pixels (``W_post`` of eq. (70)); class token dropped;
6. loss: per-patch mean squared error averaged over the **masked patches only** (eq. (71) restricted
   to Ω), against the raw patches or, with ``norm_pix_loss``, per-patch standardised ones.

``visible_only=True`` is an efficiency option that is **not the paper's**; it follows He et al.'s MAE
(``models_mae.py``): the encoder sees only the class token and the visible patches (position added
before it), then the mask tokens fill the masked positions and the position table is added to **every**
token before the decoder (MAE's ``x + decoder_pos_embed``, so visible tokens carry their position twice).
CRATE-MAE's decoder works at the encoder's width, so MAE's ``decoder_embed`` has no counterpart here.

What the official module has and this one does not: ``decoder_embed`` (a ``Linear(d, d)`` defined but
never used in the official forward) and a second, identical copy of the position table
(``pos_embed``; the official forward adds ``decoder_pos_embed``).  They are counted in the official
parameter totals (Table 9): :meth:`CRATEMAE.num_params` with ``layout="official"`` adds them back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..config_utils import Range, option, override
from ..layers import LAYER_FORMS, DecoderLayer, EncoderLayer, LayerConfig, drop_path_rates
from ..loading.official import HEADS_NOT_STORED, OfficialFormat, mae_official_to_native
from ._registry import PretrainedSource, register_arch, register_model, register_pretrained
from .base import Model, Trace
from .classifier import ImageClassifier, ModelConfig, build_model
from .contract import MASKED_AUTOENCODER, FamilyConfig
from .image_input import ImageEncoderGeometry, ImageInput, patchify, unpatchify
from .spec import IMAGENET_MEAN, IMAGENET_STD, DataSpec

__all__ = [
    "MAE_ARCH",
    "MAEConfig",
    "MAEOutput",
    "CRATEMAE",
    "sincos_pos_embed",
    "random_masking",
    "mae_to_classifier",
    "MAE_FORMAT",
]

MAE_ARCH = "crate_mae"
MASK_RATIO = Range(0, 1, lo_open=True, hi_open=True)  # the share of patches masked


@dataclass
class MAEConfig(ImageEncoderGeometry, LayerConfig, FamilyConfig):
    """Every hyperparameter of a CRATE-MAE; round-trips through ``config.json`` (``arch == "crate_mae"``).

    Values are coerced to the declared types (:func:`~crate_transformer.config_utils.coerce_fields`)
    and validated with one-line errors, as :class:`~crate_transformer.models.classifier.ModelConfig`.
    """

    arch: str = option(MAE_ARCH, "the family: crate_mae (checked by validate, which names the classifier's config)")
    image_size: int = override(ModelConfig, "image_size", 224)
    patch_size: int = override(ModelConfig, "patch_size", 16)
    in_chans: int = override(ModelConfig, "in_chans", 3)
    dim: int = override(ModelConfig, "dim", 768)
    depth: int = option(12, "layers L of the encoder and of the decoder (symmetric, Table 9)")
    heads: int = option(12, "attention heads K of the encoder and of the decoder")
    dim_head: int | None = override(ModelConfig, "dim_head", None)
    mask_ratio: float = option(
        0.75, "share of patches masked (Fig. 11); |Ω| = N − int(N (1 − r))", range=MASK_RATIO, applies="always"
    )
    norm_pix_loss: bool = option(
        False, "the loss on per-patch normalised pixels (official default: raw pixels)", applies="always"
    )
    # the encoder layers' settings are LayerConfig's (eta, layer_form, ...); λ = 0.5 as the official crate_encoder.py
    lambd: float = override(LayerConfig, "lambd", 0.5)
    decoder_form: str = option(
        "official", "decoder layer: official (x_ − MSSA(LN(x_))) | jmlr (Alg. 5)", choices=LAYER_FORMS
    )
    visible_only: bool = option(
        False,
        "the encoder sees only the visible tokens, positions re-added before the decoder (He et al.)",
        applies="always",
    )
    norm_eps: float = option(1e-6, "ε of the final encoder / decoder LayerNorms", range=Range(0, lo_open=True))
    drop_path: float = option(
        0.0,
        "stochastic depth of the encoder's last layer, rising linearly from 0; 0 = off",
        range=Range(0, 1, hi_open=True),
    )
    data: DataSpec | None = override(ModelConfig, "data", None)

    # added later: configs without them stay byte-identical (every layer field but eta, lambd, layer_form)
    OMIT_AT_DEFAULT = ("drop_path", "dropout", "ista_mode", "scale_scores", "tied_output", "tied_beta", "eps",
                       "attention", "mlp", "odl_ratio", "mlp_ratio", "gelu", "proj_bias")  # fmt: skip
    KEY_ORDER = ("arch", "image_size", "patch_size", "in_chans", "dim", "depth", "heads", "dim_head", "mask_ratio",
                 "norm_pix_loss", "eta", "lambd", "layer_form", "decoder_form", "visible_only", "norm_eps",
                 "drop_path", "data")  # fmt: skip
    kind = MASKED_AUTOENCODER
    BLOCK_COUNTS = {"depth": "layers"}  # the numbered blocks of the weights these fields count
    pipeline_tag = "image-feature-extraction"
    white_box = True  # CRATE encoder layers

    def validate(self) -> None:
        self.check_layer()
        if self.arch != MAE_ARCH:
            raise ValueError(f"MAEConfig.arch must be {MAE_ARCH!r}, got {self.arch!r}; use ModelConfig for classifiers")
        self.check_geometry()
        if self.dim % 4:
            raise ValueError(f"dim={self.dim} must be a multiple of 4 for the 2-D sin-cos position embedding")
        check_mask_ratio(self.mask_ratio, self.grid**2)
        self.check_data()

    @property
    def num_patches(self) -> int:
        return self.grid**2


def check_mask_ratio(ratio: float, num_patches: int) -> int:
    """Validate a mask ratio for ``num_patches`` patches; returns the number of kept (visible) patches."""
    MASK_RATIO.check("mask_ratio", ratio, "e.g. mask_ratio=0.75 (the paper's)")
    keep = int(num_patches * (1 - ratio))
    if keep < 1 or keep >= num_patches:
        raise ValueError(
            f"mask_ratio={ratio} keeps {keep} of {num_patches} patches; it must keep at least one and mask at "
            f"least one (choose a ratio in ({1 / num_patches:.3g}, {1 - 1 / num_patches:.3g}))"
        )
    return keep


class MAEOutput(NamedTuple):
    """``(loss, pred, mask)`` as the official forward returns: the masked-patch loss, the predicted
    patches ``(b, N, p·p·c)`` and the mask ``(b, N)`` (1 = masked, 0 = visible)."""

    loss: Tensor
    pred: Tensor
    mask: Tensor


# --------------------------------------------------------------------------- embedding and masking
def sincos_pos_embed(dim: int, h: int, w: int, cls_token: bool = True) -> Tensor:
    """The fixed 2-D sin-cos position table of MAE / CRATE-MAE, ``(h·w [+1], dim)``.

    Token ``(i, j)`` (row-major) gets ``[sin(jω), cos(jω), sin(iω), cos(iω)]`` with
    ``ω_k = 10000^{-k/(dim/4)}``, ``k < dim/4``: the first half encodes the column, the second the
    row (as the official ``get_2d_sincos_pos_embed``); the class token's row is zero.
    """
    if dim % 4:
        raise ValueError(f"dim={dim} must be a multiple of 4 for the 2-D sin-cos position embedding")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )

    def one_d(pos: Tensor) -> Tensor:
        out = pos.reshape(-1, 1) * omega
        return torch.cat([out.sin(), out.cos()], dim=1)

    emb = torch.cat([one_d(cols), one_d(rows)], dim=1)
    if cls_token:
        emb = torch.cat([torch.zeros(1, dim, dtype=emb.dtype), emb], dim=0)
    return emb.float()


def random_masking(
    batch: int, num_patches: int, ratio: float, *, noise: Tensor | None = None, device: torch.device | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample random masking by argsort of uniform noise (He et al.; official ``random_masking``).

    Returns ``(ids_keep (b, n_keep), mask (b, N) with 1 = masked, ids_restore (b, N))``.  ``noise``
    ``(b, N)`` fixes the draw (small noise = kept), e.g. to compare two implementations.
    """
    keep = check_mask_ratio(ratio, num_patches)
    if noise is None:
        noise = torch.rand(batch, num_patches, device=device)
    elif noise.shape != (batch, num_patches):
        raise ValueError(f"noise must have shape {(batch, num_patches)}, got {tuple(noise.shape)}")
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    mask = (ids_restore >= keep).to(noise.dtype if noise.is_floating_point() else torch.float32)
    return ids_shuffle[:, :keep], mask, ids_restore


# --------------------------------------------------------------------------- the model
class CRATEMAE(ImageInput, Model):
    """CRATE-MAE (JMLR §3.6, pp.38-40): ``CRATEMAE(MAEConfig(...))`` or ``ct.create_model("crate_mae_small")``.

    * ``forward(x, mask_ratio=None, noise=None)`` → :class:`MAEOutput` ``(loss, pred, mask)``;
    * ``forward_features(x)`` → the encoder's output ``LN(Z^{L+1})`` ``(b, 1+N, d)`` of the **unmasked**
      image (after the encoder's final LayerNorm, the :class:`~crate_transformer.models.base.Model` contract), for
      probes and analysis; ``forward_head(z)`` → the decoder's predicted patches ``(b, N, p·p·c)``;
    * ``forward_trace(x)`` → every encoder layer's tokens (:class:`~crate_transformer.models.base.Trace`);
    * ``decoder_trace(z)`` → every decoder layer's tokens from encoder output ``z``;
    * ``reconstruct(x)`` → (reconstructed images, mask as an image) for figures.
    """

    config_class = MAEConfig
    arch = MAE_ARCH
    no_decay_names = ("cls_token", "mask_token")
    num_prefix_tokens = 1  # the class token

    def __init__(self, config: MAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        patch_dim = c.in_chans * c.patch_size**2
        self.patch_embed = nn.Linear(patch_dim, c.dim)  # W_pre of eq. (69)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.dim))  # x_mask of eq. (71), in token space
        self.register_buffer("pos_embed", sincos_pos_embed(c.dim, c.grid, c.grid).unsqueeze(0))  # fixed E_pos
        rates = drop_path_rates(c.drop_path, c.depth)
        self.layers = nn.ModuleList(EncoderLayer.from_config(c, drop_path=r) for r in rates)
        self.norm = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(c.dim, c.heads, c.head_dim, form=c.decoder_form) for _ in range(c.depth)
        )
        self.decoder_norm = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.decoder_pred = nn.Linear(c.dim, patch_dim)  # W_post of eq. (70)
        self._init_weights()

    def _init_weights(self) -> None:
        """Official ``initialize_weights``: xavier-uniform Linear weights (incl. the patch projection),
        zero biases, LayerNorm (1, 0), class and mask tokens N(0, 0.02²); ISTA ``D`` and decoder ``E``
        keep their kaiming-uniform init."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)

    # ---------------------------------------------------------------- embedding
    def position_embedding(self, h: int, w: int) -> Tensor:
        """The ``(1, 1 + h·w, d)`` position table for an ``h × w`` patch grid (sin-cos is defined for any grid)."""
        if (h, w) == (self.config.grid, self.config.grid):
            return self.pos_embed
        return sincos_pos_embed(self.config.dim, h, w).unsqueeze(0).to(self.pos_embed)

    def _patch_tokens(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = self.model_images(x)
        p = self.config.patch_size
        return self.patch_embed(patchify(x, p)), self.position_embedding(x.shape[-2] // p, x.shape[-1] // p)

    def embed(self, x: Tensor) -> Tensor:
        """``f_pre`` of the unmasked image (eq. (69) + class token): ``[z_cls, W_pre X] + E_pos`` → ``(b, N+1, d)``."""
        tokens, pos = self._patch_tokens(x)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1) + pos

    # ---------------------------------------------------------------- encoder / decoder
    def encode(self, z: Tensor) -> Tensor:
        """The encoder layers (no final LayerNorm)."""
        return self.run_layers(z)

    def forward_encoder(
        self, x: Tensor, mask_ratio: float | None = None, noise: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Mask, encode, and return ``(decoder input (b, 1+N, d), mask (b, N))``.

        Official form: ``Mask_Ω`` then ``LN(f(·))`` over all ``N + 1`` tokens.  ``visible_only`` (He et al.):
        the encoder sees the class token and the visible tokens; mask tokens fill in after it, and the
        position table is added to every token (MAE's ``forward_decoder``).
        """
        tokens, pos = self._patch_tokens(x)
        b, n, d = tokens.shape
        ratio = self.config.mask_ratio if mask_ratio is None else mask_ratio
        ids_keep, mask, _ = random_masking(b, n, ratio, noise=noise, device=x.device)
        cls = self.cls_token.expand(b, -1, -1) + pos[:, :1]
        masked = mask.bool().unsqueeze(-1)
        if not self.config.visible_only:
            z = torch.cat([cls, torch.where(masked, self.mask_token.to(tokens.dtype), tokens) + pos[:, 1:]], dim=1)
            return self.norm(self.encode(z)), mask
        index = ids_keep.unsqueeze(-1).expand(-1, -1, d)
        visible = torch.gather(tokens + pos[:, 1:], 1, index)
        z = self.norm(self.encode(torch.cat([cls, visible], dim=1)))
        full = self.mask_token.expand(b, n, -1).to(z.dtype).scatter(1, index, z[:, 1:])
        return torch.cat([z[:, :1], full], dim=1) + pos.to(z.dtype), mask

    def forward_decoder(self, z: Tensor) -> Tensor:
        """``g_post ∘ g^{L-1} ∘ … ∘ g^0`` (§3.7): decoder layers → LayerNorm → Linear; class token dropped."""
        return self.forward_head(self.run_layers(z, self.decoder_layers))

    def target(self, x: Tensor) -> Tensor:
        """The regression target: the patches of ``x`` (per-patch standardised with ``norm_pix_loss``)."""
        t = patchify(x, self.config.patch_size)
        if self.config.norm_pix_loss:
            t = (t - t.mean(dim=-1, keepdim=True)) / (t.var(dim=-1, keepdim=True) + 1e-6) ** 0.5
        return t

    def forward_loss(self, x: Tensor, pred: Tensor, mask: Tensor) -> Tensor:
        """Eq. (71) on the masked patches Ω only: mean over Ω of each patch's mean squared error."""
        per_patch = (pred.float() - self.target(x).float()).pow(2).mean(dim=-1)
        return (per_patch * mask).sum() / mask.sum()

    def forward(self, x: Tensor, mask_ratio: float | None = None, noise: Tensor | None = None) -> MAEOutput:
        z, mask = self.forward_encoder(x, mask_ratio, noise)
        pred = self.forward_decoder(z)
        return MAEOutput(self.forward_loss(x, pred, mask), pred, mask)

    # ---------------------------------------------------------------- encoder as a feature extractor
    def forward_features(self, x: Tensor) -> Tensor:
        """The encoder's output ``LN(Z^{L+1})`` on the unmasked image, ``(b, 1+N, d)``."""
        return self.finish_features(self.encode(self.embed(x)))

    def finish_features(self, z: Tensor) -> Tensor:
        return self.norm(z)

    def norm_tokens(self, z: Tensor) -> Tensor:
        return self.norm(z)

    def forward_head(self, z: Tensor, pre_logits: bool = False) -> Tensor:
        """The decoder's last LayerNorm and ``W_post`` (eq. (70)) on the decoded tokens: pixels of every patch
        ``(b, N, p·p·c)`` (class token dropped); ``pre_logits`` stops before ``W_post``."""
        z = self.decoder_norm(z)
        return z[:, 1:] if pre_logits else self.decoder_pred(z)[:, 1:]

    def forward_trace(self, x: Tensor, return_attention: bool = False) -> Trace:
        """Every encoder layer's tokens on the unmasked image (same indexing as the classifier's trace)."""
        z = self.embed(x)
        return Trace.of(self.layers, z, return_attention)

    def decoder_trace(self, z: Tensor) -> list[Tensor]:
        """``[LN(z), g^0(LN(z)), …]``: the decoder input (normalised encoder output ``z``), then each layer's."""
        out = [self.norm(z)]
        for layer in self.decoder_layers:
            out.append(layer(out[-1]))
        return out

    @torch.no_grad()
    def reconstruct(
        self, x: Tensor, mask_ratio: float | None = None, noise: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(reconstruction, mask image, per-image masked-patch loss)`` for figures (Fig. 11, p.39).

        The reconstruction shows the visible patches of ``x`` and the predictions at the masked ones
        (with ``norm_pix_loss`` the predictions are de-standardised with the true patch statistics,
        as in He et al.'s visualisation).  The mask image is 1 where a patch was masked.
        """
        pred, mask = self.forward(x, mask_ratio, noise)[1:]
        p = self.config.patch_size
        h, w = x.shape[-2] // p, x.shape[-1] // p
        target = patchify(x, p)
        loss = ((pred - self.target(x)).pow(2).mean(-1) * mask).sum(1) / mask.sum(1)
        if self.config.norm_pix_loss:
            pred = pred * (target.var(-1, keepdim=True) + 1e-6) ** 0.5 + target.mean(-1, keepdim=True)
        m = mask.unsqueeze(-1)
        recon = unpatchify(target * (1 - m) + pred.to(target.dtype) * m, p, h, w)
        mask_img = unpatchify(m.expand_as(target).to(x.dtype), p, h, w)
        return recon, mask_img, loss

    # ---------------------------------------------------------------- utilities
    def official_num_params(self) -> int:
        """Table 9's count: the official layout, with its unused ``decoder_embed`` and both sin-cos tables."""
        return self.num_params(layout="official")

    def as_classifier(self) -> ImageClassifier:
        """The encoder as a CRATE classifier to fine-tune (:func:`mae_to_classifier`, a fresh head)."""
        return mae_to_classifier(self)

    def num_params(self, trainable_only: bool = False, layout: str = "native") -> int:
        """Parameter count.  ``layout="official"`` adds what the official module also holds and Table 9
        counts: the unused ``decoder_embed`` Linear(d, d) and both fixed sin-cos tables (``pos_embed``,
        ``decoder_pos_embed``); e.g. 25,405,824 for ``crate_mae_small``, 44,638,464 for ``crate_mae_base``."""
        n = super().num_params(trainable_only)
        if layout == "official":
            d = self.config.dim
            n += (d * d + d) + (0 if trainable_only else 2 * self.pos_embed.numel())
        elif layout != "native":
            raise ValueError(f"unknown layout {layout!r}; choose 'native' or 'official'")
        return n


# --------------------------------------------------------------------------- MAE → classifier (Table 3 protocol)
def mae_to_classifier(model: CRATEMAE, num_classes: int | None = None, pool: str = "mean") -> ImageClassifier:
    """A CRATE classifier initialised from a CRATE-MAE encoder (fine-tuning, JMLR §4.2 and Table 3, p.41).

    What maps to what (the rest of the MAE — mask token, decoder, ``decoder_pred`` — is dropped):

    ============================== =========================================================
    CRATE-MAE                      classifier (:class:`~crate_transformer.models.classifier.CRATE`)
    ============================== =========================================================
    ``patch_embed`` (Linear)       ``patch_embed.1`` (``patch_norm=False``: no LayerNorms)
    ``cls_token``                  ``cls_token``
    ``pos_embed`` (fixed sin-cos)  ``pos_embed`` (copied; **learned** from then on)
    ``layers.{i}.*``               ``layers.{i}.*`` (same operators, η and λ = 0.5 kept)
    ``norm`` (LN, eps 1e-6)        ``head.0`` (LN, eps 1e-5)
    —                              ``head.1`` fresh Linear(d, ``num_classes``)
    ============================== =========================================================

    ``pool="mean"`` is the paper's global average pooling (eqs. (72)-(73), p.40; the official mean
    includes the class token); ``"cls"`` uses the class token.
    """
    c = model.config
    if num_classes is None:
        num_classes = len(c.data.classes) if c.data is not None and c.data.classes else 1000
    cfg = ModelConfig(
        arch="crate", image_size=c.image_size, patch_size=c.patch_size, in_chans=c.in_chans,
        num_classes=num_classes, dim=c.dim, depth=c.depth, heads=c.heads, dim_head=c.dim_head, pool=pool,
        eta=c.eta, lambd=c.lambd, layer_form=c.layer_form, patch_norm=False, data=c.data,
    )  # fmt: skip
    clf = build_model(cfg).to(model.pos_embed.device)
    src = model.state_dict()
    state = clf.state_dict()
    state.update({k: v for k, v in src.items() if k.startswith("layers.")})
    state.update({
        "cls_token": src["cls_token"], "pos_embed": src["pos_embed"],
        "patch_embed.1.weight": src["patch_embed.weight"], "patch_embed.1.bias": src["patch_embed.bias"],
        "head.0.weight": src["norm.weight"], "head.0.bias": src["norm.bias"],
    })  # fmt: skip
    clf.load_state_dict(state, strict=True)
    return clf


# --------------------------------------------------------------------------- the authors' format, registry entries
MAE_FORMAT = OfficialFormat(
    name="CRATE-MAE",
    origin="Ma-Lab-Berkeley/CRATE model/crate_ae",
    to_native=lambda state, config: mae_official_to_native(state),
    detect=lambda state: any(k.startswith(("decoder_blocks.", "mask_token")) for k in state),
    example="crate_mae_base",
    unstored=HEADS_NOT_STORED,
)

register_arch(MAE_ARCH, CRATEMAE, official=MAE_FORMAT)
# CRATE-MAE (official mae_crate_* factories; encoder and decoder share L, d, K; patch 16, λ = 0.5).
# Official-layout parameter counts (Table 9): S 25,405,824 (25.4M), B 44,638,464 (44.6M).  The official
# mae_crate_large has depth 24; Table 9's "Large, L = 12, 78.5M" is crate_mae_large with depth=12.
register_model("crate_mae_tiny", arch=MAE_ARCH, dim=384, depth=12, heads=6)
register_model("crate_mae_small", arch=MAE_ARCH, dim=576, depth=12, heads=12)
register_model("crate_mae_base", arch=MAE_ARCH, dim=768, depth=12, heads=12)
register_model("crate_mae_large", arch=MAE_ARCH, dim=1024, depth=24, heads=16)
# The mae task's default for the built-in 28x28 digits.  ISTA step η = 0.5, not the official 0.1: at
# d = 64 and 5 minutes of training the larger step learns faster (the measurement: docs/results.md).
register_model(
    "crate_mae_mnist", arch=MAE_ARCH, image_size=28, patch_size=4, in_chans=1, dim=64, depth=4, heads=4, eta=0.5
)
register_pretrained(
    PretrainedSource(
        name="crate_mae_base",
        title="CRATE-MAE-B/16, ImageNet-1K masked autoencoding",
        loader=MAE_FORMAT.name,
        filename="",
        url="https://drive.google.com/file/d/11i5BMwymqOsunq44WD3omN5mS6ZREQPO/view?usp=sharing",
        input="image 224",
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        classes="none (masked-patch reconstruction)",
        licence="MIT (the repository's)",
        reference="github.com/Ma-Lab-Berkeley/CRATE README.md, main.py (commit 674408f), model/crate_ae/crate_ae.py",
    )
)
