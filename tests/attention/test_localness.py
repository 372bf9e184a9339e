"""Localness (Yang et al. 2018): the Gaussian bias against the equations written out per query,
masking, causality, left padding (positions are ranks among the real keys), the decoder
context and gradients (the contracts of every mechanism are in test_contracts.py)."""

from __future__ import annotations

import math

import pytest
import torch

from attention import MultiHeadAttention, UnsupportedContext, build
from attention.localness import localness
from tests.conftest import heads

pytestmark = pytest.mark.usefixtures("float64")


def naive_localness(core, q, k, v, key_mask, causal):
    """Eq. 4-8 query by query: (out, weights)."""
    b, h, lq, d = q.shape
    lk = k.shape[-2]
    pred = core.predict
    out = torch.zeros(b, h, lq, v.shape[-1])
    weights = torch.zeros(b, h, lq, lk)
    for bi in range(b):
        real = [j for j in range(lk) if key_mask[bi, j]]
        rank = {j: r for r, j in enumerate(real)}
        for i in range(lq):
            visible = [j for j in real if not causal or j <= i + lk - lq]
            n = len(visible)  # I
            query = q[bi, :, i].reshape(-1)  # Q_i, the heads concatenated
            hidden = torch.tanh(pred.w_p.weight @ query)
            for hi in range(h):
                centre = (n - 1) * torch.sigmoid(pred.v_p.weight[hi] @ hidden)  # Eq. 7
                if pred.window is None:
                    window = n * torch.sigmoid(pred.v_d.weight[hi] @ hidden)  # Eq. 8
                else:
                    window = torch.tensor(float(pred.window))
                sigma = window / 2
                logits = torch.stack([
                    q[bi, hi, i] @ k[bi, hi, j] / math.sqrt(d)
                    - (rank[j] - centre) ** 2 / (2 * sigma**2) for j in visible])  # Eq. 5
                alpha = torch.softmax(logits, 0)
                weights[bi, hi, i, visible] = alpha
                out[bi, hi, i] = alpha @ v[bi, hi, visible]
    return out, weights


def inputs(b=2, lq=5, lk=5, d_model=8, h=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = heads(torch.randn(b, lq, d_model, generator=g), h)
    k = heads(torch.randn(b, lk, d_model, generator=g), h)
    v = heads(torch.randn(b, lk, d_model, generator=g), h)
    key_mask = torch.ones(b, lk, dtype=torch.bool)
    key_mask[-1, :2] = False  # left padding: positions are ranks among the real keys
    return q, k, v, key_mask


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_matches_the_equations(window, causal):
    torch.manual_seed(0)
    core = localness(window=window).multihead(d_model=8, n_heads=2)
    with torch.no_grad():  # large weights so that the bias matters
        core.predict.v_p.weight.mul_(4)
    q, k, v, key_mask = inputs()
    if causal:
        key_mask[-1] = torch.tensor([True, True, True, False, False])
    out, w = core(q, k, v, key_mask=key_mask, causal=causal, need_weights=True)
    ref_out, ref_w = naive_localness(core, q, k, v, key_mask, causal)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)
    assert (w[-1][..., ~key_mask[-1]] == 0).all()
    if causal:
        assert (w.triu(1) == 0).all()


def test_cross_attention_matches_the_equations():
    torch.manual_seed(1)
    core = localness().multihead(d_model=8, n_heads=2, self_attention=False)
    q, k, v, key_mask = inputs(lq=3, lk=6)
    out, w = core(q, k, v, key_mask=key_mask, need_weights=True)
    ref_out, ref_w = naive_localness(core, q, k, v, key_mask, False)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)


def test_bias_peaks_at_the_predicted_centre():
    """With q . k = 0 the weights are the normalised Gaussian: their mode is round(P_i)."""
    core = localness(window=2).multihead(d_model=4, n_heads=1)
    q = torch.randn(1, 1, 3, 4)
    k, v = torch.zeros(1, 1, 9, 4), torch.randn(1, 1, 9, 4)
    _, w = core(q, k, v, need_weights=True)
    hidden = torch.tanh(core.predict.w_p(q[0, 0]))
    centre = 8 * torch.sigmoid(core.predict.v_p(hidden))[:, 0]  # (I - 1) sigmoid(p), I = 9
    torch.testing.assert_close(w[0, 0].argmax(-1), centre.round().long())
    gauss = torch.exp(-2 * (torch.arange(9.0) - centre[:, None]) ** 2 / 4)
    torch.testing.assert_close(w[0, 0], gauss / gauss.sum(-1, keepdim=True))


def test_left_padding_changes_nothing():
    """Positions are ranks among the real keys: a left-padded copy gives the same outputs."""
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 2, localness())
    x = torch.randn(1, 4, 8)
    padded = torch.cat([torch.randn(1, 2, 8), x], 1)
    mask = torch.tensor([[False, False, True, True, True, True]])
    out, _ = mha(x, x)
    out_p, w_p = mha(padded, padded, mask, need_weights=True)
    torch.testing.assert_close(out_p[:, 2:], out)
    assert (w_p[..., :2] == 0).all()


def test_gradcheck():
    torch.manual_seed(4)
    core = localness().multihead(d_model=4, n_heads=2)
    q, k, v, key_mask = inputs(b=2, lq=3, lk=4, d_model=4)
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda q, k, v: core(q, k, v, key_mask=key_mask)[0], args)


@pytest.mark.parametrize("window", [None, 2])
def test_decoder_matches_the_equations(window):
    torch.manual_seed(5)
    core = localness(window=window).decoder(query_dim=5, memory_dim=6)
    s, h = torch.randn(2, 4, 5), torch.randn(2, 7, 6)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    memory = core.precompute(h, mask)
    ctx, w = core(s, memory)
    pred = core.predict
    ref = torch.zeros(2, 4, 7)
    for b in range(2):
        n = int(mask[b].sum())
        for t in range(4):
            hidden = torch.tanh(pred.w_p.weight @ s[b, t])
            centre = (n - 1) * torch.sigmoid(pred.v_p.weight[0] @ hidden)
            width = n * torch.sigmoid(pred.v_d.weight[0] @ hidden) if window is None else window
            logits = core.query_proj(s[b, t]) @ h[b, :n].T / math.sqrt(6)
            logits = logits - (torch.arange(n) - centre) ** 2 / (2 * (width / 2) ** 2)
            ref[b, t, :n] = torch.softmax(logits, 0)
    torch.testing.assert_close(w, ref)
    torch.testing.assert_close(ctx, ref @ h)


def test_alignment_is_unsupported_with_a_reason():
    with pytest.raises(UnsupportedContext, match="'localness'.*alignment.*position"):
        localness().alignment(dim=4)
    assert localness().supports("multihead") and localness().supports("decoder")
    assert not localness().supports("alignment")


def test_options():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="localness: window"):
            localness(window=bad)
    assert build("localness", window=10).tag() == "localness(window=10)"
