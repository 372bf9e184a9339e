"""Decoding shared by every seq2seq model (one implementation)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


@torch.no_grad()
def greedy_decode(next_logits: Callable[[Tensor], Tensor], batch_size: int, bos_id: int,
                  eos_id: int, max_len: int, device=None) -> Tensor:
    """Argmax decoding.  ``next_logits(prefix (B,t)) -> (B,V)`` scores the next token after
    each prefix (which starts with bos).  Returns (B, <=max_len) ids without bos; a
    finished sequence is padded with eos; stops early when every sequence has ended."""
    prefix = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    for _ in range(max_len):
        token = next_logits(prefix).argmax(-1)
        token = token.masked_fill(done, eos_id)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
        done |= token == eos_id
        if done.all():
            break
    return prefix[:, 1:]
