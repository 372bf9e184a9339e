"""Localness modelling (Yang et al., EMNLP 2018, "Modeling Localness for Self-Attention
Networks"), a baseline of the Differentiable Window paper (Tables 1, 5).

A Gaussian bias centred at a predicted position is added to the logits before the softmax:

    G_ij = -(j - P_i)^2 / (2 sigma_i^2),      sigma_i = D_i / 2              (Gaussian bias)
    attention = softmax(Q K^T / sqrt(d) + G) V

The centre and the window are predicted from the query and scaled by the true length I
(the number of keys query i may attend):

    p_i = v_p^T tanh(W_p Q_i)         P_i = (I - 1) * sigmoid(p_i)         (central position)
    z_i = v_d^T tanh(W_p Q_i)         D_i = I * sigmoid(z_i)        (query-specific window)

``window`` fixes D instead (Yang et al.'s fixed-window variant).  W_p (d_model x d_model) is
shared by centre and window (the paper's query-specific window reuses W_p); v_p and v_d give
one scalar per head.  Positions j are 0-based ranks among the real keys; the paper writes
P_i = I * sigmoid(p_i), Yang et al.'s released code (baosongyang/Context-Aware-SAN) scales the
centre by the real length minus one so that it spans exactly the positions 0..I-1, which is
what is done here.  For causal attention I is the visible prefix, so no future key changes a
centre.

Contexts: multi-head self- and cross-attention (for cross-attention the centre points into the
source, as Luong et al.'s local-p attention, which Yang et al. extend), and an RNN decoder
over its source memory (Luong local-p style: P_t = (S - 1) * sigmoid(v_p^T tanh(W_p s_t)), with
the bias added to scaled dot-product logits).  The bias is one (..., Lq, Lk) tensor added
inside ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attention.base import DecoderCore, Mechanism, MultiHeadCore, query_projection
from attention.masking import attention_mask, check_mask, masked_attention, masked_softmax


def key_positions(key_mask: Tensor | None, lk: int, device=None) -> Tensor:
    """0-based rank of each key among the real keys: (B, Lk), or (Lk,) without a mask."""
    if key_mask is None:
        return torch.arange(lk, device=device)
    return key_mask.long().cumsum(-1) - 1


def gaussian_bias(positions: Tensor, centre: Tensor, window: Tensor | float) -> Tensor:
    """G_ij = -(j - P_i)^2 / (2 sigma_i^2) with sigma_i = D_i / 2:
    positions (..., 1, Lk), centre and window (..., Lq, 1) -> (..., Lq, Lk)."""
    sigma = window / 2
    if torch.is_tensor(sigma):  # a predicted window: keep sigma^2 away from 0 (sigmoid underflow)
        sigma = sigma.clamp(min=torch.finfo(sigma.dtype).eps)
    return -((positions - centre) ** 2) / (2 * sigma**2)


class LocalnessPredictor(nn.Module):
    """Centre P_i and window D_i from queries (B,Lq,Dq), one per head:
    returns (P, D) of shape (B,H,Lq,1) (D a float when the window is fixed)."""

    def __init__(self, query_dim: int, heads: int, window: int | None):
        super().__init__()
        self.heads, self.window = heads, window
        self.w_p = nn.Linear(query_dim, query_dim, bias=False)  # W_p
        self.v_p = nn.Linear(query_dim, heads, bias=False)  # v_p, one per head
        self.v_d = nn.Linear(query_dim, heads, bias=False) if window is None else None

    def forward(self, queries: Tensor, length: Tensor | float) -> tuple[Tensor, Tensor | float]:
        hidden = torch.tanh(self.w_p(queries))  # (B,Lq,Dq)
        p = self.v_p(hidden).transpose(1, 2).unsqueeze(-1)  # (B,H,Lq,1)
        last = (length - 1).clamp(min=0) if torch.is_tensor(length) else max(length - 1, 0)
        centre = last * torch.sigmoid(p)  # P_i
        if self.v_d is None:
            return centre, float(self.window)
        z = self.v_d(hidden).transpose(1, 2).unsqueeze(-1)  # (B,H,Lq,1)
        return centre, length * torch.sigmoid(z)  # D_i


def visible_length(mask: Tensor | None, lk: int, dtype: torch.dtype) -> Tensor | float:
    """I: the number of keys each query may attend (mask (..., Lq, Lk) -> (..., Lq, 1))."""
    return float(lk) if mask is None else mask.sum(-1, keepdim=True).to(dtype)


class localness(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Gaussian localness bias (Yang et al. 2018).  ``window=None`` predicts a query-specific
    window D_i = I * sigmoid(z_i); an integer fixes D (in tokens)."""

    name = "localness"
    unsupported = {
        "alignment": "its Gaussian bias is centred on a position of the other sentence, and "
                     "DecompAtt alignment of two different sentences has no positional "
                     "correspondence to be local around (the model is order-free by design)",
    }

    def __init__(self, window: int | None = None):
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window < 1):
            raise ValueError(f"localness: window must be None (predicted) or an integer >= 1, "
                             f"got {window!r}")
        self.window = window

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return LocalnessMultiHead(d_model, n_heads, self.window, dropout)

    def decoder(self, *, query_dim, memory_dim):
        return LocalnessDecoder(query_dim, memory_dim, self.window)


