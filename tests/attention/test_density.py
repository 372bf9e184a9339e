"""Attention density matrix (docs/papers.md): the MQT shortcut and blocked AQT against the
N x N matrix Psi built with loops (Eq. 6-11), padding, every context, block sizes and
gradients (the contracts of every mechanism, step-by-step decoding among them, are in
test_contracts.py)."""

from __future__ import annotations

import importlib

import pytest
import torch

from attention import MultiHeadAttention, UnsupportedContext, build
from attention import density as density_module
from attention.density import aqt_offdiagonal, density, pair_encoding_sum
from attention.functional import density_context

DT = torch.float64
compiled = importlib.import_module("attention._compiled")


def naive_omega(scores, h, s, w, scheme, real):
    """omega (T,N) of Eq. 8 for one sequence, Psi_i built entry by entry (Eq. 6, 9-11); only the
    rows j and columns k where ``real`` (T,N) (one visibility row per query) take part."""
    t, n = scores.shape
    omega = torch.zeros(t, n, dtype=DT)
    for i in range(t):
        psi = torch.zeros(n, n, dtype=DT)
        for j in range(n):
            for k in range(n):
                if j == k:
                    psi[j, k] = scores[i, k]
                    continue
                pair = torch.tanh(h[j] + h[k])  # Eq. 9
                psi[j, k] = w * (pair @ s[i]) if scheme == "mqt" else torch.tanh(pair + s[i]) @ w
        keep = real[i].nonzero().flatten()
        column_mean = psi[keep][:, keep].mean(0)  # mean over real rows j, per real column k
        omega[i, keep] = torch.softmax(column_mean, -1)
    return omega


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    b, t, n, d = 2, 3, 5, 4
    return dict(
        scores=torch.randn(b, t, n, generator=g, dtype=DT),
        h=torch.randn(b, n, d, generator=g, dtype=DT),
        s=torch.randn(b, t, d, generator=g, dtype=DT),
        mask=torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0]], dtype=torch.bool),
        w={"mqt": torch.tensor(0.7, dtype=DT), "aqt": torch.randn(d, generator=g, dtype=DT)},
        g=g,
    )


@pytest.fixture(params=["compiled", "eager"])
def pair_path(request, monkeypatch):
    """The compiled exp-identity kernels (MQT pair sums, AQT), or the eager blocked tanh."""
    if request.param == "eager":
        monkeypatch.setattr(compiled, "COMPILE", False)
    elif not compiled.COMPILE:
        pytest.skip("ATTNREPRO_COMPILE=0")
    return request.param


@pytest.mark.parametrize("scheme", ["mqt", "aqt"])
@pytest.mark.parametrize("block_elements", [1, 37, 1 << 22])
def test_functional_equals_naive_density_matrix(data, scheme, block_elements, pair_path):
    scores, h, s, mask, w = data["scores"], data["h"], data["s"], data["mask"], data["w"][scheme]
    context, omega = density_context(scores, h, s, w, scheme, mask,
                                     block_elements=block_elements)
    for b in range(2):
        expected = naive_omega(scores[b], h[b], s[b], w, scheme, mask[b].expand(3, 5))
        torch.testing.assert_close(omega[b], expected)
        torch.testing.assert_close(context[b], expected @ h[b])
    assert torch.equal(omega[1, :, [1, 4]], torch.zeros(3, 2))  # padded keys: exactly 0


