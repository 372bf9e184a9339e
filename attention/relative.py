"""Relative position representations (Shaw et al., NAACL 2018), a baseline of the
Differentiable Window paper (Tables 1, 5, 6).

Each pair (i, j) of one sequence gets learned vectors of its clipped distance,

    a^K_ij = w^K_clip(j - i, k),   a^V_ij = w^V_clip(j - i, k),   clip(x, k) = max(-k, min(k, x))

(2k + 1 vectors of the head size, shared across heads), used in the logits and the output:

    e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)                                        (Eq. 4)
    z_i  = sum_j alpha_ij (v_j + a^V_ij),   alpha = softmax_j(e)                 (Eq. 3)

Without forming the (Lq, Lk, d) tensors a^K, a^V: q_i . a^K_ij = (q W^K^T)[i, rel(i, j)] is a
gather from the (B,H,Lq,2k+1) product q W^K^T, and sum_j alpha_ij a^V_ij = (buckets W^V)_i
with buckets[i, r] = sum of alpha_ij over the j at clipped distance r (a scatter-add).
With ``values=False`` only the logits change and the output is one
``scaled_dot_product_attention`` call with the positional logits as an additive bias.

Positions follow the causal convention of attention/masking.py: query i sits at position
i + (Lk - Lq), so cached incremental decoding sees the same distances as the full sequence.

Self-attention only: distances j - i compare positions within one sequence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mechanism, MultiHeadCore, UnsupportedContext
from attention.masking import attention_mask, masked_attention, masked_softmax

_SELF_ONLY = ("relative positions j - i compare two positions of the same sequence "
              "(Shaw et al. 2018 define them for self-attention only)")


def relative_index(lq: int, lk: int, max_distance: int, device=None) -> Tensor:
    """(Lq, Lk) index into the 2k+1 embeddings: clip(j - i', k) + k with i' = i + (Lk - Lq)."""
    i = torch.arange(lq, device=device)[:, None] + (lk - lq)
    j = torch.arange(lk, device=device)[None, :]
    return (j - i).clamp(-max_distance, max_distance) + max_distance


class relative(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Shaw et al. relative positions.  ``max_distance`` is the clipping distance k;
    ``values`` adds a^V to the values (Eq. 3) besides a^K to the keys (Eq. 4)."""

    name = "relative"
    unsupported = {
        "alignment": _SELF_ONLY + "; a DecompAtt alignment relates two different sentences",
        "decoder": _SELF_ONLY + "; an RNN decoder attends over another (source) sequence",
    }

    def __init__(self, max_distance: int = 16, values: bool = True):
        if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 0:
            raise ValueError(f"relative: max_distance must be an integer >= 0, "
                             f"got {max_distance!r}")
        self.max_distance, self.values = max_distance, values

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        if not self_attention:
            raise UnsupportedContext(
                f"attention {self.name!r} cannot be used for multi-head cross attention "
                f"(self_attention=False): {_SELF_ONLY}. Use it for encoder or decoder "
                "self-attention and another mechanism for cross attention")
        return RelativeMultiHead(d_model // n_heads, self.max_distance, self.values, dropout)


class RelativeMultiHead(MultiHeadCore):
    def __init__(self, head_dim: int, max_distance: int, values: bool, dropout: float):
        super().__init__()
        self.max_distance, self.dropout = max_distance, dropout
        n = 2 * max_distance + 1
        # w^K, w^V: (2k+1, d), shared across heads; N(0, 1/d) keeps q . a^K on the scale of q . k
        self.key_embedding = nn.Parameter(torch.randn(n, head_dim) * head_dim**-0.5)
        self.value_embedding = (nn.Parameter(torch.randn(n, head_dim) * head_dim**-0.5)
                                if values else None)

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        b, h, lq, d = q.shape
        lk = k.shape[-2]
        if lq > lk:
            raise ValueError(f"relative: self-attention needs Lq <= Lk (the queries are the last "
                             f"Lq of the Lk positions), got Lq={lq}, Lk={lk}")
        mask = attention_mask(key_mask, lq, lk, causal, device=q.device)  # (B,1,Lq,Lk) | None
        rel = relative_index(lq, lk, self.max_distance, q.device).expand(b, h, lq, lk)
        scale = 1.0 / math.sqrt(d)
        # q_i . a^K_ij: (B,H,Lq,2k+1) gathered at rel(i, j)
        position_logits = (q @ self.key_embedding.t()).gather(-1, rel) * scale  # (B,H,Lq,Lk)
        p = self.dropout if self.training else 0.0
        if self.value_embedding is None:
            out = masked_attention(q, k, v, mask, position_logits, p)
            weights = None
            if need_weights:
                weights = masked_softmax(q @ k.transpose(-2, -1) * scale + position_logits, mask)
            return out, weights
        weights = masked_softmax(q @ k.transpose(-2, -1) * scale + position_logits, mask)  # Eq. 4
        dropped = F.dropout(weights, p, self.training)
        buckets = dropped.new_zeros(b, h, lq, 2 * self.max_distance + 1).scatter_add_(
            -1, rel, dropped)  # sum of alpha_ij per clipped distance (B,H,Lq,2k+1)
        out = dropped @ v + buckets @ self.value_embedding  # Eq. 3
        return out, (weights if need_weights else None)
