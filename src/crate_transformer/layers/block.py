"""CRATE's layers: the encoder layer (eq. (45)) built of a compression and a sparsification block chosen from two
tables, the decoder layer (eqs. (62)-(64)), stochastic depth, and the trace of a layer's intermediate tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config_utils import Range
from ..objectives import autocast_on, full_precision
from . import _hook_state
from .attention import MHSA, MSSA
from .config import ATTENTION_NAMES, ISTA_MODES, LAYER_FORMS, MLPS, LayerConfig
from .hooks import HookPoint, Site, attention_sites, code_site
from .sparse import ISTA, MLP, MMISTA, OvercompleteISTA, Skip, SoftISTA, TiedOvercompleteISTA
from .tssa import TSSA

# the layer's first block, by LayerConfig.attention (as timm's ATTN_LAYERS, HF GPT-2's GPT2_ATTENTION_CLASSES)
ATTENTIONS: dict[str, type[nn.Module]] = {"mssa": MSSA, "mhsa": MHSA, "tssa": TSSA}
# the layer's second block, by LayerConfig.second_block: LayerConfig.mlp, or for mlp="ista" an ablation of eq. (44)
# by its ista_mode (JMLR Tables 13 and 15: "ista_soft", "ista_mm", and "none" for no sparsification)
SECOND_BLOCKS: dict[str, type[nn.Module]] = {
    "ista": ISTA,
    "ista_soft": SoftISTA,
    "ista_mm": MMISTA,
    "mlp": MLP,
    "odl": OvercompleteISTA,
    "ista_overcomplete": TiedOvercompleteISTA,
    "none": Skip,
}
# the entries LayerConfig.second_block names for ista_mode (chosen by that option, not by mlp)
_MODE_BLOCKS = ("ista_soft", "ista_mm", "none")
assert tuple(ATTENTIONS) == ATTENTION_NAMES and set(MLPS) | set(_MODE_BLOCKS) <= set(SECOND_BLOCKS)


def _pick(table: Mapping[str, type[nn.Module]], name: str, field: str) -> type[nn.Module]:
    if name not in table:
        raise ValueError(f"unknown {field} {name!r}; choose one of {tuple(k for k in table if k not in _MODE_BLOCKS)}")
    return table[name]


def _settings(config: LayerConfig | None, fields: dict[str, Any]) -> LayerConfig:
    """The layer's settings: ``config`` (default: CRATE's) with ``fields`` replacing its fields, checked."""
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(LayerConfig)})
    if unknown:
        raise ValueError(f"EncoderLayer has no setting {unknown[0]!r}; the settings are LayerConfig's fields")
    c = dataclasses.replace(config or LayerConfig(), **fields)
    if c.layer_form not in LAYER_FORMS:
        raise ValueError(f"unknown layer_form {c.layer_form!r}; choose one of {LAYER_FORMS}")
    if c.ista_mode not in ISTA_MODES:
        raise ValueError(f"unknown ista_mode {c.ista_mode!r}; choose one of {ISTA_MODES}")
    return c


def _given(module: nn.Module | None, cls: type[nn.Module], arg: str, name: str) -> nn.Module | None:
    """A block the caller built (a family whose block takes settings LayerConfig does not hold), checked to be the
    class the layer's table has for ``name``."""
    if module is not None and not isinstance(module, cls):
        raise ValueError(f"{arg} is a {type(module).__name__}, but the layer's {name!r} is {cls.__name__}; build that")
    return module


