"""Differentiable Window for Dynamic Local Attention (Nguyen et al., ACL 2020), Sections 3-4.

Discrete window (Eq. 3-6): query i attends keys l_i <= j <= r_i.  With one-hot boundaries
phi(l), phi(r) and U the n x n upper-triangular matrix of ones (U[u, v] = 1 iff u <= v):

    rightward  phi(l) U     = 1[l <= j]     a cumulative sum          (Eq. 5)
    leftward   phi(r) U^T   = 1[r >= j]     a reverse cumulative sum
    m = (phi(l) U) * (phi(r) U^T)                                      (Eq. 6)

Trainable soft masking (Eq. 7-9): boundary distributions over the keys a query may attend,

    phi_l(q_i) = softmax_j(q_i W_l K^T)       phi_r(q_i) = softmax_j(q_i W_r K^T)     (Eq. 7-8)
    m_hat_i = (phi_l U) * (phi_r U^T) + (phi_r U) * (phi_l U^T)                        (Eq. 9)

so m_hat_i[j] = P(l <= j <= r) + P(r <= j <= l) for independent l ~ phi_l, r ~ phi_r; the
second term covers windows pointed to the wrong way round (l > r).

Segment-based soft masking (Eq. 10-11), segment size b: every token of a segment shares one
value.  The rightward value of token j is the cumulative sum up to the END of j's segment, the
leftward value the reverse sum from the START of j's segment (n=6, b=2: phi_l U_seg =
[p1+p2, p1+p2, p1..p4, p1..p4, p1..p6, p1..p6]); a last partial segment ends at the last key.
Both terms of Eq. 9 use segments.

Multiplicative window (MW, Eq. 12-13): A = softmax(Q K^T / sqrt(d)) * M_hat, output A V (not
renormalised).  Additive window (AW, Eq. 14-17): separate global (Q_g, K_g) and local (Q_l, K_l)
projections, A = softmax(Q_g K_g^T / sqrt(d) + M_hat * (Q_l K_l^T / sqrt(d))), output A V.

``boundary="paper"`` scores the boundaries as Eq. 7-8 with a W_l, W_r per head on the per-head
q and k.  ``boundary="authors"`` follows the authors' fairseq code (tungngthanh/dynamic-attention,
learnable_gl_attention.py): left and right boundaries get query and key projections of their
own of the layer inputs.  Neither divides the boundary scores by sqrt(d); ``boundary_scale``
multiplies them by a constant, or with ``"length"`` by the number of keys the query may attend
(the code's ``gumbel_alpha='src_len'``: the non-pad length, and for causal attention the
visible prefix so that no future key leaks in).

Placement in the paper (Sec. 4.3): encoder self-attention AW, decoder self-attention MW
token-based (the decoder cannot point to unfinished segments, so ``segment_size > 1`` with
causal attention is an error), cross-attention AW with segments of 5.

The window is content-based (it points with q . W . k), so it is defined for pairwise
alignment too (a window over b for each a_i and over a for each b_j, the alignment's unscaled
dot products as global scores) and for an RNN decoder over its source memory.  M_hat is one
(..., Lq, Lk) tensor like the attention weights; nothing of size Lq * Lk * d is formed.

Multi-head attention (every variant and option: MW and AW, tokens and segments, both
boundaries and scales, key padding, causality, need_weights, dropout) takes a fused,
memory-bounded path, :mod:`attention._window_kernels`: tiles of query rows, the two boundary
softmaxes, Eq. 9-11 and the weights in one kernel per tile, only the O(L * d) inputs kept
for the backward pass, which recomputes each tile (as flash attention does).  It computes
what :meth:`WindowMultiHead._plain` computes (the equations through autograd on whole
(B, H, Lq, Lk) tensors, tested against each other; dropout draws its own masks).  Pairwise
alignment and the RNN decoder (short sequences) use the plain equations only.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention import _window_kernels as kernels
from attention.base import (
    Alignment,
    AlignmentCore,
    DecoderCore,
    Mechanism,
    MultiHeadCore,
    UnsupportedContext,
    query_projection,
)
from attention.masking import attention_mask, check_mask, masked_attention, masked_softmax

VARIANTS = ("mw", "aw")
BOUNDARIES = ("paper", "authors")


# -- Eq. 9-11: the soft window from two boundary distributions ------------------------------
def _segment_bounds(n: int, segment_size: int, device=None) -> tuple[Tensor, Tensor]:
    """(start, end) position of the segment of each of n tokens; the last segment may be short."""
    j = torch.arange(n, device=device)
    start = j - j % segment_size
    return start, (start + segment_size - 1).clamp(max=n - 1)


def window_mask(phi_l: Tensor, phi_r: Tensor, segment_size: int = 1) -> Tensor:
    """Soft window m_hat (..., Lq, Lk) of Eq. 9 (segment-based: Eq. 10-11) from the boundary
    distributions phi_l, phi_r (..., Lq, Lk) over the last dim:
    m_hat[j] = P(l <= j <= r) + P(r <= j <= l), l ~ phi_l and r ~ phi_r independent, positions
    replaced by their segments when ``segment_size`` > 1.  Cumulative sums, no triangular
    matmul.  Exported as ``attention.functional.window_mask``."""
    if phi_l.shape != phi_r.shape:
        raise ValueError(f"window_mask: phi_l {tuple(phi_l.shape)} and phi_r "
                         f"{tuple(phi_r.shape)} must have the same shape (..., Lq, Lk)")
    if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 1:
        raise ValueError(f"window_mask: segment_size must be an integer >= 1, got {segment_size!r}")
    l_before, r_before = phi_l.cumsum(-1), phi_r.cumsum(-1)  # P(l <= j), P(r <= j): phi U
    # P(l >= j) = total - P(l <= j) + P(l = j): one scan per boundary, no flipped copies
    # (fwd+bwd of the whole mask 20% faster than flip-cumsum-flip at L=512)
    l_after = l_before[..., -1:] - l_before + phi_l
    r_after = r_before[..., -1:] - r_before + phi_r
    if segment_size > 1:
        start, end = _segment_bounds(phi_l.shape[-1], segment_size, phi_l.device)
        l_before, r_before = l_before.index_select(-1, end), r_before.index_select(-1, end)
        l_after, r_after = l_after.index_select(-1, start), r_after.index_select(-1, start)
    return l_before * r_after + r_before * l_after  # Eq. 9


def boundary_scale_factor(option: float | str, mask: Tensor | None, lk: int,
                          dtype: torch.dtype) -> Tensor | float:
    """The multiplier of the boundary scores: a constant, or for ``"length"`` the number of
    keys each query may attend (mask (..., Lq, Lk) -> (..., Lq, 1))."""
    if option != "length":
        return float(option)
    return float(lk) if mask is None else mask.sum(-1, keepdim=True).to(dtype)


def boundary_distributions(left_scores: Tensor, right_scores: Tensor, mask: Tensor | None,
                           scale: float | str = 1.0) -> tuple[Tensor, Tensor]:
    """phi_l, phi_r (..., Lq, Lk) of Eq. 7-8 from boundary scores (..., Lq, Lk): the masked
    softmax of scale * scores (a masked key gets no boundary mass)."""
    s = boundary_scale_factor(scale, mask, left_scores.shape[-1], left_scores.dtype)
    return masked_softmax(left_scores * s, mask), masked_softmax(right_scores * s, mask)


def soft_window(left_scores: Tensor, right_scores: Tensor, mask: Tensor | None,
                scale: float | str = 1.0, segment_size: int = 1) -> Tensor:
    """M_hat from boundary scores (..., Lq, Lk): Eq. 7-8, then Eq. 9-11."""
    return window_mask(*boundary_distributions(left_scores, right_scores, mask, scale),
                       segment_size)


def window_weights(scores: Tensor, mask: Tensor | None, m_hat: Tensor, variant: str,
                   local_scores: Tensor | None = None) -> Tensor:
    """A (..., Lq, Lk): MW softmax(scores) * M_hat (Eq. 12) or AW
    softmax(scores + M_hat * local_scores) (Eq. 14-17); masked keys exactly 0."""
    if variant == "mw":
        return masked_softmax(scores, mask) * m_hat
    return masked_softmax(scores + m_hat * local_scores, mask)


# -- projections ------------------------------------------------------------------------------
def _split_heads(x: Tensor, groups: int, heads: int) -> Tensor:
    """(B, L, groups * P) -> (B, groups, heads, L, P // heads)."""
    b, n, _ = x.shape
    return x.view(b, n, groups, heads, -1).permute(0, 2, 3, 1, 4)


class BoundaryScores(nn.Module):
    """Left and right boundary scores, Eq. 7-8 before the softmax: (B, 2, H, Lq, Lk).

    ``paper``: q_i W k_j^T with a (query_dim x key_dim) W_l and W_r per head, on per-head
    tensors q (B,H,Lq,query_dim), k (B,H,Lk,key_dim).
    ``authors``: (x_i W_q + b)(y_j W_k + b)^T with separate left and right projections of the
    inputs x (B,Lq,query_dim), y (B,Lk,key_dim) to ``heads`` heads of proj_dim // heads.
    :meth:`keys` is what depends on the keys only (computed once per source in a decoder).
    """

    def __init__(self, boundary: str, heads: int, query_dim: int, key_dim: int,
                 proj_dim: int | None = None):
        super().__init__()
        self.boundary, self.heads = boundary, heads
        if boundary == "paper":
            weight = torch.empty(2, heads, query_dim, key_dim)
            for w in weight.view(-1, query_dim, key_dim):
                nn.init.xavier_uniform_(w)
            self.weight = nn.Parameter(weight)  # W_l, W_r per head
        else:
            proj_dim = key_dim if proj_dim is None else proj_dim
            if proj_dim % heads:
                raise ValueError(f"window: boundary projection size {proj_dim} is not divisible "
                                 f"by {heads} heads")
            self.query = nn.Linear(query_dim, 2 * proj_dim)  # left q, right q
            self.key = nn.Linear(key_dim, 2 * proj_dim)  # left k, right k

    def keys(self, k: Tensor) -> Tensor:
        if self.boundary == "paper":
            # k W^T so that q @ keys^T = q W k^T: (B,1,H,Lk,kd) @ (2,H,kd,qd) -> (B,2,H,Lk,qd)
            return k.unsqueeze(1) @ self.weight.transpose(-2, -1)
        return _split_heads(self.key(k), 2, self.heads)  # (B,2,H,Lk,dh)

    def forward(self, q: Tensor, keys: Tensor) -> Tensor:
        q = q.unsqueeze(1) if self.boundary == "paper" else _split_heads(self.query(q), 2,
                                                                         self.heads)
        return q @ keys.transpose(-2, -1)  # (B,2,H,Lq,Lk)


class LocalScores(nn.Module):
    """Q_l K_l^T of the AW local attention (Eq. 14-17, unscaled): local projections of the
    inputs x (B,Lq,query_dim), y (B,Lk,key_dim), split into heads -> (B,H,Lq,Lk)."""

    def __init__(self, heads: int, query_dim: int, key_dim: int, proj_dim: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(query_dim, proj_dim)
        self.key = nn.Linear(key_dim, proj_dim)

    def keys(self, y: Tensor) -> Tensor:
        return _split_heads(self.key(y), 1, self.heads).squeeze(1)  # (B,H,Lk,dh)

    def forward(self, x: Tensor, keys: Tensor) -> Tensor:
        q = _split_heads(self.query(x), 1, self.heads).squeeze(1)  # (B,H,Lq,dh)
        return q @ keys.transpose(-2, -1)


# -- the flag ---------------------------------------------------------------------------------
def _check_options(variant, segment_size, boundary, boundary_scale) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"window: variant must be one of {VARIANTS}, got {variant!r}")
    if boundary not in BOUNDARIES:
        raise ValueError(f"window: boundary must be one of {BOUNDARIES}, got {boundary!r}")
    if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 1:
        raise ValueError(f"window: segment_size must be an integer >= 1, got {segment_size!r}")
    if isinstance(boundary_scale, str):
        if boundary_scale != "length":
            raise ValueError(f"window: boundary_scale must be a positive number or 'length', "
                             f"got {boundary_scale!r}")
    elif isinstance(boundary_scale, bool) or not isinstance(boundary_scale, int | float) \
            or not boundary_scale > 0:
        raise ValueError(f"window: boundary_scale must be a positive number or 'length', "
                         f"got {boundary_scale!r}")


class window(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Differentiable window attention.

    variant: ``"mw"`` multiplicative (Eq. 12-13) or ``"aw"`` additive (Eq. 14-17).
    segment_size: 1 = token-based (Eq. 9), b > 1 = segment-based (Eq. 10-11); not with causal
        attention.
    boundary: ``"paper"`` (Eq. 7-8, W_l/W_r per head on the per-head q, k) or ``"authors"``
        (separate left/right q/k projections of the inputs, as in the public code).
    boundary_scale: multiplier of the boundary scores before their softmax: a constant (1.0 =
        Eq. 7-8) or ``"length"`` = the number of keys the query may attend.
    """

    name = "window"

    def __init__(self, variant: Literal["mw", "aw"] = "aw", segment_size: int = 1,
                 boundary: Literal["paper", "authors"] = "paper",
                 boundary_scale: float | Literal["length"] = 1.0):
        _check_options(variant, segment_size, boundary, boundary_scale)
        self.variant, self.segment_size = variant, segment_size
        self.boundary, self.boundary_scale = boundary, boundary_scale

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return WindowMultiHead(self, d_model, n_heads, dropout)

    def alignment(self, *, dim):
        return WindowAlignment(self, dim)

    def decoder(self, *, query_dim, memory_dim):
        return WindowDecoder(self, query_dim, memory_dim)


def _flag_option(name: str) -> property:
    return property(lambda core: getattr(core.options, name),
                    doc=f"The window flag's {name} (held by the flag, read here).")


class _FlagOptions:
    """A window core's options, read from the :class:`window` flag it was built from
    (``self.options``), where they are held once."""

    options: window
    variant = _flag_option("variant")
    segment_size = _flag_option("segment_size")
    boundary = _flag_option("boundary")
    boundary_scale = _flag_option("boundary_scale")


class WindowMultiHead(_FlagOptions, MultiHeadCore):
    """Self or cross attention; AW local projections and ``authors`` boundaries project the
    un-projected ``query_input``/``key_input``."""

    #: run the fused, memory-bounded path (False: the plain autograd path, for comparison)
    fused = True

    def __init__(self, options: window, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.options = options
        self.dropout = dropout
        d = d_model // n_heads
        self.boundaries = (BoundaryScores("paper", n_heads, d, d) if self.boundary == "paper"
                           else BoundaryScores("authors", n_heads, d_model, d_model, d_model))
        self.local = (LocalScores(n_heads, d_model, d_model, d_model)
                      if self.variant == "aw" else None)

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        self._check(causal, query_input, key_input)
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        if self.fused:
            return self._fused(q, k, v, mask, need_weights, query_input, key_input)
        return self._plain(q, k, v, mask, need_weights, query_input, key_input)

    def check_causal(self) -> None:
        if self.segment_size > 1:
            raise UnsupportedContext(
                f"window: segment_size={self.segment_size} with causal attention: the decoder "
                "cannot point to unfinished segments (Sec. 4.3); use segment_size=1 for decoder "
                "self-attention")

    def _check(self, causal, query_input, key_input) -> None:
        if causal:
            self.check_causal()
        if (self.boundary == "authors" or self.variant == "aw") and (
                query_input is None or key_input is None):
            raise ValueError(
                f"window(variant={self.variant!r}, boundary={self.boundary!r}) projects the "
                "un-projected inputs: query_input (B,Lq,D) and key_input (B,Lk,D) are required")

    def _fused(self, q, k, v, mask, need_weights, query_input, key_input):
        """The memory-bounded path (:mod:`attention._window_kernels`): blocks of query rows,
        every (Lq, Lk) block recomputed in the backward pass."""
        b, h, lq, _ = q.shape
        lk = k.shape[-2]

        def flat(t: Tensor | None) -> Tensor | None:  # (B, H, L, e) -> (B * H, L, e)
            return None if t is None else t.reshape(b * h, t.shape[-2], t.shape[-1])

        w = lq_ = lk_ = rq = rk = cq = ck = None
        if self.boundary == "paper":
            w = self.boundaries.weight  # (2, H, d, d): scores q W k^T
        else:
            bq = _split_heads(self.boundaries.query(query_input), 2, h)  # (B,2,H,Lq,dh)
            bk = self.boundaries.keys(key_input)  # (B,2,H,Lk,dh)
            lq_, rq, lk_, rk = flat(bq[:, 0]), flat(bq[:, 1]), flat(bk[:, 0]), flat(bk[:, 1])
        if self.variant == "aw":
            cq = _split_heads(self.local.query(query_input), 1, h).squeeze(1)  # (B,H,Lq,dh)
            cq, ck = flat(cq), flat(self.local.keys(key_input))
        opt = kernels.Options(settings=self.options,
                              dropout=self.dropout if self.training else 0.0,
                              need_weights=need_weights, batch=(b, h))
        inputs = kernels.Inputs(flat(q), flat(k), flat(v), w, lq_, lk_, rq, rk, cq, ck)
        out, weights = kernels.window_attention(inputs, mask, opt)
        out = out.view(b, h, lq, v.shape[-1])
        return out, (None if weights is None else weights.view(b, h, lq, lk))

    def boundary_scores(self, q, k, query_input=None, key_input=None) -> Tensor:
        """Left and right boundary scores (B,2,H,Lq,Lk) before Eq. 7-8's softmax (with
        :func:`boundary_distributions`: where each query's window starts and ends, for heat
        maps); the inputs as :meth:`forward` takes them."""
        if self.boundary == "paper":
            return self.boundaries(q, self.boundaries.keys(k))
        return self.boundaries(query_input, self.boundaries.keys(key_input))

    def _plain(self, q, k, v, mask, need_weights, query_input, key_input):
        """Eq. 7-17 on whole (B, H, Lq, Lk) tensors through autograd (the reference of the
        fused path, and what it computes)."""
        bounds = self.boundary_scores(q, k, query_input, key_input)  # (B,2,H,Lq,Lk)
        m_hat = soft_window(bounds[:, 0], bounds[:, 1], mask, self.boundary_scale,
                            self.segment_size)  # (B,H,Lq,Lk)
        scale = 1.0 / math.sqrt(q.shape[-1])
        p = self.dropout if self.training else 0.0
        if self.variant == "mw":
            weights = window_weights(q @ k.transpose(-2, -1) * scale, mask, m_hat, "mw")  # Eq. 12
            out = F.dropout(weights, p, self.training) @ v  # Eq. 13
            return out, (weights if need_weights else None)
        local = self.local(query_input, self.local.keys(key_input)) * scale  # (B,H,Lq,Lk)
        bias = m_hat * local  # Eq. 14-17: the window-masked local scores
        out = masked_attention(q, k, v, mask, bias, p)  # softmax(global + bias) V
        weights = None
        if need_weights:
            weights = masked_softmax(q @ k.transpose(-2, -1) * scale + bias, mask)
        return out, weights


class WindowAlignment(_FlagOptions, AlignmentCore):
    """A window over b for each a_i and over a for each b_j; global scores e_ij = a_i . b_j
    (unscaled, as the DecompAtt alignment), boundaries and AW local scores unscaled too.  The
    same boundary and local parameters serve both directions."""

    def __init__(self, options: window, dim: int):
        super().__init__()
        self.options = options
        self.boundaries = (BoundaryScores("paper", 1, dim, dim) if self.boundary == "paper"
                           else BoundaryScores("authors", 1, dim, dim, dim))
        self.local = LocalScores(1, dim, dim, dim) if self.variant == "aw" else None

    def _attend(self, x: Tensor, y: Tensor, mask_y: Tensor | None, scores: Tensor) -> Tensor:
        """Window weights (B,Lx,Ly) of each x_i over y."""
        xq, yk = (x.unsqueeze(1), y.unsqueeze(1)) if self.boundary == "paper" else (x, y)
        bounds = self.boundaries(xq, self.boundaries.keys(yk)).squeeze(2)  # (B,2,Lx,Ly)
        mask = None if mask_y is None else mask_y[:, None, :]  # (B,1,Ly)
        m_hat = soft_window(bounds[:, 0], bounds[:, 1], mask, self.boundary_scale,
                            self.segment_size)
        local = None if self.local is None else self.local(x, self.local.keys(y)).squeeze(1)
        return window_weights(scores, mask, m_hat, self.variant, local)

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        mask_a, mask_b = check_mask(mask_a, "mask_a"), check_mask(mask_b, "mask_b")
        scores = a @ b.transpose(1, 2)  # e_ij (B,La,Lb)
        weights_a = self._attend(a, b, mask_b, scores)  # weight of b_j for a_i
        weights_b = self._attend(b, a, mask_a, scores.transpose(1, 2)).transpose(1, 2)
        if mask_a is not None:  # padded a_i: no alignment of its own, no weight in alpha_j
            weights_a = weights_a.masked_fill(~mask_a[:, :, None], 0.0)
        if mask_b is not None:
            weights_b = weights_b.masked_fill(~mask_b[:, None, :], 0.0)
        value_a = a if value_a is None else value_a
        value_b = b if value_b is None else value_b
        return Alignment(weights_a @ value_b, weights_b.transpose(1, 2) @ value_a,
                         weights_a, weights_b)


class WindowDecoder(_FlagOptions, DecoderCore):
    """An RNN decoder's window over its source memory: global scores q(s_t) . h_j / sqrt(Dm)
    (q = identity or a projection to Dm), boundaries over the source (segments allowed: the
    whole source is known), AW local scores of their own projections."""

    def __init__(self, options: window, query_dim: int, memory_dim: int):
        super().__init__()
        self.options = options
        self.query_proj = query_projection(query_dim, memory_dim)
        self.boundaries = (BoundaryScores("paper", 1, query_dim, memory_dim)
                           if self.boundary == "paper"
                           else BoundaryScores("authors", 1, query_dim, memory_dim, memory_dim))
        self.local = (LocalScores(1, query_dim, memory_dim, memory_dim)
                      if self.variant == "aw" else None)

    def build_memory(self, h, mask=None):
        mask = check_mask(mask)
        keys = self.boundaries.keys(h.unsqueeze(1) if self.boundary == "paper" else h)
        memory = {"h": h, "mask": mask, "boundary_keys": keys}  # keys (B,2,1,N,·)
        if self.local is not None:
            memory["local_keys"] = self.local.keys(h)  # (B,1,N,Dm)
        return memory

    def forward(self, s, memory):
        h, mask = memory["h"], memory["mask"]
        scale = 1.0 / math.sqrt(h.shape[-1])
        scores = self.query_proj(s) @ h.transpose(1, 2) * scale  # (B,T,N)
        q = s.unsqueeze(1) if self.boundary == "paper" else s
        bounds = self.boundaries(q, memory["boundary_keys"]).squeeze(2)  # (B,2,T,N)
        m = None if mask is None else mask[:, None, :]  # (B,1,N)
        m_hat = soft_window(bounds[:, 0], bounds[:, 1], m, self.boundary_scale,
                            self.segment_size)
        local = None
        if self.local is not None:
            local = self.local(s, memory["local_keys"]).squeeze(1) * scale  # (B,T,N)
        weights = window_weights(scores, m, m_hat, self.variant, local)
        return weights @ h, weights
