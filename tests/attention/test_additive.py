"""Additive attention (Bahdanau et al. 2015, Eq. 5 of the ADM paper): every context against the
formula written out with loops, masking, blocked scores and gradients (the C++ scores against
the blocked ones: test_additive_pairs.py; the contracts of every
mechanism, step-by-step decoding among them, are in test_contracts.py)."""

from __future__ import annotations

import pytest
import torch

from attention import MultiHeadAttention, _additive_ext, build
from attention import additive as additive_module
from attention.additive import additive, additive_scores, row_blocks, rows_per_block

DT = torch.float64


def naive_scores(s, h, w, v, b, u):
    """alpha[i, j] = u . tanh(W s_i + V h_j + b) with loops, s (T,Dq), h (N,Dm)."""
    out = torch.zeros(s.shape[0], h.shape[0], dtype=DT)
    for i in range(s.shape[0]):
        for j in range(h.shape[0]):
            out[i, j] = u @ torch.tanh(w @ s[i] + v @ h[j] + b)
    return out


def naive_softmax(scores, real):
    """softmax over the positions where ``real``; other positions 0."""
    out = torch.zeros_like(scores)
    e = torch.exp(scores[..., real])
    out[..., real] = e / e.sum(-1, keepdim=True)
    return out


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 4, generator=g, dtype=DT)
    s = torch.randn(2, 3, 6, generator=g, dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    return h, s, mask


def test_decoder_matches_eq5_with_loops(data):
    h, s, mask = data
    core = additive(hidden=7).decoder(query_dim=6, memory_dim=4).double()
    core.score.block_elements = 9  # several blocks of query rows
    context, weights = core(s, core.precompute(h, mask))
    sc = core.score
    for b in range(2):
        scores = naive_scores(s[b], h[b], sc.query.weight, sc.key.weight, sc.key.bias, sc.u)
        expected = naive_softmax(scores, mask[b])
        torch.testing.assert_close(weights[b], expected)
        torch.testing.assert_close(context[b], expected @ h[b])
    assert torch.equal(weights[1, :, 3:], torch.zeros(3, 2))  # padded keys: exactly 0
    assert core.score.u.shape == (7,)


def test_hidden_defaults_to_memory_dim():
    core = additive().decoder(query_dim=6, memory_dim=4)
    assert core.score.query.weight.shape == (4, 6) and core.score.key.weight.shape == (4, 4)


def test_blocked_scores_equal_unblocked_and_stay_within_budget(monkeypatch):
    monkeypatch.setattr(_additive_ext.LIBRARY, "enabled", False)  # the blocked path
    g = torch.Generator().manual_seed(1)
    wq = torch.randn(2, 3, 7, 5, generator=g, dtype=DT)
    vk = torch.randn(2, 3, 4, 5, generator=g, dtype=DT)
    u = torch.randn(3, 5, generator=g, dtype=DT)  # one u per head
    whole = additive_scores(wq, vk, u)
    seen = []
    block = additive_module._additive_block

    def recording(wq_block, vk_, u_col):
        seen.append(wq_block.shape[-2])
        return block(wq_block, vk_, u_col)

    monkeypatch.setattr(additive_module, "_additive_block", recording)
    budget = 2 * 2 * 3 * 4 * 5  # two query rows of (B,H,Lk,A) per block
    blocked = additive_scores(wq, vk, u, block_elements=budget)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=1e-12)
    assert seen == [2, 2, 2, 1]
    naive = torch.einsum("hd,bhijd->bhij", u, torch.tanh(wq[:, :, :, None] + vk[:, :, None]))
    torch.testing.assert_close(whole, naive)


def test_blocked_scores_gradcheck(monkeypatch):
    monkeypatch.setattr(_additive_ext.LIBRARY, "enabled", False)  # the blocked path
    g = torch.Generator().manual_seed(2)
    wq = torch.randn(2, 3, 3, generator=g, dtype=DT, requires_grad=True)
    vk = torch.randn(2, 4, 3, generator=g, dtype=DT, requires_grad=True)
    u = torch.randn(3, generator=g, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: additive_scores(a, b, c, block_elements=12), (wq, vk, u))


def test_decoder_gradcheck(data):
    h, s, mask = data
    core = additive().decoder(query_dim=6, memory_dim=4).double()
    core.score.block_elements = 10
    h = h[:, :4].clone().requires_grad_()
    s = s[:, :2].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda h_, s_: core(s_, core.precompute(h_, mask[:, :4])),
                                    (h, s))


