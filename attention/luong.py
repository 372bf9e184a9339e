"""Multiplicative (global) attention, Luong et al. 2015, Sec. 3.1.

    score(s_i, h_j) = s_i^T h_j          score="dot"      (needs equal dimensions)
    score(s_i, h_j) = s_i^T W_a h_j      score="general"

followed by a softmax over the real source positions.  Neither score is scaled.  In the
decoder context W_a h_j depends only on the source and is computed once (``precompute``).
Pairwise alignment scores a_i against b_j and normalises both ways (DecompAtt Eq. 4).
Multi-head attention: ``dot`` is the unscaled dot product softmax(Q K^T) V, ``general`` has
one W_a per head, softmax(Q W_a K^T) V; both through ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from attention.additive import attend, softmax_alignment
from attention.base import AlignmentCore, DecoderCore, Mechanism, MultiHeadCore
from attention.masking import attention_mask, check_mask, masked_attention, masked_softmax

SCORES = ("dot", "general")


class luong(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Luong attention with the ``dot`` or ``general`` score (Luong et al. 2015, Eq. 8)."""

    name = "luong"

    def __init__(self, score: Literal["dot", "general"] = "general"):
        if score not in SCORES:
            raise ValueError(f"luong: score must be one of {SCORES}, got {score!r}")
        self.score = score

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return LuongMultiHead(self.score, n_heads, d_model // n_heads, dropout)

    def alignment(self, *, dim):
        return LuongAlignment(self.score, dim)

    def decoder(self, *, query_dim, memory_dim):
        if self.score == "dot" and query_dim != memory_dim:
            raise ValueError(
                f"luong(score='dot') scores s . h and needs the decoder state and the memory to "
                f"have one dimension, got query_dim={query_dim}, memory_dim={memory_dim}; "
                f"use score='general' (s W h) for different dimensions")
        return LuongDecoder(self.score, query_dim, memory_dim)


class LuongMultiHead(MultiHeadCore):
    def __init__(self, score: str, n_heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.weight = None
        if score == "general":
            bound = 1.0 / math.sqrt(head_dim)  # nn.Linear's default range
            self.weight = nn.Parameter(  # W_a per head (H,d,d)
                torch.empty(n_heads, head_dim, head_dim).uniform_(-bound, bound))

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        if self.weight is not None:
            q = q @ self.weight  # q_i^T W_a  (B,H,Lq,d)
        # unscaled: SDPA divides by sqrt(d), so the query is multiplied by it first
        out = masked_attention(q * math.sqrt(q.shape[-1]), k, v, mask,
                               dropout_p=self.dropout if self.training else 0.0)
        weights = masked_softmax(q @ k.transpose(-2, -1), mask) if need_weights else None
        return out, weights


class LuongAlignment(AlignmentCore):
    def __init__(self, score: str, dim: int):
        super().__init__()
        self.weight = nn.Linear(dim, dim, bias=False) if score == "general" else nn.Identity()

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        scores = a @ self.weight(b).transpose(1, 2)  # e_ij = a_i^T W_a b_j  (B,La,Lb)
        return softmax_alignment(scores, a, b, mask_a, mask_b, value_a, value_b)


class LuongDecoder(DecoderCore):
    def __init__(self, score: str, query_dim: int, memory_dim: int):
        super().__init__()
        self.weight = (nn.Linear(memory_dim, query_dim, bias=False) if score == "general"
                       else nn.Identity())  # W_a

    def build_memory(self, h, mask=None):
        return {"h": h, "mask": check_mask(mask), "keys": self.weight(h)}  # W_a h_j (B,N,Dq)

    def forward(self, s, memory):
        return attend(s @ memory["keys"].transpose(1, 2), memory)  # (B,T,Dm), (B,T,N)
