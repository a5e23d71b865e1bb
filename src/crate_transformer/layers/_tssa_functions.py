"""TSSA's memory-saving backward passes (private): :class:`~crate_transformer.layers.TSSA` with
``memory_saving=True`` (the default) runs its step as one of these autograd Functions, whose backward, derived by
hand, keeps the projections and per-head statistics and recomputes the rest, where autograd's own graph of the
operator (``memory_saving=False``, the code in :mod:`.tssa`) keeps the squares and the products besides.  Both give
the same gradients (``tests/layers/test_tssa.py``, float64); ``benchmarks/tssa_backward.py`` measures the two.

The per-head sums the statistics are made of (:func:`_head_sums`, :func:`_token_sums`) are here too: the forward in
:mod:`.tssa` and these backwards both use them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..objectives import at_least_float32, full_precision
from .reference import _TSSA_ENERGY_FLOOR, _TSSA_MASS_EPS

# tssa._global_step: (y, temp, weight, bias, heads, attn_dropout, training) -> (output, Π, statistics)
GlobalStep = Callable[..., tuple[Tensor, Tensor, tuple[Tensor, ...]]]


# --------------------------------------------------------------------------- per-head sums
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


# --------------------------------------------------------------------------- the non-causal backward
class _GlobalStep(torch.autograd.Function):
    """TSSA's non-causal step (``step``: :func:`~crate_transformer.layers.tssa._global_step`, run without a graph)
    whose backward keeps the projections ``y`` and per-head statistics (Π and the scores
    ``(b, n, K)``, ``(b, K·p)`` energies, moments and factors) and recomputes the squares and the product
    ``Π ⊙ w ⊙ shrink``: autograd's own graph of the step would keep the squares (float32 for half projections),
    that product and its scaled copy, 1.7-2.6x the bytes MSSA's flash attention keeps
    (``tests/layers/test_tssa.py``)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        step: GlobalStep,
        y: Tensor,
        temp: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        heads: int,
        p: float,
        training: bool,
    ) -> tuple[Tensor, Tensor]:
        out, pi, stats = step(y, temp, weight, bias, heads, p, training)
        ctx.heads = heads
        ctx.save_for_backward(y, temp, weight, pi, *stats)
        return out, pi

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, grad_pi: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        y, temp, weight, pi, energy, share, moment, shrink = ctx.saved_tensors
        with full_precision(y):
            grad_w, grad_b, dz = _output_grads(grad_out, y, pi, shrink, weight, ctx.heads, ctx.needs_input_grad[4])
            stats = (energy, share, pi, moment, shrink)
            dy, grad_temp = _statistics_grads(dz, y, temp, stats, grad_pi, ctx.heads)
        return None, dy.to(y.dtype), grad_temp.view_as(temp), grad_w, grad_b, None, None, None


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
