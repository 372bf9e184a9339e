"""Compositional De-Attention (CoDA), Tay et al., NeurIPS 2019.

Dual affinity (Eq. 1-2) between elements a_i of A and b_j of B:

    E_ij = alpha * F_E(a_i) . F_E(b_j)
    N_ij = -beta * || F_N(a_i) - F_N(b_j) ||_1

Quasi-attention (Eq. 3-6), no softmax, values in [-1, 1]:

    M = tanh(E) * sigmoid(N)                    gate="plain"
    N <- N - mean(N)                            gate="centered"   (Eq. 4)
    M = tanh(E) * 2 * sigmoid(N)                gate="scaled"     (Eq. 5)
    E <- E - mean(E)                            center_e=True     (Eq. 6)

Compositional pooling (Eq. 7): A' = M B, B' = M^T A.  CoDA Transformer (Eq. 10): per head
E = Q K^T / sqrt(d), N = -||q_i - k_j||_1 / sqrt(d) (``scale=False`` drops the 1/sqrt(d),
footnote 3).  Table 9 swaps tanh (``e_fn``) and sigmoid (``n_fn``) for other functions.

Masked entries of M are exactly 0 (never -inf); centering subtracts the mean over the valid
entries of each Lq x Lk matrix.  The L1 term never materialises (..., Lq, Lk, d): see
:func:`l1_distance`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Alignment, AlignmentCore, DecoderCore, Mechanism, MultiHeadCore
from attention.masking import attention_mask, masked_mean

E_FUNCTIONS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid}
N_FUNCTIONS = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "arctan": torch.arctan,
    "algebraic": lambda x: x * torch.rsqrt(1 + x * x),  # x / sqrt(1 + x^2)
}
GATES = ("plain", "centered", "scaled")


def l1_distance(q: Tensor, k: Tensor) -> Tensor:
    """||q_i - k_j||_1 for q (..., Lq, d), k (..., Lk, d) -> (..., Lq, Lk).

    ``torch.cdist(p=1)`` loops over pairs in its forward and backward kernels, so neither
    pass allocates the (..., Lq, Lk, d) broadcast (benchmarks/attention.py measures it).
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q = q.expand(*batch, *q.shape[-2:]).reshape(-1, *q.shape[-2:])
    k = k.expand(*batch, *k.shape[-2:]).reshape(-1, *k.shape[-2:])
    return torch.cdist(q, k, p=1).view(*batch, q.shape[-2], k.shape[-2])


def _check_options(gate: str, e_fn: str, n_fn: str) -> None:
    if gate not in GATES:
        raise ValueError(f"coda: gate must be one of {GATES}, got {gate!r}")
    if e_fn not in E_FUNCTIONS:
        raise ValueError(f"coda: e_fn must be one of {tuple(E_FUNCTIONS)}, got {e_fn!r}")
    if n_fn not in N_FUNCTIONS:
        raise ValueError(f"coda: n_fn must be one of {tuple(N_FUNCTIONS)}, got {n_fn!r}")


def quasi_attention_matrix(
    q: Tensor, k: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0, beta: float = 1.0,
    scale: bool = True, gate: str = "plain", center_e: bool = False, e_fn: str = "tanh",
    n_fn: str = "sigmoid",
) -> Tensor:
    """M (..., Lq, Lk) of Eq. 3-6 (Eq. 10 with ``scale``); zero where ``mask`` is False."""
    _check_options(gate, e_fn, n_fn)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale else 1.0
    affinity = (alpha * s) * (q @ k.transpose(-2, -1))  # E (Eq. 1)
    negative = (-beta * s) * l1_distance(q, k)  # N (Eq. 2)
    if center_e:
        affinity = affinity - masked_mean(affinity, mask)  # Eq. 6
    if gate == "centered":
        negative = negative - masked_mean(negative, mask)  # Eq. 4
    g = N_FUNCTIONS[n_fn](negative)
    if gate == "scaled":
        g = 2 * g  # Eq. 5
    m = E_FUNCTIONS[e_fn](affinity) * g  # Eq. 3
    if mask is not None:
        m = m.masked_fill(~mask, 0.0)
    return m