def naive_pairs(h, mask):
    """P_k = sum_{j != k, mask_j} tanh(h_j + h_k), one (k, j) at a time."""
    out = torch.zeros_like(h)
    for b in range(h.shape[0]):
        for k in range(h.shape[1]):
            for j in range(h.shape[1]):
                if j != k and (mask is None or mask[b, j]):
                    out[b, k] = out[b, k] + torch.tanh(h[b, j] + h[b, k])
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_pair_encoding_sum_loops(data, pair_path, dtype):
    """Values and gradients against the loops, with and without padding; float32 as trained."""
    h = (3 * data["h"]).to(dtype).requires_grad_()
    tol = {} if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    for mask in (data["mask"], None):
        cotangent = torch.randn(h.shape, generator=data["g"], dtype=DT).to(dtype)
        pairs = pair_encoding_sum(h, mask, block_elements=9)
        expected = naive_pairs(h, mask)
        torch.testing.assert_close(pairs, expected, **tol)
        got, want = (torch.autograd.grad(p, h, cotangent)[0] for p in (pairs, expected))
        torch.testing.assert_close(got, want, **tol)


def test_pair_encoding_sum_heads_and_tiny_sizes(pair_path):
    """Leading dims (B, H) as multi-head attention passes them, a (B,1,N) mask, N = 1 and 2;
    the compiled kernels serve every size without a graph per shape."""
    g = torch.Generator().manual_seed(5)
    pair_encoding_sum(torch.randn(1, 3, 2, dtype=DT))  # the float64 graphs exist
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for n in (1, 2, 6, 9, 3):
        h = torch.randn(2, 3, n, 4, generator=g, dtype=DT, requires_grad=True)
        mask = torch.rand(2, 1, n, generator=g) > 0.3
        pairs = pair_encoding_sum(h, mask)
        flat = naive_pairs(h.reshape(6, n, 4), mask.expand(2, 3, n).reshape(6, n))
        torch.testing.assert_close(pairs, flat.reshape(2, 3, n, 4))
        torch.autograd.grad(pairs.sum(), h)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs <= 2
    assert torch.autograd.gradcheck(lambda x: pair_encoding_sum(x, mask), (h,))


