"""Differentiable window (Nguyen et al. 2020): window_mask against exact enumeration of all
discrete windows, the paper's segment example, every context against the equations written
out naively, masking, causality and gradients (the contracts of every mechanism are in
test_contracts.py)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from attention import MultiHeadAttention, build
from attention.functional import window_mask
from attention.window import window
from tests.conftest import heads

pytestmark = pytest.mark.usefixtures("float64")


# -- the naive formulas ---------------------------------------------------------------------------
def window_indicator(n: int, b: int) -> torch.Tensor:
    """I[l, r, j] = 1[seg(l) <= seg(j) <= seg(r)] + 1[seg(r) <= seg(j) <= seg(l)] (Eq. 3, 9-11)."""
    ind = torch.zeros(n, n, n)
    for l, r, j in itertools.product(range(n), repeat=3):
        sl, sr, sj = l // b, r // b, j // b
        ind[l, r, j] = float(sl <= sj <= sr) + float(sr <= sj <= sl)
    return ind


def enumerated_window(phi_l, phi_r, b=1):
    """E[m[j]] over independent l ~ phi_l, r ~ phi_r: sum_{l,r} phi_l[l] phi_r[r] I[l, r, j]."""
    return torch.einsum("...l,...r,lrj->...j", phi_l, phi_r, window_indicator(phi_l.shape[-1], b))


def naive_softmax(scores, mask):
    """softmax over the last dim with masked entries removed (rows here are never empty)."""
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)


def full_mask(key_mask, lq, lk, causal):
    """(B,1,Lq,Lk) boolean."""
    m = key_mask[:, None, None, :].expand(-1, 1, lq, lk)
    if causal:
        m = m & torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    return m


def naive_boundary_scores(core, q, k, x, y, h):
    """(left, right) scores (B,H,Lq,Lk) of Eq. 7-8 from the core's parameters."""
    if core.boundary == "paper":
        w = core.boundaries.weight  # (2,H,d,d)
        return [torch.einsum("bhid,hde,bhje->bhij", q, w[s], k) for s in range(2)]
    d_model = x.shape[-1]
    wq, bq = core.boundaries.query.weight, core.boundaries.query.bias
    wk, bk = core.boundaries.key.weight, core.boundaries.key.bias
    out = []
    for s in range(2):
        part = slice(s * d_model, (s + 1) * d_model)
        qs = heads(F.linear(x, wq[part], bq[part]), h)
        ks = heads(F.linear(y, wk[part], bk[part]), h)
        out.append(qs @ ks.transpose(-2, -1))
    return out


