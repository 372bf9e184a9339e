"""The layers of DecaProp (Tay et al., "Densely Connected Attention Propagation for Reading
Comprehension", NeurIPS 2018), the reader of CoDA Table 1; the network is
lit_models/decaprop.py.

- :class:`FactorizationMachine` (Rendle 2010, Eq. 1 in the O(kp) form of Lemma 3.1):
  FM(x) = w0 + w.x + 1/2 sum_f [ (V_f . x)^2 - (V_f^2) . (x^2) ], which equals
  w0 + w.x + sum_{i<j} <v_i, v_j> x_i x_j (the naive pairwise sum, kept in the tests);
- :class:`BidirectionalAttentionConnector` (DecaProp's BAC): co-attention of two
  sequences, each token compared with what it aligns to in three ways (product,
  concatenation, difference), each comparison compressed to ONE scalar by an FM; with the
  intra part, the same three comparisons against the sequence's own self-alignment;
- :class:`BiGRU` with variational dropout on its input (one mask per sequence, shared over
  time), its backward direction reading each sequence reversed within its length, so that
  padding changes nothing;
- :class:`GatedSelfAttention` (R-Net's gated self-matching attention, Wang et al. 2017, as
  DecaProp's code uses it): R = [H; softmax(F(H) F(H)^T / sqrt(d)) H] * sigmoid(W_g R);
- :func:`best_spans`: argmax_{i <= j < i + max_span} p_start(i) p_end(j).

Masks are boolean, True = real token (attention.masking).  Padded positions of every output
here are 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.masking import masked_softmax


class FactorizationMachine(nn.Module):
    """x (..., p) -> FM(x) (...): a scalar per vector, linear terms plus every pairwise
    interaction x_i x_j weighted by <v_i, v_j>, v_i in R^k (Rendle 2010, Eq. 1).

    V (p, k) is Xavier-initialised, or N(0, ``init_std``^2) (DecaProp's intra FMs); w0 and w
    start at 0 (DecaProp's compose_op)."""

    def __init__(self, p: int, k: int, init_std: float | None = None):
        super().__init__()
        self.w0 = nn.Parameter(torch.zeros(()))
        self.w = nn.Parameter(torch.zeros(p))
        self.v = nn.Parameter(torch.empty(p, k))
        if init_std is None:
            nn.init.xavier_uniform_(self.v)
        else:
            nn.init.normal_(self.v, std=init_std)

    def forward(self, x: Tensor) -> Tensor:
        xv = x @ self.v  # sum_i v_if x_i (..., k)
        pairs = 0.5 * (xv.pow(2) - x.pow(2) @ self.v.pow(2)).sum(-1)  # Lemma 3.1 (...)
        return self.w0 + x @ self.w + pairs


def compare_features(x: Tensor, aligned: Tensor, fms: nn.ModuleList) -> Tensor:
    """DecaProp's three comparisons of a token with what it is aligned to, each compressed to
    one scalar: [FM_mul(x * x'), FM_cat([x; x']), FM_sub(x - x')] (B, L, 3)."""
    mul, cat, sub = fms
    return torch.stack([mul(x * aligned), cat(torch.cat([x, aligned], -1)), sub(x - aligned)],
                       dim=-1)


class BidirectionalAttentionConnector(nn.Module):
    """BAC(A, B) -> (F_A (B, La, n), F_B (B, Lb, n)), n = 6 with the intra part, else 3.

        A_hat = relu(relu(A W1) W2), B_hat likewise (W1, W2 shared by A and B, no bias)
        Y = A_hat B_hat^T / sqrt(D)                                     (B, La, Lb)
        B_a = softmax_j(Y) B,  A_b = softmax_i(Y^T) A                   (co-attention)
        F_A = [FM_mul(A * B_a), FM_cat([A; B_a]), FM_sub(A - B_a)]      (inter)
            + the same three of A against softmax_j(A_hat A_hat^T / sqrt(D)) A  (intra)

    The A and B sides share one FM per comparison (inter and intra have their own).  The
    softmaxes are masked (DecaProp's code adds -1e-30 at padded positions, which masks
    nothing; we mask, so padding changes nothing); the intra part is the self co-attention of
    each sequence with the same affinity (the published call to ``intra_attention`` does not
    match its signature)."""

    def __init__(self, dim: int, factor: int, intra: bool = True):
        super().__init__()
        self.dim = dim
        self.project = nn.Sequential(nn.Linear(dim, dim, bias=False), nn.ReLU(),
                                     nn.Linear(dim, dim, bias=False), nn.ReLU())
        for layer in self.project[::2]:
            nn.init.xavier_uniform_(layer.weight)
        self.inter = nn.ModuleList(FactorizationMachine(p, factor)
                                   for p in (dim, 2 * dim, dim))
        self.intra = (nn.ModuleList(FactorizationMachine(p, factor, init_std=0.1)
                                    for p in (dim, 2 * dim, dim)) if intra else None)

    @property
    def n_features(self) -> int:
        return 6 if self.intra is not None else 3

    def _self_aligned(self, x: Tensor, x_hat: Tensor, mask: Tensor) -> Tensor:
        scores = x_hat @ x_hat.transpose(1, 2) / math.sqrt(self.dim)  # (B,L,L)
        return masked_softmax(scores, mask[:, None, :], dim=-1) @ x  # (B,L,D)

    def forward(self, a: Tensor, b: Tensor, mask_a: Tensor, mask_b: Tensor
                ) -> tuple[Tensor, Tensor]:
        a_hat, b_hat = self.project(a), self.project(b)  # (B,La,D), (B,Lb,D)
        y = a_hat @ b_hat.transpose(1, 2) / math.sqrt(self.dim)  # (B,La,Lb)
        b_for_a = masked_softmax(y, mask_b[:, None, :], dim=-1) @ b  # B_a (B,La,D)
        a_for_b = masked_softmax(y.transpose(1, 2), mask_a[:, None, :], dim=-1) @ a  # (B,Lb,D)
        fa = [compare_features(a, b_for_a, self.inter)]  # (B,La,3)
        fb = [compare_features(b, a_for_b, self.inter)]  # (B,Lb,3)
        if self.intra is not None:
            fa.append(compare_features(a, self._self_aligned(a, a_hat, mask_a), self.intra))
            fb.append(compare_features(b, self._self_aligned(b, b_hat, mask_b), self.intra))
        fa, fb = torch.cat(fa, -1), torch.cat(fb, -1)  # (B,La,n), (B,Lb,n)
        return fa * mask_a[..., None], fb * mask_b[..., None]


class VariationalDropout(nn.Module):
    """Dropout with one mask per sequence, shared over time (Gal & Ghahramani 2016): x
    (B, L, D) times a (B, 1, D) mask of keep-probability 1 - p, scaled by 1 / (1 - p)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        keep = x.new_empty(x.shape[0], 1, x.shape[-1]).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


def reverse_padded(x: Tensor, lengths: Tensor) -> Tensor:
    """Each sequence of x (B, L, D) reversed within its length (padding stays at the end):
    row b holds x[b, n_b - 1], ..., x[b, 0], then x[b, n_b:]."""
    pos = torch.arange(x.shape[1], device=x.device)[None, :]  # (1,L)
    n = lengths[:, None]  # (B,1)
    index = torch.where(pos < n, n - 1 - pos, pos)  # (B,L), its own inverse
    return x.gather(1, index[..., None].expand_as(x))


class BiGRU(nn.Module):
    """One bidirectional GRU layer, x (B, L, d_in) -> (B, L, 2 d) = [forward; backward],
    zero initial states, variational dropout on its input.  The backward direction reads
    each sequence reversed within its length, so padding (mask False, at the end) is read
    by neither direction before a real token and changes nothing; padded outputs are 0.
    (Two unidirectional GRUs over padded batches: packed sequences give the same numbers,
    but their backward pass zero-fills a full-size gradient at every time step on the CPU,
    about 40% of a training step here.)"""

    def __init__(self, d_in: int, d: int, dropout: float):
        super().__init__()
        self.dropout = VariationalDropout(dropout)
        self.forward_gru = nn.GRU(d_in, d, batch_first=True)
        self.backward_gru = nn.GRU(d_in, d, batch_first=True)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.dropout(x)
        lengths = mask.sum(1)
        ahead, _ = self.forward_gru(x)  # (B,L,d)
        behind, _ = self.backward_gru(reverse_padded(x, lengths))
        out = torch.cat([ahead, reverse_padded(behind, lengths)], -1)  # (B,L,2d)
        return out * mask[..., None]


class GatedSelfAttention(nn.Module):
    """H (B, L, D) -> R (B, L, 2D):

        S = softmax_j( relu(W_i H) relu(W_m H)^T / sqrt(d) )     (masked, hidden d)
        R = [H; S H] * sigmoid(W_g [H; S H])

    (R-Net's gated self-matching attention as DecaProp's code writes it: ReLU projections,
    dot-product scores, an input gate without bias; variational dropout on the inputs.)"""

    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.dropout = VariationalDropout(dropout)
        self.hidden = hidden
        self.query = nn.Linear(dim, hidden, bias=False)
        self.key = nn.Linear(dim, hidden, bias=False)
        self.gate = nn.Linear(2 * dim, 2 * dim, bias=False)
        for layer in (self.query, self.key, self.gate):
            nn.init.xavier_uniform_(layer.weight)

    def forward(self, h: Tensor, mask: Tensor) -> Tensor:
        # independent masks for the two sides, as R-Net's dot_attention drops them apart
        q, k = F.relu(self.query(self.dropout(h))), F.relu(self.key(self.dropout(h)))  # (B,L,d)
        scores = q @ k.transpose(1, 2) / math.sqrt(self.hidden)  # (B,L,L)
        attended = masked_softmax(scores, mask[:, None, :], dim=-1) @ h  # S H (B,L,D)
        r = torch.cat([h, attended], -1)  # (B,L,2D)
        return r * torch.sigmoid(self.gate(self.dropout(r))) * mask[..., None]


class SubMult(nn.Module):
    """DecaProp's SubMult composition of a token c and its aligned c~ (Wang & Jiang 2017):
    G = relu(W [(c~ - c)^2; c~ * c] + b), (B, L, D) -> (B, L, D)."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(2 * dim, dim)
        nn.init.xavier_uniform_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, c: Tensor, aligned: Tensor) -> Tensor:
        return F.relu(self.linear(torch.cat([(aligned - c).pow(2), aligned * c], -1)))


def best_spans(start_log_probs: Tensor, end_log_probs: Tensor, max_span: int
               ) -> tuple[Tensor, Tensor, Tensor]:
    """(start (B,), end (B,), log p_start + log p_end (B,)) of the best span with
    start <= end < start + max_span (at most ``max_span`` tokens; DecaProp's span_evaluate
    scores p_start(i) p_end(j) for j in [i, i + maxspan)).  Inputs (B, L) log-probabilities,
    -inf at padded positions.  Ties go to the smallest start, then the smallest end (numpy's
    argmax over the row-major (i, j) table, as the authors decode).

    Computed over the band of (L, max_span) diagonals, never the (L, L) table."""
    if max_span < 1:
        raise ValueError(f"max_span must be at least 1, got {max_span}")
    b, length = start_log_probs.shape
    width = min(max_span, length)
    ends = F.pad(end_log_probs, (0, width - 1), value=float("-inf"))  # (B,L+w-1)
    band = start_log_probs[:, :, None] + ends.unfold(1, width, 1)  # [i, k] = span (i, i+k)
    band = band.reshape(b, -1)  # row-major (i, k)
    flat = band.argmax(-1)  # the first maximum: smallest i, then smallest k (B,)
    score = band.gather(1, flat[:, None]).squeeze(1)
    start = torch.div(flat, width, rounding_mode="floor")
    return start, start + flat % width, score