def test_pair_encoding_sum_beyond_the_exp_range_takes_the_tanh_path(data):
    """|h| beyond EXP_RANGE would overflow exp(2h): the eager path answers, still exact."""
    h = data["h"].float().clone()
    h[0, 0, 0], h[0, 1, 0] = 60.0, -57.0  # tanh(3) for this pair, inf * 0 in exp form
    pairs = pair_encoding_sum(h, data["mask"])
    torch.testing.assert_close(pairs, naive_pairs(h, data["mask"]), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(pairs).all()


def test_a_failing_compiler_falls_back_to_the_tanh_path(data, monkeypatch):
    def no_compiler(*args, **kwargs):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(compiled, "COMPILE", True)
    monkeypatch.setattr(torch, "compile", no_compiler)
    for name, kernel in [("_pair_sum", density_module._pair_sum),
                         ("_pair_sum_grad", density_module._pair_sum_grad)]:
        dims = ",".join(kernel.inputs) + "->" + ",".join(kernel.outputs)
        monkeypatch.setattr(density_module, name, compiled.PaddedKernel(kernel.fn, dims))
    h = data["h"].clone().requires_grad_()
    with pytest.warns(UserWarning, match="torch.compile of _pair_sum_block failed"):
        pairs = pair_encoding_sum(h, data["mask"])  # compiling fails inside the first call
    torch.testing.assert_close(pairs, naive_pairs(h, data["mask"]))
    (grad,) = torch.autograd.grad(pairs.sum(), h)
    (want,) = torch.autograd.grad(naive_pairs(h, data["mask"]).sum(), h)
    torch.testing.assert_close(grad, want)
    assert density_module._pair_sum.failed


def test_aqt_compiled_gradients_and_a_failing_compiler(data, monkeypatch):
    """The compiled AQT path: gradients of h, s and a per-head w_s (H, D) against the eager
    path; then a compiler that fails inside the first call: a warning, the same numbers."""
    g = data["g"]
    h = torch.randn(2, 3, 5, 4, generator=g, dtype=DT, requires_grad=True)  # (B,H,N,D)
    s = torch.randn(2, 3, 6, 4, generator=g, dtype=DT, requires_grad=True)
    w = torch.randn(3, 4, generator=g, dtype=DT, requires_grad=True)
    visible = torch.rand(2, 1, 6, 5, generator=g) > 0.3
    cotangent = torch.randn(2, 3, 6, 5, generator=g, dtype=DT)

    def values_and_grads():
        out = aqt_offdiagonal(h, s, w, visible)
        return [out, *torch.autograd.grad(out, (h, s, w), cotangent)]

    fast = values_and_grads()
    monkeypatch.setattr(compiled, "COMPILE", False)
    for got, want in zip(fast, values_and_grads()):
        torch.testing.assert_close(got, want)

    def no_compiler(*args, **kwargs):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(compiled, "COMPILE", True)
    monkeypatch.setattr(torch, "compile", no_compiler)
    for name in ("_aqt_forward", "_aqt_grad_s", "_aqt_grad_t", "_aqt_grad_w"):
        kernel = getattr(density_module, name)
        dims = ",".join(kernel.inputs) + "->" + ",".join(kernel.outputs)
        monkeypatch.setattr(density_module, name, compiled.PaddedKernel(kernel.fn, dims))
    with pytest.warns(UserWarning, match="torch.compile of _aqt_block_kernel failed"):
        fallback = values_and_grads()
    for got, want in zip(fallback, fast):
        torch.testing.assert_close(got, want)


def test_blocks_stay_within_budget(data, monkeypatch):
    """The eager paths (the MQT pair sums without a compiler; AQT always) hold one block."""
    monkeypatch.setattr(compiled, "COMPILE", False)
    h, s, mask, w = data["h"], data["s"], data["mask"], data["w"]["aqt"]
    pair_rows, aqt_blocks = [], []
    pair_block, aqt_block = density_module._pair_tanh_block, density_module._aqt_block

    def record_pair(h_k, *args):
        pair_rows.append(h_k.shape[-2])
        return pair_block(h_k, *args)

    def record_aqt(h_j, h_, s_t, *args):
        aqt_blocks.append((s_t.shape[-2], h_j.shape[-2]))
        return aqt_block(h_j, h_, s_t, *args)

    monkeypatch.setattr(density_module, "_pair_tanh_block", record_pair)
    monkeypatch.setattr(density_module, "_aqt_block", record_aqt)
    row = 2 * 5 * 4  # B * N * D: one (k) row of L, one (step, j) pair of tanh(L + s)
    pair_encoding_sum(h, mask, block_elements=2 * row)
    assert pair_rows == [2, 2, 1]
    aqt_offdiagonal(h, s, w, mask[:, None, :], block_elements=2 * row)
    assert aqt_blocks == [(1, 2), (1, 2), (1, 1)] * 3  # per step rows 2 + 2 + 1: <= 2 pairs
    aqt_blocks.clear()
    aqt_offdiagonal(h, s, w, mask[:, None, :], block_elements=11 * row)
    assert aqt_blocks == [(2, 5), (1, 5)]  # 10 of 11 pairs, then the last step


@pytest.mark.parametrize("scheme", ["mqt", "aqt"])
def test_functional_gradcheck(data, scheme):
    g = data["g"]
    w = torch.tensor(0.5, dtype=DT) if scheme == "mqt" else torch.randn(2, generator=g, dtype=DT)
    args = (torch.randn(1, 2, 3, generator=g, dtype=DT),  # scores (B,T,N)
            torch.randn(1, 3, 2, generator=g, dtype=DT),  # h (B,N,D)
            torch.randn(1, 2, 2, generator=g, dtype=DT), w)  # s (B,T,D), w_s
    args = tuple(a.requires_grad_() for a in args)
    mask = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda *a: density_context(*a, scheme, mask, block_elements=5), args)


