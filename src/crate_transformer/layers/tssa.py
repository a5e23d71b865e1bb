"""ToST's linear-time compression step TSSA (Wu et al., ICLR 2025)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..objectives import at_least_float32, full_precision
from ._tssa_functions import _CausalStep, _GlobalStep, _head_sums, _token_sums
from .attention import check_cache
from .config import LayerConfig
from .reference import _TSSA_ENERGY_FLOOR, _TSSA_MASS_EPS


class TSSA(nn.Module):
    """Token statistics self-attention, ToST's compression step (Wu et al., ICLR 2025, §3; App. E Algs. 1-2):
    :func:`tssa_reference` in linear time, then the output projection.

    One projection ``W = [U_1ᵀ; …; U_Kᵀ]`` (``qkv``, with a bias when ``qkv_bias``) maps each token into the
    heads; each token's memberships Π in the heads (:meth:`memberships`) and, per head, the Π-weighted second
    moment of every coordinate over the tokens are computed once, and each token's projection is multiplied by
    ``−Π_jk / (1 + moment)``: a scalar per coordinate instead of a pairwise similarity, so time and memory grow
    linearly with the number of tokens.  This is a gradient step on the variational compression term of
    :func:`~crate_transformer.objectives.variational_coding_rate` (Π held fixed; ``tests/layers/test_tssa.py``
    checks it by autograd), the counterpart of MSSA's step on ``R^c`` (eq. (13)).

    ``causal=True`` is the form of ``tost_lang/model_TSSA.py``: token ``j`` reads running sums over tokens
    ``≤ j`` (prefix sums), plus a learned offset per head and position (``denom_bias``, ``(K, block_size, 1)``)
    in its membership score.  Its key-value cache is three running sums per layer, a constant size however long
    the text (``cache["length"]`` counts the tokens seen).  :meth:`attention_map` gives the ``(b, K, n, n)``
    weights with which token ``j``'s statistics read token ``i`` (``Π_ik / Σ_{i'} Π_i'k`` over the tokens it
    reads: every row the same non-causally): the picture of the memberships that the analysis draws; they are
    built only when asked for.

    ``attn_dropout`` drops entries of the ``1/(1 + moment)`` factor and ``dropout`` the output, as the authors'
    ``attn_drop`` and ``proj_drop`` (``attn_dropout`` / ``resid_dropout``).

    The code here is the operator, differentiated by autograd.  ``memory_saving=True`` (the default) runs the step
    with gradients as an autograd Function of the private :mod:`._tssa_functions` instead, whose backward (derived
    by hand, the same gradients) keeps the projections and per-head statistics where autograd's graph keeps the
    squares and products besides; ``benchmarks/tssa_backward.py`` measures the two (``docs/speed.md``).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        dropout: float = 0.0,
        *,
        attn_dropout: float = 0.0,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        causal: bool = False,
        block_size: int | None = None,
        memory_saving: bool = True,
    ) -> None:
        super().__init__()
        if causal and (block_size is None or block_size < 1):
            raise ValueError(
                f"a causal TSSA needs its context length block_size (a positive integer), got {block_size}"
            )
        self.heads, self.dim_head, self.causal = heads, dim_head, causal
        self.dropout, self.attn_dropout = dropout, attn_dropout
        self.memory_saving = memory_saving  # the step with gradients: a hand-derived backward (class docstring)
        self.qkv = nn.Linear(dim, heads * dim_head, bias=qkv_bias)
        self.temp = nn.Parameter(torch.ones(heads, 1))
        self.denom_bias = nn.Parameter(torch.zeros(heads, block_size, 1)) if causal else None
        self.proj = nn.Linear(heads * dim_head, dim, bias=proj_bias)

    @classmethod
    def from_config(cls, dim: int, heads: int, dim_head: int, c: LayerConfig, *, causal: bool, bias: bool) -> TSSA:
        """TSSA as a CRATE layer's compression step (``attention="tssa"``); the causal form needs the context length
        of its position offsets, which ToST's own language models give (``tost_gpt_*``)."""
        if causal:
            raise ValueError("attention='tssa' builds non-causal layers only; for text use ToST's language models")
        return cls(dim, heads, dim_head, c.dropout, proj_bias=bias)

    def subspaces(self) -> Tensor:
        """The learned bases ``U`` as a ``(K, d, p)`` tensor (as :meth:`MSSA.subspaces`; the bias is not in them)."""
        d = self.qkv.in_features
        return self.qkv.weight.reshape(self.heads, self.dim_head, d).transpose(1, 2)

    def project(self, x: Tensor) -> Tensor:
        """Row tokens ``(b, n, d)`` → the heads' projections ``(b, K, n, p)``."""
        b, n, _ = x.shape
        return self.qkv(x).view(b, n, self.heads, self.dim_head).transpose(1, 2)

    def _scores(self, w: Tensor, cache: dict[str, Any] | None, start: int | Tensor) -> Tensor:
        """The causal form's Π as ``(b, K, n)`` (softmax over the heads) from the projections ``w``."""
        sq = w.square()
        energy = sq.cumsum(-2)
        if cache is not None and "sq" in cache:
            energy = energy + cache["sq"]
        # gathered, not sliced: a start that is a tensor (compiled decoding's position) cannot slice, and a slice's
        # view guards on the length against the context, which torch.export refuses for a dynamic length
        positions = start + torch.arange(w.shape[-2], device=w.device)
        share = (sq / energy.clamp_min(_TSSA_ENERGY_FLOOR) + self.denom_bias.index_select(1, positions)).sum(-1)
        return torch.softmax(share * self.temp, dim=1)

    def memberships(self, x: Tensor) -> Tensor:
        """Π, each token's membership in the heads (the paper's eq. (10); rows sum to 1): ``(b, n, K)``."""
        if not self.causal:
            return _token_statistics(self.qkv(x), self.temp, self.heads)[3].to(x.dtype)
        return self._scores(self.project(x), None, 0).transpose(1, 2)

    def _moments(self, w: Tensor, pi: Tensor, cache: dict[str, Any] | None) -> Tensor:
        """The causal form's Π-weighted second moments each token reads, ``(b, K, n, p)``; running sums kept in
        ``cache``."""
        sq = w.square()
        num, mass = (sq * pi.unsqueeze(-1)).cumsum(-2), pi.cumsum(-1)
        if cache is not None:
            if "sq" in cache:
                num, mass = num + cache["wsq"], mass + cache["pi"]
                cache["sq"] = cache["sq"] + sq.sum(-2, keepdim=True)
            else:
                cache["sq"] = sq.sum(-2, keepdim=True)
            cache["wsq"], cache["pi"] = num[..., -1:, :], mass[..., -1:]
        return num / (mass + _TSSA_MASS_EPS).unsqueeze(-1)

    def _attention(self, pi: Tensor) -> Tensor:
        """``(b, K, n, n)``: row ``j`` holds the weights ``Π_ik / Σ_{i'} Π_i'k`` of the tokens ``i`` it reads."""
        n = pi.shape[-1]
        if not self.causal:
            return (pi / (pi.sum(-1, keepdim=True) + _TSSA_MASS_EPS)).unsqueeze(-2).expand(*pi.shape[:-1], n, n)
        mask = torch.ones(n, n, dtype=torch.bool, device=pi.device).tril()
        rows = pi.unsqueeze(-2) * mask
        return rows / (pi.cumsum(-1) + _TSSA_MASS_EPS).unsqueeze(-1)

    def forward(self, x: Tensor, cache: dict[str, Any] | None = None, key_mask: Tensor | None = None) -> Tensor:
        """``x`` (b, n, d) → (b, n, d).  ``cache`` (causal only): this layer's running sums, ``x`` the newest tokens.
        ``key_mask`` is refused unless None: padding would enter the statistics every token reads."""
        if key_mask is not None:
            raise ValueError("TSSA has no padding mask (every token enters the token statistics); pad on the right")
        check_cache(cache, self.causal, "TSSA")
        if not self.causal:
            return F.dropout(self._global(x)[0], self.dropout, self.training)
        b, n, _ = x.shape
        start = 0 if cache is None else cache.get("length", 0)
        # a tensor start is compiled decoding's position, whose length was checked before decoding began
        if not isinstance(start, Tensor) and start + n > self.denom_bias.shape[1]:
            raise ValueError(f"{start + n} tokens exceed the context of {self.denom_bias.shape[1]} (block_size)")
        return F.dropout(self._causal(x, cache, start)[0], self.dropout, self.training)

    def attention_map(self, x: Tensor) -> Tensor:
        """``(b, K, n, n)``: the weights with which each token's statistics read every token (class docstring)."""
        return self._attention(self.memberships(x).transpose(1, 2))

    def _causal(self, x: Tensor, cache: dict[str, Any] | None, start: int | Tensor) -> tuple[Tensor, Tensor]:
        """The causal form: the projected output ``(b, n, d)`` and Π ``(b, K, n)``: running sums of the squares
        (each token's share of the energies, :meth:`_scores`) and of the Π-weighted squares (:meth:`_moments`).
        Training without a cache with ``memory_saving`` is a ``_CausalStep``, whose backward keeps only the
        projections and Π."""
        if cache is None and torch.is_grad_enabled() and self.memory_saving:
            y = self.qkv(x)
            bias = (self.denom_bias, self.proj.weight, self.proj.bias)
            out, pi = _CausalStep.apply(y, self.temp, *bias, self.heads, self.attn_dropout, self.training)
            return out, pi.to(y.dtype).transpose(1, 2)
        b, n, _ = x.shape
        w = self.project(x)
        pi = self._scores(w, cache, start)
        shrink = F.dropout(1.0 / (1.0 + self._moments(w, pi, cache)), self.attn_dropout, self.training)
        if cache is not None:
            cache["length"] = start + n
        return self.proj((-(w * pi.unsqueeze(-1)) * shrink).transpose(1, 2).reshape(b, n, -1)), pi

    def _global(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The non-causal form: the projected output ``(b, n, d)`` and Π ``(b, K, n)`` (:func:`_global_step`).
        With gradients and ``memory_saving`` a ``_GlobalStep``, whose backward keeps only the projections and
        per-head statistics."""
        y = self.qkv(x)
        args = (y, self.temp, self.proj.weight, self.proj.bias, self.heads, self.attn_dropout, self.training)
        if torch.is_grad_enabled() and self.memory_saving:
            out, pi = _GlobalStep.apply(_global_step, *args)
        else:
            out, pi = _global_step(*args)[:2]
        return out, pi.to(y.dtype).transpose(1, 2)


# --------------------------------------------------------------------------- the non-causal step
def _token_statistics(y: Tensor, temp: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The non-causal form's token statistics from the projections ``y`` ``(b, n, K·p)``: their squares, the
    energies ``Σ_i w_ki²`` ``(b, 1, K·p)``, the membership scores and Π ``(b, n, K)`` (eq. (10)) and the
    Π-weighted second moments ``(b, K·p)``, in float32 for half projections.

    Each statistic is a pass over the squares in their ``(b, n, K·p)`` layout: a coordinate's energy is a sum
    over the tokens, the membership scores ``Σ_i w_kji² / energy_ki`` a scaled sum per head, the Π-weighted
    moments a Π-weighted sum over the tokens (``_token_sums``).  No ``(b, K, n, p)`` copy of the projections is
    made: few passes over few temporaries (``benchmarks/bench_tost.py``)."""
    b, n, D = y.shape
    with full_precision(y):
        sq = at_least_float32(y).square()
        energy = sq.sum(1, keepdim=True)
        # F.normalize's floor on the norm, as the authors' code: max(‖w‖, 1e-12)² = max(‖w‖², 1e-24)
        share = _head_sums(sq, 1.0 / energy.clamp_min(_TSSA_ENERGY_FLOOR**2).view(b, D), heads)
        pi = torch.softmax(share * temp.view(1, 1, heads).to(sq.dtype), dim=-1)
        num = _token_sums(pi, sq, heads)
        mass = (pi.sum(1) + _TSSA_MASS_EPS).repeat_interleave(D // heads, dim=-1)
    return sq, energy, share, pi, num / mass


def _global_step(
    y: Tensor, temp: Tensor, weight: Tensor, bias: Tensor | None, heads: int, attn_dropout: float, training: bool
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """TSSA's non-causal output ``W (−Π_jk w_j ⊙ shrink) + bias`` from the projections ``y``, with Π and the
    statistics the memory-saving backward needs: the energies, the membership scores, the moments and the factors
    ``shrink = dropout(1 / (1 + moment))`` ``(b, K·p)``.

    For one sample the factor is folded into the output projection's weight (a ``(d, K·p)`` product instead of an
    ``(n, K·p)`` one).  Without a graph to keep (inference, or inside the memory-saving Function) the product
    ``Π ⊙ w`` reuses the squares' memory and is scaled in place; with one, autograd differentiates it as written.
    So is a traced export: an exported program is run with gradients on or off whatever the mode it was traced
    in, and autograd refuses the ``out=`` product where an input requires a gradient."""
    b, n, D = y.shape
    sq, energy, share, pi, moment = _token_statistics(y, temp, heads)
    shrink = F.dropout(1.0 / (1.0 + moment), attn_dropout, training)
    y4, pi4 = y.view(b, n, heads, D // heads), pi.to(y.dtype).unsqueeze(-1)
    graph = (torch.is_grad_enabled() and (y.requires_grad or temp.requires_grad)) or torch.compiler.is_exporting()
    in_place = sq.dtype == y.dtype and not graph
    z = (torch.mul(y4, pi4, out=sq.view_as(y4)) if in_place else y4 * pi4).view(b, n, D)
    factor = -shrink.to(y.dtype)
    if statically_known_true(b == 1):  # not a guard on a batch size that torch.export keeps dynamic
        out = F.linear(z, weight * factor, bias)
    else:
        out = F.linear(z * factor.unsqueeze(1) if graph else z.mul_(factor.unsqueeze(1)), weight, bias)
    return out, pi, (energy, share, moment, shrink)
