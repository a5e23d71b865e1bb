"""A model family written outside the package, as a user (or a new family module) would: one file on the
contract of ``docs/adding_a_model.md`` and its registry lines, nothing else.  ``tests/models/test_new_family.py``
trains, analyses, reads the features of and reloads it through the unchanged package and ``crate`` command.

The model is deliberately not an ``ImageClassifier`` subclass: a consumer that dispatched on the classes of the
built-in families would not recognise it.  It is a small white-box classifier: a linear patch embedding, a class
token and a learned position table, CRATE layers (MSSA + ISTA, :class:`~crate_transformer.layers.EncoderLayer`),
then the mean of the tokens through a LayerNorm and a linear head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from crate_transformer.config_utils import Range, option
from crate_transformer.layers import EncoderLayer
from crate_transformer.models._registry import register_arch, register_model
from crate_transformer.models.base import Model, Trace
from crate_transformer.models.contract import IMAGE_CLASSIFIER, FamilyConfig
from crate_transformer.models.image_input import ImageEncoderGeometry, ImageInput
from crate_transformer.models.spec import DataSpec

ARCH = "toy_crate"


@dataclass
class ToyConfig(ImageEncoderGeometry, FamilyConfig):
    arch: str = option(ARCH, "the family: toy")
    image_size: int = option(8, "image side in pixels")
    patch_size: int = option(2, "patch side in pixels")
    in_chans: int = option(1, "input channels")
    num_classes: int = option(10, "classes")
    dim: int = option(32, "token width")
    depth: int = option(2, "layers")
    heads: int = option(4, "attention heads")
    dim_head: int | None = option(None, "head width (None: dim // heads)")
    eta: float = option(0.1, "ISTA step size", range=Range(0, lo_open=True))
    lambd: float = option(0.1, "ISTA sparsity weight", range=Range(0))
    data: DataSpec | None = option(None, "what it was trained on")

    # the capability contract: what this model is, and what the analysis may measure in it
    kind = IMAGE_CLASSIFIER
    pipeline_tag = "image-classification"
    white_box = True
    sparse_output = True
    layer_blocks = ("mssa", "ista")
    BLOCK_COUNTS = {"depth": "layers"}

    def validate(self) -> None:
        if self.arch != ARCH:
            raise ValueError(f"ToyConfig.arch must be {ARCH!r}, got {self.arch!r}")
        self.check_geometry(positive=("num_classes",))
        self.check_data()


class ToyCRATE(ImageInput, Model):
    config_class = ToyConfig
    arch = ARCH
    no_decay_names = ("pos_embed", "cls_token")
    num_prefix_tokens = 1

    def __init__(self, config: ToyConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.proj = nn.Linear(c.in_chans * c.patch_size**2, c.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, c.grid**2 + 1, c.dim) * 0.02)
        self.layers = nn.ModuleList(
            EncoderLayer(c.dim, c.heads, c.head_dim, eta=c.eta, lambd=c.lambd) for _ in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.num_classes)

    def embed(self, x: Tensor) -> Tensor:
        self.check_images(x, finite=False)
        if x.shape[-1] != self.config.image_size or x.shape[-2] != self.config.image_size:
            raise ValueError(f"ToyCRATE takes {self.config.image_size}-pixel images, got {tuple(x.shape[-2:])}")
        z = self.proj(self.patchify(x.to(self.cls_token.dtype)))
        return torch.cat([self.cls_token.expand(len(x), -1, -1), z], dim=1) + self.pos_embed

    def forward_features(self, x: Tensor) -> Tensor:
        return self.run_layers(self.embed(x))

    def forward_trace(self, x: Tensor, return_attention: bool = False) -> Trace:
        return Trace.of(self.layers, self.embed(x), return_attention)

    def forward_head(self, z: Tensor, pre_logits: bool = False) -> Tensor:
        z = self.norm(z.mean(dim=1))
        return z if pre_logits else self.head(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int) -> None:
        self.config = dataclasses.replace(self.config, num_classes=num_classes)
        self.head = nn.Linear(self.config.dim, num_classes).to(self.cls_token.device)


register_arch(ARCH, ToyCRATE)
register_model("toy_crate_digits", arch=ARCH, image_size=8, patch_size=4, dim=32, depth=2, heads=2)