class LocalnessMultiHead(MultiHeadCore):
    """Centres from the projected queries Q (the heads concatenated), one per head."""

    def __init__(self, d_model: int, n_heads: int, window: int | None, dropout: float):
        super().__init__()
        self.predict = LocalnessPredictor(d_model, n_heads, window)
        self.dropout = dropout

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        b, h, lq, d = q.shape
        lk = k.shape[-2]
        mask = attention_mask(key_mask, lq, lk, causal, device=q.device)  # (B,1,Lq,Lk) | None
        length = visible_length(mask, lk, q.dtype)  # I (B,1,Lq,1)
        centre, window = self.predict(q.transpose(1, 2).reshape(b, lq, h * d), length)
        positions = key_positions(key_mask, lk, q.device).to(q.dtype)  # (B,Lk) | (Lk,)
        positions = positions[:, None, None, :] if positions.dim() == 2 else positions
        bias = gaussian_bias(positions, centre, window)  # (B,H,Lq,Lk)
        out = masked_attention(q, k, v, mask, bias, self.dropout if self.training else 0.0)
        weights = None
        if need_weights:
            weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(d) + bias, mask)
        return out, weights


class LocalnessDecoder(DecoderCore):
    """Luong local-p style: the centre over the source is predicted from the decoder state and
    scaled by the source length; the Gaussian bias is added to scaled dot-product logits."""

    def __init__(self, query_dim: int, memory_dim: int, window: int | None):
        super().__init__()
        self.query_proj = query_projection(query_dim, memory_dim)
        self.predict = LocalnessPredictor(query_dim, 1, window)

    def build_memory(self, h, mask=None):
        mask = check_mask(mask)
        n = h.shape[1]
        positions = key_positions(mask, n, h.device).to(h.dtype)
        positions = positions.expand(h.shape[0], n) if mask is None else positions
        length = (h.new_full((h.shape[0],), float(n)) if mask is None
                  else mask.sum(-1).to(h.dtype))
        return {"h": h, "mask": mask, "positions": positions, "length": length}

    def forward(self, s, memory):
        h, mask = memory["h"], memory["mask"]
        length = memory["length"][:, None, None, None]  # S (B,1,1,1)
        centre, window = self.predict(s, length)  # (B,1,T,1)
        bias = gaussian_bias(memory["positions"][:, None, None, :], centre, window)[:, 0]
        scores = self.query_proj(s) @ h.transpose(1, 2) / math.sqrt(h.shape[-1])  # (B,T,N)
        w = masked_softmax(scores + bias, None if mask is None else mask[:, None, :])
        return w @ h, w
