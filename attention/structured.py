"""Segmentation attention, Kim et al. 2017 "Structured Attention Networks" (Sec. 3.2, 4.2).

A linear-chain CRF over binary z_1..z_N, z_j = 1 meaning "attend to position j":

    log phi(z) = start[z_1] + sum_j theta_j z_j + sum_j W[z_j, z_{j+1}] + end[z_N]

with theta_j the attention score of position j (unary potential of z_j = 1, 0 for z_j = 0)
and W a learned 2 x 2 transition matrix.  As in harvardnlp/struct-attn (models/CRF.lua) the
start and end potentials are the mean of W over the other state (the geometric mean of the
potentials), start[c] = mean_a W[a, c], end[c] = mean_b W[c, b], and W starts uniform in
(-0.1, 0.1).  The marginals p(z_j = 1) come from forward-backward in log space (logsumexp),
sequential over positions and vectorised over everything else.  On CPU (float32/float64
scores) the same chain runs in C++ (:mod:`attention._crf_chain_ext`: scaled forward-backward
in double, and a backward pass of its own, O(N) per chain by the expectation semiring), about
15 times faster than that loop and autograd's replay of it at IMDb's 256 keys; the log-space
loop stays the reference (tests compare the two) and the path for other devices and dtypes.

struct-attn's NMT decoder (models/models-nmt.lua) attends with the marginals L1-normalised
and multiplied by lambda (default 2):

    weights_j = lam * p(z_j = 1) / sum_k p(z_k = 1)

so the weights sum to ``lam``, not 1; we compute the ratio as a softmax of the log
marginals (the partition function cancels).  Masked positions are taken out of the chain
(z_j = 0, no potential), so a padded sequence gets exactly the marginals of the unpadded one
and its padded positions exactly 0 weight.  Any mask works, including a different one per
query row (causal prefixes).

Unary scores (``score``): ``"dot"`` follows struct-attn: theta_j = h_j . (W s_i) with W a
bias-free linear map of the decoder state (unscaled dot a_i . b_j in alignment, the scaled
dot product q . k / sqrt(d) in multi-head attention); ``"additive"`` is Bahdanau's
u^T tanh(W s_i + V h_j + b) (per-head u in multi-head attention).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention import _crf_chain_ext
from attention.additive import AdditiveScore, additive_scores, align
from attention.base import AlignmentCore, DecoderCore, Mechanism, MultiHeadCore
from attention.masking import attention_mask, check_mask, masked_softmax, pair_mask

SCORES = ("dot", "additive")


def forward_backward(theta: Tensor, transition: Tensor,
                     mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Forward-backward of the segmentation CRF for unary scores theta (..., N), a transition
    matrix (2, 2) and mask (broadcastable to theta, True = in the chain).

    Returns (node (..., N), log_z (...)): node_j = log of the summed potential of all
    assignments with z_j = 1, so log p(z_j = 1) = node_j - log_z at real positions (node is
    meaningless at masked ones)."""
    if transition.shape != (2, 2):
        raise ValueError(f"the segmentation CRF needs a (2, 2) transition matrix, got "
                         f"{tuple(transition.shape)}")
    n, batch = theta.shape[-1], theta.shape[:-1]
    mask = (theta.new_ones(theta.shape, dtype=torch.bool) if mask is None
            else torch.broadcast_to(check_mask(mask), theta.shape))
    start, end = transition.mean(0), transition.mean(1)  # (2,) each
    unary = torch.stack((torch.zeros_like(theta), theta), dim=-1)  # (..., N, 2)

    alphas = []  # alpha_j[c]: log sum over z_<=j with z_j = c, unary of j included
    alpha = theta.new_zeros(*batch, 2)
    started = torch.zeros(batch, dtype=torch.bool, device=theta.device)
    for j in range(n):
        # sum over the previous state a of alpha[a] + W[a, c]  (..., 2)
        carried = torch.logaddexp(alpha[..., :1] + transition[0], alpha[..., 1:] + transition[1])
        new = torch.where(started.unsqueeze(-1), carried, start) + unary[..., j, :]
        alpha = torch.where(mask[..., j, None], new, alpha)  # masked j: leave the chain as is
        started = started | mask[..., j]
        alphas.append(alpha)
    log_z = torch.logsumexp(alpha + end, dim=-1)

    betas = [None] * n  # beta_j[c]: log sum over z_>j given z_j = c (end included)
    ahead = theta.new_zeros(*batch, 2)  # unary + beta of the next real position
    started = torch.zeros(batch, dtype=torch.bool, device=theta.device)
    for j in reversed(range(n)):
        # sum over the next state d of W[c, d] + ahead[d]  (..., 2)
        carried = torch.logaddexp(transition[:, 0] + ahead[..., :1],
                                  transition[:, 1] + ahead[..., 1:])
        betas[j] = torch.where(started.unsqueeze(-1), carried, end)
        ahead = torch.where(mask[..., j, None], unary[..., j, :] + betas[j], ahead)
        started = started | mask[..., j]
    node = torch.stack(alphas, dim=-2)[..., 1] + torch.stack(betas, dim=-2)[..., 1]  # (..., N)
    return node, log_z


def crf_marginals(theta: Tensor, transition: Tensor, mask: Tensor | None = None) -> Tensor:
    """p(z_j = 1) (..., N) of the segmentation CRF; exactly 0 at masked positions."""
    if _crf_chain_ext.supports(theta):
        return _crf_chain_ext.chain(
            theta, transition, check_mask(mask), normalise=False,
            fallback=lambda: log_space_marginals(theta, transition, mask))
    return log_space_marginals(theta, transition, mask)


