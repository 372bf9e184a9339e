"""Segmentation attention (Kim et al. 2017): CRF marginals against brute-force enumeration of
all 2^N assignments of z, struct-attn's lambda normalisation, padding and per-row masks, every
context and gradients (the contracts of every mechanism, step-by-step decoding among them,
are in test_contracts.py).  Every test runs twice: on the C++ chain
(attention/_crf_chain.cpp, with its own backward pass) and on the log-space Python
recursion with autograd; the two are also compared directly, at the sizes of a training
step."""

from __future__ import annotations

import itertools

import pytest
import torch

from attention import MultiHeadAttention, _compiled, _crf_chain_ext, _native, build
from attention.structured import crf_marginals, segmentation_attention, structured

DT = torch.float64


@pytest.fixture(autouse=True, params=["cpp", "python"])
def chain_path(request, monkeypatch):
    """Each test on the C++ chain (skipped without a C++ compiler) and on the Python
    recursion; returns the number of calls of the C++ chain (so that a test knows it ran)."""
    calls = {"chain": 0}
    if request.param == "cpp":
        if _native.compiler() is None:
            pytest.skip("no C++ compiler")
        monkeypatch.setattr(_compiled, "COMPILE", True)
        monkeypatch.setattr(_crf_chain_ext.LIBRARY, "enabled", True)
        assert _crf_chain_ext.LIBRARY.library() is not None, "the C++ chain failed to build"
        original = _crf_chain_ext.chain

        def counted(*args, **kwargs):
            calls["chain"] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(_crf_chain_ext, "chain", counted)
    else:
        monkeypatch.setattr(_crf_chain_ext.LIBRARY, "enabled", False)
    yield calls
    if request.param == "cpp":
        assert calls["chain"] > 0, "the C++ chain did not run"


def brute_marginals(theta, transition, real):
    """p(z_j = 1) for one chain theta (N,) by enumerating every z over the real positions
    (padded positions are out of the chain); 0 at padded positions."""
    keep = real.nonzero().flatten().tolist()
    start, end = transition.mean(0), transition.mean(1)  # struct-attn's start / end potentials
    total = torch.zeros((), dtype=DT)
    on = torch.zeros(theta.shape[0], dtype=DT)
    for z in itertools.product([0, 1], repeat=len(keep)):
        if not keep:
            break
        score = start[z[0]] + end[z[-1]]
        score = score + sum(theta[j] * zj for j, zj in zip(keep, z))
        score = score + sum(transition[z[i], z[i + 1]] for i in range(len(z) - 1))
        p = torch.exp(score)
        total = total + p
        for j, zj in zip(keep, z):
            if zj:
                on[j] = on[j] + p
    return on / total if keep else on


def brute_weights(theta, transition, real, lam):
    p = brute_marginals(theta, transition, real)
    return lam * p / p.sum() if real.any() else p


@pytest.fixture
def g():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_marginals_equal_enumeration(g, n):
    theta = 2 * torch.randn(3, n, generator=g, dtype=DT)
    transition = torch.randn(2, 2, generator=g, dtype=DT)
    p = crf_marginals(theta, transition)
    for b in range(3):
        torch.testing.assert_close(p[b], brute_marginals(theta[b], transition,
                                                         torch.ones(n, dtype=torch.bool)))


def test_marginals_with_padding_and_holes(g):
    theta = 2 * torch.randn(4, 6, generator=g, dtype=DT)
    transition = torch.randn(2, 2, generator=g, dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0],  # right padding
                         [0, 0, 1, 1, 1, 1],  # left padding
                         [1, 0, 1, 1, 0, 1],  # holes
                         [0, 0, 0, 0, 0, 0]], dtype=torch.bool)  # empty
    p = crf_marginals(theta, transition, mask)
    weights = segmentation_attention(theta, transition, mask, lam=2.0)
    for b in range(4):
        torch.testing.assert_close(p[b], brute_marginals(theta[b], transition, mask[b]))
        torch.testing.assert_close(weights[b], brute_weights(theta[b], transition, mask[b], 2.0))
    assert torch.equal(p[~mask], torch.zeros(int((~mask).sum()), dtype=DT))
    assert torch.equal(weights[~mask], torch.zeros(int((~mask).sum()), dtype=DT))
    torch.testing.assert_close(weights[:3].sum(-1), torch.full((3,), 2.0, dtype=DT))
    # a padded chain has exactly the marginals of the unpadded one
    torch.testing.assert_close(p[0, :4], crf_marginals(theta[0, :4], transition))


def test_lambda_scales_normalised_marginals(g):
    theta = torch.randn(2, 5, generator=g, dtype=DT)
    transition = torch.randn(2, 2, generator=g, dtype=DT)
    p = crf_marginals(theta, transition)
    w = segmentation_attention(theta, transition, lam=3.0)
    torch.testing.assert_close(w, 3.0 * p / p.sum(-1, keepdim=True))
    # with W = 0 the z_j are independent: p(z_j = 1) = sigmoid(theta_j)
    torch.testing.assert_close(crf_marginals(theta, torch.zeros(2, 2, dtype=DT)),
                               torch.sigmoid(theta))


