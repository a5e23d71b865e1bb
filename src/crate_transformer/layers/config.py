"""A CRATE layer's settings, declared once (:class:`LayerConfig`), and the names its options may take.

The blocks (:mod:`.attention`, :mod:`.sparse`) read what they need from a :class:`LayerConfig` given whole
(``from_config``); the layer (:mod:`.block`) picks its two blocks from name → class tables keyed by these names."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .._reads import watch, watched
from ..config_utils import OBSERVED, Range, option

LAYER_FORMS = ("official", "jmlr")
# the first block: CRATE's MSSA | standard attention (Table 17) | ToST's token statistics attention (Wu et al. 2025)
ATTENTION_NAMES = ("mssa", "mhsa", "tssa")
# the second block: CRATE's ISTA | GELU MLP (Table 17) | CRATE-α's ODL | the crate-lm overcomplete ISTA
MLPS = ("ista", "mlp", "odl", "ista_overcomplete")
ISTA_MODES = ("relu", "soft", "mm", "none")
GELUS = ("exact", "tanh")  # the MLP's GELU: erf (nanoGPT, timm) | tanh approximation (OpenAI / HF GPT-2)
# a head's width p where a config may give it (dim_head); None there means dim // heads
DIM_HEAD = Range(0, lo_open=True, integer=True, note="or None = dim // heads")


@dataclasses.dataclass
class LayerConfig:
    """The hyperparameters of a CRATE layer (:class:`~crate_transformer.layers.EncoderLayer`), declared once and
    inherited by the model configs whose layers are CRATE layers (``ModelConfig``, ``MAEConfig``, ``LMConfig``);
    another default is :func:`~crate_transformer.config_utils.override` (CRATE-MAE's λ = 0.5), fixed layers (the ViT
    and GPT baselines) a :meth:`layer_config` of their own.  Where each field applies is observed: a model build
    refuses one given that it never read (``models._registry.build``)."""

    APPLIES: ClassVar[str] = OBSERVED  # inherited by the model configs: each field is checked against the build

    dropout: float = option(0.0, "dropout of the attention and MLP outputs", range=Range(0, 1, hi_open=True))
    eta: float = option(0.1, "ISTA step size η (eq. (44))", range=Range(0, lo_open=True))
    lambd: float = option(0.1, "ISTA sparsity weight λ (eq. (44))", range=Range(0))
    ista_mode: str = option("relu", "the ISTA step: relu | soft | mm | none", choices=ISTA_MODES)
    layer_form: str = option("official", "official (skip from Z) | jmlr (skip from LN(Z), Alg. 4)", choices=LAYER_FORMS)
    scale_scores: bool = option(True, "MSSA scores × p^-1/2 (official) or unscaled (eq. (35))")
    tied_output: bool = option(False, "MSSA output β[U_1..U_K] (eq. (36)) instead of a trainable W")
    tied_beta: float = option(1.0, "β of the tied MSSA output")
    eps: float = option(0.1, "ε of the MM step (ista_mode='mm')", range=Range(0, lo_open=True))
    attention: str = option(
        "mssa",
        "mssa | mhsa (standard attention: CRATE-MHSA, Table 17) | tssa (ToST's linear-time TSSA)",
        choices=ATTENTION_NAMES,
    )
    mlp: str = option(
        "ista", "ista | mlp (CRATE-MLP) | odl (CRATE-α) | ista_overcomplete (the crate-lm release)", choices=MLPS
    )
    odl_ratio: int = option(4, "atoms per dimension of an overcomplete dictionary (m = odl_ratio · dim)")
    mlp_ratio: float = option(4.0, "hidden width of the GELU MLP, × dim", range=Range(0, lo_open=True))
    gelu: str = option("exact", "the MLP's GELU: exact (erf) | tanh (OpenAI GPT-2)", choices=GELUS)
    proj_bias: bool | None = option(None, "a bias on MSSA's output W (eq. (37)); None: yes but with odl")

    @property
    def second_block(self) -> str:
        """The name of the layer's second block: ``mlp``, or for CRATE's ISTA its ablation by ``ista_mode``
        (``"ista_soft"``, ``"ista_mm"``, and ``"none"`` where ISTA is switched off, Table 15)."""
        if self.mlp != "ista" or self.ista_mode == "relu":
            return self.mlp
        return "none" if self.ista_mode == "none" else f"ista_{self.ista_mode}"

    @property
    def ln_eps(self) -> float:
        """The eps of the layer's two LayerNorms: CRATE-α's PreNorm's 1e-6 in its ODL layers (``mlp="odl"``), else
        PyTorch's default 1e-5 (the official CRATE and crate-lm code)."""
        return 1e-6 if self.mlp == "odl" else 1e-5

    @property
    def attention_bias(self) -> bool:
        """Whether the attention's output ``W`` (eq. (37)) has a bias: ``proj_bias``, which by default (None) is yes
        but in CRATE-α's ODL layers (its ``to_out`` has none)."""
        return self.mlp != "odl" if self.proj_bias is None else self.proj_bias

    @property
    def sparse_output(self) -> bool:
        """Whether every layer ends with CRATE's ISTA step or an ablation of it (outputs with exact zeros, JMLR
        Figs. 14-15)."""
        c = self.layer_config()
        return c.mlp == "ista" and c.ista_mode != "none"

    @property
    def layer_blocks(self) -> tuple[str, str]:
        """The names of the layer's two blocks, e.g. ``("mssa", "ista")`` or ``("mhsa", "mlp")`` (as built)."""
        c = self.layer_config()
        return (c.attention, c.mlp)

    def layer_config(self) -> LayerConfig:
        """The settings of this model's layers as a plain :class:`LayerConfig` (these fields; a family with fixed
        blocks overrides this: the ViT and GPT baselines are ``attention="mhsa", mlp="mlp"``)."""
        seen = watched(self)  # a build recording what it reads (models._registry.build): the copy reads for it
        c = LayerConfig(**{f.name: object.__getattribute__(self, f.name) for f in dataclasses.fields(LayerConfig)})
        if seen is not None:
            watch(c, seen)
        return c

    def check_layer(self) -> None:
        """The combinations a CRATE layer cannot build (one-line ``ValueError``)."""
        if self.mlp != "ista" and self.ista_mode != "relu":
            raise ValueError(
                f"ista_mode={self.ista_mode!r} applies to the ISTA block only, but mlp={self.mlp!r}; "
                "use mlp=ista or drop ista_mode"
            )
        if self.attention != "mssa" and self.tied_output:
            raise ValueError(f"tied_output applies to MSSA only, but attention={self.attention!r}; use attention=mssa")