def log_space_marginals(theta: Tensor, transition: Tensor, mask: Tensor | None) -> Tensor:
    """:func:`crf_marginals` by the log-space :func:`forward_backward` (autograd records it)."""
    node, log_z = forward_backward(theta, transition, mask)
    log_p = node - log_z.unsqueeze(-1)
    if mask is not None:
        log_p = log_p.masked_fill(~torch.broadcast_to(mask, theta.shape), float("-inf"))
    return log_p.exp()


def segmentation_attention(theta: Tensor, transition: Tensor, mask: Tensor | None = None,
                           lam: float = 2.0) -> Tensor:
    """lam * p(z_j = 1) / sum_k p(z_k = 1) over the real positions (struct-attn); (..., N),
    exactly 0 at masked positions and for rows without a real position.

    CPU float32/float64 scores take the C++ chain of :mod:`attention._crf_chain_ext` (the
    same recursions in one pass per chain, with their own backward); others, and chains out
    of its range, the log-space :func:`forward_backward`."""
    if _crf_chain_ext.supports(theta):
        return _crf_chain_ext.chain(
            theta, transition, check_mask(mask), normalise=True, lam=lam,
            fallback=lambda: log_space_attention(theta, transition, mask, lam))
    return log_space_attention(theta, transition, mask, lam)


def log_space_attention(theta: Tensor, transition: Tensor, mask: Tensor | None,
                        lam: float) -> Tensor:
    """:func:`segmentation_attention` by the log-space :func:`forward_backward`."""
    node, _ = forward_backward(theta, transition, mask)
    return lam * masked_softmax(node, mask)


# -- the flag ---------------------------------------------------------------------------------
def _transition() -> nn.Parameter:
    return nn.Parameter(torch.empty(2, 2).uniform_(-0.1, 0.1))  # struct-attn's param_init


class structured(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Segmentation attention (linear-chain CRF over binary z).  ``lam`` scales the normalised
    marginals (struct-attn's -lambda, default 2); ``score`` picks the unary score;
    ``hidden`` is the additive score's size (None = memory / feature dimension)."""

    name = "structured"

    def __init__(self, score: Literal["dot", "additive"] = "dot", lam: float = 2.0,
                 hidden: int | None = None):
        if score not in SCORES:
            raise ValueError(f"structured: score must be one of {SCORES}, got {score!r}")
        if hidden is not None and hidden < 1:
            raise ValueError(f"structured: hidden must be a positive size or None, got {hidden}")
        self.score, self.lam, self.hidden = score, lam, hidden

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return StructuredMultiHead(self.score, self.lam, n_heads, d_model // n_heads, dropout)

    def alignment(self, *, dim):
        return StructuredAlignment(self.score, self.lam, dim, self.hidden or dim)

    def decoder(self, *, query_dim, memory_dim):
        return StructuredDecoder(self.score, self.lam, query_dim, memory_dim,
                                 self.hidden or memory_dim)


class StructuredDecoder(DecoderCore):
    def __init__(self, score: str, lam: float, query_dim: int, memory_dim: int, hidden: int):
        super().__init__()
        self.lam = lam
        if score == "dot":  # struct-attn: h_j . (W s_i)
            self.query = nn.Linear(query_dim, memory_dim, bias=False)
            self.additive = None
        else:
            self.additive = AdditiveScore(query_dim, memory_dim, hidden)
        self.transition = _transition()

    def build_memory(self, h, mask=None):
        keys = h if self.additive is None else self.additive.keys(h)
        return {"h": h, "mask": check_mask(mask), "keys": keys}

    def forward(self, s, memory):
        h, mask, keys = memory["h"], memory["mask"], memory["keys"]
        if self.additive is None:
            theta = self.query(s) @ keys.transpose(1, 2)  # (B,T,N)
        else:
            theta = self.additive(s, keys)
        weights = segmentation_attention(theta, self.transition,
                                         None if mask is None else mask[:, None, :], self.lam)
        return weights @ h, weights  # (B,T,Dm), (B,T,N)


class StructuredAlignment(AlignmentCore):
    def __init__(self, score: str, lam: float, dim: int, hidden: int):
        super().__init__()
        self.lam = lam
        self.additive = None if score == "dot" else AdditiveScore(dim, dim, hidden)
        self.transition = _transition()

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        if self.additive is None:
            theta = a @ b.transpose(1, 2)  # e_ij (B,La,Lb)
        else:
            theta = self.additive(a, self.additive.keys(b))
        pairs = pair_mask(mask_a, mask_b)
        pairs_t = None if pairs is None else pairs.transpose(1, 2)
        weights_a = segmentation_attention(theta, self.transition, pairs, self.lam)  # over b
        weights_b = segmentation_attention(theta.transpose(1, 2), self.transition, pairs_t,
                                           self.lam)  # over a  (B,Lb,La)
        return align(weights_a, weights_b.transpose(1, 2), a, b, value_a, value_b)


class StructuredMultiHead(MultiHeadCore):
    def __init__(self, score: str, lam: float, n_heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.lam, self.dropout = lam, dropout
        self.u = None
        if score == "additive":
            bound = 1.0 / math.sqrt(head_dim)
            self.u = nn.Parameter(torch.empty(n_heads, head_dim).uniform_(-bound, bound))
        self.transition = _transition()

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        if self.u is None:
            theta = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B,H,Lq,Lk)
        else:
            theta = additive_scores(q, k, self.u)
        # a chain over the keys of each query row: causal rows see their own prefix
        weights = segmentation_attention(theta, self.transition, mask, self.lam)
        out = F.dropout(weights, self.dropout, self.training) @ v  # (B,H,Lq,dv)
        return out, (weights if need_weights else None)
