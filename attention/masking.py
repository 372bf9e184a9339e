"""Masks, in one place.  Convention: boolean, True = a real token / may attend."""

from __future__ import annotations

import torch
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