# --------------------------------------------------------------------------- the layer's norms
class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that normalises the tokens in the precision they arrive in, under autocast as well.

    CRATE's layer replaces its tokens by the sparse code (eq. (44)), so under bf16 autocast the tokens between layers
    are bf16.  CUDA's autocast runs ``layer_norm`` in float32: it casts the tokens in, writes a float32 result and the
    next matrix product casts it back, three passes over the tokens (and a float32 copy kept for the backward) where
    one pass in bf16 computes the same normalisation (the kernel accumulates in float32; γ and β are cast as
    autocast casts a product's weights).  Tokens in float32 (a ViT's residual stream) are normalised as before.
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype in (torch.float32, torch.float64) or not autocast_on(x):
            return super().forward(x)
        weight, bias = (None if p is None else p.to(x.dtype) for p in (self.weight, self.bias))
        with full_precision(x):  # autocast off: the norm in the tokens' dtype
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


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
class EncoderLayer(nn.Module):
    """One CRATE layer ``f^ℓ`` (eq. (45), JMLR p.25): compression, then sparsification::

        Z_half = Z + MSSA(LN1(Z))        (layer_form="official": the official code, NeurIPS Alg. 2)
        Z_half = LN1(Z) + MSSA(LN1(Z))   (layer_form="jmlr": JMLR Alg. 4, p.111)
        Z_next = ISTA(LN2(Z_half))

    The two blocks are picked once, when the layer is built, from :data:`ATTENTIONS` (``config.attention``) and
    :data:`SECOND_BLOCKS` (``config.second_block``: ``mlp``, or an ablation of ISTA by ``ista_mode``), and each
    builds itself from the :class:`LayerConfig` given whole.  Each
    second block declares (:class:`~crate_transformer.layers.sparse.SecondBlock`) whether it adds to its input —
    ``Z_next = Z_half + f(LN2(Z_half))``: the GELU :class:`MLP` (CRATE-MLP, Table 17; with ``attention="mhsa"``
    the ViT block), CRATE-α's :class:`OvercompleteISTA` — or replaces it as CRATE's :class:`ISTA` does (and the
    crate-lm :class:`TiedOvercompleteISTA`), and the attribute it is stored under (``ista`` or ``mlp``), so the
    state-dict keys are the released ones.  ``ista_mode="none"`` (Table 15) is :class:`Skip`: ``Z_next = Z_half``.

    ``drop_path`` (stochastic depth, :class:`DropPath`) drops the residual branches per sample in training: the
    attention's update and, where the second block adds to its input, its update.  ``causal`` is a language model's
    mask (eqs. (86)-(87)).  The settings come as a :class:`LayerConfig` (default: CRATE's), or as its fields by
    keyword (``EncoderLayer(64, 4, 16, mlp="odl")``), or both (the keywords win).

    What the model says of its layer, not its blocks: the LayerNorms' eps (``norm_eps``, default
    :attr:`LayerConfig.ln_eps`) and bias (``norm_bias``), the attention's output bias
    (:attr:`LayerConfig.attention_bias`), and ``layer_scale`` (LayerScale, CaiT and ToST; off by default: no
    parameters) — learned per-channel scales ``γ1, γ2`` initialised to it on both residual branches,
    ``Z_half = Z + γ1 ⊙ Attn(LN1(Z))``, ``Z_next = Z_half + γ2 ⊙ f(LN2(Z_half))``.  A family whose block takes
    settings a :class:`LayerConfig` does not hold gives it built (``attn``, ``block``: ToST's TSSA with its qkv
    bias, attention dropout and causal context), of the class the tables name.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        config: LayerConfig | None = None,
        *,
        causal: bool = False,
        drop_path: float = 0.0,
        norm_eps: float | None = None,
        norm_bias: bool = True,
        layer_scale: float | None = None,
        attn: nn.Module | None = None,
        block: nn.Module | None = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        c = _settings(config, fields)
        Attention = _pick(ATTENTIONS, c.attention, "attention")
        Block = _pick(SECOND_BLOCKS, c.second_block, "mlp")
        if layer_scale is not None and not Block.residual:
            raise ValueError(f"layer_scale scales residual branches, but {Block.__name__} replaces the tokens")
        eps = c.ln_eps if norm_eps is None else norm_eps
        self.norm1 = LayerNorm(dim, eps=eps, bias=norm_bias)
        attn = _given(attn, Attention, "attn", c.attention)
        self.attn = attn or Attention.from_config(dim, heads, dim_head, c, causal=causal, bias=c.attention_bias)
        self.norm2 = LayerNorm(dim, eps=eps, bias=norm_bias) if Block.normed else nn.Identity()
        self.add_module(Block.state_key, _given(block, Block, "block", c.second_block) or Block.from_config(dim, c))
        self.gamma1 = self.gamma2 = None  # LayerScale (CaiT, ToST): per-channel scales of the residual branches
        if layer_scale is not None:
            self.gamma1 = nn.Parameter(torch.full((dim,), float(layer_scale)))
            self.gamma2 = nn.Parameter(torch.full((dim,), float(layer_scale)))
        self.drop_path = DropPath(drop_path)  # no parameters: state dicts are unchanged
        self.z_half = HookPoint()  # Z^{ℓ+1/2}, where hooks read and replace it (hook_sites); no parameters either
        self.block_key, self.skip_from_norm, self.config = Block.state_key, c.layer_form == "jmlr", c
        if getattr(Block, "obsolete", ()):
            self.register_load_state_dict_pre_hook(_drop_obsolete)

    @classmethod
    def from_config(cls, c: Any, **overrides: Any) -> EncoderLayer:
        """The layer a model config describes: ``dim``, ``heads``, ``head_dim`` and its
        :meth:`LayerConfig.layer_config`; ``overrides`` (``causal``, ``drop_path``) as the constructor's keywords."""
        if not isinstance(c, LayerConfig):
            raise ValueError(f"{type(c).__name__} has no layer settings; a config of CRATE layers extends LayerConfig")
        return cls(c.dim, c.heads, c.head_dim, c.layer_config(), **overrides)

    @property
    def block(self) -> nn.Module:
        """The second block (ISTA, MLP, overcomplete ISTA, Skip), stored under its own ``state_key``."""
        return self._modules[self.block_key]

    @property
    def form(self) -> str:
        """``"official"`` or ``"jmlr"`` (``layer_form``), fixed when the layer is built."""
        return "jmlr" if self.skip_from_norm else "official"

    def forward(self, x: Tensor, cache: dict[str, Tensor] | None = None, key_mask: Tensor | None = None) -> Tensor:
        _hook_state.guard()  # a compiled graph is guarded on the hooks attached (_hook_state's docstring)
        h = self.norm1(x)
        update = self.attn(h, cache=cache, key_mask=key_mask)
        half = self.z_half(
            (h if self.skip_from_norm else x) + self.drop_path(update if self.gamma1 is None else self.gamma1 * update)
        )
        out = self.block(self.norm2(half))
        if not self.block.residual:
            return out
        return half + self.drop_path(out if self.gamma2 is None else self.gamma2 * out)

    def code_site(self) -> tuple[nn.Module, str] | None:
        """Where this layer's sparse code (or its MLP's units) is read: ``(module, unit kind)``, None without one
        (``ista_mode="none"``)."""
        return self.block.code_site()

    def hook_sites(self) -> dict[str, Site]:
        """The layer's named values, in the order they are formed (``model.hook_names()`` prefixes
        ``layers.{i}.``): ``z_in`` (its input Z^ℓ), ``attn.*`` (:func:`.hooks.attention_sites`), ``z_half``
        (Z^{ℓ+1/2}), ``code`` (ISTA's sparse code Z^{ℓ+1}, eq. (44); the overcomplete code A2) or ``mlp.hidden``
        (an MLP's GELU units), and ``z_out`` (the layer's output)."""
        sites = {"z_in": Site(self, "input")}
        sites.update({f"attn.{name}": site for name, site in attention_sites(self.attn).items()})
        sites["z_half"] = Site(self.z_half)
        found = self.code_site()
        if found is not None:
            sites["mlp.hidden" if found[1] == "mlp" else "code"] = code_site(*found)
        sites["z_out"] = Site(self)
        return sites

    def output_bias(self) -> Tensor | None:
        """The bias this layer adds unchanged to every output token, or None: a residual MLP's output bias, or
        the attention's output bias when the second block is skipped (``ista_mode="none"``).  CRATE's ISTA and the
        overcomplete ISTA replace the tokens through a ReLU (eq. (45)) and CRATE-α's ODL has no bias: None."""
        if self.gamma2 is not None:
            return None  # the bias is scaled by γ2 (layer scale), not added unchanged
        proj = getattr(self.attn, "proj", None)
        return self.block.output_bias(proj.bias if proj is not None else None)

    def obsolete_keys(self) -> tuple[str, ...]:
        """Keys earlier versions saved for this layer that it no longer has (dropped on load)."""
        return getattr(self.block, "obsolete", ())


