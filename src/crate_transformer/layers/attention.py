"""The compression step: CRATE's MSSA (eqs. (35)-(37), (86)-(87)), standard attention (MHSA, Table 17), the
shared scaled-dot-product call and the key-value cache append."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import LayerConfig
from .hooks import HookPoint, Site, heads_site, hooked
from .static_cache import StaticLayerCache


# --------------------------------------------------------------------------- attention with a cache
def cache_append(cache: dict[str, Tensor] | None, key: str, new: Tensor) -> Tensor:
    """``new`` (b, K, n, p) appended along the token axis to ``cache[key]`` (stored back), or ``new`` itself.

    A layer's key-value cache is a plain dict: CRATE's MSSA keeps one tensor ``"w"`` (``U_kᵀ z`` serves as
    query, key and value, eq. (35)), a standard attention ``"k"`` and ``"v"``.  A
    :class:`~crate_transformer.layers.static_cache.StaticLayerCache` (compiled decoding) writes ``new`` into its
    fixed-size buffer in place and returns the whole buffer (its ``key_mask`` hides the unfilled positions).
    """
    if cache is None:
        return new
    if isinstance(cache, StaticLayerCache):
        return cache.append(key, new)
    old = cache.get(key)
    cache[key] = new if old is None else torch.cat([old, new], dim=-2)
    return cache[key]


def check_cache(cache: dict | None, causal: bool, what: str) -> None:
    """A key-value cache serves causal decoding only (one-line ``ValueError`` otherwise)."""
    if cache is not None and not causal:
        raise ValueError(f"a key-value cache needs a causal {what}; build the layer with causal=True")


def causal_softmax(scores: Tensor, causal: bool) -> Tensor:
    """The row softmax of ``(…, n, n)`` scores, with the causal mask of eqs. (86)-(87) where ``causal``: the
    attention maps a trace shows (the forward passes go through :func:`attend`)."""
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1)


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


def attend_explicit(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: nn.Module,
    *,
    causal: bool,
    scale: float,
    dropout_p: float = 0.0,
    key_mask: Tensor | None = None,
) -> Tensor:
    """:func:`attend` with the attention pattern written out and passed through ``pattern`` (a
    :class:`~crate_transformer.layers.hooks.HookPoint`), where hooks read or replace it: the ``(b, K, m, s)``
    row-softmax ``softmax(scale·q kᵀ + mask)`` (eqs. (86)-(87)), the same masks as :func:`attend`.  Run only while
    the pattern is hooked; otherwise the fused kernel never forms the matrix."""
    m, s = q.shape[-2], k.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * scale
    mask = torch.ones(m, s, dtype=torch.bool, device=q.device).tril(s - m) if causal else None
    if key_mask is not None:
        keys = key_mask[:, None, None, :].to(torch.bool)
        mask = keys if mask is None else mask & keys
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = pattern(torch.softmax(scores, dim=-1))
    return F.dropout(weights, dropout_p, training=dropout_p > 0) @ v


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
        self.pattern = HookPoint()  # the attention pattern, formed only while hooked (attend_explicit)

    def subspaces(self) -> Tensor:
        """The learned bases ``U`` as a ``(K, d, p)`` tensor (the heads' projections ``U_k``)."""
        d = self.qkv.in_features
        return self.qkv.weight.reshape(self.heads, self.dim_head, d).transpose(1, 2)

    @classmethod
    def from_config(cls, dim: int, heads: int, dim_head: int, c: LayerConfig, *, causal: bool, bias: bool) -> MSSA:
        return cls(
            dim,
            heads,
            dim_head,
            c.dropout,
            scale_scores=c.scale_scores,
            tied_output=c.tied_output,
            tied_beta=c.tied_beta,
            causal=causal,
            proj_bias=bias,
        )

    def project(self, x: Tensor) -> Tensor:
        """Row tokens ``(b, n, d)`` → ``U_kᵀ z`` per head, ``(b, K, n, p)``: query, key and value at once."""
        b, n, _ = x.shape
        return self.qkv(x).view(b, n, self.heads, self.dim_head).transpose(1, 2)

    def forward(self, x: Tensor, cache: dict[str, Tensor] | None = None, key_mask: Tensor | None = None) -> Tensor:
        """``x`` (b, n, d) → (b, n, d).  ``cache``: this layer's key-value cache for causal decoding —
        ``x`` holds the newest tokens and ``cache["w"]`` the projections ``U_kᵀ z`` of the earlier ones,
        the **single** tensor that plays query, key and value (a standard attention caches K and V).
        ``key_mask`` (b, n): True for real tokens, False for padding, which no token attends to."""
        check_cache(cache, self.causal, "MSSA")
        w = self.project(x)  # (b, K, n, p)
        kv = cache_append(cache, "w", w)  # (b, K, s, p): the cached tokens and these
        p_drop = self.dropout if self.training else 0.0
        how = dict(causal=self.causal, scale=self.scale, dropout_p=p_drop, key_mask=key_mask)
        out = attend_explicit(w, kv, kv, self.pattern, **how) if hooked(self.pattern) else attend(w, kv, kv, **how)
        b, _, n, _ = out.shape
        out = out.transpose(1, 2).reshape(b, n, self.heads * self.dim_head)  # heads side by side: [SSA_1; …; SSA_K]
        if self.proj is None:
            return self.tied_beta * (out @ self.qkv.weight)  # β [U_1…U_K] (eq. (36)) applied to row tokens
        return self.proj(out)  # W (eq. (37))

    def attention_map(self, x: Tensor) -> Tensor:
        """The ``(b, K, n, n)`` row-softmax attention of each head on ``x`` (what the forward's kernel applies)."""
        w = self.project(x)
        return causal_softmax((w @ w.transpose(-1, -2)) * self.scale, self.causal)

    def hook_sites(self) -> dict[str, Site]:
        """``qkv``: each head's ``U_kᵀ LN(Z)`` ``(b, K, n, p)`` (query, key and value at once, eq. (35));
        ``pattern``: the ``(b, K, n, s)`` row softmax of eq. (35) / (86); ``out``: the block's output, ``W``
        (eq. (37)) or ``β [U_1 … U_K]`` (eq. (36)) applied to the heads' outputs."""
        return {"qkv": heads_site(self.qkv, self.heads), "pattern": Site(self.pattern), "out": Site(self)}


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
        self.pattern = HookPoint()  # the attention pattern, formed only while hooked (attend_explicit)

    @classmethod
    def from_config(cls, dim: int, heads: int, dim_head: int, c: LayerConfig, *, causal: bool, bias: bool) -> MHSA:
        return cls(dim, heads, c.dropout, dim_head, causal=causal)  # timm's layout: always biased

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Row tokens ``(b, n, d)`` → queries, keys, values, each ``(b, K, n, p)``."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x: Tensor, cache: dict[str, Tensor] | None = None, key_mask: Tensor | None = None) -> Tensor:
        check_cache(cache, self.causal, "attention")
        q, k, v = self.project(x)
        k, v = cache_append(cache, "k", k), cache_append(cache, "v", v)
        p_drop = self.dropout if self.training else 0.0
        how = dict(causal=self.causal, scale=self.dim_head**-0.5, dropout_p=p_drop, key_mask=key_mask)
        out = attend_explicit(q, k, v, self.pattern, **how) if hooked(self.pattern) else attend(q, k, v, **how)
        b, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, n, self.heads * self.dim_head))

    def attention_map(self, x: Tensor) -> Tensor:
        """The ``(b, K, n, n)`` row-softmax attention of each head on ``x``."""
        q, k, _ = self.project(x)
        return causal_softmax(q @ k.transpose(-1, -2) * self.dim_head**-0.5, self.causal)

    def hook_sites(self) -> dict[str, Site]:
        """``q``, ``k``, ``v``: the three projections ``(b, K, n, p)`` (TransformerLens' ``hook_q/k/v``);
        ``pattern``: the ``(b, K, n, s)`` row softmax; ``out``: the output projection's output."""
        sites = {name: heads_site(self.qkv, self.heads, i, 3) for i, name in enumerate("qkv")}
        return {**sites, "pattern": Site(self.pattern), "out": Site(self)}
