"""Softmax attention, the baseline of every paper, in its three contexts against masked softmax
written out by hand: padding and causal masks, fully masked rows, returned weights (the
contracts of every mechanism are in test_contracts.py)."""

from __future__ import annotations

import math

import pytest
import torch

from attention import MultiHeadAttention, build
from attention.masking import causal_mask
from tests.conftest import heads

DT = torch.float64


def naive_softmax(scores, valid, dim=-1):
    """exp(s) / sum exp(s) over the valid entries of ``dim``; invalid entries and rows with no
    valid entry are 0."""
    valid = valid.expand(scores.shape)
    e = torch.where(valid, torch.exp(scores - scores.amax(dim, keepdim=True)), 0.0)
    total = e.sum(dim, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)


@pytest.mark.parametrize("kind", ["self", "cross", "causal"])
def test_multihead_matches_masked_softmax(kind):
    g = torch.Generator().manual_seed(0)
    mha = MultiHeadAttention(12, 3, "softmax").double()
    x = torch.randn(2, 5, 12, generator=g, dtype=DT)
    mem = x if kind != "cross" else torch.randn(2, 7, 12, generator=g, dtype=DT)
    key_mask = torch.ones(2, mem.shape[1], dtype=torch.bool)
    key_mask[1, -2:] = False
    out, w = mha(x, mem, key_mask, causal=kind == "causal", need_weights=True)
    q, k, v = (heads(p(t), 3) for p, t in ((mha.q_proj, x), (mha.k_proj, mem), (mha.v_proj, mem)))
    valid = key_mask[:, None, None, :]
    if kind == "causal":
        valid = valid & causal_mask(5, 5)
    ref_w = naive_softmax(q @ k.transpose(-2, -1) / math.sqrt(4), valid)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, mha.out_proj((ref_w @ v).transpose(1, 2).reshape(2, 5, 12)))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=DT))
    assert torch.equal(w[1, :, :, -2:], torch.zeros(3, 5, 2, dtype=DT))  # padded keys: 0
    if kind == "causal":
        assert torch.equal(w.triu(1), torch.zeros_like(w))
    assert mha(x, mem, key_mask, need_weights=False)[1] is None


def test_fully_masked_rows_give_zero_not_nan():
    g = torch.Generator().manual_seed(2)
    core = build("softmax").multihead(d_model=8, n_heads=2)
    q, k, v = (torch.randn(2, 2, 3, 4, generator=g, dtype=DT, requires_grad=True)
               for _ in range(3))
    key_mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)  # batch 1: empty
    out, w = core(q, k, v, key_mask=key_mask, need_weights=True)
    assert torch.equal(out[1], torch.zeros(2, 3, 4, dtype=DT))
    assert torch.equal(w[1], torch.zeros(2, 3, 3, dtype=DT))
    ref = naive_softmax(q[0] @ k[0].transpose(-2, -1) / 2, key_mask[0])
    torch.testing.assert_close(w[0], ref)
    torch.testing.assert_close(out[0], ref @ v[0])
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_alignment_both_directions():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 4, 6, generator=g, dtype=DT)
    b = torch.randn(2, 5, 6, generator=g, dtype=DT)
    mask_a = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    mask_b = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    res = build("softmax").alignment(dim=6)(a, b, mask_a, mask_b)
    e = a @ b.transpose(1, 2)  # e_ij = a_i . b_j, unscaled (Parikh et al.)
    row = naive_softmax(e, mask_b[:, None, :], dim=2) * mask_a[:, :, None]  # weight of b_j
    col = naive_softmax(e, mask_a[:, :, None], dim=1) * mask_b[:, None, :]  # weight of a_i
    torch.testing.assert_close(res.weights_a, row)
    torch.testing.assert_close(res.weights_b, col)
    torch.testing.assert_close(res.a_aligned, row @ b)  # beta_i
    torch.testing.assert_close(res.b_aligned, col.transpose(1, 2) @ a)  # alpha_j
    torch.testing.assert_close(res.weights_a.sum(2)[1, :3], torch.ones(3, dtype=DT))
    assert torch.equal(res.weights_a[1, 3], torch.zeros(5, dtype=DT))  # padded a_i: no weights


def test_decoder_matches_masked_softmax():
    g = torch.Generator().manual_seed(4)
    core = build("softmax").decoder(query_dim=5, memory_dim=4).double()
    h = torch.randn(2, 6, 4, generator=g, dtype=DT)
    s = torch.randn(2, 3, 5, generator=g, dtype=DT)
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    memory = core.precompute(h, mask)
    context, weights = core(s, memory)
    ref_w = naive_softmax(core.query_proj(s) @ h.transpose(1, 2) / 2, mask[:, None, :])
    torch.testing.assert_close(weights, ref_w)
    torch.testing.assert_close(context, ref_w @ h)
