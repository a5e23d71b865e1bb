"""CRATE-α (Yang et al., NeurIPS 2024, "Scaling White-Box Transformers for Vision", arXiv 2405.20299): the
image-classifier family and the authors' PyTorch checkpoint format.

CRATE-α is the CRATE classifier (JMLR eqs. (65)-(66)) with a different sparse-coding block, which is what let
CRATE scale to ImageNet-21K: ODL — an overcomplete dictionary ``D ∈ R^{d×4d}``, two ISTA steps started from zero
on the non-negative LASSO (JMLR eq. (42)), a separate decoder dictionary ``D1`` — plus a residual around it (see
:class:`~crate_transformer.layers.OvercompleteISTA`).  The released PyTorch code (UCSC-VLAA/CRATE-alpha,
``torch_inference/model/crate_alpha.py``) also embeds patches with a bare convolution (no LayerNorms around it),
uses LayerNorm eps 1e-6 inside the layers and no bias on the attention output ``W`` (JMLR eq. (37)); its head is
a LayerNorm (eps 1e-5) and a Linear on the class token.

The whole family is this module — :class:`AlphaConfig`, :class:`CRATEAlpha`, the authors' key map with its two
converters, :data:`ALPHA_FORMAT` and its registry lines (``register_arch``, ``register_model``,
``register_pretrained``) at the bottom.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor, nn

from ..config_utils import override
from ..layers import EncoderLayer, drop_path_rates
from ..loading.official import HEADS_NOT_STORED, OfficialFormat, conv_to_linear, linear_to_conv, rename
from ._registry import PretrainedSource, register_arch, register_model, register_pretrained
from .classifier import ImageClassifier, ModelConfig
from .spec import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "ALPHA_ARCH",
    "ALPHA_CHOICES",
    "ALPHA_KEY_MAP",
    "ALPHA_FORMAT",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "AlphaConfig",
    "CRATEAlpha",
    "alpha_config",
    "alpha_official_to_native",
    "alpha_native_to_official",
    "looks_like_alpha",
]

ALPHA_ARCH = "crate_alpha"
# The ModelConfig fields whose value makes a CRATE classifier CRATE-α (torch_inference/model/crate_alpha.py).
ALPHA_CHOICES: dict[str, object] = {
    "mlp": "odl",
    "patch_norm": False,
    "attention": "mssa",
    "layer_form": "official",
    "scale_scores": True,
    "tied_output": False,
    "ista_mode": "relu",
}
# The input normalisation of the released checkpoints (eval_in1k_cls.py: Resize 256, CenterCrop 224, ToTensor,
# then Normalize with IMAGENET_MEAN / IMAGENET_STD).


@dataclass
class AlphaConfig(ModelConfig):
    """A CRATE-α classifier: :class:`~crate_transformer.models.classifier.ModelConfig`'s fields, with the CRATE-α
    choices
    (:data:`ALPHA_CHOICES`) fixed — another value for one of them is a one-line ``ValueError`` — and
    CRATE-α-B/16's sizes as the defaults.  ``odl_ratio`` (4), ``eta`` and ``lambd`` (0.1) are the ODL block's."""

    arch: str = override(ModelConfig, "arch", ALPHA_ARCH, help="the family: crate_alpha", choices=(ALPHA_ARCH,))
    dim: int = override(ModelConfig, "dim", 768)
    depth: int = override(ModelConfig, "depth", 12)
    heads: int = override(ModelConfig, "heads", 12)
    patch_norm: bool = override(ModelConfig, "patch_norm", False)
    mlp: str = override(ModelConfig, "mlp", "odl")

    def validate(self) -> None:
        super().validate()
        for name, value in ALPHA_CHOICES.items():
            if getattr(self, name) != value:
                raise ValueError(
                    f"CRATE-α has {name}={value!r}, got {name}={getattr(self, name)!r}; drop {name} "
                    "(that variant of CRATE is arch='crate')"
                )


def alpha_config(config: ModelConfig | None = None) -> AlphaConfig:
    """``config`` as an :class:`AlphaConfig` (``None``: CRATE-α-B/16).

    A plain ``ModelConfig`` is converted: its fields are kept, those of :data:`ALPHA_CHOICES` still at their
    ModelConfig default become CRATE-α's, and any other value for them is refused by :class:`AlphaConfig`.
    """
    if config is None or isinstance(config, AlphaConfig):
        return config or AlphaConfig()
    if not isinstance(config, ModelConfig):
        raise ValueError(f"expected an AlphaConfig, got {type(config).__name__}; e.g. AlphaConfig(dim=64, heads=4)")
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ModelConfig)}
    for name, value in ALPHA_CHOICES.items():
        if fields[name] == defaults[name]:
            fields[name] = value
    return AlphaConfig(**{**fields, "arch": ALPHA_ARCH})


class CRATEAlpha(ImageClassifier):
    """The CRATE-α classifier: ``CRATEAlpha(AlphaConfig(dim=64, depth=2, heads=4, ...))``, ``CRATEAlpha()``
    (B/16) or ``ct.create_model("crate_alpha_base16")``.

    Patch conv (the equal Linear on (p1, p2, c)-ordered patches) → class token + position table → L layers of
    ``Z + MSSA(LN(Z))`` then ``Z + ODL(LN(Z))`` → pool → LayerNorm + Linear.  Everything else — position-table
    interpolation for other image sizes, ``forward_trace``, ``save_pretrained`` — is the classifier's.
    """

    config_class = AlphaConfig
    arch = ALPHA_ARCH

    def __init__(self, config: AlphaConfig | ModelConfig | None = None) -> None:
        super().__init__(alpha_config(config))

    def build_encoder(self, c: AlphaConfig) -> tuple[nn.Module, nn.ModuleList, float]:
        """The authors' initialisation: PyTorch's default for the patch map (a p×p stride-p conv and the Linear
        on its flattened patch share the fan-in) and for every Linear and LayerNorm, kaiming-uniform ``D`` and
        ``D1`` (:class:`~crate_transformer.layers.OvercompleteISTA`), ``torch.randn`` class token and
        position table (init std 1)."""
        patch_embed = nn.Sequential(nn.Linear(c.in_chans * c.patch_size**2, c.dim))
        rates = drop_path_rates(c.drop_path, c.depth)
        layers = nn.ModuleList(EncoderLayer.from_config(c, drop_path=r) for r in rates)
        return patch_embed, layers, 1.0


# --------------------------------------------------------------------------- the authors' checkpoint format
# Official → native names.  conv1 is the patch convolution (d, 3, p, p) ↔ the native Linear (d, p·p·3); the
# official to_out has no bias; fn.D / fn.D1 are the ODL dictionaries, (d, 4d) in both.
ALPHA_KEY_MAP = [
    ("conv1.", "patch_embed.0."),
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


def looks_like_alpha(state: Mapping[str, Tensor]) -> bool:
    """Whether an unwrapped state dict is in the authors' CRATE-α layout: the patch conv ``conv1`` or the ODL
    decoder dictionaries ``transformer.layers.{i}.1.fn.D1``, which no other official CRATE format has."""
    return "conv1.weight" in state or any(k.startswith("transformer.layers.") and k.endswith(".fn.D1") for k in state)


def alpha_official_to_native(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official CRATE-α state dict → :class:`CRATEAlpha` keys and shapes (:data:`ALPHA_KEY_MAP`; the conv
    weight becomes the Linear on (p1, p2, c)-ordered patches)."""
    out = rename(state, ALPHA_KEY_MAP, forward=True)
    w = out.get("patch_embed.0.weight")
    if w is not None and w.dim() == 4:
        out["patch_embed.0.weight"] = conv_to_linear(w)
    return out


