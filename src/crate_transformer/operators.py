"""CRATE operators: the compression step (MSSA), the sparsification step (ISTA), the layers built
from them, and the decoder's inverse step (JMLR §2.3-2.5 and §3.5); and ToST's linear-time compression step
(TSSA, Wu et al., ICLR 2025).

Tokens are rows, ``x`` of shape ``(b, n, d)``.  A module's weight ``W`` acts as ``F.linear(x, W) = x Wᵀ``,
i.e. as ``W z`` on a column token ``z``, so ``MSSA.qkv.weight`` is ``[U_1ᵀ; …; U_Kᵀ]`` and
``ISTA.weight`` is the dictionary ``D``.

Each module has a fast path (what ``forward`` runs) and the plain transcription of the paper's
equations as a free function (:func:`mssa_reference`, :func:`ista_reference`, :func:`tssa_reference`), which
the tests compare against and the theory lab uses directly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.optim.optimizer import register_optimizer_step_post_hook

from .config_utils import Range
from .objectives import at_least_float32, full_precision
from .static_cache import StaticLayerCache

__all__ = [
    "ISTA_MODES",
    "LAYER_FORMS",
    "MSSA",
    "TSSA",
    "ISTA",
    "MHSA",
    "MLP",
    "OvercompleteISTA",
    "EncoderLayer",
    "LayerConfig",
    "DecoderLayer",
    "ssa_reference",
    "mssa_reference",
    "tssa_reference",
    "ista_reference",
    "reusable_weight",
    "attend",
    "cache_append",
    "odl_reference",
    "ATTENTIONS",
    "MLPS",
    "GELUS",
    "DropPath",
    "drop_path_rates",
    "set_drop_path",
]

ISTA_MODES = ("relu", "soft", "mm", "none")
LAYER_FORMS = ("official", "jmlr")
ATTENTIONS = ("mssa", "mhsa")  # the layer's first block: CRATE's MSSA | standard attention (Table 17)
# the second block: CRATE's ISTA | GELU MLP (Table 17) | CRATE-α's ODL | the crate-lm overcomplete ISTA
MLPS = ("ista", "mlp", "odl", "ista_overcomplete")
# a head's width p where a config may give it (dim_head); None there means dim // heads
DIM_HEAD = Range(0, lo_open=True, integer=True, note="or None = dim // heads")
GELUS = ("exact", "tanh")  # the MLP's GELU: erf (nanoGPT, timm) | tanh approximation (OpenAI / HF GPT-2)


# --------------------------------------------------------------------------- reference forms
def ssa_reference(Z: Tensor, U_k: Tensor, scale: float = 1.0) -> Tensor:
    """Subspace self-attention, eq. (35), JMLR p.23, written in the paper's column form.

    ``SSA(Z|U_k) = (U_kᵀZ) softmax((U_kᵀZ)ᵀ(U_kᵀZ))`` with the softmax over each **column**
    (eqs. (94)-(95)).  ``Z`` is ``(d, n)`` (columns are tokens) and the result is ``(p, n)``.
    ``scale`` multiplies the scores (the official code uses ``p^{-1/2}``; the paper 1).
    """
    A = U_k.T @ Z  # p × n
    return A @ torch.softmax(scale * (A.T @ A), dim=0)


def mssa_reference(Z: Tensor, U: Tensor, beta: float = 1.0, scale: float = 1.0) -> Tensor:
    """Multi-head subspace self-attention, eq. (36), JMLR p.23: ``β [U_1…U_K] [SSA_1; …; SSA_K]``.

    Column form: ``Z`` is ``(d, n)``, ``U`` is ``(K, d, p)``; returns ``(d, n)``.
    """
    return beta * sum(U[k] @ ssa_reference(Z, U[k], scale) for k in range(U.shape[0]))


def ista_reference(Z: Tensor, D: Tensor, eta: float = 0.1, lambd: float = 0.1) -> Tensor:
    """One non-negative ISTA step, eq. (44), JMLR p.25, three matmuls as written.

    ``ISTA(Z|D) = ReLU(Z − η Dᵀ(D Z − Z) − ηλ 1)``; column form, ``Z`` is ``(d, n)``.
    """
    return F.relu(Z - eta * D.T @ (D @ Z - Z) - eta * lambd)


# --------------------------------------------------------------------------- attention with a cache
def cache_append(cache: dict[str, Tensor] | None, key: str, new: Tensor) -> Tensor:
    """``new`` (b, K, n, p) appended along the token axis to ``cache[key]`` (stored back), or ``new`` itself.

    A layer's key-value cache is a plain dict: CRATE's MSSA keeps one tensor ``"w"`` (``U_kᵀ z`` serves as
    query, key and value, eq. (35)), a standard attention ``"k"`` and ``"v"``.  A
    :class:`~crate_transformer.static_cache.StaticLayerCache` (compiled decoding) writes ``new`` into its
    fixed-size buffer in place and returns the whole buffer (its ``key_mask`` hides the unfilled positions).
    """
    if cache is None:
        return new
    if isinstance(cache, StaticLayerCache):
        return cache.append(key, new)
    old = cache.get(key)
    cache[key] = new if old is None else torch.cat([old, new], dim=-2)
    return cache[key]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    scale: float,
    dropout_p: float = 0.0,
    key_mask: Tensor | None = None,
) -> Tensor:
    """``softmax(scale·q kᵀ + CausalMask) v`` (row form of eqs. (86)-(87), JMLR p.45).

    The ``m`` queries are the **last** ``m`` of the ``s`` key positions (a key-value cache holds the
    first ``s − m``), so query ``i`` sees keys ``j ≤ s − m + i``.  PyTorch's ``is_causal`` aligns the
    mask top-left, which is only right for ``m = s``; the offset case gets an explicit mask.
    ``key_mask`` (b, s), True for real tokens, hides padding from every query.
    """
    m, s = q.shape[-2], k.shape[-2]
    if key_mask is None and (not causal or m == s or m == 1):  # one new query sees every cached key
        # bool(): lengths traced by torch.export compare to a symbolic bool, which the kernel's flag refuses
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=bool(causal and m == s), scale=scale
        )
    mask = torch.ones(m, s, dtype=torch.bool, device=q.device)
    if causal:
        mask = mask.tril(s - m)
    if key_mask is not None:
        mask = mask & key_mask[:, None, None, :].to(torch.bool)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def odl_reference(Z: Tensor, D: Tensor, D1: Tensor, eta: float = 0.1, lambd: float = 0.1) -> Tensor:
    """CRATE-α's overcomplete sparse-coding block (Yang et al. 2024, arXiv 2405.20299, §3), column form.

    ``D`` (encoder dictionary) and ``D1`` (decoder dictionary) are ``d × m`` with ``m = ratio·d``.  Two
    non-negative ISTA steps from ``A = 0`` on ``min_{A≥0} λ‖A‖_1 + ½‖Z − D A‖²``, then decode with ``D1``::

        A1 = ReLU(η Dᵀ Z − ηλ);   A2 = ReLU(A1 − η Dᵀ(D A1 − Z) − ηλ);   return D1 A2

    ``Z`` is ``(d, n)``; the result is ``(d, n)`` (the residual ``Z +`` is the layer's, not this block's).
    """
    A1 = F.relu(eta * D.T @ Z - eta * lambd)
    A2 = F.relu(A1 - eta * D.T @ (D @ A1 - Z) - eta * lambd)
    return D1 @ A2


# --------------------------------------------------------------------------- MSSA
class MSSA(nn.Module):
    """Multi-head subspace self-attention, the compression step (eqs. (36)-(37), JMLR pp.23-24; Alg. 2).

    One shared projection ``U`` plays query, key and value (``Q = K = V = U_kᵀ``).  Options:

    * ``scale_scores`` — multiply the scores by ``p^{-1/2}`` (official code, default) or not (eq. (35)).
    * ``tied_output`` — output ``β [U_1 … U_K]`` of eq. (36) instead of the trainable ``W`` (+ bias)
      of eq. (37) (Table 12 ablation); ``tied_beta`` is β.
    * ``causal`` — the causal mask of eqs. (86)-(87): token j attends to tokens i ≤ j.
    * ``proj_bias`` — the bias of ``W`` (CRATE-α's ``to_out`` has none).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_head: int,
        dropout: float = 0.0,
        *,
        scale_scores: bool = True,
        tied_output: bool = False,
        tied_beta: float = 1.0,
        causal: bool = False,
        proj_bias: bool = True,
    ) -> None:
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        self.scale = dim_head**-0.5 if scale_scores else 1.0
        self.dropout = dropout
        self.causal = causal
        self.tied_output, self.tied_beta = tied_output, tied_beta
        self.qkv = nn.Linear(dim, heads * dim_head, bias=False)
        self.proj = None if tied_output else nn.Linear(heads * dim_head, dim, bias=proj_bias)

    def subspaces(self) -> Tensor:
        """The learned bases ``U`` as a ``(K, d, p)`` tensor (the heads' projections ``U_k``)."""
        d = self.qkv.in_features
        return self.qkv.weight.reshape(self.heads, self.dim_head, d).transpose(1, 2)

    def _project_out(self, out: Tensor) -> Tensor:
        b, _, n, _ = out.shape
        out = out.transpose(1, 2).reshape(b, n, self.heads * self.dim_head)
        if self.proj is None:
            return self.tied_beta * (out @ self.qkv.weight)  # β [U_1…U_K] applied to row tokens
        return self.proj(out)

    def forward(
        self,
        x: Tensor,
        return_attention: bool = False,
        cache: dict[str, Tensor] | None = None,
        key_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``x`` (b, n, d) → (b, n, d).  ``cache``: this layer's key-value cache for causal decoding —
        ``x`` holds the newest tokens and ``cache["w"]`` the projections ``U_kᵀ z`` of the earlier ones,
        the **single** tensor that plays query, key and value (a standard attention caches K and V).
        ``key_mask`` (b, n): True for real tokens, False for padding, which no token attends to."""
        b, n, _ = x.shape
        w = self.qkv(x).view(b, n, self.heads, self.dim_head).transpose(1, 2)  # (b, K, n, p)
        p_drop = self.dropout if self.training else 0.0
        if cache is not None and (return_attention or not self.causal):
            raise ValueError("a key-value cache needs a causal MSSA without return_attention")
        if not return_attention:
            kv = cache_append(cache, "w", w)
            out = attend(w, kv, kv, causal=self.causal, scale=self.scale, dropout_p=p_drop, key_mask=key_mask)
            return self._project_out(out)
        scores = (w @ w.transpose(-1, -2)) * self.scale
        if self.causal:
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = F.dropout(attn, p_drop, self.training) @ w
        return self._project_out(out), attn


# --------------------------------------------------------------------------- TSSA (ToST)
# Where the authors' code adds 1e-8 to the Π-mass of a head, and floors a coordinate's energy (tost_vision/tost.py's
# F.normalize floors its norm at 1e-12; tost_lang/model_TSSA.py floors the squared prefix sum at 1e-12).
_TSSA_MASS_EPS = 1e-8
_TSSA_ENERGY_FLOOR = 1e-12


def tssa_reference(
    W: Tensor, temp: Tensor, *, causal: bool = False, denom_bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Token statistics self-attention before its output projection (Wu et al., "Token Statistics Transformer:
    Linear-Time Attention via Variational Rate Reduction", ICLR 2025, §3 and App. E Algs. 1-2), written token by
    token from the authors' code (``tost_vision/tost.py`` ``AttentionTSSA``, ``tost_lang/model_TSSA.py``
    ``CausalSelfAttention_TSSA``).

    ``W`` holds each head's projections ``w_kj = U_kᵀz_j (+ b_k)`` as ``(K, n, p)``; ``temp`` the heads'
    temperatures ``(K,)``; ``denom_bias`` the causal form's learned per-position offsets ``(K, n)``.  Token ``j``
    reads the tokens ``S_j`` (all of them, or ``j' ≤ j`` when ``causal``):

    * its membership in each head (Π of the paper's eq. (10), a softmax over the heads):
      ``Π_jk ∝ exp(temp_k Σ_i (w_kji² / Σ_{j'∈S_j} w_kj'i² + denom_bias_kj))``;
    * per head and coordinate, the Π-weighted second moment of the tokens it reads (the "token statistics"):
      ``m_kji = Σ_{j'∈S_j} Π_j'k w_kj'i² / Σ_{j'∈S_j} Π_j'k``;
    * its output ``−Π_jk w_kji / (1 + m_kji)``: each coordinate shrunk by ``1/(1 + m)``.

    Non-causally every token reads the same statistics, so the cost is linear in ``n``; this reference loops over
    tokens (quadratic, for the tests).  Returns ``(out (K, n, p), Π (n, K))``.
    """
    K, n, p = W.shape
    scores = W.new_zeros(n, K)
    for j in range(n):
        seen = W[:, : j + 1] if causal else W
        energy = (seen**2).sum(1)
        energy = energy.clamp_min(_TSSA_ENERGY_FLOOR) if causal else energy.sqrt().clamp_min(_TSSA_ENERGY_FLOOR) ** 2
        share = (W[:, j] ** 2 / energy).sum(-1) + (0 if denom_bias is None else p * denom_bias[:, j])
        scores[j] = temp * share
    Pi = torch.softmax(scores, dim=-1)
    out = torch.empty_like(W)
    for j in range(n):
        m = j + 1 if causal else n
        weights = Pi[:m].T  # (K, m)
        moment = (weights[..., None] * W[:, :m] ** 2).sum(1) / (weights.sum(-1, keepdim=True) + _TSSA_MASS_EPS)
        out[:, j] = -Pi[j][:, None] * W[:, j] / (1 + moment)
    return out, Pi


class TSSA(nn.Module):
    """Token statistics self-attention, ToST's compression step (Wu et al., ICLR 2025, §3; App. E Algs. 1-2):
    :func:`tssa_reference` in linear time, then the output projection.

    One projection ``W = [U_1ᵀ; …; U_Kᵀ]`` (``qkv``, with a bias when ``qkv_bias``) maps each token into the
    heads; each token's memberships Π in the heads (:meth:`memberships`) and, per head, the Π-weighted second
    moment of every coordinate over the tokens are computed once, and each token's projection is multiplied by
    ``−Π_jk / (1 + moment)``: a scalar per coordinate instead of a pairwise similarity, so time and memory grow
    linearly with the number of tokens.  This is a gradient step on the variational compression term of
    :func:`~crate_transformer.objectives.variational_coding_rate` (Π held fixed; ``tests/test_tost.py``
    checks it by autograd), the counterpart of MSSA's step on ``R^c`` (eq. (13)).

    ``causal=True`` is the form of ``tost_lang/model_TSSA.py``: token ``j`` reads running sums over tokens
    ``≤ j`` (prefix sums), plus a learned offset per head and position (``denom_bias``, ``(K, block_size, 1)``)
    in its membership score.  Its key-value cache is three running sums per layer, a constant size however long
    the text (``cache["length"]`` counts the tokens seen).  ``return_attention`` gives the ``(b, K, n, n)``
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

    def subspaces(self) -> Tensor:
        """The learned bases ``U`` as a ``(K, d, p)`` tensor (as :meth:`MSSA.subspaces`; the bias is not in them)."""
        d = self.qkv.in_features
        return self.qkv.weight.reshape(self.heads, self.dim_head, d).transpose(1, 2)

    def project(self, x: Tensor) -> Tensor:
        """Row tokens ``(b, n, d)`` → the heads' projections ``(b, K, n, p)``."""
        b, n, _ = x.shape
        return self.qkv(x).view(b, n, self.heads, self.dim_head).transpose(1, 2)

    def _statistics(self, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The non-causal form's token statistics from the projections ``y`` ``(b, n, K·p)``: their squares, Π
        ``(b, n, K)`` and the factors ``−1/(1 + moment)`` ``(b, K·p)``, in float32 for half projections.

        Each statistic is a pass over the squares in their ``(b, n, K·p)`` layout: a coordinate's energy is a sum
        over the tokens, the membership scores ``Σ_i w_kji² / energy_ki`` a scaled sum per head, the Π-weighted
        moments the diagonal blocks of one product ``Πᵀ · squares``.  No ``(b, K, n, p)`` copy of the
        projections is made: few passes over few temporaries (``benchmarks/bench_tost.py``)."""
        b, n, D = y.shape
        K, p = self.heads, self.dim_head
        with full_precision(y):
            sq = at_least_float32(y).square()
            # F.normalize's floor on the norm, as the authors' code: max(‖w‖, 1e-12)² = max(‖w‖², 1e-24)
            inv = 1.0 / sq.sum(1, keepdim=True).clamp_min(_TSSA_ENERGY_FLOOR**2)
            share = (sq * inv).view(b, n, K, p).sum(-1)
            pi = torch.softmax(share * self.temp.view(1, 1, K).to(sq.dtype), dim=-1)
            num = (pi.transpose(1, 2) @ sq).view(b, K, K, p).diagonal(dim1=1, dim2=2).transpose(1, 2)
            moment = num / (pi.sum(1) + _TSSA_MASS_EPS).unsqueeze(-1)
        shrink = F.dropout(1.0 / (1.0 + moment), self.attn_dropout, self.training)
        return sq, pi, -shrink.reshape(b, D)

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
            return self._statistics(self.qkv(x))[1].to(x.dtype)
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

    def forward(
        self,
        x: Tensor,
        return_attention: bool = False,
        cache: dict[str, Any] | None = None,
        key_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``x`` (b, n, d) → (b, n, d).  ``cache`` (causal only): this layer's running sums, ``x`` the newest tokens.
        ``key_mask`` is refused unless None: padding would enter the statistics every token reads."""
        if key_mask is not None:
            raise ValueError("TSSA has no padding mask (every token enters the token statistics); pad on the right")
        if cache is not None and (return_attention or not self.causal):
            raise ValueError("a key-value cache needs a causal TSSA without return_attention")
        b, n, _ = x.shape
        start = 0 if cache is None else cache.get("length", 0)
        # a tensor start is compiled decoding's position, whose length was checked before decoding began
        if self.causal and not isinstance(start, Tensor) and start + n > self.denom_bias.shape[1]:
            raise ValueError(f"{start + n} tokens exceed the context of {self.denom_bias.shape[1]} (block_size)")
        if not self.causal:
            out, pi = self._global(x)
        else:
            w = self.project(x)
            pi = self._scores(w, cache, start)
            shrink = F.dropout(1.0 / (1.0 + self._moments(w, pi, cache)), self.attn_dropout, self.training)
            if cache is not None:
                cache["length"] = start + n
            out = self.proj((-(w * pi.unsqueeze(-1)) * shrink).transpose(1, 2).reshape(b, n, -1))
        out = F.dropout(out, self.dropout, self.training)
        return (out, self._attention(pi)) if return_attention else out

    def _global(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The non-causal form: the projected output ``(b, n, d)`` and Π ``(b, K, n)``.  For one sample the
        per-coordinate factor is folded into the output projection's weight (a ``(d, K·p)`` product instead of an
        ``(n, K·p)`` one); without gradients the product ``Π ⊙ w`` reuses the squares' memory."""
        y = self.qkv(x)
        b, n, D = y.shape
        sq, pi, shrink = self._statistics(y)
        pi, shrink = pi.to(y.dtype), shrink.to(y.dtype)
        y4, pi4 = y.view(b, n, self.heads, self.dim_head), pi.unsqueeze(-1)
        in_place = not torch.is_grad_enabled() and sq.dtype == y.dtype
        z = (torch.mul(y4, pi4, out=sq.view_as(y4)) if in_place else y4 * pi4).view(b, n, D)
        if statically_known_true(b == 1):  # not a guard on a batch size that torch.export keeps dynamic
            return F.linear(z, self.proj.weight * shrink, self.proj.bias), pi.transpose(1, 2)
        z = z.mul_(shrink.unsqueeze(1)) if in_place else z * shrink.unsqueeze(1)
        return F.linear(z, self.proj.weight, self.proj.bias), pi.transpose(1, 2)


# --------------------------------------------------------------------------- ISTA
# Optimizer steps taken in this process (every torch.optim optimizer).  A fused optimizer (``fused=True``) writes
# the parameters without bumping their version counters, so a version alone cannot prove a weight unchanged.
_optimizer_steps = 0


def _count_optimizer_step(*_: Any) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


def reusable_weight(w: Tensor) -> bool:
    """Whether a product of the parameter ``w`` computed in this forward may be kept for later ones.

    Only where no gradient flows to ``w`` (grad mode off), on a trainable ``nn.Parameter`` of a real device,
    outside compilation, tracing, CUDA-graph capture, ``torch.func`` transforms, dispatch modes (FakeTensorMode,
    FLOP counters) and a process group (FSDP and DeepSpeed write gathered weights in place, unseen).  Frozen
    parameters (``requires_grad=False``: EMA copies, DINO teachers) are excluded because EMA code commonly
    updates them through ``.data``, which no version counter sees.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_grad_enabled() or not w.requires_grad:
        return False
    if type(w) is not nn.Parameter or w.device.type == "meta" or w.is_inference():
        return False
    if w.is_cuda and torch.cuda.is_current_stream_capturing():  # a graph would replay the kept matrix, stale
        return False
    if torch._C._are_functorch_transforms_active() or torch._C._len_torch_dispatch_stack():
        return False
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


class ISTA(nn.Module):
    """The sparsification step: one proximal-gradient step on the non-negative LASSO (42).

    ``mode="relu"`` (default, eq. (44), JMLR p.25; Alg. 3): ``ReLU(Z + η Dᵀ(Z − D Z) − ηλ)``.  Row tokens
    ``x`` get the pre-activation ``x A − ηλ`` with ``A = I + η (D − DᵀD)`` (:meth:`step_matrix`), computed
    whichever way costs fewer FLOPs for the ``n`` token rows (the results agree to float rounding):

    * **thin**: ``x + η (x − x Dᵀ) D``, two ``n × d × d`` matmuls: ``4nd²`` FLOPs, ``12nd²`` with the backward;
    * **fused**: ``x A``, one matmul after the token-independent ``DᵀD``: ``2nd² + 2d³``, ``6nd² + 6d³`` with
      the backward — cheaper from ``n = d`` rows on, with or without the backward.

    When no gradient flows to ``D`` (:func:`reusable_weight`: inference, generation, analysis) ``A`` is
    computed once and reused by later forwards, so a decoded token or a single image pays ``2nd²``.  It is
    rebuilt whenever ``D`` or η may have changed: an in-place write PyTorch tracks (version counter:
    ``load_state_dict``, ``copy_``, optimizers, EMA updates), a new tensor or storage for ``D`` (``.to()``,
    ``.half()``, ``assign=True`` loads), any optimizer step (fused ones bypass the version counter),
    ``train()``/``eval()``, and any forward through which a gradient flows to ``D``.  Writes through ``.data``
    are invisible to PyTorch; switch the mode (``model.eval()``) after one.  The matrix is a plain attribute:
    not in ``state_dict``, not copied or pickled.

    Ablations:

    * ``"soft"`` — soft threshold ``S_{ηλ}`` instead of ReLU (Table 13, JMLR p.100);
    * ``"mm"``   — the majorisation-minimisation step of eq. (123), JMLR p.62, with
      ``α = d/(n ε²)``: ``ReLU((1 + 4/(9(1+α))) Dᵀz − 4λ/(9α))``;
    * ``"none"`` — no sparsification (Table 15); the layer skips this block.

    ``D`` is ``d×d``, kaiming-uniform initialised as in the official code; η and λ are
    configuration (saved with the model), not parameters.
    """

    def __init__(self, dim: int, eta: float = 0.1, lambd: float = 0.1, mode: str = "relu", eps: float = 0.1) -> None:
        super().__init__()
        if mode not in ISTA_MODES:
            raise ValueError(f"unknown ISTA mode {mode!r}; choose one of {ISTA_MODES}")
        self.eta, self.lambd, self.mode, self.eps = eta, lambd, mode, eps
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight)
        self._kept: tuple | None = None  # (D, its key, A, D's storage) of the last reusable forward

    def step_matrix(self) -> Tensor:
        """``A = I + η (D − DᵀD)`` such that the ISTA pre-activation of row tokens is ``x A − ηλ``."""
        D = self.weight
        eye = torch.eye(D.shape[0], dtype=D.dtype, device=D.device)
        return eye + self.eta * (D - D.T @ D)

    def kept_step_matrix(self) -> Tensor | None:
        """``A`` for a forward through which no gradient flows, computed once and reused while ``D`` and η are
        unchanged (see the class docstring); None where :func:`reusable_weight` says reuse is not safe."""
        w = self.weight
        if not reusable_weight(w):
            return None
        # the stream: a matrix computed on one CUDA stream is not ready on another without a synchronisation
        stream = torch.cuda.current_stream(w.device).cuda_stream if w.is_cuda else None
        key = (w._version, w.data_ptr(), w.dtype, w.device, stream, self.eta, _optimizer_steps)
        kept = self._kept
        if kept is not None and kept[0] is w and kept[1] == key:
            return kept[2]
        with torch.autocast(w.device.type, enabled=False):  # full precision whatever the caller's autocast
            A = self.step_matrix()
        self._kept = (w, key, A, w.detach())  # holding D's storage: no later tensor can take its address
        return A

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "mm":
            n, d = x.shape[-2], x.shape[-1]
            alpha = d / (n * self.eps**2)
            return F.relu((1 + 4 / (9 * (1 + alpha))) * (x @ self.weight) - 4 * self.lambd / (9 * alpha))
        rows, D, bias = x.reshape(-1, x.shape[-1]), self.weight, -self.eta * self.lambd
        A = self.kept_step_matrix()
        if A is None and torch.is_grad_enabled() and D.requires_grad:
            self._kept = None  # D is being trained: what was kept may be stepped past unseen
        thin = rows.shape[0] < D.shape[0]  # thin is cheaper (class docstring)
        if isinstance(thin, torch.SymBool):  # a row count torch.export keeps dynamic: the fused form holds for
            thin = statically_known_true(thin)  # every count, where a guard on the count would fail the export
        if A is None and thin:
            pre = torch.addmm(rows + bias, rows - F.linear(rows, D), D, alpha=self.eta).view_as(x)
        else:
            pre = torch.addmm(x.new_full((1,), bias), rows, self.step_matrix() if A is None else A).view_as(x)
        if self.mode == "soft":
            return torch.sign(pre + self.eta * self.lambd) * F.relu(
                (pre + self.eta * self.lambd).abs() - self.eta * self.lambd
            )
        return F.relu(pre)

    def train(self, mode: bool = True) -> ISTA:
        self._kept = None
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> ISTA:
        self._kept = None  # .to(), .half(), .cuda(), share_memory(): D gets new storage
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_kept": None}  # copies and pickles recompute it

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, eta={self.eta}, lambd={self.lambd}, mode={self.mode!r}"


# --------------------------------------------------------------------------- hybrids' blocks (Table 17, CRATE-α)
class MHSA(nn.Module):
    """Standard multi-head self-attention with separate Q, K, V (ViT; CRATE-MHSA of JMLR Table 17, p.101).

    ``qkv`` maps ``d → 3·K·p`` (with bias, timm layout), scores are scaled by ``p^{-1/2}``, ``proj`` maps
    ``K·p → d``.  Unlike :class:`MSSA`, query, key and value are three different projections, so a
    causal decoder's key-value cache (``causal=True``, the GPT-2 baseline) holds two tensors, ``"k"``
    and ``"v"``, per layer.
    """

    def __init__(
        self, dim: int, heads: int, dropout: float = 0.0, dim_head: int | None = None, causal: bool = False
    ) -> None:
        super().__init__()
        self.heads, self.dropout, self.causal = heads, dropout, causal
        self.dim_head = dim_head if dim_head is not None else dim // heads
        inner = heads * self.dim_head
        self.qkv = nn.Linear(dim, 3 * inner)
        self.proj = nn.Linear(inner, dim)

    def forward(
        self,
        x: Tensor,
        return_attention: bool = False,
        cache: dict[str, Tensor] | None = None,
        key_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)
        p_drop = self.dropout if self.training else 0.0
        scale = self.dim_head**-0.5
        if cache is not None and (return_attention or not self.causal):
            raise ValueError("a key-value cache needs a causal attention without return_attention")
        if return_attention:
            scores = q @ k.transpose(-1, -2) * scale
            if self.causal:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            attn = torch.softmax(scores, dim=-1)
            out = F.dropout(attn, p_drop, self.training) @ v
        else:
            k, v = cache_append(cache, "k", k), cache_append(cache, "v", v)
            out = attend(q, k, v, causal=self.causal, scale=scale, dropout_p=p_drop, key_mask=key_mask)
        out = self.proj(out.transpose(1, 2).reshape(b, n, self.heads * self.dim_head))
        return (out, attn) if return_attention else out


class MLP(nn.Sequential):
    """The transformer MLP ``Linear(d, h) → GELU → Dropout → Linear(h, d)``, ``h = int(d·mlp_ratio)``
    (ViT; CRATE-MLP of JMLR Table 17).  A ``Sequential``, so its keys are ``0.*`` and ``3.*`` (timm-like).
    ``gelu="tanh"`` is the tanh approximation OpenAI's GPT-2 was trained with (HF's ``gelu_new``); ``bias=False``
    leaves out both biases (nanoGPT's ``bias=False`` models)."""

    def __init__(
        self, dim: int, mlp_ratio: float = 4.0, dropout: float = 0.0, gelu: str = "exact", bias: bool = True
    ) -> None:
        if gelu not in GELUS:
            raise ValueError(f"unknown gelu {gelu!r}; choose one of {GELUS}")
        hidden = int(dim * mlp_ratio)
        act = nn.GELU(approximate="tanh" if gelu == "tanh" else "none")
        super().__init__(nn.Linear(dim, hidden, bias=bias), act, nn.Dropout(dropout), nn.Linear(hidden, dim, bias=bias))


class OvercompleteISTA(nn.Module):
    """CRATE-α's sparse-coding block (Yang et al. 2024, "Scaling White-Box Transformers for Vision", §3).

    Three changes to CRATE's ISTA, which is how CRATE was scaled to ImageNet-21K / CLIP sizes:
    an **overcomplete** dictionary ``D ∈ R^{d×m}``, ``m = ratio·d`` (default 4); two ISTA steps started
    from zero instead of one step started from the input; a **decoupled** decoder dictionary ``D1``
    mapping the sparse code back to ``R^d``.  The layer adds the input back (a residual, see
    :class:`EncoderLayer`).  Row form of :func:`odl_reference`; parameters ``D``, ``D1`` as in the
    official ``torch_inference/model/crate_alpha.py`` (kaiming-uniform).

    ``tied=True`` is the overcomplete ISTA of the crate-lm language models (Bai & Ma 2025, "Improving
    Neuron-level Interpretability with White-box Language Models"): the same two steps, decoded with ``D``
    itself (``D1 = D``, no second dictionary; ``odl_reference(Z, D, D)``), initialised as the official
    ``crate_overcomplete.py`` (kaiming-uniform on the ``m × d`` matrix ``Dᵀ``).
    """

    def __init__(self, dim: int, ratio: int = 4, eta: float = 0.1, lambd: float = 0.1, tied: bool = False) -> None:
        super().__init__()
        self.eta, self.lambd = eta, lambd
        if tied:
            self.D = nn.Parameter(nn.init.kaiming_uniform_(torch.empty(ratio * dim, dim)).T.contiguous())
            self.D1 = None
            return
        self.D = nn.Parameter(torch.empty(dim, ratio * dim))
        self.D1 = nn.Parameter(torch.empty(dim, ratio * dim))
        nn.init.kaiming_uniform_(self.D)
        nn.init.kaiming_uniform_(self.D1)

    def code(self, x: Tensor) -> Tensor:
        """The sparse code ``A2`` of row tokens ``x`` (…, d) → (…, m).

        Four thin matmuls, each with its scaling and shift fused in (``addmm``); nothing here is independent of
        the tokens (a Gram matrix ``DᵀD`` would be ``m × m``, costlier than the two products it replaces)."""
        rows, D, shift = x.reshape(-1, x.shape[-1]), self.D, -self.eta * self.lambd
        a1 = torch.addmm(rows.new_full((1,), shift), rows, D, alpha=self.eta).relu_()
        residual = torch.addmm(rows, a1, D.T, beta=-1)  # D A1 − Z in row form
        return torch.addmm(a1 + shift, residual, D, alpha=-self.eta).relu_().view(*x.shape[:-1], -1)

    def forward(self, x: Tensor) -> Tensor:
        return self.code(x) @ (self.D if self.D1 is None else self.D1).T

    def extra_repr(self) -> str:
        d, m = self.D.shape
        return f"dim={d}, atoms={m}, eta={self.eta}, lambd={self.lambd}, tied={self.D1 is None}"


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
