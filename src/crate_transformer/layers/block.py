"""CRATE's layers: the encoder layer (eq. (45)) built of a compression and a sparsification block, the
decoder layer (eqs. (62)-(64)), their options (:class:`LayerConfig`) and stochastic depth."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config_utils import Range
from .attention import MHSA, MSSA
from .sparse import GELUS, ISTA, ISTA_MODES, MLP, OvercompleteISTA

LAYER_FORMS = ("official", "jmlr")
ATTENTIONS = ("mssa", "mhsa")  # the layer's first block: CRATE's MSSA | standard attention (Table 17)
# the second block: CRATE's ISTA | GELU MLP (Table 17) | CRATE-α's ODL | the crate-lm overcomplete ISTA
MLPS = ("ista", "mlp", "odl", "ista_overcomplete")
# a head's width p where a config may give it (dim_head); None there means dim // heads
DIM_HEAD = Range(0, lo_open=True, integer=True, note="or None = dim // heads")


# --------------------------------------------------------------------------- stochastic depth
class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016) per sample, as timm's ``DropPath``: in training each sample's
    residual branch is zeroed with probability ``p`` and otherwise scaled by ``1 / (1 − p)``, so its
    expectation is unchanged; identity in eval mode and at ``p = 0`` (no random numbers are drawn then)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        Range(0, 1, hi_open=True, note="the drop path rate").check("p", p)
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Per-layer drop path rates rising linearly from 0 (first layer) to ``rate`` (last), as timm's and
    DeiT's ``torch.linspace(0, drop_path_rate, depth)`` (computed in Python: models are also built on ``meta``)."""
    return [rate * i / (depth - 1) if depth > 1 else 0.0 for i in range(depth)]


