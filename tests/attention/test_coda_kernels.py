"""CoDA's C++ L1 kernels (attention/_coda_l1.cpp, built and loaded by
attention._coda_l1_ext) against the naive broadcast formula and the plain path (torch.cdist
and its backward kernel, as with ATTNREPRO_COMPILE=0): values and gradients in float32 and
float64, sizes that leave a tail in every tile, ties (sign(0) = 0), masks and padded rows,
threads, the build cache, and the fallback when the build fails."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from attention.functional import coda as coda_fn
from attention.functional import l1_distance
from attention.masking import causal_mask
from tests.attention.test_coda import compare
from tests.conftest import break_native_library

ext = importlib.import_module("attention._coda_l1_ext")

native_lib = importlib.import_module("attention._native")
kernels = importlib.import_module("attention._coda_kernels")
compiled = importlib.import_module("attention._compiled")
impl = importlib.import_module("attention.coda")

#: (N, r, Lk, d): single elements, tails of the forward tiles (4 rows x 32/64 keys) and of the
#: gradient tiles (8 rows, vectors of 16/8 along d), d below and above one vector
SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (3, 9, 70, 20), (2, 33, 129, 64), (1, 17, 300, 3),
          (4, 16, 64, 16), (2, 8, 96, 40)]
DTYPES = [torch.float32, torch.float64]


@pytest.fixture
def native(monkeypatch):
    """The C++ kernels on (skipped without a C++ compiler); the element-wise part runs
    eagerly, so no torch.compile time is spent."""
    if native_lib.compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(compiled, "COMPILE", True)
    monkeypatch.setattr(ext.LIBRARY, "enabled", True)
    assert ext.library() is not None, "the C++ kernels failed to build (see the warning)"
    monkeypatch.setattr(impl, "_OPS", kernels.BlockOps(impl._factors, impl._forward_block,
                                                       impl._backward_block))


def ints(*shape, generator, dtype, low=-3, high=4):
    """Small integers: many ties, and sums exact in float32 as in float64."""
    return torch.randint(low, high, shape, generator=generator).to(dtype)


def naive_l1(q, k):
    return (q[..., :, None, :] - k[..., None, :, :]).abs().sum(-1)


def naive_grads(w, e, q, k):
    """The gradients of sum_ij (w_ij D_ij + e_ij q_i.k_j), with torch.sign (sign(0) = 0)."""
    s = torch.sign(q[:, :, None, :] - k[:, None, :, :])  # (N,r,Lk,d)
    gq = (w[..., None] * s).sum(2)
    gk = -(w[..., None] * s).sum(1)
    if e is not None:
        gq, gk = gq + e @ k, gk + e.transpose(1, 2) @ q
    return gq, gk


# -- the kernels -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_distance_and_dot_are_exact_on_integers(native, dtype, shape):
    n, r, lk, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    q, k = ints(n, r, d, generator=g, dtype=dtype), ints(n, lk, d, generator=g, dtype=dtype)
    assert torch.equal(ext.distance(q, k), naive_l1(q, k))
    dot, dist = ext.products(q, k)
    assert torch.equal(dist, naive_l1(q, k)) and torch.equal(dot, q @ k.transpose(1, 2))
    for d2 in (d, 5):  # a third product a.b in the same pass, of another width
        a, b = ints(n, r, d2, generator=g, dtype=dtype), ints(n, lk, d2, generator=g, dtype=dtype)
        dot, dist, ab = ext.products(q, k, a, b)
        assert torch.equal(dist, naive_l1(q, k)) and torch.equal(dot, q @ k.transpose(1, 2))
        assert torch.equal(ab, a @ b.transpose(1, 2))


#: keys shorter than 64 and not a multiple of 16: float32 on AVX-512 takes the flat tiles (lanes
#: over the keys of consecutive matrices, up to 16 matrices a tile at 1 key)
SHORT_KEYS = [1, 2, 3, 4, 5, 6, 7, 15, 17, 31, 33, 47, 63]


@pytest.mark.parametrize("lk", SHORT_KEYS)
@pytest.mark.parametrize("r", [1, 5, 17])
def test_products_of_short_keys_are_exact_on_integers(native, r, lk):
    """q.k, D and a.b at every short key length (tiles spanning 1 to 16 matrices, row tails),
    exact on integers, for a matrix count that leaves a partial last tile."""
    g = torch.Generator().manual_seed(r * 100 + lk)
    n, d = 7, 19
    q, k = ints(n, r, d, generator=g, dtype=torch.float32), ints(n, lk, d, generator=g,
                                                                dtype=torch.float32)
    a, b = ints(n, r, 5, generator=g, dtype=torch.float32), ints(n, lk, 5, generator=g,
                                                                dtype=torch.float32)
    dot, dist, ab = ext.products(q, k, a, b)
    assert torch.equal(dist, naive_l1(q, k)) and torch.equal(dot, q @ k.transpose(1, 2))
    assert torch.equal(ab, a @ b.transpose(1, 2))
    assert torch.equal(ext.products(q, k)[1], naive_l1(q, k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_distance_and_dot_on_random_values(native, dtype, shape):
    n, r, lk, d = shape
    g = torch.Generator().manual_seed(sum(shape) + 1)
    q, k = (torch.randn(n, x, d, generator=g, dtype=dtype) for x in (r, lk))
    a, b = torch.randn(n, r, 9, generator=g, dtype=dtype), torch.randn(n, lk, 9, generator=g,
                                                                       dtype=dtype)
    dot, dist, ab = ext.products(q, k, a, b)
    tol = dict(atol=1e-4, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(dist.double(), naive_l1(q.double(), k.double()), **tol)
    torch.testing.assert_close(dot.double(), q.double() @ k.double().transpose(1, 2), **tol)
    torch.testing.assert_close(ab.double(), a.double() @ b.double().transpose(1, 2), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_e", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradients_are_exact_on_integers_with_ties(native, dtype, with_e, shape):
    """Integer q, k: ties q_it == k_jt everywhere, where sign(0) = 0 must hold; the gradient
    of k is added to what the buffer holds."""
    n, r, lk, d = shape
    g = torch.Generator().manual_seed(sum(shape) + 2)
    q, k = ints(n, r, d, generator=g, dtype=dtype), ints(n, lk, d, generator=g, dtype=dtype)
    w = ints(n, r, lk, generator=g, dtype=dtype)
    e = ints(n, r, lk, generator=g, dtype=dtype) if with_e else None
    start = ints(n, lk, d, generator=g, dtype=dtype)
    grad_k = start.clone()
    grad_q = ext.grads(w, q, k, grad_k, e)
    want_q, want_k = naive_grads(w, e, q, k)
    assert torch.equal(grad_q, want_q) and torch.equal(grad_k, start + want_k)
    assert torch.equal(ext.grads(w, q, k, None, e), want_q)  # no gradient of k wanted
    buffer = torch.empty_like(q)
    assert ext.grads(w, q, k, None, e, out=buffer) is buffer and torch.equal(buffer, want_q)
    strided = torch.zeros(n, d, lk, dtype=dtype).transpose(1, 2)  # not contiguous
    ext.grads(w, q, k, strided, e)
    assert torch.equal(strided, want_k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sign_of_zero_is_zero(native, dtype):
    """q == k in every coordinate (and -0.0 against 0.0): the L1 term adds nothing."""
    g = torch.Generator().manual_seed(3)
    k = torch.randn(2, 40, 24, generator=g, dtype=dtype)
    q = k[:, :9].clone()
    q[0, 0] = -0.0
    k[0, 0] = 0.0
    w = torch.randn(2, 9, 40, generator=g, dtype=dtype)
    grad_k = torch.zeros_like(k)
    grad_q = ext.grads(w, q, k, grad_k)
    want_q, want_k = naive_grads(w, None, q, k)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(grad_q, want_q, **tol)
    torch.testing.assert_close(grad_k, want_k, **tol)
    # the one row of q that equals a row of k: that key's term is exactly 0 for both
    single = ext.grads(w[:, :1, :1], q[:, :1], k[:, :1], None)
    assert torch.equal(single, torch.zeros_like(single))


@pytest.mark.parametrize("n", [1, 3, 16])
def test_threads_do_not_change_the_result(native, n):
    """One thread against several, also when a few matrices are split over threads by keys
    (partial gradients of q summed afterwards): every term counted once.  On integers, so
    exact whatever the order; on random floats another thread count may sum the partial
    gradients in another order (last bits; docs/reproducibility.md, Determinism)."""
    g = torch.Generator().manual_seed(4)
    q, k = ints(n, 37, 24, generator=g, dtype=torch.float32), ints(n, 300, 24, generator=g,
                                                                   dtype=torch.float32)
    w, e = (ints(n, 37, 300, generator=g, dtype=torch.float32) for _ in range(2))
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            grad_k = torch.zeros_like(k)
            results.append((*ext.products(q, k, w[:, :, :24], k), ext.grads(w, q, k, grad_k, e),
                            grad_k))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


# -- CoDA through the C++ kernels --------------------------------------------------------------
OPTIONS = [dict(gate="scaled"), dict(gate="centered", center_e=True),
           dict(gate="centered", center_e=True, center_rows=True),
           dict(gate="plain", e_fn="sigmoid", n_fn="arctan")]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("dtype", DTYPES)
def test_coda_matches_the_paper_with_masks(native, dtype, options):
    """Values and gradients against the naive formula, with padded keys, padded query rows
    (a pair mask) and a causal mask, on sizes with tails."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 11, 20, generator=g, dtype=dtype, requires_grad=True)
               for _ in range(3))
    key_mask = torch.ones(2, 11, dtype=torch.bool)
    key_mask[1, 7:] = False
    pair = key_mask[:, None, :, None] & key_mask[:, None, None, :]
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-7)
    for mask in (None, key_mask[:, None, None, :], pair, pair & causal_mask(11, 11)):
        compare(q, k, v, mask, **tol, **options)


