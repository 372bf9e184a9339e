"""Relative positions (Shaw et al. 2018): the gather / scatter-add implementation against
Eq. 3-4 with the (Lq, Lk, d) tensors a^K, a^V formed explicitly, masking, causality,
gradients and the contexts it refuses (the contracts of every mechanism, the
incremental-decoding offset among them, are in test_contracts.py)."""

from __future__ import annotations

import math

import pytest
import torch

from attention import MultiHeadAttention, UnsupportedContext, build
from attention.relative import relative
from tests.conftest import heads

pytestmark = pytest.mark.usefixtures("float64")


def naive_relative(core, q, k, v, key_mask, causal):
    """Eq. 3-4 with a^K_ij = w^K[clip(j - i, k)], a^V likewise, broadcast explicitly."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    kk = core.max_distance
    i = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    idx = (j - i).clamp(-kk, kk) + kk
    a_k = core.key_embedding[idx]  # (Lq,Lk,d)
    logits = ((q[..., :, None, :] * (k[..., None, :, :] + a_k)).sum(-1)) / math.sqrt(d)  # Eq. 4
    mask = key_mask[:, None, None, :].expand(-1, 1, lq, lk)
    if causal:
        mask = mask & torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    alpha = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
    values = v[..., None, :, :]  # (B,H,1,Lk,d)
    if core.value_embedding is not None:
        values = values + core.value_embedding[idx]  # v_j + a^V_ij
    return (alpha[..., None] * values).sum(-2), alpha  # Eq. 3


def inputs(b=2, l=6, d_model=8, h=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (heads(torch.randn(b, l, d_model, generator=g), h) for _ in range(3))
    key_mask = torch.ones(b, l, dtype=torch.bool)
    key_mask[-1, l - 2:] = False
    return q, k, v, key_mask


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("max_distance", [0, 2, 16])
def test_matches_the_equations(values, causal, max_distance):
    torch.manual_seed(0)
    core = relative(max_distance=max_distance, values=values).multihead(d_model=8, n_heads=2)
    q, k, v, key_mask = inputs()
    out, w = core(q, k, v, key_mask=key_mask, causal=causal, need_weights=True)
    ref_out, ref_w = naive_relative(core, q, k, v, key_mask, causal)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)
    assert (w[-1, ..., -2:] == 0).all()
    if causal:
        assert (w.triu(1) == 0).all()


def test_positions_matter():
    """Without relative positions (and positional encodings) self-attention is permutation
    equivariant; with them it is not."""
    torch.manual_seed(1)
    mha = MultiHeadAttention(8, 2, relative(max_distance=2))
    x = torch.randn(1, 5, 8)
    perm = torch.tensor([3, 0, 4, 1, 2])
    out, _ = mha(x, x)
    out_p, _ = mha(x[:, perm], x[:, perm])
    assert not torch.allclose(out[:, perm], out_p)
    plain = MultiHeadAttention(8, 2, "softmax")
    torch.testing.assert_close(plain(x, x)[0][:, perm], plain(x[:, perm], x[:, perm])[0])


def test_more_queries_than_keys_is_an_error():
    """Queries are the last Lq of the Lk positions (cached decoding: test_contracts.py)."""
    core = relative(max_distance=3).multihead(d_model=8, n_heads=2)
    q, k, v, _ = inputs()
    with pytest.raises(ValueError, match="Lq <= Lk"):
        core(q, k[..., :3, :], v[..., :3, :])


@pytest.mark.parametrize("values", [True, False])
def test_gradcheck(values):
    torch.manual_seed(5)
    core = relative(max_distance=1, values=values).multihead(d_model=4, n_heads=2)
    q, k, v, key_mask = inputs(l=4, d_model=4)
    emb = [core.key_embedding] + ([core.value_embedding] if values else [])

    def f(q, k, v, *tables):
        return core(q, k, v, key_mask=key_mask, causal=True)[0]

    args = [t.clone().requires_grad_() for t in (q, k, v)] + emb
    assert torch.autograd.gradcheck(f, args)


def test_other_contexts_are_unsupported_with_a_reason():
    with pytest.raises(UnsupportedContext, match="'relative'.*cross attention.*same sequence"):
        MultiHeadAttention(8, 2, "relative", self_attention=False)
    with pytest.raises(UnsupportedContext, match="'relative'.*alignment.*same sequence"):
        relative().alignment(dim=4)
    with pytest.raises(UnsupportedContext, match="'relative'.*decoder.*same sequence"):
        relative().decoder(query_dim=4, memory_dim=4)
    assert relative().supports("multihead")


def test_options():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="relative: max_distance"):
            relative(max_distance=bad)
    assert build("relative", max_distance=4, values=False).tag() == \
        "relative(max_distance=4,values=False)"
    core = relative(max_distance=4).multihead(d_model=8, n_heads=2)
    assert core.key_embedding.shape == (9, 4) and core.value_embedding.shape == (9, 4)
