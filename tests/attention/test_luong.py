"""Luong attention (Luong et al. 2015, dot and general scores): every context against the
formula written out with loops, masking and gradients (the contracts of every mechanism,
step-by-step decoding among them, are in test_contracts.py)."""

from __future__ import annotations

import pytest
import torch

from attention import MultiHeadAttention, build
from attention.luong import luong

DT = torch.float64


def naive_softmax(scores, real):
    """softmax over the positions where ``real``; other positions 0."""
    out = torch.zeros_like(scores)
    e = torch.exp(scores[..., real])
    out[..., real] = e / e.sum(-1, keepdim=True)
    return out


def naive_score(x, y, w=None):
    """x . y (dot) or x^T W y (general), one pair."""
    return x @ y if w is None else x @ w @ y


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 4, generator=g, dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
    return h, mask, g


@pytest.mark.parametrize("score,query_dim", [("dot", 4), ("general", 4), ("general", 6)])
def test_decoder_matches_formula(data, score, query_dim):
    h, mask, g = data
    s = torch.randn(2, 3, query_dim, generator=g, dtype=DT)
    core = luong(score).decoder(query_dim=query_dim, memory_dim=4).double()
    context, weights = core(s, core.precompute(h, mask))
    w = None if score == "dot" else core.weight.weight  # W_a (Dq, Dm)
    for b in range(2):
        for i in range(3):
            scores = torch.stack([naive_score(s[b, i], h[b, j], w) for j in range(5)])
            expected = naive_softmax(scores, mask[b])
            torch.testing.assert_close(weights[b, i], expected)
            torch.testing.assert_close(context[b, i], expected @ h[b])
    assert torch.equal(weights[1, :, [0, 4]], torch.zeros(3, 2))  # padded: exactly 0


def test_dot_needs_equal_dims():
    with pytest.raises(ValueError, match="query_dim=6, memory_dim=4"):
        luong("dot").decoder(query_dim=6, memory_dim=4)
    with pytest.raises(ValueError, match="score must be one of"):
        luong("concat")


@pytest.mark.parametrize("score", ["dot", "general"])
def test_alignment_both_directions(data, score):
    a, mask_a, g = data
    b = torch.randn(2, 3, 4, generator=g, dtype=DT)
    mask_b = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    core = luong(score).alignment(dim=4).double()
    out = core(a, b, mask_a, mask_b)
    w = None if score == "dot" else core.weight.weight
    for n in range(2):
        e = torch.stack([torch.stack([naive_score(a[n, i], b[n, j], w) for j in range(3)])
                         for i in range(5)])
        row, col = torch.zeros_like(e), torch.zeros_like(e)
        for i in range(5):
            if mask_a[n, i]:
                row[i] = naive_softmax(e[i], mask_b[n])
        for j in range(3):
            if mask_b[n, j]:
                col[:, j] = naive_softmax(e[:, j], mask_a[n])
        torch.testing.assert_close(out.weights_a[n], row)
        torch.testing.assert_close(out.weights_b[n], col)
        torch.testing.assert_close(out.a_aligned[n], row @ b[n])
        torch.testing.assert_close(out.b_aligned[n], col.T @ a[n])


@pytest.mark.parametrize("score", ["dot", "general"])
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_unscaled(score, causal):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 3, 4, generator=g, dtype=DT)
    k = torch.randn(2, 2, 5, 4, generator=g, dtype=DT)
    v = torch.randn(2, 2, 5, 3, generator=g, dtype=DT)
    key_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 1]], dtype=torch.bool)
    core = luong(score).multihead(d_model=8, n_heads=2).double()
    out, weights = core(q, k, v, key_mask=key_mask, causal=causal, need_weights=True)
    for b in range(2):
        for hd in range(2):
            w = None if score == "dot" else core.weight[hd]
            for i in range(3):
                real = key_mask[b].clone()
                if causal:
                    real[i + (5 - 3) + 1:] = False
                scores = torch.stack([naive_score(q[b, hd, i], k[b, hd, j], w)
                                      for j in range(5)])
                expected = naive_softmax(scores, real)
                torch.testing.assert_close(weights[b, hd, i], expected)
                torch.testing.assert_close(out[b, hd, i], expected @ v[b, hd])
    assert torch.equal(weights[1, :, :, 3], torch.zeros(2, 3))


def test_gradcheck_decoder_and_multihead(data):
    h, mask, g = data
    core = luong("general").decoder(query_dim=3, memory_dim=4).double()
    s = torch.randn(2, 2, 3, generator=g, dtype=DT, requires_grad=True)
    h = h.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda h_, s_: core(s_, core.precompute(h_, mask)), (h, s))
    mh = luong("dot").multihead(d_model=4, n_heads=2).double()
    q = torch.randn(1, 2, 3, 2, generator=g, dtype=DT, requires_grad=True)
    k = torch.randn(1, 2, 3, 2, generator=g, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q_, k_: mh(q_, k_, k_, causal=True)[0], (q, k))


def test_registry_and_block():
    mechanism = build("luong", score="dot")
    assert mechanism.tag() == "luong(score=dot)" and build("luong").score == "general"
    assert all(mechanism.supports(c) for c in ("multihead", "alignment", "decoder"))
    block = MultiHeadAttention(8, 2, mechanism).double()
    x = torch.randn(2, 4, 8, dtype=DT)
    out, _ = block(x, x, causal=True)
    out.sum().backward()
    assert out.shape == (2, 4, 8) and block.q_proj.weight.grad.abs().sum() > 0
