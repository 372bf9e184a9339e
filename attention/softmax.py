"""Softmax attention: the baseline of every paper.

Multi-head (Vaswani et al. 2017): softmax(Q K^T / sqrt(d)) V through
``torch.nn.functional.scaled_dot_product_attention``; the weights are computed separately
only when asked for (plots).  Alignment (Parikh et al. 2016, Eq. 4 of the SNLI write-up):
e_ij = a_i . b_j, beta_i = sum_j softmax_j(e_ij) b_j, alpha_j = sum_i softmax_i(e_ij) a_i.
Decoder: scaled dot-product of the decoder state with the memory.
"""

from __future__ import annotations

import math

from attention.base import (
    Alignment,
    AlignmentCore,
    DecoderCore,
    Mechanism,
    MultiHeadCore,
    query_projection,
)
from attention.masking import attention_mask, masked_attention, masked_softmax


class softmax(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Scaled dot-product softmax attention (``scale`` applies to the multi-head and decoder
    contexts; DecompAtt alignment is unscaled, as in Parikh et al.)."""

    name = "softmax"

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return SoftmaxMultiHead(dropout)

    def alignment(self, *, dim):
        return SoftmaxAlignment()

    def decoder(self, *, query_dim, memory_dim):
        return SoftmaxDecoder(query_dim, memory_dim)


class SoftmaxMultiHead(MultiHeadCore):
    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = dropout

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        out = masked_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0)
        weights = None
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            weights = masked_softmax(scores, mask)
        return out, weights


class SoftmaxAlignment(AlignmentCore):
    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        scores = a @ b.transpose(1, 2)  # e_ij (B,La,Lb)
        ma = None if mask_a is None else mask_a[:, :, None]
        mb = None if mask_b is None else mask_b[:, None, :]
        row = masked_softmax(scores, mb, dim=2)  # softmax_j: weight of b_j for a_i
        col = masked_softmax(scores, ma, dim=1)  # softmax_i: weight of a_i for b_j
        if ma is not None:
            row = row.masked_fill(~ma, 0.0)
        if mb is not None:
            col = col.masked_fill(~mb, 0.0)
        value_a = a if value_a is None else value_a
        value_b = b if value_b is None else value_b
        return Alignment(row @ value_b, col.transpose(1, 2) @ value_a, row, col)


class SoftmaxDecoder(DecoderCore):
    def __init__(self, query_dim: int, memory_dim: int):
        super().__init__()
        self.query_proj = query_projection(query_dim, memory_dim)

    def build_memory(self, h, mask=None):
        return {"h": h, "mask": mask}

    def forward(self, s, memory):
        h, mask = memory["h"], memory["mask"]
        scores = self.query_proj(s) @ h.transpose(1, 2) / math.sqrt(h.shape[-1])  # (B,T,N)
        w = masked_softmax(scores, None if mask is None else mask[:, None, :])
        return w @ h, w
