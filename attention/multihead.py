"""Multi-head self/cross attention with any mechanism (context 1 of DESIGN.md)."""

from __future__ import annotations

from torch import Tensor, nn

from attention.base import Mechanism
from attention.registry import build


class MultiHeadAttention(nn.Module):
    """Projections, head split and merge around a mechanism's per-head core.

    forward(query (B,Lq,D), key_value (B,Lk,D), key_mask (B,Lk) | None, causal, need_weights)
        -> (out (B,Lq,D), weights (B,H,Lq,Lk) | None)
    """

    def __init__(self, d_model: int, n_heads: int, mechanism: Mechanism | str = "softmax", *,
                 dropout: float = 0.0, self_attention: bool = True, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.mechanism = build(mechanism)
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.core = self.mechanism.multihead(d_model=d_model, n_heads=n_heads, dropout=dropout,
                                             self_attention=self_attention)

    def _heads(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B,H,L,d)

    def forward(self, query: Tensor, key_value: Tensor, key_mask: Tensor | None = None,
                causal: bool = False, need_weights: bool = False):
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(key_value))
        v = self._heads(self.v_proj(key_value))
        out, weights = self.core(q, k, v, key_mask=key_mask, causal=causal,
                                 need_weights=need_weights, query_input=query,
                                 key_input=key_value)
        b, h, lq, d = out.shape
        out = out.transpose(1, 2).reshape(b, lq, h * d)  # (B,Lq,D)
        return self.out_proj(out), weights