def naive_multihead(core, q, k, v, x, y, key_mask, causal, h):
    """Eq. 7-17 per head, written out; returns (out, A)."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    mask = full_mask(key_mask, lq, lk, causal)
    left, right = naive_boundary_scores(core, q, k, x, y, h)
    scale = core.boundary_scale
    if scale == "length":
        scale = mask.sum(-1, keepdim=True).double()
    phi_l, phi_r = naive_softmax(left * scale, mask), naive_softmax(right * scale, mask)
    m_hat = enumerated_window(phi_l, phi_r, core.segment_size)
    glob = q @ k.transpose(-2, -1) / math.sqrt(d)
    if core.variant == "mw":
        a = naive_softmax(glob, mask) * m_hat  # Eq. 12
    else:
        ql = heads(core.local.query(x), h)
        kl = heads(core.local.key(y), h)
        a = naive_softmax(glob + m_hat * (ql @ kl.transpose(-2, -1) / math.sqrt(d)), mask)
    return a @ v, a


def inputs(b=2, lq=5, lk=5, d_model=8, h=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, lq, d_model, generator=g)
    y = torch.randn(b, lk, d_model, generator=g)
    q = heads(torch.randn(b, lq, d_model, generator=g), h)
    k = heads(torch.randn(b, lk, d_model, generator=g), h)
    v = heads(torch.randn(b, lk, d_model, generator=g), h)
    key_mask = torch.ones(b, lk, dtype=torch.bool)
    key_mask[-1, lk - 2:] = False
    return q, k, v, x, y, key_mask


ALL_OPTIONS = [dict(variant=var, boundary=bd, segment_size=seg, boundary_scale=sc)
               for var in ("mw", "aw") for bd in ("paper", "authors") for seg in (1, 2)
               for sc in (1.0, "length")]


# -- window_mask ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n,b", [(4, 1), (5, 1), (4, 2), (5, 2), (6, 2), (7, 3), (6, 3), (3, 3),
                                 (2, 3)])
def test_window_mask_is_the_expectation_over_discrete_windows(n, b):
    g = torch.Generator().manual_seed(n * 10 + b)
    phi_l = torch.softmax(torch.randn(2, 3, n, generator=g) * 2, -1)
    phi_r = torch.softmax(torch.randn(2, 3, n, generator=g) * 2, -1)
    torch.testing.assert_close(window_mask(phi_l, phi_r, b), enumerated_window(phi_l, phi_r, b))


@pytest.mark.parametrize("n,b", [(5, 1), (6, 2), (7, 3), (2, 3)])
def test_window_mask_gradient_is_the_enumerations(n, b):
    """The gradient of the cumulative-sum window (what training backpropagates through)
    equals the gradient of the exact enumeration over discrete windows."""
    g = torch.Generator().manual_seed(40 + n * 10 + b)
    phi_l, phi_r = (torch.softmax(torch.randn(2, 3, n, generator=g, dtype=torch.float64), -1)
                    .requires_grad_() for _ in range(2))
    cotangent = torch.randn(2, 3, n, generator=g, dtype=torch.float64)
    ours = torch.autograd.grad(window_mask(phi_l, phi_r, b), (phi_l, phi_r), cotangent)
    naive = torch.autograd.grad(enumerated_window(phi_l, phi_r, b), (phi_l, phi_r), cotangent)
    for a, e in zip(ours, naive, strict=True):
        torch.testing.assert_close(a, e)
    assert torch.autograd.gradcheck(lambda a, c: window_mask(a, c, b), (phi_l, phi_r))
    only_left = torch.autograd.grad(window_mask(phi_l, phi_r.detach(), b), phi_l, cotangent)
    torch.testing.assert_close(only_left[0], naive[0])


def test_window_mask_of_one_hot_boundaries_is_the_discrete_window():
    n = 6
    eye = torch.eye(n)
    for l, r in itertools.product(range(n), repeat=2):
        m = window_mask(eye[l], eye[r])
        expected = torch.tensor([float(l <= j <= r) + float(r <= j <= l) for j in range(n)])
        torch.testing.assert_close(m, expected)


def test_window_mask_token_based_equals_eq9_with_the_triangular_matrix():
    g = torch.Generator().manual_seed(1)
    phi_l = torch.softmax(torch.randn(4, 7, generator=g), -1)
    phi_r = torch.softmax(torch.randn(4, 7, generator=g), -1)
    u = torch.ones(7, 7).triu()  # U[u, v] = 1 iff u <= v
    eq9 = (phi_l @ u) * (phi_r @ u.T) + (phi_r @ u) * (phi_l @ u.T)
    torch.testing.assert_close(window_mask(phi_l, phi_r), eq9)


def test_segment_example_of_the_paper():
    """n=6, b=2: the rightward vector is [p1+p2, p1+p2, p1..p4, p1..p4, p1..p6, p1..p6]."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.15, 0.05, 0.2])
    right_end = torch.eye(6)[5]  # r = 6 for sure: the leftward factor of term 1 is all ones
    rightward = torch.tensor([0.3, 0.3, 0.75, 0.75, 1.0, 1.0])
    # term 2: P(r <= end of j's segment) is 1 only in the last segment, times P(l >= its start)
    term2 = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.25, 0.25])
    torch.testing.assert_close(window_mask(p, right_end, 2), rightward + term2)
    # and leftward: l = 1 for sure; sums of phi_r from the START of j's segment
    left_start = torch.eye(6)[0]
    leftward = torch.tensor([1.0, 1.0, 0.7, 0.7, 0.25, 0.25])
    term2 = torch.tensor([0.3, 0.3, 0.0, 0.0, 0.0, 0.0])  # P(r <= end(seg 0)) * P(l >= 0)
    torch.testing.assert_close(window_mask(left_start, p, 2), leftward + term2)
    # token-based differs: the paper's point of segments
    assert not torch.allclose(window_mask(p, right_end, 1), rightward + term2)


def test_window_mask_rejects_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        window_mask(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="segment_size"):
        window_mask(torch.ones(3), torch.ones(3), 0)