def _drop_obsolete(module: EncoderLayer, state: dict, prefix: str, *_: Any) -> None:
    for key in module.obsolete_keys():
        state.pop(prefix + key, None)


def trace_layer(layer: nn.Module, x: Tensor, return_attention: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(Z_next, Z_half, attention or None)`` of one pass of ``layer`` (an :class:`EncoderLayer` or any layer
    with ``attn`` and ``norm2``): ``Z_half`` is what the second block's LayerNorm reads, the attention the
    ``(b, K, n, n)`` map of the layer's attention (its ``attention_map`` of what it reads).  The layer's own
    forward runs unchanged; the two are recorded by hooks for this call only."""
    seen: dict[str, Tensor] = {}

    def record(name: str, of: Any = None) -> Any:  # a pre-hook: returns None, so the layer's input is unchanged
        return lambda module, args: seen.__setitem__(name, of(module, args[0]) if of else args[0])

    hooks = [layer.norm2.register_forward_pre_hook(record("half"))]
    if return_attention:
        hooks.append(layer.attn.register_forward_pre_hook(record("attention", lambda m, h: m.attention_map(h))))
    try:
        out = layer(x)
    finally:
        for hook in hooks:
            hook.remove()
    return out, seen["half"], seen.get("attention")


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
        self.skip_from_norm = form == "jmlr"
        self.norm1 = LayerNorm(dim)
        self.weight = nn.Parameter(torch.empty(dim, dim))  # E, the synthesis dictionary
        nn.init.kaiming_uniform_(self.weight)
        self.norm2 = LayerNorm(dim)
        self.attn = MSSA(dim, heads, dim_head, dropout, scale_scores=scale_scores)
        self.z_half = HookPoint()  # X_ = E·LN1(X), where hooks read and replace it (hook_sites)

    @property
    def form(self) -> str:
        """``"official"`` or ``"jmlr"`` (``layer_form``), fixed when the layer is built."""
        return "jmlr" if self.skip_from_norm else "official"

    def forward(self, x: Tensor) -> Tensor:
        _hook_state.guard()  # a compiled graph is guarded on the hooks attached (_hook_state's docstring)
        x_ = self.z_half(F.linear(self.norm1(x), self.weight))
        h = self.norm2(x_)
        return (h if self.skip_from_norm else x_) - self.attn(h)

    def hook_sites(self) -> dict[str, Site]:
        """``z_in`` (X), ``z_half`` (``X_ = E·LN1(X)``, ISTA undone, eq. (62)), ``attn.*`` (the MSSA undone,
        eq. (63)) and ``z_out``, in the order they are formed."""
        sites = {"z_in": Site(self, "input"), "z_half": Site(self.z_half)}
        sites.update({f"attn.{name}": site for name, site in attention_sites(self.attn).items()})
        sites["z_out"] = Site(self)
        return sites
