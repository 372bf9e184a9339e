"""Additive attention, Bahdanau et al. 2015 (Eq. 5 of the attention-density-matrix paper).

The score of decoder state s_i for source encoding h_j is

    alpha(s_i, h_j) = u^T tanh(W s_i + V h_j + b)                        (Eq. 5)

and the weights are a softmax over the real source positions.  In the decoder context
``V h_j + b`` depends only on the source and is computed once (``precompute``), so a step
costs O(N * hidden).  Pairwise alignment scores a_i against b_j and normalises both ways
(DecompAtt Eq. 4).  Multi-head attention uses the block's own projections as W and V (with
their biases as b) and a vector u per head: score = u_h^T tanh(q_i + k_j).

The tanh term is (..., Lq, Lk, hidden).  On CPU (float32/float64) :func:`additive_scores`
never forms it: the C++ kernels of :mod:`attention._additive_ext` keep each tanh in a register
(``ATTNREPRO_ADDITIVE_CPP=0`` turns them off).  Otherwise it computes the term in blocks of
query rows, each block recomputed in the backward pass instead of stored (activation
checkpointing), so neither pass holds more than ``block_elements`` of it at once.  The
block helpers here (:func:`rows_per_block`, :func:`row_blocks`, :func:`checkpointed`) serve
every pairwise-tanh mechanism (``density``, ``structured``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attention import _additive_ext
from attention.base import Alignment, AlignmentCore, DecoderCore, Mechanism, MultiHeadCore
from attention.masking import attention_mask, check_mask, masked_softmax, pair_mask

#: default largest pairwise temporary (elements) a blocked computation holds at once
BLOCK_ELEMENTS = 1 << 22


# -- blocks of a pairwise computation ---------------------------------------------------------
def rows_per_block(row_elements: int, block_elements: int = BLOCK_ELEMENTS) -> int:
    """How many rows of ``row_elements`` elements fit in ``block_elements`` (at least one)."""
    if block_elements < 1:
        raise ValueError(f"block_elements must be a positive number of elements, got "
                         f"{block_elements}")
    return max(1, block_elements // max(1, row_elements))


def row_blocks(n: int, size: int) -> list[slice]:
    """Slices cutting ``n`` rows into consecutive blocks of ``size`` rows (the last shorter);
    no row: one empty block, so a loop over the blocks still yields a (empty) result."""
    if n == 0:
        return [slice(0, 0)]
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def checkpointed(fn: Callable[..., Tensor], *args) -> Tensor:
    """``fn(*args)``; under autograd its intermediates are recomputed in the backward pass
    instead of stored, so a loop of blocks never keeps more than one block alive."""
    if torch.is_grad_enabled() and any(torch.is_tensor(a) and a.requires_grad for a in args):
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


# -- Eq. 5 -----------------------------------------------------------------------------------
def _additive_block(wq: Tensor, vk: Tensor, u_col: Tensor) -> Tensor:
    t = torch.tanh(wq.unsqueeze(-2) + vk.unsqueeze(-3))  # (..., c, Lk, A)
    return (t @ u_col).squeeze(-1)  # (..., c, Lk)


def additive_scores(wq: Tensor, vk: Tensor, u: Tensor, *,
                    block_elements: int = BLOCK_ELEMENTS) -> Tensor:
    """u . tanh(wq_i + vk_j) (Eq. 5) for wq (..., Lq, A) = W s, vk (..., Lk, A) = V h + b and
    u (A,) or (*trailing batch dims, A) (e.g. (H, A), one u per head) -> (..., Lq, Lk).

    On CPU in float32/float64 the C++ kernels (:mod:`attention._additive_ext`): no extra memory
    beyond the operands' contiguous copies.  Otherwise (or with ``ATTNREPRO_ADDITIVE_CPP=0``)
    peak extra memory: one block of at most ``max(block_elements, batch * Lk * A)`` elements,
    in the forward and the backward pass.
    """
    if wq.shape[-1] != vk.shape[-1] or u.shape[-1] != wq.shape[-1]:
        raise ValueError(f"additive scores need W s, V h and u of one hidden size, got "
                         f"{wq.shape[-1]}, {vk.shape[-1]} and {u.shape[-1]}")
    if _additive_ext.supports(wq, vk, u):
        return _additive_ext.scores(wq, vk, u)
    batch = torch.broadcast_shapes(wq.shape[:-2], vk.shape[:-2])
    lq, (lk, a) = wq.shape[-2], vk.shape[-2:]
    u_col = u.unsqueeze(-2).unsqueeze(-1)  # (..., 1, A, 1)
    size = rows_per_block(math.prod(batch) * lk * a, block_elements)
    return torch.cat([checkpointed(_additive_block, wq[..., rows, :], vk, u_col)
                      for rows in row_blocks(lq, size)], dim=-2)


class AdditiveScore(nn.Module):
    """alpha(s_i, h_j) = u^T tanh(W s_i + V h_j + b) (Eq. 5), the baseline score of the
    attention density matrix paper and one unary score of ``structured``.

    ``keys(h)`` = V h + b depends only on the source (computed once per source);
    ``forward(s (..., T, Dq), keys (..., N, A))`` -> scores (..., T, N).
    """

    def __init__(self, query_dim: int, key_dim: int, hidden: int,
                 block_elements: int = BLOCK_ELEMENTS):
        super().__init__()
        self.query = nn.Linear(query_dim, hidden, bias=False)  # W
        self.key = nn.Linear(key_dim, hidden)  # V, b
        bound = 1.0 / math.sqrt(hidden)
        self.u = nn.Parameter(torch.empty(hidden).uniform_(-bound, bound))
        self.block_elements = block_elements

    def keys(self, h: Tensor) -> Tensor:
        return self.key(h)  # V h_j + b  (..., N, A)

    def forward(self, s: Tensor, keys: Tensor) -> Tensor:
        return additive_scores(self.query(s), keys, self.u, block_elements=self.block_elements)


# -- the softmax over scores, shared by the softmax-normalised mechanisms ---------------------
def attend(scores: Tensor, memory: dict) -> tuple[Tensor, Tensor]:
    """Decoder context: softmax over the real source positions of scores (B,T,N), and the
    context (B,T,Dm) pooled from ``memory["h"]``."""
    mask = memory["mask"]
    weights = masked_softmax(scores, None if mask is None else mask[:, None, :])  # (B,T,N)
    return weights @ memory["h"], weights


def align(weights_a: Tensor, weights_b: Tensor, a: Tensor, b: Tensor,
          value_a: Tensor | None = None, value_b: Tensor | None = None) -> Alignment:
    """Pool both directions (DecompAtt Eq. 4): weights_a (B,La,Lb) weighs b_j for a_i,
    weights_b (B,La,Lb) weighs a_i for b_j."""
    value_a = a if value_a is None else value_a
    value_b = b if value_b is None else value_b
    return Alignment(weights_a @ value_b, weights_b.transpose(1, 2) @ value_a,
                     weights_a, weights_b)


def softmax_alignment(scores: Tensor, a: Tensor, b: Tensor, mask_a: Tensor | None = None,
                      mask_b: Tensor | None = None, value_a: Tensor | None = None,
                      value_b: Tensor | None = None) -> Alignment:
    """Alignment by a masked softmax of e (B,La,Lb) over b for each a_i and over a for each
    b_j; padded rows and columns get all-zero weights."""
    pairs = pair_mask(mask_a, mask_b)
    return align(masked_softmax(scores, pairs, dim=2), masked_softmax(scores, pairs, dim=1),
                 a, b, value_a, value_b)


# -- the flag ---------------------------------------------------------------------------------
class additive(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Bahdanau additive attention.  ``hidden`` is the size of u, W s and V h (None = the
    memory dimension in the decoder, the feature dimension in alignment); multi-head attention
    uses the head size."""

    name = "additive"

    def __init__(self, hidden: int | None = None):
        if hidden is not None and hidden < 1:
            raise ValueError(f"additive: hidden must be a positive size or None, got {hidden}")
        self.hidden = hidden

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return AdditiveMultiHead(n_heads, d_model // n_heads, dropout)

    def alignment(self, *, dim):
        return AdditiveAlignment(dim, self.hidden or dim)

    def decoder(self, *, query_dim, memory_dim):
        return AdditiveDecoder(query_dim, memory_dim, self.hidden or memory_dim)


class AdditiveMultiHead(MultiHeadCore):
    def __init__(self, n_heads: int, head_dim: int, dropout: float):
        super().__init__()
        bound = 1.0 / math.sqrt(head_dim)
        self.u = nn.Parameter(torch.empty(n_heads, head_dim).uniform_(-bound, bound))  # (H,d)
        self.dropout = dropout

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        scores = additive_scores(q, k, self.u)  # (B,H,Lq,Lk)
        weights = masked_softmax(scores, mask)
        out = F.dropout(weights, self.dropout, self.training) @ v  # (B,H,Lq,dv)
        return out, (weights if need_weights else None)


class AdditiveAlignment(AlignmentCore):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.score = AdditiveScore(dim, dim, hidden)

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        scores = self.score(a, self.score.keys(b))  # e_ij (B,La,Lb)
        return softmax_alignment(scores, a, b, mask_a, mask_b, value_a, value_b)


class AdditiveDecoder(DecoderCore):
    def __init__(self, query_dim: int, memory_dim: int, hidden: int):
        super().__init__()
        self.score = AdditiveScore(query_dim, memory_dim, hidden)

    def build_memory(self, h, mask=None):
        return {"h": h, "mask": check_mask(mask), "keys": self.score.keys(h)}

    def forward(self, s, memory):
        return attend(self.score(s, memory["keys"]), memory)  # (B,T,Dm), (B,T,N)