@pytest.mark.parametrize("dtype", DTYPES)
def test_coda_ties_match_the_paper(native, dtype):
    g = torch.Generator().manual_seed(6)
    q, k = (ints(2, 2, 13, 16, generator=g, dtype=dtype).requires_grad_() for _ in range(2))
    v = torch.randn(2, 2, 13, 5, generator=g, dtype=dtype, requires_grad=True)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-7)
    compare(q, k, v, **tol, gate="scaled")
    compare(q, q, v, **tol, gate="centered")  # q_i == k_i: every diagonal entry a tie


def test_native_and_plain_paths_agree_on_a_benchmark_like_size(native, monkeypatch):
    """float32 at a size with several tiles (and tails): the C++ path against the plain
    path (ATTNREPRO_COMPILE=0: torch.cdist), values and every gradient."""
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 1 << 16)  # many tiles
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 4, 70, 64, generator=g, requires_grad=True) for _ in range(3))
    c = torch.randn(2, 4, 70, 64, generator=g)
    key_mask = (torch.arange(70) < torch.tensor([[70], [51]]))[:, None, None, :]

    def run():
        out = coda_fn(q, k, v, key_mask, gate="scaled")[0]
        return (out, *torch.autograd.grad((out * c).sum(), (q, k, v)))

    fast = run()
    monkeypatch.setattr(compiled, "COMPILE", False)
    assert not ext.supports(q.detach())
    plain = run()
    for a, b in zip(fast, plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_gradcheck_through_the_native_kernels(native):
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    mask = torch.rand(2, 5, 5, generator=g) > 0.2
    assert torch.autograd.gradcheck(
        lambda q, k, v: coda_fn(q, k, v, mask, gate="centered", center_e=True,
                                center_rows=False), (q, k, v))
    assert torch.autograd.gradcheck(l1_distance, (q, k))


def test_no_allocation_of_the_broadcast(native):
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(4, 64, 32, generator=g, requires_grad=True) for _ in range(3))
    broadcast = 4 * 64 * 64 * 32 * 4
    with torch.profiler.profile(profile_memory=True) as prof:
        out = coda_fn(q, k, v)[0]
        out.sum().backward()
    assert max(e.cpu_memory_usage for e in prof.events()) < broadcast / 8