def alpha_native_to_official(state: Mapping[str, Tensor], in_chans: int = 3) -> dict[str, Tensor]:
    """A :class:`CRATEAlpha` state dict → the official keys, loadable with ``load_state_dict(strict=True)`` by
    the authors' module (whose ``conv1`` takes 3 channels)."""
    out = rename(state, ALPHA_KEY_MAP, forward=False)
    out["conv1.weight"] = linear_to_conv(out["conv1.weight"], in_chans)
    return out


ALPHA_FORMAT = OfficialFormat(
    name="CRATE-α",
    origin="UCSC-VLAA/CRATE-alpha torch_inference/model/crate_alpha.py",
    to_native=lambda state, config: alpha_official_to_native(state),
    detect=looks_like_alpha,
    example="crate_alpha_base16",
    unstored=HEADS_NOT_STORED,
)


# --------------------------------------------------------------------------- registry entries
register_arch(ALPHA_ARCH, CRATEAlpha, official=ALPHA_FORMAT)
# The sizes of the released PyTorch checkpoints (UCSC-VLAA/CRATE-alpha on the HF Hub, torch/crate_alpha_B16.pth and
# torch/crate_alpha_L14.pth; the factories CRATE_base / CRATE_large of torch_inference/model/crate_alpha.py), both
# fine-tuned and evaluated at 224.  Parameters with the 1000-class head: 72,328,936 and 253,650,920.  The
# ImageNet-21K pre-training files (torch/in21k_Pretrain): num_classes=19167.
register_model("crate_alpha_base16", arch=ALPHA_ARCH, image_size=224, patch_size=16, dim=768, depth=12, heads=12)
register_model("crate_alpha_large14", arch=ALPHA_ARCH, image_size=224, patch_size=14, dim=1024, depth=24, heads=16)
_REFERENCE = "github.com/UCSC-VLAA/CRATE-alpha README.md, torch_inference/eval_in1k_cls.py (commit edbd624)"
for _name, _size, _top1 in (("crate_alpha_base16", "B16", "81.2"), ("crate_alpha_large14", "L14", "83.9")):
    register_pretrained(
        PretrainedSource(
            name=_name,
            title=f"CRATE-α-{_size[0]}/{_size[1:]}, ImageNet-21K pre-trained, ImageNet-1K fine-tuned ({_top1}% top-1)",
            loader=ALPHA_FORMAT.name,
            filename=f"torch/crate_alpha_{_size}.pth",
            repo_id="UCSC-VLAA/CRATE-alpha",
            input="image 224 (resize 256, centre crop 224)",
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            crop_pct=224 / 256,
            interpolation="bilinear",  # torchvision's Resize default, which eval_in1k_cls.py uses
            classes="ImageNet-1K (1000)",
            licence="Apache-2.0 (Hub model card)",
            reference=_REFERENCE,
        )
    )
