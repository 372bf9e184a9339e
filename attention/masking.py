"""Masks, in one place.  Convention: boolean, True = a real token / may attend."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_mask(lq: int, lk: int, device=None) -> Tensor:
    """(Lq, Lk): query i sees keys j <= i + (Lk - Lq) (the last query sees every key)."""
    return torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=lk - lq)


def attention_mask(key_mask: Tensor | None, lq: int, lk: int, causal: bool = False,
                   device=None) -> Tensor | None:
    """Combine a key mask (B, Lk) and causality into one mask broadcastable to (B, 1, Lq, Lk)
    (per-head tensors); None when every key may be attended."""
    mask = None
    if key_mask is not None:
        if key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be boolean (True = real token), got {key_mask.dtype}")
        mask = key_mask[:, None, None, :]  # (B,1,1,Lk)
    if causal:
        c = causal_mask(lq, lk, device=device if key_mask is None else key_mask.device)
        mask = c if mask is None else mask & c
    return mask


def masked_mean(x: Tensor, mask: Tensor | None, dims: tuple[int, ...] = (-2, -1)) -> Tensor:
    """Mean of x over ``dims`` counting only entries where mask is True (kept dims).
    An all-masked slice has mean 0."""
    if mask is None:
        return x.mean(dim=dims, keepdim=True)
    mask = mask.expand_as(x)
    total = x.masked_fill(~mask, 0).sum(dim=dims, keepdim=True)
    count = mask.sum(dim=dims, keepdim=True).clamp(min=1)
    return total / count


def masked_max(x: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Max of x over ``dim`` taking only entries where ``mask`` (broadcastable to x) is True
    (dim removed), e.g. max pooling over the real tokens of (B, L, D) with a (B, L, 1) mask.
    An all-masked slice has max 0."""
    mask = mask.expand_as(x)
    out = x.masked_fill(~mask, float("-inf")).amax(dim=dim)
    return out.masked_fill(~mask.any(dim=dim), 0.0)


def masked_softmax(scores: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    """softmax over ``dim`` with masked entries exactly 0; an all-masked slice is all 0
    (not NaN)."""
    if mask is None:
        return torch.softmax(scores, dim=dim)
    mask = mask.expand_as(scores)
    scores = scores.masked_fill(~mask, float("-inf"))
    # a fully masked slice would give NaN: give it a finite max so exp(-inf - 0) = 0
    row_max = scores.amax(dim=dim, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    return e / e.sum(dim=dim, keepdim=True).clamp(min=torch.finfo(e.dtype).tiny)


def lengths_to_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """(B,) lengths -> (B, max_len) mask, True for the first lengths[b] positions."""
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                     bias: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """softmax(q k^T / sqrt(d) + bias) v through ``scaled_dot_product_attention``.

    q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv); ``mask`` boolean broadcastable to
    (..., Lq, Lk), True = may attend; ``bias`` an additive logit term broadcastable to the same
    shape (relative positions, a Gaussian localness bias, a window's local scores).  Masked
    keys get exactly zero weight; a query with no visible key outputs 0 (not NaN).
    """
    empty = None
    if mask is not None:
        empty = ~mask.any(-1, keepdim=True)  # (..., Lq, 1)
        if empty.any():
            mask = mask | empty
        else:
            empty = None
    if bias is not None and mask is not None:
        attn_mask = bias.masked_fill(~mask, float("-inf"))
    else:
        attn_mask = bias if bias is not None else mask
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return out if empty is None else out.masked_fill(empty, 0.0)


def check_mask(mask: Tensor | None, name: str = "mask") -> Tensor | None:
    """``mask`` unchanged after checking that it is boolean (True = real token); None passes."""
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"{name} must be boolean (True = real token), got {mask.dtype}")
    return mask


def pair_mask(mask_a: Tensor | None, mask_b: Tensor | None) -> Tensor | None:
    """Key masks (B, La) and (B, Lb) -> a mask broadcastable to (B, La, Lb), True where both
    a_i and b_j are real (pairwise alignment); None when both masks are None."""
    ma = None if mask_a is None else check_mask(mask_a, "mask_a")[:, :, None]  # (B,La,1)
    mb = None if mask_b is None else check_mask(mask_b, "mask_b")[:, None, :]  # (B,1,Lb)
    if ma is None or mb is None:
        return mb if ma is None else ma
    return ma & mb