# -- building -----------------------------------------------------------------------------------
def test_the_build_is_cached_per_source_and_flags(native, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    path = ext.LIBRARY.build()
    assert path.parent == tmp_path / "attnrepro_coda_l1" and path.exists()
    assert ext.LIBRARY.build_seconds is not None and ext.LIBRARY.build_seconds > 0
    mtime = path.stat().st_mtime_ns
    assert ext.LIBRARY.build() == path and path.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    # other flags (another CPU capability): their own file
    monkeypatch.setattr(native_lib, "isa_flags", lambda: ["-DATTNREPRO_OTHER_FLAGS"])
    assert ext.LIBRARY.build() != path


def test_isa_flags_follow_torchs_cpu_capability(monkeypatch):
    monkeypatch.setattr(native_lib.platform, "machine", lambda: "x86_64")
    for capability, flag in [("AVX512", "-mavx512f"), ("AVX2", "-mavx2"), ("DEFAULT", None)]:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        flags = native_lib.isa_flags()
        assert (flag in flags) if flag else flags == []
        assert "-march=native" not in flags
    monkeypatch.setattr(native_lib.platform, "machine", lambda: "aarch64")
    assert native_lib.isa_flags() == []


def test_a_failing_build_falls_back_with_one_warning(monkeypatch, tmp_path):
    """A source that does not compile (as a missing compiler would): one warning, then the
    plain path, still exact."""
    break_native_library(monkeypatch, tmp_path, ext.LIBRARY)
    monkeypatch.setattr(impl, "_OPS", kernels.BlockOps(impl._factors, impl._forward_block,
                                                       impl._backward_block))
    # the compiled L1 kernels off as well: torch.cdist runs, no torch.compile time
    for name in ("l1", "l1_grads"):
        kernel = getattr(kernels, name)
        dims = ",".join(kernel.fallback.inputs) + "->" + ",".join(kernel.fallback.outputs)
        fallback = compiled.PaddedKernel(kernel.fallback.fn, dims)
        fallback.failed = True
        monkeypatch.setattr(kernels, name, kernels.NativeKernel(kernel.native, fallback))
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    with pytest.warns(UserWarning, match="building the CoDA L1 kernels failed"):
        compare(q, k, v, gate="centered")
    assert ext.library() is None and not ext.supports(q)
    assert not os.listdir(tmp_path / "cache" / "attnrepro_coda_l1")  # no partial library


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(ext.LIBRARY, "enabled", False)
    assert ext.library() is None and not ext.supports(torch.zeros(1, 1, 1))
    monkeypatch.setattr(ext.LIBRARY, "enabled", True)
    monkeypatch.setattr(compiled, "COMPILE", False)  # ATTNREPRO_COMPILE=0
    assert ext.library() is None
    assert not ext.supports(torch.zeros(1, 1, 1, dtype=torch.float16))


# -- Eq. 1-6 in C++ (attention._coda_l1_ext.eq_forward, eq_backward) ----------------------------
@pytest.fixture
def native_eq(monkeypatch):
    """The C++ kernels on, Eq. 1-6 included (the module's own blocks, not the eager ones of
    ``native``); counts the calls of the C++ element-wise kernels in ``calls`` (a separate
    pass or fused into the L1 kernel's tiles alike)."""
    if native_lib.compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(compiled, "COMPILE", True)
    monkeypatch.setattr(ext.LIBRARY, "enabled", True)
    monkeypatch.setattr(impl, "NATIVE_EQ", True)
    assert ext.library() is not None, "the C++ kernels failed to build (see the warning)"
    calls = {"forward": 0, "backward": 0}

    def counted(name, fn):
        def run(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(ext, "eq_forward", counted("forward", ext.eq_forward))
    monkeypatch.setattr(ext, "eq_backward", counted("backward", ext.eq_backward))
    # fused into the L1 kernel's tiles (coda.FUSED_EQ): the same C++ Eq. 1-6, counted alike
    monkeypatch.setattr(ext, "fused_forward", counted("forward", ext.fused_forward))
    monkeypatch.setattr(ext, "fused_backward", counted("backward", ext.fused_backward))
    return calls


def test_eq_kernels_match_tanh_and_sigmoid_on_every_range(native_eq):
    """M = tanh(s_e q.k) g sigmoid(s_n D) and its derivatives, element by element, against
    torch in float64: saturated, tiny, zero and negative arguments, every tail length of a
    vector, a mask and dropout uniforms."""
    x = torch.cat([torch.linspace(-30, 30, 2001), torch.tensor([0.0, -0.0, 1e-30, -1e-30,
                                                                  1e-8, -1e-8, 200.0, -200.0])])
    for count in (x.numel(), 1, 5, 17, 33):
        qk = x[:count].reshape(1, 1, count)
        dist = x.flip(0)[:count].abs().reshape(1, 1, count) * 3  # D >= 0
        g = torch.Generator().manual_seed(count)
        mask = torch.rand(qk.shape, generator=g) > 0.2
        u = torch.rand(qk.shape, generator=g)
        d_md, d_m = torch.randn(qk.shape, generator=g), torch.randn(qk.shape, generator=g)
        for gs, p in ((2.0, 0.25), (1.0, 0.0)):
            es, ns = 0.7, -0.3
            e, n = es * qk.double(), ns * dist.double()
            te, gn = torch.tanh(e), torch.sigmoid(n)
            keep = (u >= p).double() / (1 - p) if p else torch.ones_like(e)
            m = (te * gn * gs).masked_fill(~mask, 0)
            got_m, got_md = ext.eq_forward(qk, dist, mask, u if p else None, p, es, ns, gs)
            torch.testing.assert_close(got_m.double(), m, atol=3e-7, rtol=0)
            torch.testing.assert_close(got_md.double(), m * keep, atol=3e-7 / (1 - p), rtol=0)
            dm = ((d_md.double() * keep) + d_m.double()).masked_fill(~mask, 0)
            de = es * dm * gn * gs * (1 - te * te)
            dn = ns * dm * te * gs * gn * (1 - gn)
            got = ext.eq_backward(qk, dist, mask, u if p else None, p, d_md, d_m, es, ns, gs)
            for a, b in zip(got, (m * keep, de, dn)):
                torch.testing.assert_close(a.double(), b, atol=2e-6, rtol=0)
    assert native_eq == {"forward": 10, "backward": 10}


#: odd lengths: a single key or query, tails of every vector and tile
SHORT = [1, 5, 17, 33]


@pytest.mark.parametrize("lk", SHORT)
@pytest.mark.parametrize("lq", SHORT)
@pytest.mark.parametrize("gate", ["scaled", "plain"])
def test_eq_in_cpp_matches_the_paper_on_short_sequences(native_eq, lq, lk, gate):
    """CoDA in float32 through the C++ Eq. 1-6 against the naive formula tanh(E) sigmoid(N)
    in float64, values and gradients of q, k and v (of M v and of M), without a mask, with
    padded keys, a pair mask and (Lq = Lk) a causal one."""
    g = torch.Generator().manual_seed(100 * lq + lk)
    q = torch.randn(2, 3, lq, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 3, lk, 16, generator=g, requires_grad=True) for _ in range(2))
    key_mask = torch.ones(2, lk, dtype=torch.bool)
    key_mask[1, lk // 2 + 1:] = False
    query_mask = torch.ones(2, lq, dtype=torch.bool)
    query_mask[0, lq // 2 + 1:] = False
    pair = query_mask[:, None, :, None] & key_mask[:, None, None, :]
    masks = [None, key_mask[:, None, None, :], pair]
    if lq == lk:
        masks.append(pair & causal_mask(lq, lk))
    for mask in masks:
        compare(q, k, v, mask, atol=2e-5, rtol=1e-4, gate=gate)
    assert native_eq["forward"] == len(masks) and native_eq["backward"] == len(masks)


@pytest.mark.parametrize("shape", [(3, 4, 17, 17, 32), (3, 4, 5, 17, 32), (2, 2, 1, 33, 8),
                                   (2, 2, 6, 6, 32)], ids=str)
@pytest.mark.parametrize("need_weights", [False, True])
def test_eq_in_cpp_equals_the_compiled_blocks_with_dropout(native_eq, monkeypatch, shape,
                                                         need_weights):
    """The C++ Eq. 1-6 against the compiled blocks (NATIVE_EQ off) under dropout, the same
    seed: M v, M and every gradient within float rounding (the same entries dropped)."""
    b, h, lq, lk, d = shape
    g = torch.Generator().manual_seed(lq * lk)
    q = torch.randn(b, h, lq, d, generator=g, requires_grad=True)
    k, v = (torch.randn(b, h, lk, d, generator=g, requires_grad=True) for _ in range(2))
    mask = torch.rand(b, 1, lq, lk, generator=g) > 0.2
    c_out = torch.randn(b, h, lq, d, generator=g)
    c_m = torch.randn(b, h, lq, lk, generator=g)

    def run():
        torch.manual_seed(3)  # the dropout seed
        out, _, m = impl._coda(q, k, v, mask, need_weights=need_weights, dropout=0.3,
                               gate="scaled")
        loss = (out * c_out).sum() + (0 if m is None else (m * c_m).sum())
        return (out, *([] if m is None else [m]), *torch.autograd.grad(loss, (q, k, v)))

    fast = run()
    assert native_eq == {"forward": 1, "backward": 1}
    monkeypatch.setattr(impl, "NATIVE_EQ", False)
    for a, b_ in zip(fast, run(), strict=True):
        torch.testing.assert_close(a, b_, atol=1e-6, rtol=1e-5)
    assert native_eq == {"forward": 1, "backward": 1}  # the second run compiled


# -- Eq. 1-6 fused into the L1 kernel's tiles (attention._coda_l1_ext.fused_forward, ..._backward)
def test_fused_kernels_equal_the_separate_passes(native_eq):
    """fused_forward / fused_backward against products + eq_forward / eq_backward (the separate
    passes they replace) on the same tensors: bit for bit (the same sums, then eq_vector's
    arithmetic on the same values), with and without mask, dropout, the third product and the
    gradient of M, on the keys' tiles with tails and on the flat tiles of short keys."""
    es, ns = 0.125, -0.125
    for n, r, lk, d, d2 in [(2, 9, 70, 20, 20), (3, 5, 129, 64, 64), (1, 4, 64, 16, 7),
                            (4, 7, 5, 32, 32), (5, 3, 17, 19, 5), (3, 17, 33, 8, 8),
                            (2, 6, 63, 64, 64), (7, 1, 1, 3, 3)]:
        g = torch.Generator().manual_seed(n * r * lk)
        q, a = torch.randn(n, r, d, generator=g), torch.randn(n, r, d2, generator=g)
        k, b = torch.randn(n, lk, d, generator=g), torch.randn(n, lk, d2, generator=g)
        mask = torch.rand(n, r, lk, generator=g) > 0.2
        u = torch.rand(n, r, lk, generator=g)
        d_m = torch.randn(n, r, lk, generator=g)
        for m_, u_, p, gs in ((None, None, 0.0, 2.0), (mask, u, 0.3, 2.0), (mask, None, 0.0, 1.0),
                              (None, u, 0.5, 1.0)):
            qk, dist, ab = ext.products(q, k, a, b)
            want = ext.eq_forward(qk, dist, m_, u_, p, es, ns, gs)
            got = ext.fused_forward(q, k, m_, u_, p, es, ns, gs)
            for x, y in zip(got, want):
                assert torch.equal(x, y)
            if u_ is not None:  # M not wanted: only M with dropout
                m_none, md = ext.fused_forward(q, k, m_, u_, p, es, ns, gs, need_m=False)
                assert m_none is None and torch.equal(md, want[1])
            for a_, b_, dm_ in ((a, b, None), (a, b, d_m), (None, None, d_m)):
                want = ext.eq_backward(qk, dist, m_, u_, p, None if a_ is None else ab, dm_,
                                       es, ns, gs)
                got = ext.fused_backward(q, k, a_, b_, m_, u_, p, dm_, es, ns, gs)
                for x, y in zip(got, want):
                    assert torch.equal(x, y)
                md, de, dn = ext.fused_backward(q, k, a_, b_, m_, u_, p, dm_, es, ns, gs,
                                                need_md=False)
                assert md is None and torch.equal(de, want[1]) and torch.equal(dn, want[2])


def test_fused_kernels_do_not_depend_on_the_threads(native_eq):
    """One thread against two and three: the tiles' results do not depend on the split."""
    g = torch.Generator().manual_seed(11)
    threads = torch.get_num_threads()
    for lk in (300, 17):
        q, a = torch.randn(6, 37, 24, generator=g), torch.randn(6, 37, 24, generator=g)
        k, b = torch.randn(6, lk, 24, generator=g), torch.randn(6, lk, 24, generator=g)
        mask, u = torch.rand(6, 37, lk, generator=g) > 0.2, torch.rand(6, 37, lk, generator=g)
        results = []
        try:
            for count in (1, 2, 3):
                torch.set_num_threads(count)
                results.append((*ext.fused_forward(q, k, mask, u, 0.3, 0.2, -0.2, 2.0),
                                *ext.fused_backward(q, k, a, b, mask, u, 0.3, None, 0.2, -0.2,
                                                    2.0)))
        finally:
            torch.set_num_threads(threads)
        for other in results[1:]:
            for x, y in zip(results[0], other):
                assert torch.equal(x, y)


#: (B, H, Lq, Lk, d): L=512 multi-head (several tiles), keys' tiles with tails, and the flat
#: tiles of short keys (Lk < 64) with every kind of segment
FUSED_SHAPES = [(1, 2, 512, 512, 64), (2, 3, 40, 70, 20), (3, 4, 7, 5, 32), (2, 3, 17, 17, 16),
                (2, 2, 9, 33, 8), (2, 2, 30, 63, 64)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=str)
def test_fused_coda_equals_the_separate_passes(native_eq, monkeypatch, shape, dropout, threads):
    """CoDA through the fused kernels (coda.FUSED_EQ) against the separate passes (q.k and D,
    then the C++ Eq. 1-6), the same dropout seed: M v, M and the gradients of q, k and v from
    both outputs equal bit for bit, with masked keys and fully masked query rows, with and
    without the weights output, at 1 and 2 threads."""
    b, h, lq, lk, d = shape
    g = torch.Generator().manual_seed(lq * lk + d)
    q = torch.randn(b, h, lq, d, generator=g, requires_grad=True)
    k, v = (torch.randn(b, h, lk, d, generator=g, requires_grad=True) for _ in range(2))
    key_mask = torch.ones(b, lk, dtype=torch.bool)
    key_mask[-1, lk // 2 + 1:] = False
    query_mask = torch.ones(b, lq, dtype=torch.bool)
    query_mask[0, lq // 2 + 1:] = False  # padded query rows: every key masked
    pair = query_mask[:, None, :, None] & key_mask[:, None, None, :]
    c_out = torch.randn(b, h, lq, d, generator=g)
    c_m = torch.randn(b, h, lq, lk, generator=g)

    def run(mask, need_weights):
        torch.manual_seed(3)  # the dropout seed
        out, _, m = impl._coda(q, k, v, mask, need_weights=need_weights, dropout=dropout,
                               gate="scaled")
        loss = (out * c_out).sum() + (0 if m is None else (m * c_m).sum())
        return (out, *([] if m is None else [m]), *torch.autograd.grad(loss, (q, k, v)))

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for mask in (None, key_mask[:, None, None, :], pair):
            for need_weights in (False, True):
                native_eq.update(forward=0, backward=0)
                monkeypatch.setattr(impl, "FUSED_EQ", True)
                calls = {"forward": 0, "backward": 0}
                fns = {name: getattr(ext, f"fused_{name}") for name in calls}

                def counted(name, calls=calls, fns=fns):
                    def run_fused(*args, **kwargs):
                        calls[name] += 1
                        return fns[name](*args, **kwargs)
                    return run_fused

                for name in calls:
                    monkeypatch.setattr(ext, f"fused_{name}", counted(name))
                fast = run(mask, need_weights)
                for name in calls:
                    monkeypatch.setattr(ext, f"fused_{name}", fns[name])
                assert calls["forward"] > 0 and calls["backward"] == calls["forward"]
                monkeypatch.setattr(impl, "FUSED_EQ", False)
                separate = run(mask, need_weights)
                # the separate passes ran too (native_eq counts both kinds)
                assert native_eq["forward"] == 2 * calls["forward"]
                for x, y in zip(fast, separate, strict=True):
                    assert torch.equal(x, y)
    finally:
        torch.set_num_threads(before)


def test_fused_coda_keeps_the_separate_path_where_it_does_not_apply(native_eq, monkeypatch):
    """float64, centring, the other functions and both directions' products stay on the
    separate passes (the fused kernels never called), and float64 passes gradcheck."""
    calls = {"forward": 0, "backward": 0}
    for name in ("forward", "backward"):
        fn = getattr(ext, f"fused_{name}")
        monkeypatch.setattr(ext, f"fused_{name}",
                            lambda *a, name=name, fn=fn, **kw: (calls.__setitem__(
                                name, calls[name] + 1), fn(*a, **kw))[1])
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(2, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    mask = torch.rand(2, 5, 5, generator=g) > 0.2
    assert torch.autograd.gradcheck(lambda q, k, v: coda_fn(q, k, v, mask, gate="scaled"),
                                    (q, k, v))
    f32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    for options in (dict(gate="centered"), dict(gate="scaled", center_e=True),
                    dict(gate="plain", e_fn="sigmoid", n_fn="arctan")):
        compare(*f32, mask, atol=2e-5, rtol=1e-4, **options)
    out_t = impl._coda(*f32, mask, v_t=f32[0], gate="scaled")[1]  # M^T v_t as well
    out_t.sum().backward()
    assert calls == {"forward": 1, "backward": 0}  # only the last forward (float32, uncentred)
    compare(*f32, mask, atol=2e-5, rtol=1e-4, gate="scaled")  # and fused here
    assert calls == {"forward": 2, "backward": 1}