def test_extreme_scores_stay_finite(g):
    theta = torch.tensor([[500.0, -500.0, 0.0, 800.0]], dtype=DT, requires_grad=True)
    transition = torch.randn(2, 2, generator=g, dtype=DT)
    w = segmentation_attention(theta, transition, torch.tensor([[1, 1, 1, 0]]).bool())
    w.sum().backward()
    assert torch.isfinite(w).all() and torch.isfinite(theta.grad).all()
    # z_1 = 1 and z_2 = 0 for sure; z_3 (theta 0, last real) follows W[0, .] + end
    end = transition.mean(1)
    p3 = torch.sigmoid(transition[0, 1] + end[1] - transition[0, 0] - end[0])
    expected = 2 * torch.stack([torch.ones((), dtype=DT), torch.zeros((), dtype=DT), p3]) / (1 + p3)
    torch.testing.assert_close(w[0], torch.cat([expected, torch.zeros(1, dtype=DT)]).detach())


def test_gradcheck_marginals(g):
    theta = torch.randn(2, 4, generator=g, dtype=DT, requires_grad=True)
    transition = torch.randn(2, 2, generator=g, dtype=DT, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda t, w: crf_marginals(t, w, mask), (theta, transition))
    assert torch.autograd.gradcheck(lambda t, w: segmentation_attention(t, w, mask),
                                    (theta, transition))


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_decoder_matches_enumeration(g, score):
    h = torch.randn(2, 5, 4, generator=g, dtype=DT)
    s = torch.randn(2, 3, 6, generator=g, dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    core = structured(score, lam=2.0).decoder(query_dim=6, memory_dim=4).double()
    memory = core.precompute(h, mask)
    context, weights = core(s, memory)
    if score == "dot":  # struct-attn: h_j . (W s_i)
        theta = torch.einsum("bnd,btd->btn", h, core.query(s))
    else:  # Bahdanau Eq. 5 (tested in test_additive.py)
        theta = core.additive(s, core.additive.keys(h))
    for b in range(2):
        for i in range(3):
            expected = brute_weights(theta[b, i], core.transition, mask[b], 2.0)
            torch.testing.assert_close(weights[b, i], expected)
            torch.testing.assert_close(context[b, i], expected @ h[b])


def test_decoder_gradcheck(g):
    core = structured().decoder(query_dim=3, memory_dim=3).double()
    h = torch.randn(1, 4, 3, generator=g, dtype=DT, requires_grad=True)
    s = torch.randn(1, 2, 3, generator=g, dtype=DT, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda h_, s_: core(s_, core.precompute(h_, mask)), (h, s))


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_alignment_both_directions(g, score):
    a = torch.randn(2, 4, 3, generator=g, dtype=DT)
    b = torch.randn(2, 3, 3, generator=g, dtype=DT)
    mask_a = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    mask_b = torch.tensor([[1, 0, 1], [1, 1, 1]], dtype=torch.bool)
    core = structured(score, lam=1.5).alignment(dim=3).double()
    out = core(a, b, mask_a, mask_b)
    e = a @ b.transpose(1, 2) if score == "dot" else core.additive(a, core.additive.keys(b))
    for n in range(2):
        row = torch.zeros(4, 3, dtype=DT)
        col = torch.zeros(4, 3, dtype=DT)
        for i in range(4):
            if mask_a[n, i]:
                row[i] = brute_weights(e[n, i], core.transition, mask_b[n], 1.5)
        for j in range(3):
            if mask_b[n, j]:
                col[:, j] = brute_weights(e[n, :, j], core.transition, mask_a[n], 1.5)
        torch.testing.assert_close(out.weights_a[n], row)
        torch.testing.assert_close(out.weights_b[n], col)
        torch.testing.assert_close(out.a_aligned[n], row @ b[n])
        torch.testing.assert_close(out.b_aligned[n], col.T @ a[n])


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_multihead_causal_rows_have_their_own_prefix(g, score):
    q = torch.randn(2, 2, 4, 3, generator=g, dtype=DT)
    k = torch.randn(2, 2, 4, 3, generator=g, dtype=DT)
    v = torch.randn(2, 2, 4, 2, generator=g, dtype=DT)
    key_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    core = structured(score).multihead(d_model=6, n_heads=2).double()
    out, weights = core(q, k, v, key_mask=key_mask, causal=True, need_weights=True)
    for b in range(2):
        for hd in range(2):
            for i in range(4):
                real = key_mask[b] & (torch.arange(4) <= i)
                if score == "dot":
                    theta = k[b, hd] @ q[b, hd, i] / 3 ** 0.5
                else:
                    theta = torch.tanh(q[b, hd, i] + k[b, hd]) @ core.u[hd]
                expected = brute_weights(theta, core.transition, real, 2.0)
                torch.testing.assert_close(weights[b, hd, i], expected)
                torch.testing.assert_close(out[b, hd, i], expected @ v[b, hd])


def test_registry_block_and_options():
    mechanism = build("structured", score="additive", lam=1.0)
    assert mechanism.tag() == "structured(score=additive,lam=1.0)"
    assert all(mechanism.supports(c) for c in ("multihead", "alignment", "decoder"))
    block = MultiHeadAttention(8, 2, "structured").double()
    x = torch.randn(2, 5, 8, dtype=DT)
    out, w = block(x, x, torch.tensor([[1] * 5, [1, 1, 1, 0, 0]], dtype=torch.bool),
                   need_weights=True)
    out.sum().backward()
    assert block.core.transition.grad.abs().sum() > 0
    torch.testing.assert_close(w.sum(-1), torch.full((2, 2, 5), 2.0, dtype=DT))
    with pytest.raises(ValueError, match="score must be one of"):
        structured("general")
    with pytest.raises(ValueError, match=r"\(2, 2\) transition"):
        crf_marginals(torch.zeros(1, 3), torch.zeros(3, 3))
    with pytest.raises(TypeError, match="boolean"):
        crf_marginals(torch.zeros(1, 3), torch.zeros(2, 2), torch.ones(1, 3))