def set_drop_path(model: nn.Module, rate: float) -> None:
    """Record ``rate`` as ``model.config.drop_path`` and give every :class:`DropPath` of ``model`` the rate that the
    model's own constructor gives it for that config (e.g. before fine-tuning a loaded model).

    The rates are read from the model built from the new config (once, on the meta device), not recomputed here:
    each family keeps its own rule (timm's and DeiT's linear rise for CRATE, ViT, CRATE-MAE and CRATE-α; one rate
    for every block in ToST, as XCiT), so a model rebuilt from its saved config — a resumed run,
    ``from_pretrained`` — is the model that was trained."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "drop_path"):
        raise ValueError(f"{type(model).__name__} has no drop_path setting; drop path applies to the image encoders")
    config = config.replace(drop_path=rate)
    with torch.device("meta"):
        rates = {name: m.p for name, m in type(model)(config).named_modules() if isinstance(m, DropPath)}
    mine = {name: m for name, m in model.named_modules() if isinstance(m, DropPath)}
    if mine.keys() != rates.keys():
        raise ValueError(f"{type(model).__name__}'s drop path modules differ from those its config builds")
    for name, module in mine.items():
        module.p = float(rates[name])
    model.config = config


# --------------------------------------------------------------------------- layers
def _layer_field(default: Any, help: str, **meta: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **meta})


@dataclasses.dataclass
class LayerConfig:
    """The hyperparameters of a CRATE layer (:class:`EncoderLayer`), declared once: the model configs whose layers
    are CRATE layers (the classifier's ``ModelConfig``, ``MAEConfig``, ``LMConfig``) inherit these fields, their
    ranges and their choices, and :meth:`EncoderLayer.from_config` reads every one of them (a test checks that the
    fields and the layer's keywords are the same set).  A family that wants another default redeclares the field
    with :meth:`default` (CRATE-MAE's λ = 0.5)."""

    dropout: float = _layer_field(0.0, "dropout of the attention and MLP outputs", range=Range(0, 1, hi_open=True))
    eta: float = _layer_field(0.1, "ISTA step size η (eq. (44))", range=Range(0, lo_open=True))
    lambd: float = _layer_field(0.1, "ISTA sparsity weight λ (eq. (44))", range=Range(0))
    ista_mode: str = _layer_field("relu", "the ISTA step: relu | soft | mm | none", choices=ISTA_MODES)
    layer_form: str = _layer_field(
        "official", "official (skip from Z) | jmlr (skip from LN(Z), Alg. 4)", choices=LAYER_FORMS
    )
    scale_scores: bool = _layer_field(True, "MSSA scores × p^-1/2 (official) or unscaled (eq. (35))")
    tied_output: bool = _layer_field(False, "MSSA output β[U_1..U_K] (eq. (36)) instead of a trainable W")
    tied_beta: float = _layer_field(1.0, "β of the tied MSSA output")
    eps: float = _layer_field(0.1, "ε of the MM step (ista_mode='mm')", range=Range(0, lo_open=True))
    attention: str = _layer_field("mssa", "mssa | mhsa (standard attention: CRATE-MHSA, Table 17)", choices=ATTENTIONS)
    mlp: str = _layer_field(
        "ista", "ista | mlp (CRATE-MLP) | odl (CRATE-α) | ista_overcomplete (the crate-lm release)", choices=MLPS
    )
    odl_ratio: int = _layer_field(4, "atoms per dimension of an overcomplete dictionary (m = odl_ratio · dim)")
    mlp_ratio: float = _layer_field(4.0, "hidden width of the GELU MLP, × dim", range=Range(0, lo_open=True))
    gelu: str = _layer_field("exact", "the MLP's GELU: exact (erf) | tanh (OpenAI GPT-2)", choices=GELUS)
    proj_bias: bool | None = _layer_field(None, "a bias on MSSA's output W (eq. (37)); None: yes but with odl")

    @staticmethod
    def default(name: str, value: Any) -> Any:
        """The field ``name`` with another default (its help, range and choices kept), for a family's config."""
        meta = {f.name: f for f in dataclasses.fields(LayerConfig)}[name].metadata
        return dataclasses.field(default=value, metadata=meta)

    def check_layer(self) -> None:
        """The combinations a CRATE layer cannot build (one-line ``ValueError``)."""
        if self.mlp != "ista" and self.ista_mode != "relu":
            raise ValueError(
                f"ista_mode={self.ista_mode!r} applies to the ISTA block only, but mlp={self.mlp!r}; "
                "use mlp=ista or drop ista_mode"
            )
        if self.attention == "mhsa" and self.tied_output:
            raise ValueError("tied_output applies to MSSA only, but attention='mhsa'; use attention=mssa")


# LayerConfig field -> the EncoderLayer keyword it sets, where the names differ
_LAYER_KEYWORDS = {"layer_form": "form"}


class EncoderLayer(nn.Module):
    """One CRATE layer ``f^ℓ`` (eq. (45), JMLR p.25): compression then sparsification.

    ``form="official"`` (official code, NeurIPS Alg. 2)::

        Z_half = Z + MSSA(LN1(Z));   Z_next = ISTA(LN2(Z_half))

    ``form="jmlr"`` (JMLR Alg. 4, p.111) takes the skip from ``LN1(Z)``::

        Z_half = LN1(Z) + MSSA(LN1(Z));   Z_next = ISTA(LN2(Z_half))

    The blocks can be swapped for the ablations (defaults: CRATE, unchanged keys ``norm1, attn, norm2, ista``):

    * ``attention="mhsa"`` — :class:`MHSA` (separate Q, K, V) instead of MSSA: CRATE-MHSA (Table 17);
    * ``mlp="mlp"`` — a GELU :class:`MLP` with a residual, ``Z_next = Z_half + MLP(LN2(Z_half))``, stored
      as ``mlp``: CRATE-MLP (Table 17); with ``attention="mhsa"`` too this is the ViT block;
    * ``mlp="odl"`` — CRATE-α (Yang et al. 2024): :class:`OvercompleteISTA` with a residual,
      ``Z_next = Z_half + ODL(LN2(Z_half))``, stored as ``mlp``; LayerNorm eps 1e-6 and no bias on ``W``
      as in the official CRATE-α code;
    * ``mlp="ista_overcomplete"`` — the crate-lm language models' sparsification step: :class:`OvercompleteISTA`
      with one tied dictionary and, like CRATE's ISTA, **no** residual, ``Z_next = ODL(LN2(Z_half))``;
      stored as ``mlp``.

    ``gelu`` picks the GELU of ``mlp="mlp"`` (``"tanh"``: OpenAI GPT-2's approximation).

    ``proj_bias`` sets whether MSSA's output ``W`` (eq. (37)) has a bias; by default it has one except with
    ``mlp="odl"``.  The released CRATE-BERT has none.

    ``drop_path`` (stochastic depth, :class:`DropPath`) drops the residual branches per sample in training:
    the MSSA/MHSA update ``MSSA(LN1(Z))`` and, where the second block is residual (``mlp``, ``odl``), its
    update.  CRATE's ISTA step replaces the tokens (eq. (45)) rather than adding to them, so it is never dropped.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        *,
        dropout: float = 0.0,
        eta: float = 0.1,
        lambd: float = 0.1,
        ista_mode: str = "relu",
        form: str = "official",
        scale_scores: bool = True,
        tied_output: bool = False,
        tied_beta: float = 1.0,
        causal: bool = False,
        eps: float = 0.1,
        attention: str = "mssa",
        mlp: str = "ista",
        mlp_ratio: float = 4.0,
        odl_ratio: int = 4,
        gelu: str = "exact",
        proj_bias: bool | None = None,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        if form not in LAYER_FORMS:
            raise ValueError(f"unknown layer form {form!r}; choose one of {LAYER_FORMS}")
        self.drop_path = DropPath(drop_path)  # no parameters: state dicts are unchanged
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; choose one of {ATTENTIONS}")
        if mlp not in MLPS:
            raise ValueError(f"unknown mlp {mlp!r}; choose one of {MLPS}")
        self.form, self.kind = form, mlp
        ln_eps = 1e-6 if mlp == "odl" else 1e-5  # CRATE-α's PreNorm uses eps 1e-6
        self.norm1 = nn.LayerNorm(dim, eps=ln_eps)
        if attention == "mhsa":
            self.attn: nn.Module = MHSA(dim, heads, dropout, dim_head, causal=causal)
        else:
            self.attn = MSSA(
                dim,
                heads,
                dim_head,
                dropout,
                scale_scores=scale_scores,
                tied_output=tied_output,
                tied_beta=tied_beta,
                causal=causal,
                proj_bias=mlp != "odl" if proj_bias is None else proj_bias,
            )
        self.norm2 = nn.LayerNorm(dim, eps=ln_eps)
        if mlp == "ista":
            self.ista = ISTA(dim, eta, lambd, ista_mode, eps)
            if ista_mode == "none":  # Table 15/16: the block (and its LayerNorm) is skipped; frozen, so neither
                self.ista.requires_grad_(False)  # the optimizer nor DDP waits for gradients that never come
                self.norm2.requires_grad_(False)
        elif mlp == "mlp":
            self.mlp: nn.Module = MLP(dim, mlp_ratio, dropout, gelu)
        else:
            self.mlp = OvercompleteISTA(dim, odl_ratio, eta, lambd, tied=mlp == "ista_overcomplete")

    @property
    def block(self) -> nn.Module:
        """The second block, whatever it is (ISTA, MLP, overcomplete ISTA): one name for every variant (the
        modules keep their own attribute, ``ista`` or ``mlp``, so state-dict keys and official key maps are
        unchanged)."""
        return self.ista if self.kind == "ista" else self.mlp

    def code_site(self) -> tuple[nn.Module, str] | None:
        """Where this layer's sparse code (or its MLP's units) is read: ``(module, unit kind)``.

        ``"ista"``: the ISTA block's output (eq. (44)); ``"mlp"``: the output of the MLP's GELU; ``"odl"`` /
        ``"ista_overcomplete"``: the overcomplete block, whose :meth:`OvercompleteISTA.code` is recomputed from
        its input.  None when the layer has none (ISTA switched off, ``ista_mode="none"``)."""
        if self.kind == "ista":
            return (self.ista, "ista") if self.ista.mode != "none" else None
        if self.kind == "mlp":
            return (self.mlp[1], "mlp")
        return (self.mlp, self.kind)

    @classmethod
    def from_config(cls, c: Any, **overrides: Any) -> EncoderLayer:
        """The layer a model config describes: ``dim``, ``heads``, ``head_dim`` and every field of its
        :class:`LayerConfig` (``form`` from ``layer_form``), all of them; ``overrides`` win (``drop_path``, a language
        model's ``causal``).  The classifier, CRATE-MAE, CRATE-α and the language models build their layers so."""
        if not isinstance(c, LayerConfig):
            raise ValueError(f"{type(c).__name__} has no layer settings; a config of CRATE layers extends LayerConfig")
        kw = {_LAYER_KEYWORDS.get(f.name, f.name): getattr(c, f.name) for f in dataclasses.fields(LayerConfig)}
        return cls(c.dim, c.heads, c.head_dim, **{**kw, **overrides})

    def output_bias(self) -> Tensor | None:
        """The bias this layer adds unchanged to every output token, or None: a residual MLP's output bias, or
        MSSA's output bias when the ISTA block is skipped (``ista_mode="none"``).  CRATE's ISTA and the
        overcomplete ISTA replace the tokens through a ReLU (eq. (45)) and CRATE-α's ODL has no bias: None."""
        if self.kind == "mlp":
            return self.mlp[3].bias
        if self.kind == "ista" and self.ista.mode == "none" and getattr(self.attn, "proj", None) is not None:
            return self.attn.proj.bias
        return None

    def forward(
        self,
        x: Tensor,
        return_attention: bool = False,
        cache: dict[str, Tensor] | None = None,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Returns ``(Z_next, Z_half, attention or None)``; ``cache`` and ``key_mask`` as in :meth:`MSSA.forward`."""
        h = self.norm1(x)
        attn = None
        if return_attention:
            m, attn = self.attn(h, return_attention=True)
        else:
            m = self.attn(h, cache=cache, key_mask=key_mask)
        half = (x if self.form == "official" else h) + self.drop_path(m)
        if self.kind == "ista_overcomplete":  # replaces the tokens, as CRATE's ISTA step does
            return self.mlp(self.norm2(half)), half, attn
        if self.kind != "ista":
            return half + self.drop_path(self.mlp(self.norm2(half))), half, attn
        out = half if self.ista.mode == "none" else self.ista(self.norm2(half))
        return out, half, attn


class DecoderLayer(nn.Module):
    """One CRATE decoder layer ``g^ℓ`` (structured diffusion, eqs. (62)-(64), JMLR p.34).

    First undo ISTA with a linear synthesis dictionary ``E``, then undo compression::

        official (CRATE-MAE code):  X_ = E·LN1(X);  X_next = X_ − MSSA(LN2(X_))
        jmlr (Alg. 5, p.112):       X_ = E·LN1(X);  X_next = LN2(X_) − MSSA(LN2(X_))
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        *,
        dropout: float = 0.0,
        form: str = "official",
        scale_scores: bool = True,
    ) -> None:
        super().__init__()
        if form not in LAYER_FORMS:
            raise ValueError(f"unknown layer form {form!r}; choose one of {LAYER_FORMS}")
        self.form = form
        self.norm1 = nn.LayerNorm(dim)
        self.weight = nn.Parameter(torch.empty(dim, dim))  # E, the synthesis dictionary
        nn.init.kaiming_uniform_(self.weight)
        self.norm2 = nn.LayerNorm(dim)
        self.attn = MSSA(dim, heads, dim_head, dropout, scale_scores=scale_scores)

    def forward(self, x: Tensor) -> Tensor:
        x_ = F.linear(self.norm1(x), self.weight)
        h = self.norm2(x_)
        return (x_ if self.form == "official" else h) - self.attn(h)