def quasi_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0,
    beta: float = 1.0, scale: bool = True, gate: str = "plain", center_e: bool = False,
    e_fn: str = "tanh", n_fn: str = "sigmoid",
) -> tuple[Tensor, Tensor]:
    """CoDA on per-head tensors: q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv);
    mask boolean broadcastable to (..., Lq, Lk), True = may attend.
    Returns (M v (..., Lq, dv), M (..., Lq, Lk)).  Exported as ``attention.functional.coda``."""
    m = quasi_attention_matrix(q, k, mask, alpha=alpha, beta=beta, scale=scale, gate=gate,
                               center_e=center_e, e_fn=e_fn, n_fn=n_fn)
    return m @ v, m  # Eq. 7 / Eq. 10


class coda(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Compositional De-Attention.  ``scale=None`` follows the paper in each context:
    1/sqrt(d) in multi-head and decoder attention (Eq. 10), none in pairwise alignment
    (Eq. 1-2)."""

    name = "coda"

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, scale: bool | None = None,
                 gate: Literal["plain", "centered", "scaled"] = "plain", center_e: bool = False,
                 e_fn: Literal["tanh", "sigmoid"] = "tanh",
                 n_fn: Literal["sigmoid", "tanh", "arctan", "algebraic"] = "sigmoid"):
        _check_options(gate, e_fn, n_fn)
        self.alpha, self.beta, self.scale = alpha, beta, scale
        self.gate, self.center_e, self.e_fn, self.n_fn = gate, center_e, e_fn, n_fn

    def kwargs(self, default_scale: bool) -> dict:
        return dict(alpha=self.alpha, beta=self.beta,
                    scale=default_scale if self.scale is None else self.scale, gate=self.gate,
                    center_e=self.center_e, e_fn=self.e_fn, n_fn=self.n_fn)

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return CodaMultiHead(self.kwargs(True), dropout)

    def alignment(self, *, dim):
        return CodaAlignment(self.kwargs(False))

    def decoder(self, *, query_dim, memory_dim):
        return CodaDecoder(self.kwargs(True), query_dim, memory_dim)


class CodaMultiHead(MultiHeadCore):
    def __init__(self, options: dict, dropout: float):
        super().__init__()
        self.options, self.dropout = options, dropout

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        m = quasi_attention_matrix(q, k, mask, **self.options)  # (B,H,Lq,Lk)
        out = F.dropout(m, self.dropout, self.training) @ v  # (B,H,Lq,dv)
        return out, (m if need_weights else None)


class CodaAlignment(AlignmentCore):
    def __init__(self, options: dict):
        super().__init__()
        self.options = options

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        mask = None
        if mask_a is not None or mask_b is not None:
            ma = mask_a if mask_a is not None else a.new_ones(a.shape[:2], dtype=torch.bool)
            mb = mask_b if mask_b is not None else b.new_ones(b.shape[:2], dtype=torch.bool)
            mask = ma[:, :, None] & mb[:, None, :]  # (B,La,Lb)
        m = quasi_attention_matrix(a, b, mask, **self.options)  # (B,La,Lb)
        value_a = a if value_a is None else value_a
        value_b = b if value_b is None else value_b
        return Alignment(m @ value_b, m.transpose(1, 2) @ value_a, m, m)  # Eq. 7


class CodaDecoder(DecoderCore):
    def __init__(self, options: dict, query_dim: int, memory_dim: int):
        super().__init__()
        self.options = options
        # E and N compare s_i with h_j, so s is mapped to the memory's dimension when they differ
        self.query_proj = (nn.Identity() if query_dim == memory_dim
                           else nn.Linear(query_dim, memory_dim, bias=False))

    def precompute(self, h, mask=None):
        return {"h": h, "mask": mask}

    def forward(self, s, memory):
        h, mask = memory["h"], memory["mask"]
        m = quasi_attention_matrix(self.query_proj(s), h,
                                   None if mask is None else mask[:, None, :], **self.options)
        return m @ h, m  # (B,T,Dm), (B,T,N)