@pytest.mark.parametrize("scheme", ["mqt", "aqt"])
@pytest.mark.parametrize("query_dim", [4, 6])
def test_decoder_matches_naive(data, scheme, query_dim):
    h, mask, g = data["h"], data["mask"], data["g"]
    s = torch.randn(2, 3, query_dim, generator=g, dtype=DT)
    core = density(scheme, block_elements=30).decoder(query_dim=query_dim, memory_dim=4).double()
    memory = core.precompute(h, mask)
    # once per source: P_k (MQT); L and exp(2L) (AQT, for its compiled kernels)
    assert ("pairs" in memory) == (scheme == "mqt" or compiled.COMPILE)
    context, omega = core(s, memory)
    scores = core.score(s, core.score.keys(h))  # Eq. 5 (tested in test_additive.py)
    s_d = core.query_proj(s)
    for b in range(2):
        expected = naive_omega(scores[b], h[b], s_d[b], core.w_s, scheme, mask[b].expand(3, 5))
        torch.testing.assert_close(omega[b], expected)
        torch.testing.assert_close(context[b], expected @ h[b])


def test_multihead_mqt_matches_naive(data):
    g = data["g"]
    q = torch.randn(2, 2, 3, 4, generator=g, dtype=DT)
    k = torch.randn(2, 2, 5, 4, generator=g, dtype=DT)
    v = torch.randn(2, 2, 5, 3, generator=g, dtype=DT)
    key_mask = data["mask"]
    core = density("mqt", block_elements=50).multihead(d_model=8, n_heads=2).double()
    out, weights = core(q, k, v, key_mask=key_mask, need_weights=True)
    for b in range(2):
        for hd in range(2):
            scores = q[b, hd] @ k[b, hd].T / 2.0  # scaled dot product, d = 4
            expected = naive_omega(scores, k[b, hd], q[b, hd], core.w_s[hd, 0, 0], "mqt",
                                   key_mask[b].expand(3, 5))
            torch.testing.assert_close(weights[b, hd], expected)
            torch.testing.assert_close(out[b, hd], expected @ v[b, hd])
    with pytest.raises(UnsupportedContext, match="'density'.*causal"):
        core(q, k, v, key_mask=key_mask, causal=True)


def test_multihead_aqt_causal_matches_naive(data):
    g = data["g"]
    q = torch.randn(2, 2, 4, 2, generator=g, dtype=DT)
    k = torch.randn(2, 2, 4, 2, generator=g, dtype=DT)
    key_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    core = density("aqt", block_elements=20).multihead(d_model=4, n_heads=2).double()
    out, weights = core(q, k, k, key_mask=key_mask, causal=True, need_weights=True)
    for b in range(2):
        visible = key_mask[b] & torch.ones(4, 4, dtype=torch.bool).tril()  # own prefix per row
        for hd in range(2):
            scores = q[b, hd] @ k[b, hd].T / 2.0 ** 0.5
            expected = naive_omega(scores, k[b, hd], q[b, hd], core.w_s[hd], "aqt", visible)
            torch.testing.assert_close(weights[b, hd], expected)
            torch.testing.assert_close(out[b, hd], expected @ k[b, hd])


@pytest.mark.parametrize("scheme", ["mqt", "aqt"])
def test_alignment_both_directions(data, scheme):
    a, mask_a, g = data["h"], data["mask"], data["g"]
    b = torch.randn(2, 3, 4, generator=g, dtype=DT)
    mask_b = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    core = density(scheme, block_elements=16).alignment(dim=4).double()
    out = core(a, b, mask_a, mask_b)
    e = core.score(a, core.score.keys(b))  # (B,La,Lb)
    for n in range(2):
        row = naive_omega(e[n], b[n], a[n], core.w_s, scheme, mask_b[n].expand(5, 3))
        row[~mask_a[n]] = 0
        col = naive_omega(e[n].T, a[n], b[n], core.w_s, scheme, mask_a[n].expand(3, 5)).T
        col[:, ~mask_b[n]] = 0
        torch.testing.assert_close(out.weights_a[n], row)
        torch.testing.assert_close(out.weights_b[n], col)
        torch.testing.assert_close(out.a_aligned[n], row @ b[n])
        torch.testing.assert_close(out.b_aligned[n], col.T @ a[n])


