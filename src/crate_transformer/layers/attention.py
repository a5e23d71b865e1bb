"""The compression step: CRATE's MSSA (eqs. (35)-(37), (86)-(87)), standard attention (MHSA, Table 17), the
shared scaled-dot-product call and the key-value cache append."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..static_cache import StaticLayerCache


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
