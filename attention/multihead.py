"""Multi-head self/cross attention with any mechanism (context 1 of docs/design.md)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention.base import Mechanism
from attention.registry import build


class MultiHeadAttention(nn.Module):
    """Projections, head split and merge around a mechanism's per-head core.

    forward(query (B,Lq,D), key_value (B,Lk,D), key_mask (B,Lk) | None, causal, need_weights,
            cache: dict | None)
        -> (out (B,Lq,D), weights (B,H,Lq,Lk) | None)

    Incremental decoding (``cache``, a dict this module fills, as fairseq's
    ``incremental_state``):

    * self-attention: ``query`` = ``key_value`` = the new positions only; their projected
      keys and values and the un-projected inputs (``key_input``, which mechanisms with
      projections of their own need: window boundaries, localness centres) are appended to
      those of the earlier positions, and the new queries attend over all of them.  With
      ``causal`` each new query sees the keys up to its own position, so the output equals
      those rows of the full causal forward (tests/attention/test_contracts.py checks it for every
      mechanism);
    * cross-attention: the memory's keys and values are projected at the first call and
      reused after it.

    No query (Lq = 0) gives an empty output (and weights) without asking the mechanism; no
    key is refused with a ValueError (attention.base.MultiHeadCore).

    Every tensor in the cache has the batch first, so beam search reorders it with
    ``index_select`` on dim 0 (attention.base.select_rows).
    """

    def __init__(self, d_model: int, n_heads: int, mechanism: Mechanism | str = "softmax", *,
                 dropout: float = 0.0, self_attention: bool = True, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.mechanism = build(mechanism)
        self.n_heads = n_heads
        self.self_attention = self_attention
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.core = self.mechanism.multihead(d_model=d_model, n_heads=n_heads, dropout=dropout,
                                             self_attention=self_attention)

    def _heads(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B,H,L,d)

    def _keys_values(self, key_value: Tensor, key_mask: Tensor | None, cache: dict | None):
        """(k, v, key_input, key_mask) over every key, with the cache kept up to date."""
        if cache is None:
            return self._heads(self.k_proj(key_value)), self._heads(self.v_proj(key_value)), \
                key_value, key_mask
        if not self.self_attention:  # the memory: projected once
            if "k" not in cache:
                cache.update(k=self._heads(self.k_proj(key_value)),
                             v=self._heads(self.v_proj(key_value)), key_input=key_value,
                             key_mask=key_mask)
            return cache["k"], cache["v"], cache["key_input"], cache.get("key_mask")
        new = {"k": self._heads(self.k_proj(key_value)), "v": self._heads(self.v_proj(key_value)),
               "key_input": key_value}
        if "k" in cache:
            old_mask = cache["key_mask"]
            if old_mask is not None or key_mask is not None:  # a mask over every key
                b, seen, t = key_value.shape[0], cache["k"].shape[2], key_value.shape[1]
                ones = key_value.new_ones
                key_mask = torch.cat([ones(b, seen, dtype=torch.bool) if old_mask is None
                                      else old_mask,
                                      ones(b, t, dtype=torch.bool) if key_mask is None
                                      else key_mask], dim=1)
            dims = {"k": 2, "v": 2, "key_input": 1}
            new = {name: torch.cat([cache[name], x], dim=dims[name]) for name, x in new.items()}
        cache.update(new, key_mask=key_mask)
        return new["k"], new["v"], new["key_input"], key_mask

    def forward(self, query: Tensor, key_value: Tensor, key_mask: Tensor | None = None,
                causal: bool = False, need_weights: bool = False, cache: dict | None = None):
        q = self._heads(self.q_proj(query))
        k, v, key_input, key_mask = self._keys_values(key_value, key_mask, cache)
        if q.shape[2] == 0 and k.shape[2] > 0:  # no query: nothing to attend, in any mechanism
            b, h, _, d = q.shape
            weights = q.new_zeros(b, h, 0, k.shape[2]) if need_weights else None
            return self.out_proj(query), weights
        out, weights = self.core(q, k, v, key_mask=key_mask, causal=causal,
                                 need_weights=need_weights, query_input=query,
                                 key_input=key_input)
        b, h, lq, d = out.shape
        out = out.transpose(1, 2).reshape(b, lq, h * d)  # (B,Lq,D)
        return self.out_proj(out), weights