def test_registry_block_and_errors(data):
    mechanism = build("density", scheme="aqt")
    assert mechanism.tag() == "density(scheme=aqt)"
    assert all(mechanism.supports(c) for c in ("multihead", "alignment", "decoder"))
    block = MultiHeadAttention(8, 2, "density").double()
    x = torch.randn(2, 4, 8, dtype=DT)
    out, _ = block(x, x, torch.tensor([[1] * 4, [1, 1, 0, 0]], dtype=torch.bool))
    out.sum().backward()
    assert block.core.w_s.grad.abs().sum() > 0
    with pytest.raises(UnsupportedContext, match="density"):
        block(x, x, causal=True)
    scores, h, s, mask = data["scores"], data["h"], data["s"], data["mask"]
    with pytest.raises(ValueError, match="scheme must be one of"):
        density("xqt")
    with pytest.raises(ValueError, match=r"w_s for scheme 'aqt' must have shape \(4,\)"):
        density_context(scores, h, s, data["w"]["mqt"], "aqt", mask)
    with pytest.raises(ValueError, match="must share"):
        density_context(scores, h, s[..., :3], data["w"]["mqt"], "mqt", mask)
    with pytest.raises(TypeError, match="boolean"):
        density_context(scores, h, s, data["w"]["mqt"], "mqt", mask.long())


@pytest.mark.parametrize("precision", ["autocast", "bfloat16 tensors"])
def test_kernels_compute_bfloat16_in_float32(precision):
    """bfloat16 h, s (a model's bf16 layers under ``bf16-mixed``, or a model cast to bf16)
    go to the compiled exp-identity kernels in float32, as float32 inputs of the same values
    do, forward and backward; under autocast the result is float32.  Before, the dtype check
    sent them to the eager blocked tanh in bfloat16: 2x (MQT) and 7x (AQT) the float32 time
    at B=32, N=50, D=256, and sums of N^2 D terms with an 8-bit mantissa."""
    if not density_module._pair_sum.active():
        pytest.skip("no compiled kernels here (no compiler, or ATTNREPRO_COMPILE=0)")
    g = torch.Generator().manual_seed(5)
    h = torch.randn(2, 9, 8, generator=g).to(torch.bfloat16)
    s = torch.randn(2, 3, 8, generator=g).to(torch.bfloat16)
    w = torch.randn(8, generator=g).to(torch.bfloat16).float()  # a bfloat16 value either way
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3], dtype=torch.bool)
    visible = mask[:, None, :]

    def both(h, s, w):
        return pair_encoding_sum(h, mask), aqt_offdiagonal(h, s, w, visible)

    h32, s32, w32 = (x.float().clone().requires_grad_() for x in (h, s, w))
    expected = both(h32, s32, w32)
    sum(e.sum() for e in expected).backward()
    low = [h.requires_grad_(), s.requires_grad_(),
           (w.to(torch.bfloat16) if precision == "bfloat16 tensors" else w).requires_grad_()]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast"):
        got = both(*low)
    sum(o.float().sum() for o in got).backward()
    for name, out, ref in zip(("MQT pair sums", "AQT"), got, expected, strict=True):
        assert out.dtype == (torch.float32 if precision == "autocast" else torch.bfloat16), name
        # bfloat16 out: float32's result rounded to bfloat16 (the eager path was further off)
        ref = ref.detach() if precision == "autocast" else ref.detach().to(out.dtype).float()
        torch.testing.assert_close(out.float(), ref, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
    for name, x, x32 in zip("hsw", low, (h32, s32, w32), strict=True):
        # bfloat16 gradients of bf16 tensors, summed over the two uses of each: within 1% of
        # the largest
        scale = float(x32.grad.abs().max())
        torch.testing.assert_close(x.grad.float(), x32.grad, rtol=0, atol=1e-2 * scale,
                                   msg=lambda m, name=name: f"the gradient of {name}: {m}")