def test_alignment_both_directions(data):
    h, _, mask = data
    g = torch.Generator().manual_seed(3)
    a, b = h, torch.randn(2, 4, 4, generator=g, dtype=DT)
    mask_a, mask_b = mask, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    core = additive().alignment(dim=4).double()
    out = core(a, b, mask_a, mask_b)
    sc = core.score
    for n in range(2):
        e = naive_scores(a[n], b[n], sc.query.weight, sc.key.weight, sc.key.bias, sc.u)
        row = torch.zeros_like(e)
        col = torch.zeros_like(e)
        for i in range(a.shape[1]):
            if mask_a[n, i]:
                row[i] = naive_softmax(e[i], mask_b[n])
        for j in range(b.shape[1]):
            if mask_b[n, j]:
                col[:, j] = naive_softmax(e[:, j], mask_a[n])
        torch.testing.assert_close(out.weights_a[n], row)
        torch.testing.assert_close(out.weights_b[n], col)
        torch.testing.assert_close(out.a_aligned[n], row @ b[n])
        torch.testing.assert_close(out.b_aligned[n], col.T @ a[n])
    assert torch.equal(out.weights_a[0, :, 2:], torch.zeros(5, 2))
    assert torch.equal(out.weights_b[1, 3:], torch.zeros(2, 4))


@pytest.mark.parametrize("causal", [False, True])
def test_multihead_matches_per_head_formula(causal):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 2, 4, 3, generator=g, dtype=DT)
    k = torch.randn(2, 2, 5, 3, generator=g, dtype=DT)
    v = torch.randn(2, 2, 5, 6, generator=g, dtype=DT)
    key_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    core = additive().multihead(d_model=6, n_heads=2).double()
    out, weights = core(q, k, v, key_mask=key_mask, causal=causal, need_weights=True)
    for b in range(2):
        for hd in range(2):
            for i in range(4):
                real = key_mask[b].clone()
                if causal:
                    real[i + (5 - 4) + 1:] = False  # query i sees keys j <= i + (Lk - Lq)
                scores = torch.stack([core.u[hd] @ torch.tanh(q[b, hd, i] + k[b, hd, j])
                                      for j in range(5)])
                w = naive_softmax(scores, real)
                torch.testing.assert_close(weights[b, hd, i], w)
                torch.testing.assert_close(out[b, hd, i], w @ v[b, hd])
    assert torch.equal(weights[1, :, :, 4], torch.zeros(2, 4))


def test_in_multihead_block_and_registry():
    mechanism = build("additive", hidden=3)
    assert mechanism == additive(hidden=3) and mechanism.tag() == "additive(hidden=3)"
    assert all(mechanism.supports(c) for c in ("multihead", "alignment", "decoder"))
    block = MultiHeadAttention(8, 2, "additive").double()
    x = torch.randn(2, 5, 8, dtype=DT)
    out, w = block(x, x, torch.tensor([[1] * 5, [1, 1, 1, 0, 0]], dtype=torch.bool),
                   need_weights=True)
    out.sum().backward()
    assert out.shape == (2, 5, 8) and block.core.u.grad.abs().sum() > 0
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 5, dtype=DT))


def test_bad_options_and_masks(data):
    h, s, mask = data
    with pytest.raises(ValueError, match="hidden"):
        additive(hidden=0)
    core = additive().decoder(query_dim=6, memory_dim=4)
    with pytest.raises(TypeError, match="boolean"):
        core.precompute(h.float(), mask.long())
    with pytest.raises(ValueError, match="hidden size"):
        additive_scores(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.zeros(3))


def test_row_blocks_cover_every_row_once():
    """The block helpers of every blocked pairwise computation (additive, density): the
    blocks cover 0..n-1 in order, none longer than ``size``; no row is one empty block, so a
    concatenation over the blocks is an empty tensor rather than an error."""
    for n in range(0, 12):
        for size in range(1, 14):
            blocks = row_blocks(n, size)
            rows = [i for block in blocks for i in range(n)[block]]
            assert rows == list(range(n)) and all(b.stop - b.start <= size for b in blocks)
    assert row_blocks(0, 5) == [slice(0, 0)]
    assert rows_per_block(10, 35) == 3 and rows_per_block(10 ** 9, 35) == 1
    with pytest.raises(ValueError, match="positive number of elements"):
        rows_per_block(10, 0)
