"""ToST's linear-time compression step TSSA (Wu et al., ICLR 2025)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..objectives import at_least_float32, full_precision
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
    ) -> None:
        super().__init__()
        if causal and (block_size is None or block_size < 1):
            raise ValueError(
                f"a causal TSSA needs its context length block_size (a positive integer), got {block_size}"
            )
        self.heads, self.dim_head, self.causal = heads, dim_head, causal
        self.dropout, self.attn_dropout = dropout, attn_dropout
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
        """The causal form: the projected output ``(b, n, d)`` and Π ``(b, K, n)``.  Training without a cache is a
        :class:`_CausalStep`, whose backward keeps only the projections and Π."""
        if cache is None and torch.is_grad_enabled():
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
        With gradients a :class:`_GlobalStep`, whose backward keeps only the projections and per-head statistics."""
        y = self.qkv(x)
        args = (y, self.temp, self.proj.weight, self.proj.bias, self.heads, self.attn_dropout, self.training)
        out, pi = _GlobalStep.apply(*args) if torch.is_grad_enabled() else _global_step(*args)[:2]
        return out, pi.to(y.dtype).transpose(1, 2)


# --------------------------------------------------------------------------- the non-causal step and its backward
def _head_sums(t: Tensor, v: Tensor, heads: int) -> Tensor:
    """``(b, n, K·p)`` and ``(b, K·p)`` → ``(b, n, K)``: ``Σ_{c in head k} t_jc v_c``."""
    b, n, D = t.shape
    return (t.view(b, n, heads, D // heads) * v.view(b, 1, heads, -1)).sum(-1)


def _outer(pi: Tensor, v: Tensor, heads: int) -> Tensor:
    """``(b, n, K)`` and ``(b, K·p)`` → ``(b, n, K·p)``: ``Π_jk v_c`` for each coordinate ``c`` of head ``k``."""
    b, n, _ = pi.shape
    return (pi.unsqueeze(-1) * v.view(b, 1, heads, -1)).view(b, n, -1)


def _product(t: Tensor, u: Tensor) -> Tensor:
    """``t ⊙ u`` in float32 for a half ``t`` (its one float32 copy multiplied in place: a mixed-dtype product
    promotes ``u`` on the fly), else ``t * u``."""
    f = at_least_float32(t)
    return f.mul_(u) if f is not t else t * u


def _token_sums(pi: Tensor, t: Tensor, heads: int) -> Tensor:
    """``(b, n, K)`` and ``(b, n, K·p)`` → ``(b, K·p)``: ``Σ_j Π_jk t_jc`` for each coordinate ``c`` of head ``k``.

    Eager, the diagonal blocks of one product ``Πᵀ · t`` (a GEMM, no ``(b, n, K·p)`` temporary); under
    torch.compile, the product and sum over the tokens, which inductor fuses with the kernel that makes ``t``, where
    a GEMM would be an extern call it cannot fuse (``benchmarks/attention_kernels.py`` counts the kernels)."""
    b, n, D = t.shape
    if torch.compiler.is_compiling():
        return (t.view(b, n, heads, D // heads) * pi.unsqueeze(-1)).sum(1).view(b, D)
    m = pi.transpose(1, 2) @ t
    return m.view(b, heads, heads, D // heads).diagonal(dim1=1, dim2=2).transpose(1, 2).reshape(b, D)


def _token_statistics(y: Tensor, temp: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The non-causal form's token statistics from the projections ``y`` ``(b, n, K·p)``: their squares, the
    energies ``Σ_i w_ki²`` ``(b, 1, K·p)``, the membership scores and Π ``(b, n, K)`` (eq. (10)) and the
    Π-weighted second moments ``(b, K·p)``, in float32 for half projections.

    Each statistic is a pass over the squares in their ``(b, n, K·p)`` layout: a coordinate's energy is a sum
    over the tokens, the membership scores ``Σ_i w_kji² / energy_ki`` a scaled sum per head, the Π-weighted
    moments a Π-weighted sum over the tokens (:func:`_token_sums`).  No ``(b, K, n, p)`` copy of the projections is
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
    statistics the backward needs: the energies, the membership scores, the moments and the factors
    ``shrink = dropout(1 / (1 + moment))`` ``(b, K·p)``.

    The product ``Π ⊙ w`` reuses the squares' memory (not needed after the statistics); for one sample the factor
    is folded into the output projection's weight (a ``(d, K·p)`` product instead of an ``(n, K·p)`` one)."""
    b, n, D = y.shape
    sq, energy, share, pi, moment = _token_statistics(y, temp, heads)
    shrink = F.dropout(1.0 / (1.0 + moment), attn_dropout, training)
    y4, pi4 = y.view(b, n, heads, D // heads), pi.to(y.dtype).unsqueeze(-1)
    in_place = sq.dtype == y.dtype
    z = (torch.mul(y4, pi4, out=sq.view_as(y4)) if in_place else y4 * pi4).view(b, n, D)
    factor = -shrink.to(y.dtype)
    if statically_known_true(b == 1):  # not a guard on a batch size that torch.export keeps dynamic
        out = F.linear(z, weight * factor, bias)
    else:
        out = F.linear(z.mul_(factor.unsqueeze(1)), weight, bias)
    return out, pi, (energy, share, moment, shrink)


class _GlobalStep(torch.autograd.Function):
    """:func:`_global_step` whose backward keeps the projections ``y`` and per-head statistics (Π and the scores
    ``(b, n, K)``, ``(b, K·p)`` energies, moments and factors) and recomputes the squares and the product
    ``Π ⊙ w ⊙ shrink``: autograd's own graph of the step would keep the squares (float32 for half projections),
    that product and its scaled copy, 1.7-2.6x the bytes MSSA's flash attention keeps
    (``tests/layers/test_tssa.py``)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, y: Tensor, temp: Tensor, weight: Tensor, bias: Tensor | None, heads: int, p: float, training: bool
    ) -> tuple[Tensor, Tensor]:
        out, pi, stats = _global_step(y, temp, weight, bias, heads, p, training)
        ctx.heads = heads
        ctx.save_for_backward(y, temp, weight, pi, *stats)
        return out, pi

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, grad_pi: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        y, temp, weight, pi, energy, share, moment, shrink = ctx.saved_tensors
        with full_precision(y):
            grad_w, grad_b, dz = _output_grads(grad_out, y, pi, shrink, weight, ctx.heads, ctx.needs_input_grad[3])
            stats = (energy, share, pi, moment, shrink)
            dy, grad_temp = _statistics_grads(dz, y, temp, stats, grad_pi, ctx.heads)
        return dy.to(y.dtype), grad_temp.view_as(temp), grad_w, grad_b, None, None, None


def _output_grads(
    grad_out: Tensor, y: Tensor, pi: Tensor, shrink: Tensor, weight: Tensor, heads: int, with_bias: bool
) -> tuple[Tensor, Tensor | None, Tensor]:
    """The output projection's gradients (weight, bias) and the gradient of its input ``z = −Π ⊙ w ⊙ shrink``,
    the product recomputed from the kept projections, in their dtype."""
    b, n, D = y.shape
    g = grad_out.reshape(b * n, -1).to(y.dtype)
    z = y * _outer(pi.to(y.dtype), -shrink.to(y.dtype), heads)
    grad_w = g.t() @ z.view(b * n, D)
    del z
    return grad_w, g.sum(0) if with_bias else None, (g @ weight.to(y.dtype)).view(b, n, D)


def _statistics_grads(
    dz: Tensor,
    y: Tensor,
    temp: Tensor,
    stats: tuple[Tensor, ...],
    grad_pi: Tensor | None,
    heads: int,
) -> tuple[Tensor, Tensor]:
    """The gradients of the projections ``y`` and the temperature through :func:`_token_statistics` and the
    product ``z = −Π_jk w_j ⊙ shrink``, given ``dz``; the squares recomputed, per-head sums as products with
    :func:`_head_sums`, :func:`_outer` and :func:`_token_sums` (float32 for half projections)."""
    b, n, D = y.shape
    energy, share, pi, moment, shrink = stats
    # half projections: float32 copies made one at a time and worked on in place (mixed-dtype products promote
    # on the fly), so the backward holds at most two float32 tensors of the projections' size at once
    a = _product(dz, y)
    d_shrink = -_token_sums(pi, a, heads)
    d_pi = _head_sums(a, -shrink, heads)
    del a
    # shrink = mask / (1 + moment): d shrink / d moment = −shrink / (1 + moment)
    d_moment = -d_shrink * shrink / (1.0 + moment)
    mass = (pi.sum(1) + _TSSA_MASS_EPS).repeat_interleave(D // heads, dim=-1)
    d_num = d_moment / mass  # moment = num / mass
    d_pi = d_pi + (-(d_moment * moment / mass).view(b, heads, -1).sum(-1)).unsqueeze(1)
    sq = _product(y, y)
    d_pi = d_pi + _head_sums(sq, d_num, heads)
    if grad_pi is not None:
        d_pi = d_pi + grad_pi
    inv = 1.0 / energy.clamp_min(_TSSA_ENERGY_FLOOR**2).view(b, D)
    d_logit = pi * (d_pi - (d_pi * pi).sum(-1, keepdim=True))
    grad_temp = (share * d_logit).sum((0, 1))
    d_share = d_logit * temp.view(1, 1, heads).to(d_logit.dtype)
    d_inv = _token_sums(d_share, sq, heads)
    del sq
    d_energy = -d_inv * inv.square() * (energy.view(b, D) >= _TSSA_ENERGY_FLOOR**2)
    # dy = 2 y (d_share_k inv_c + Π_k d_num_c + d_energy_c) − dz Π_k shrink_c
    dy = torch.addcmul((2 * d_energy).view(b, 1, heads, -1), d_share.unsqueeze(-1), (2 * inv).view(b, 1, heads, -1))
    dy = dy.addcmul_(pi.unsqueeze(-1), (2 * d_num).view(b, 1, heads, -1)).view(b, n, D).mul_(y)
    return dy.addcmul_(dz, _outer(pi, -shrink, heads)), grad_temp


# --------------------------------------------------------------------------- the causal step and its backward
def _reverse_cumsum(t: Tensor) -> Tensor:
    """``Σ_{j' ≥ j} t_j'`` along the tokens (dim 1): the backward of a prefix sum."""
    return t.flip(1).cumsum(1).flip(1)


def _causal_scores(y4: Tensor, temp: Tensor, denom_bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The causal form's squares of the projections ``y4`` ``(b, n, K, p)`` (float32 for half), membership
    scores and Π ``(b, n, K)``: each token's share of the running energies, plus its position's offset."""
    sq = at_least_float32(y4).square()
    # gathered, not sliced: a slice's view guards on the length against the context (see _scores)
    bias = denom_bias.index_select(1, torch.arange(y4.shape[1], device=y4.device))[..., 0].t().to(sq.dtype)
    share = (sq / sq.cumsum(1).clamp_min(_TSSA_ENERGY_FLOOR)).sum(-1) + y4.shape[-1] * bias
    return sq, share, torch.softmax(share * temp.view(1, 1, -1).to(sq.dtype), dim=-1)


def _causal_moments(sq: Tensor, pi: Tensor, keep: Tensor | None, p: float) -> tuple[Tensor, ...]:
    """The running masses ``(b, n, K)`` and Π-weighted moments each token reads, the factors ``1 / (1 + moment)``
    and the factors after dropout (``keep``: its kept entries, None without dropout)."""
    mass = pi.cumsum(1) + _TSSA_MASS_EPS
    moment = (sq * pi.unsqueeze(-1)).cumsum(1).div_(mass.unsqueeze(-1))
    factor = 1.0 / (1.0 + moment)
    return mass, moment, factor, factor if keep is None else factor * keep / (1.0 - p)


class _CausalStep(torch.autograd.Function):
    """The causal form's step, ``W (−Π_jk w_j ⊙ shrink_j) + bias`` with running statistics, whose backward keeps the
    projections, Π and the scores ``(b, n, K)`` (and the dropout's mask) and recomputes the running sums:
    autograd's own graph kept six tensors of the projections' size besides."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        y: Tensor,
        temp: Tensor,
        denom_bias: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        heads: int,
        p: float,
        training: bool,
    ) -> tuple[Tensor, Tensor]:
        b, n, D = y.shape
        y4 = y.view(b, n, heads, D // heads)
        # the kept entries drawn as F.dropout draws them on the (b, K, n, p) factors of the cached form
        keep = None
        if training and p > 0:
            keep = (F.dropout(y.new_ones(b, heads, n, D // heads), p, True) != 0).transpose(1, 2)
        with full_precision(y):
            sq, share, pi = _causal_scores(y4, temp, denom_bias)
            shrink = _causal_moments(sq, pi, keep, p)[-1]
            del sq
            z = (y4 * pi.to(y.dtype).unsqueeze(-1)).mul_(shrink.to(y.dtype)).neg_().view(b, n, D)
        ctx.heads, ctx.p = heads, p
        ctx.save_for_backward(y, temp, denom_bias, weight, share, pi, keep)
        return F.linear(z, weight, bias), pi

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, grad_pi: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        y, temp, denom_bias, weight, share, pi, keep = ctx.saved_tensors
        b, n, D = y.shape
        y4 = y.view(b, n, ctx.heads, D // ctx.heads)
        with full_precision(y):
            sq = _product(y4, y4)
            mass, moment, factor, shrink = _causal_moments(sq, pi, keep, ctx.p)
            g = grad_out.reshape(b * n, -1).to(y.dtype)
            z = (y4 * pi.to(y.dtype).unsqueeze(-1)).mul_(shrink.to(y.dtype)).neg_().view(b * n, D)
            grad_w, grad_b = g.t() @ z, g.sum(0) if ctx.needs_input_grad[4] else None
            del z
            dz = at_least_float32((g @ weight.to(y.dtype)).view(y4.shape))
            stats = (sq, share, pi, mass, moment, factor, shrink)
            dy, grad_temp, d_share = _causal_grads(dz, y4, temp, stats, grad_pi)
        positions = torch.arange(n, device=y.device)
        d_bias = (y4.shape[-1] * d_share.sum(0)).t().unsqueeze(-1).to(denom_bias.dtype)  # (K, n, 1)
        grad_bias = torch.zeros_like(denom_bias).index_add_(1, positions, d_bias)
        return dy.view(b, n, D).to(y.dtype), grad_temp.view_as(temp), grad_bias, grad_w, grad_b, None, None, None


def _causal_grads(
    dz: Tensor, y4: Tensor, temp: Tensor, stats: tuple[Tensor, ...], grad_pi: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of the projections, the temperature and the membership scores through the causal form's
    running statistics and ``z = −Π_jk w_j ⊙ shrink_j``, given ``dz`` ``(b, n, K, p)``."""
    sq, share, pi, mass, moment, factor, shrink = stats
    pi4 = pi.unsqueeze(-1)
    a = dz * y4
    d_pi = -(a * shrink).sum(-1)
    # z = −w Π shrink and shrink = keep / (1 + moment): d moment = a Π shrink / (1 + moment)
    d_moment = a.mul_(pi4).mul_(shrink).mul_(factor)
    # moment = num / mass, num and mass running sums: their backward a sum over the later tokens
    d_pi = d_pi + _reverse_cumsum(-(d_moment * moment).sum(-1) / mass)
    d_num = _reverse_cumsum(d_moment.div_(mass.unsqueeze(-1)))
    d_pi = d_pi + (d_num * sq).sum(-1)
    if grad_pi is not None:
        d_pi = d_pi + grad_pi
    d_logit = pi * (d_pi - (d_pi * pi).sum(-1, keepdim=True))
    grad_temp = (share * d_logit).sum((0, 1))
    d_share = d_logit * temp.view(1, 1, -1).to(d_logit.dtype)
    # share = Σ_p sq / max(energy, floor), energy the running sum of the squares
    energy = sq.cumsum(1)
    inv = 1.0 / energy.clamp_min(_TSSA_ENERGY_FLOOR)
    d_energy = (sq * inv).mul_(inv).mul_(-d_share.unsqueeze(-1)).mul_(energy >= _TSSA_ENERGY_FLOOR)
    d_sq = torch.addcmul(d_num.mul_(pi4), d_share.unsqueeze(-1), inv).add_(_reverse_cumsum(d_energy))
    return (dz * pi4).mul_(shrink).neg_().addcmul_(y4, d_sq, value=2.0), grad_temp, d_share