# -- multi-head -----------------------------------------------------------------------------------
@pytest.mark.parametrize("opts", ALL_OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_multihead_matches_the_equations(opts):
    torch.manual_seed(0)
    core = window(**opts).multihead(d_model=8, n_heads=2)
    q, k, v, x, y, key_mask = inputs(lq=4, lk=5)
    out, a = core(q, k, v, key_mask=key_mask, need_weights=True, query_input=x, key_input=y)
    ref_out, ref_a = naive_multihead(core, q, k, v, x, y, key_mask, False, 2)
    torch.testing.assert_close(a, ref_a)
    torch.testing.assert_close(out, ref_out)
    assert (a[1, :, :, -2:] == 0).all()  # padded keys: exactly zero weight
    sums = a.sum(-1)
    if opts["variant"] == "aw":
        torch.testing.assert_close(sums, torch.ones_like(sums))
    else:  # MW is not renormalised (m_hat counts l = r = j twice, so a row may exceed 1)
        assert ((sums - 1).abs() > 1e-3).any()


@pytest.mark.parametrize("variant", ["mw", "aw"])
@pytest.mark.parametrize("boundary", ["paper", "authors"])
def test_causal_multihead_matches_the_equations(variant, boundary):
    torch.manual_seed(1)
    core = window(variant=variant, boundary=boundary, boundary_scale="length").multihead(
        d_model=8, n_heads=2)
    q, k, v, x, y, key_mask = inputs(lq=5, lk=5)
    out, a = core(q, k, v, key_mask=key_mask, causal=True, need_weights=True, query_input=x,
                  key_input=y)
    ref_out, ref_a = naive_multihead(core, q, k, v, x, y, key_mask, True, 2)
    torch.testing.assert_close(a, ref_a)
    torch.testing.assert_close(out, ref_out)
    assert (a.triu(1) == 0).all()


def test_causal_segments_are_refused():
    core = window(segment_size=2).multihead(d_model=8, n_heads=2)
    q, k, v, x, y, _ = inputs()
    with pytest.raises(ValueError, match="cannot point to unfinished segments"):
        core(q, k, v, causal=True, query_input=x, key_input=y)


def test_fully_masked_rows_are_zero_not_nan():
    core = window(variant="aw").multihead(d_model=8, n_heads=2)
    q, k, v, x, y, key_mask = inputs()
    key_mask[0] = False
    out, a = core(q, k, v, key_mask=key_mask, need_weights=True, query_input=x, key_input=y)
    assert torch.isfinite(out).all() and (out[0] == 0).all() and (a[0] == 0).all()


@pytest.mark.parametrize("opts", [dict(variant="mw"), dict(variant="aw", segment_size=2),
                                  dict(variant="aw", boundary="authors", boundary_scale="length")])
def test_gradcheck(opts):
    torch.manual_seed(4)
    core = window(**opts).multihead(d_model=4, n_heads=2)
    q, k, v, x, y, key_mask = inputs(b=1, lq=3, lk=4, d_model=4)
    key_mask[0, -1] = False
    args = [t.clone().requires_grad_() for t in (q, k, v, x, y)]

    def f(q, k, v, x, y):
        return core(q, k, v, key_mask=key_mask, query_input=x, key_input=y)[0]

    assert torch.autograd.gradcheck(f, args)


def test_through_multihead_attention_self_and_cross():
    torch.manual_seed(5)
    for opts in (dict(variant="aw", segment_size=5), dict(variant="mw"),
                 dict(boundary="authors", boundary_scale=2.0)):
        mha = MultiHeadAttention(8, 2, build("window", **opts), self_attention=False)
        tgt, src = torch.randn(2, 3, 8), torch.randn(2, 7, 8)
        src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
        out, w = mha(tgt, src, src_mask, need_weights=True)
        assert out.shape == (2, 3, 8) and w.shape == (2, 2, 3, 7)
        assert (w[1, ..., 4:] == 0).all() and torch.isfinite(out).all()
        out, w = MultiHeadAttention(8, 2, build("window", **opts))(src, src, src_mask,
                                                                   need_weights=True)
        assert out.shape == (2, 7, 8) and (w[1, ..., 4:] == 0).all()


def test_inputs_are_required_where_projected():
    core = window(variant="aw").multihead(d_model=8, n_heads=2)
    q, k, v, *_ = inputs()
    with pytest.raises(ValueError, match="query_input"):
        core(q, k, v)
    mw = window(variant="mw").multihead(d_model=8, n_heads=2)
    assert mw(q, k, v)[0].shape == q.shape  # paper MW needs only the per-head q, k, v


def test_options_are_checked_and_shown():
    for bad in (dict(variant="xw"), dict(boundary="code"), dict(segment_size=0),
                dict(boundary_scale="len"), dict(boundary_scale=-1.0)):
        with pytest.raises(ValueError, match="window"):
            window(**bad)
    tag = build("window", variant="mw", segment_size=5).tag()
    assert tag == "window(variant=mw,segment_size=5)"


# -- alignment ------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["mw", "aw"])
@pytest.mark.parametrize("boundary", ["paper", "authors"])
def test_alignment_matches_the_equations(variant, boundary):
    torch.manual_seed(6)
    core = window(variant=variant, boundary=boundary, segment_size=2).alignment(dim=6)
    a, b = torch.randn(2, 4, 6), torch.randn(2, 5, 6)
    mask_a = torch.tensor([[True] * 4, [True, True, True, False]])
    mask_b = torch.tensor([[True] * 5, [True, True, False, False, False]])
    res = core(a, b, mask_a, mask_b)

    def direction(x, y, mask_y, e):
        mask = mask_y[:, None, :].expand(-1, x.shape[1], -1)
        if boundary == "paper":
            w = core.boundaries.weight[:, 0]  # (2,D,D)
            left, right = (x @ w[s] @ y.transpose(1, 2) for s in range(2))
        else:
            bq, bk = core.boundaries.query, core.boundaries.key
            left, right = (F.linear(x, bq.weight[s * 6:(s + 1) * 6], bq.bias[s * 6:(s + 1) * 6])
                           @ F.linear(y, bk.weight[s * 6:(s + 1) * 6],
                                      bk.bias[s * 6:(s + 1) * 6]).transpose(1, 2)
                           for s in range(2))
        m_hat = enumerated_window(naive_softmax(left, mask), naive_softmax(right, mask), 2)
        if variant == "mw":
            return naive_softmax(e, mask) * m_hat
        local = core.local.query(x) @ core.local.key(y).transpose(1, 2)
        return naive_softmax(e + m_hat * local, mask)

    e = a @ b.transpose(1, 2)
    wa = direction(a, b, mask_b, e) * mask_a[:, :, None]
    wb = (direction(b, a, mask_a, e.transpose(1, 2)) * mask_b[:, :, None]).transpose(1, 2)
    torch.testing.assert_close(res.weights_a, wa)
    torch.testing.assert_close(res.weights_b, wb)
    torch.testing.assert_close(res.a_aligned, wa @ b)
    torch.testing.assert_close(res.b_aligned, wb.transpose(1, 2) @ a)
    assert (res.weights_a[1, :, 2:] == 0).all() and (res.weights_b[1, 3:, :] == 0).all()


# -- decoder --------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["mw", "aw"])
@pytest.mark.parametrize("boundary", ["paper", "authors"])
def test_decoder_matches_the_equations(variant, boundary):
    torch.manual_seed(7)
    core = window(variant=variant, boundary=boundary, segment_size=3,
                  boundary_scale="length").decoder(query_dim=5, memory_dim=6)
    s, h = torch.randn(2, 4, 5), torch.randn(2, 7, 6)
    mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    memory = core.precompute(h, mask)
    ctx, w = core(s, memory)
    # naive
    m = mask[:, None, :].expand(-1, 4, -1)
    length = mask.sum(-1).double()[:, None, None]
    if boundary == "paper":
        wt = core.boundaries.weight[:, 0]  # (2,Dq,Dm)
        left, right = (s @ wt[i] @ h.transpose(1, 2) for i in range(2))
    else:
        bq, bk = core.boundaries.query, core.boundaries.key
        left, right = (F.linear(s, bq.weight[i * 6:(i + 1) * 6], bq.bias[i * 6:(i + 1) * 6])
                       @ F.linear(h, bk.weight[i * 6:(i + 1) * 6],
                                  bk.bias[i * 6:(i + 1) * 6]).transpose(1, 2) for i in range(2))
    m_hat = enumerated_window(naive_softmax(left * length, m), naive_softmax(right * length, m), 3)
    glob = core.query_proj(s) @ h.transpose(1, 2) / math.sqrt(6)
    if variant == "mw":
        ref = naive_softmax(glob, m) * m_hat
    else:
        local = core.local.query(s) @ core.local.key(h).transpose(1, 2) / math.sqrt(6)
        ref = naive_softmax(glob + m_hat * local, m)
    torch.testing.assert_close(w, ref)
    torch.testing.assert_close(ctx, ref @ h)
    assert (w[1, :, 5:] == 0).all()
