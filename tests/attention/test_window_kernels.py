"""The fused multi-head window (attention._window_kernels) against the plain autograd path
of attention.window (values and gradients of every input and parameter, float32 and float64,
padding, causality, segments, need_weights, several tiles), its compiled kernels against
their eager expressions, its C++ row kernels (attention/_window_rows.cpp) against both,
dropout, and the memory bound: what autograd keeps for the backward pass is O(L * d) per
head, not O(L^2)."""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys

import pytest
import torch

from attention.window import window
from tests.conftest import break_native_library

kernels = importlib.import_module("attention._window_kernels")
compiled = importlib.import_module("attention._compiled")
rows_ext = importlib.import_module("attention._window_rows_ext")

native_lib = importlib.import_module("attention._native")

B, H, D_MODEL = 3, 2, 8


@pytest.fixture
def eager(monkeypatch):
    """The kernels' expressions without compiling (compiled ones: test_compiled_*; C++ ones:
    the tests with ``native``)."""
    monkeypatch.setattr(compiled, "COMPILE", False)


def make(opts: dict, dropout: float = 0.0, d_model: int = D_MODEL, heads: int = H,
         dtype=torch.float64):
    torch.manual_seed(0)
    return window(**opts).multihead(d_model=d_model, n_heads=heads, dropout=dropout).to(dtype)


def inputs(lq: int, lk: int, dtype, d_model: int = D_MODEL, heads: int = H, b: int = B,
           seed: int = 1):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    x, y = randn(b, lq, d_model), randn(b, lk, d_model)
    q, k, v = (randn(b, heads, n, d_model // heads) for n in (lq, lk, lk))
    key_mask = torch.ones(b, lk, dtype=torch.bool)
    key_mask[-1, lk - 3:] = False  # the last sequence padded
    if b > 2:
        key_mask[1, 1:] = False  # one real key only
    return [q, k, v, x, y], key_mask


def run(core, tensors, key_mask, causal, need_weights, fused: bool):
    """(out, weights, gradients of the inputs and parameters) of one forward + backward."""
    core.fused = fused
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    core.zero_grad(set_to_none=True)
    q, k, v, x, y = leaves
    out, weights = core(q, k, v, key_mask=key_mask, causal=causal, need_weights=need_weights,
                        query_input=x, key_input=y)
    g = torch.Generator().manual_seed(5)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
    if need_weights:
        loss = loss + (weights * torch.randn(weights.shape, generator=g,
                                             dtype=out.dtype)).sum()
    loss.backward()
    grads = [t.grad for t in leaves] + [p.grad for p in core.parameters()]
    return out.detach(), None if weights is None else weights.detach(), grads


def assert_same(core, tensors, key_mask, causal, need_weights, **tol):
    out, weights, grads = run(core, tensors, key_mask, causal, need_weights, fused=True)
    ref_out, ref_weights, ref_grads = run(core, tensors, key_mask, causal, need_weights,
                                          fused=False)
    torch.testing.assert_close(out, ref_out, **tol)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights, **tol)
    names = ["q", "k", "v", "query_input", "key_input"] + [n for n, _ in core.named_parameters()]
    for name, got, expected in zip(names, grads, ref_grads, strict=True):
        if expected is None:  # the plain path does not use it: the fused one gives 0 or None
            assert got is None or (got == 0).all(), name
            continue
        torch.testing.assert_close(got, expected, **tol, msg=lambda m, n=name: f"{n}: {m}")


OPTIONS = [dict(variant=var, boundary=bd, segment_size=seg, boundary_scale=sc)
           for var, bd, seg, sc in itertools.product(("mw", "aw"), ("paper", "authors"),
                                                      (1, 2, 3), (1.0, "length"))]


def check_options(opts: dict) -> None:
    core = make(opts)
    shapes = [(7, 7, False), (4, 7, False)]  # self, cross (Lq != Lk)
    if opts.get("segment_size", 1) == 1:
        shapes += [(7, 7, True), (3, 7, True), (1, 7, True)]  # causal; cached decoding rows
    for lq, lk, causal in shapes:
        tensors, key_mask = inputs(lq, lk, torch.float64)
        assert_same(core, tensors, key_mask, causal, need_weights=lq == lk)
        if lq != lk or causal:
            assert_same(core, tensors, None, causal, need_weights=True)  # no padding


@pytest.mark.usefixtures("eager")
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_fused_equals_plain_float64(opts, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 8 * 7 * 3)  # tiles of 3 rows (7 keys)
    check_options(opts)


@pytest.mark.usefixtures("eager")
@pytest.mark.parametrize("tile_bytes", [2 << 20, 8 * 7 * 7 * 2], ids=["one", "matrices"])
@pytest.mark.parametrize("opts", [dict(), dict(variant="mw", boundary="authors",
                                               boundary_scale="length")],
                         ids=["default", "mw-authors-length"])
def test_fused_equals_plain_other_tiles(opts, tile_bytes, monkeypatch):
    """One tile for everything, tiles of two whole matrices."""
    monkeypatch.setattr(kernels, "BLOCK_BYTES", tile_bytes)
    check_options(opts)


@pytest.mark.usefixtures("eager")
@pytest.mark.usefixtures("eager")
@pytest.mark.parametrize("tile_bytes, grouped", [(8 * 7 * 7 * 6, True), (8 * 7 * 3, False),
                                                 (8 * 7 * 7 * 3, False)],
                         ids=["whole-heads", "row-blocks", "three-matrices"])
@pytest.mark.parametrize("variant", ["aw", "mw"])
def test_paper_boundaries_per_head_and_per_matrix(variant, tile_bytes, grouped, monkeypatch):
    """The ``paper`` boundary weights multiply a tile's rows once per head when the tile
    holds all heads of some batch entries (4 heads: tiles of 4 of 6 fitting matrices), else
    per matrix (blocks of rows of three matrices; tiles of three whole matrices): both give the
    plain path's values and gradients, dL/dW summed over the batch."""
    monkeypatch.setattr(kernels, "BLOCK_BYTES", tile_bytes)
    heads, b = 4, 3
    seen = []
    original = kernels.Rows._heads

    def spy(self, n):
        index = original(self, n)
        seen.append(index is None)
        return index

    monkeypatch.setattr(kernels.Rows, "_heads", spy)
    core = make(dict(variant=variant), d_model=16, heads=heads)
    tensors, key_mask = inputs(7, 7, torch.float64, d_model=16, heads=heads, b=b)
    assert_same(core, tensors, key_mask, False, need_weights=True)
    assert seen and all(seen) == grouped and any(seen) == grouped
    if grouped:
        tiles = kernels.tiles(b * heads, 7, 7, 8, heads)
        assert [t.n.stop - t.n.start for t in tiles] == [4, 4, 4]


@pytest.mark.parametrize("opts", [dict(), dict(variant="mw"),
                                  dict(boundary="authors", segment_size=2),
                                  dict(variant="mw", boundary_scale="length", segment_size=3)],
                         ids=lambda o: "-".join(map(str, o.values())) or "default")
def test_fused_equals_plain_float32(opts, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 4 * 13 * 5)  # tiles of 5 rows
    core = make(opts, d_model=16, heads=2, dtype=torch.float32)
    tensors, key_mask = inputs(13, 13, torch.float32, d_model=16)
    for need_weights in (False, True):
        assert_same(core, tensors, key_mask, False, need_weights, rtol=1e-3, atol=1e-4)
    if opts.get("segment_size", 1) == 1:
        assert_same(core, tensors, key_mask, True, True, rtol=1e-3, atol=1e-4)


@pytest.mark.usefixtures("eager")
def test_tiles_cover_every_entry_once():
    for n, lq, lk in [(6, 7, 7), (5, 1, 9), (64, 512, 512), (64, 1024, 1024), (3, 5000, 5000)]:
        cover = torch.zeros(n, lq, dtype=torch.int)
        for t in kernels.tiles(n, lq, lk, 4):
            cover[t.n, t.rows] += 1
            rows, mats = t.rows.stop - t.rows.start, t.n.stop - t.n.start
            assert rows * mats * lk * 4 <= max(kernels.BLOCK_BYTES, lk * 4)
        assert (cover == 1).all()


@pytest.mark.usefixtures("eager")
def test_fully_masked_rows_are_zero_with_zero_gradients():
    core = make(dict())
    tensors, key_mask = inputs(5, 5, torch.float64)
    key_mask[0] = False
    out, weights, grads = run(core, tensors, key_mask, False, True, fused=True)
    assert torch.isfinite(out).all() and (out[0] == 0).all() and (weights[0] == 0).all()
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
    assert (grads[0][0] == 0).all()  # q of the empty sequence


# -- dropout: regenerated per tile in the backward pass ----------------------------------------
@pytest.mark.usefixtures("eager")
@pytest.mark.parametrize("variant", ["mw", "aw"])
def test_dropout_gradients(variant, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 8 * 6 * 2)  # several tiles, a mask each
    core = make(dict(variant=variant), dropout=0.3, d_model=4).train()
    tensors, key_mask = inputs(3, 6, torch.float64, d_model=4, b=2)
    leaves = [t.requires_grad_() for t in tensors]

    def f(q, k, v, x, y):
        torch.manual_seed(7)  # the same dropout draw for every evaluation
        return core(q, k, v, key_mask=key_mask, query_input=x, key_input=y)[0]

    assert torch.autograd.gradcheck(f, leaves)
    torch.manual_seed(7)
    out, weights = core(*leaves[:3], key_mask=key_mask, need_weights=True,
                        query_input=leaves[3], key_input=leaves[4])
    core.eval()
    plain = core(*leaves[:3], key_mask=key_mask, need_weights=True, query_input=leaves[3],
                 key_input=leaves[4])
    torch.testing.assert_close(weights, plain[1])  # the weights are returned before dropout
    assert not torch.allclose(out, plain[0])


# -- the compiled kernels ----------------------------------------------------------------------
@pytest.mark.parametrize("opts,causal", [(dict(), False), (dict(variant="mw", segment_size=3),
                                                           False),
                                         (dict(boundary="authors", boundary_scale="length"),
                                          True)],
                         ids=["aw", "mw-segments", "aw-authors-causal"])
def test_compiled_kernels_equal_plain(opts, causal, monkeypatch):
    """With compiling on, the fused path (its kernels compiled) equals the plain path."""
    if not compiled.COMPILE:
        pytest.skip("ATTNREPRO_COMPILE=0")
    monkeypatch.setattr(rows_ext.LIBRARY, "enabled", False)  # the compiled kernels, not C++
    monkeypatch.setattr(kernels, "MIN_COMPILED", 1)
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 4 * 20 * 8)  # tiles of 8 rows, a last short one
    core = make(opts, d_model=16, heads=2, dtype=torch.float32)
    tensors, key_mask = inputs(20, 20, torch.float32, d_model=16)
    assert_same(core, tensors, key_mask, causal, True, rtol=1e-3, atol=1e-4)
    for kernel in kernels.KERNELS[core.variant]:
        assert not kernel.failed, "torch.compile failed: the test ran the eager expressions"


# -- the memory bound --------------------------------------------------------------------------
def saved_bytes(core, tensors, fused: bool) -> tuple[int, int]:
    """(total, largest) bytes of the tensors autograd saves for the backward pass during
    the forward (each storage counted once)."""
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    core.fused = fused
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = core(*leaves[:3], query_input=leaves[3], key_input=leaves[4])
    out.sum().backward()
    return sum(seen.values()), max(seen.values())


@pytest.mark.usefixtures("eager")
@pytest.mark.parametrize("opts", [dict(), dict(variant="mw"), dict(boundary="authors"),
                                  dict(segment_size=4, boundary_scale="length")],
                         ids=["aw", "mw", "authors", "segments"])
def test_saved_tensors_are_linear_in_length(opts):
    """What the fused path keeps for the backward pass grows with L (inputs and projections,
    O(L * d) per head), the plain path's with L^2 (its (B, H, L, L) matrices)."""
    core = make(opts, d_model=16, heads=2, dtype=torch.float32)
    totals = {}
    for length in (128, 256):
        tensors, _ = inputs(length, length, torch.float32, d_model=16, b=2)
        totals[length], largest = saved_bytes(core, tensors, fused=True)
        matrix = 2 * 2 * length * length * 4  # one (B, H, L, L) float32 matrix
        assert largest < matrix / 4
        plain_total, plain_largest = saved_bytes(core, tensors, fused=False)
        assert plain_largest >= matrix  # (the measure sees the plain path's matrices)
    assert totals[256] < matrix / 2  # everything kept: less than half an attention matrix
    assert totals[256] <= 2.2 * totals[128]  # linear in L, not quadratic


# -- the C++ row kernels (attention/_window_rows.cpp) ----------------------------------------
DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}


@pytest.fixture
def native(monkeypatch):
    """The C++ row kernels on (skipped without a C++ compiler); returns the number of calls
    of each (so that a test knows they ran)."""
    if native_lib.compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(compiled, "COMPILE", True)
    monkeypatch.setattr(rows_ext.LIBRARY, "enabled", True)
    assert rows_ext.LIBRARY.library() is not None, "the C++ row kernels failed to build"
    calls = {"forward": 0, "backward": 0}
    originals = {name: getattr(rows_ext, name) for name in calls}
    for name in calls:
        def counted(*args, _name=name, **kwargs):
            calls[_name] += 1
            return originals[_name](*args, **kwargs)

        monkeypatch.setattr(rows_ext, name, counted)
    return calls


def fused_run(core, tensors, key_mask, causal, need_weights, *, fallback: bool = False,
              seed: int = 7):
    """:func:`run` of the fused path (the same dropout draw for a seed): through the C++ row
    kernels, or (``fallback``) through the kernels' expressions, as with
    ``ATTNREPRO_WINDOW_CPP=0`` (run eagerly: no compile time)."""
    with pytest.MonkeyPatch.context() as m:
        if fallback:
            m.setattr(rows_ext.LIBRARY, "enabled", False)
            m.setattr(compiled, "COMPILE", False)
        torch.manual_seed(seed)
        return run(core, tensors, key_mask, causal, need_weights, fused=True)


def assert_native_equals_fallback(calls, core, tensors, key_mask, causal, need_weights):
    """The C++ path (it must run: forward and backward) against the expressions: output,
    weights and every gradient, to the dtype's rounding.  ``atol`` is relative to the tensor's
    largest entry, and for float32 gradients 5e-6 of it: they sum many products (the
    boundary weights' reach tens with ``boundary_scale="length"``, where the scaled boundary
    scores are sharp), and each path is that far from the float64 result (measured: at
    most 6e-6 of the largest entry for both, 1.5e-6 between them)."""
    before = dict(calls)
    out, weights, grads = fused_run(core, tensors, key_mask, causal, need_weights)
    assert calls["forward"] > before["forward"] and calls["backward"] > before["backward"]
    after = dict(calls)
    ref_out, ref_weights, ref_grads = fused_run(core, tensors, key_mask, causal, need_weights,
                                                fallback=True)
    assert calls == after  # (the fallback took no C++ kernel)
    def close(got, expected, name):
        tol = dict(TOL[got.dtype])
        if got.dtype == torch.float32 and name not in ("out", "weights"):
            tol["atol"] = 5e-6
        tol["atol"] *= max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
        torch.testing.assert_close(got, expected, **tol, msg=lambda m: f"{name}: {m}")

    close(out, ref_out, "out")
    if need_weights:
        close(weights, ref_weights, "weights")
    names = ["q", "k", "v", "query_input", "key_input"] + [n for n, _ in core.named_parameters()]
    for name, got, expected in zip(names, grads, ref_grads, strict=True):
        if expected is None:
            assert got is None, name
            continue
        close(got, expected, name)


NATIVE_OPTIONS = [dict(variant=var, boundary=bd, segment_size=seg, boundary_scale=sc)
                  for var, bd, seg, sc in itertools.product(("mw", "aw"), ("paper", "authors"),
                                                             (1, 2, 5), (1.0, "length"))]


@pytest.mark.parametrize("opts", NATIVE_OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_native_equals_fallback_float64(native, opts, monkeypatch):
    """Every option, with key padding (one sequence with one real key, one padded at the end:
    fully masked rows for Lk = 1), without, causal (tokens), cross attention and odd key
    counts (1, 3, 17: segments of 2 and 5 end short), tiles of a few rows (views of the
    stacked scores and of the returned weights) and of several whole matrices."""
    core = make(opts)
    shapes = [(7, 7, False), (4, 7, False), (3, 1, False), (2, 3, False), (5, 17, False)]
    if opts["segment_size"] == 1:
        shapes += [(7, 7, True), (3, 7, True)]
    for block_bytes in (8 * 17 * 3, 2 << 20):  # tiles of 3 rows; one tile
        monkeypatch.setattr(kernels, "BLOCK_BYTES", block_bytes)
        for lq, lk, causal in shapes:
            tensors, key_mask = inputs(lq, lk, torch.float64)
            assert_native_equals_fallback(native, core, tensors, key_mask, causal, lq == lk)
            assert_native_equals_fallback(native, core, tensors, None, causal, True)


@pytest.mark.parametrize("opts", [dict(), dict(variant="mw"),
                                  dict(boundary="authors", segment_size=5),
                                  dict(variant="mw", boundary_scale="length", segment_size=2),
                                  dict(boundary_scale="length", segment_size=2)],
                         ids=lambda o: "-".join(map(str, o.values())) or "default")
def test_native_equals_fallback_float32(native, opts, monkeypatch):
    """float32, with a long row (Lk = 513: a partial last vector, segments that end short)
    and tiles of several rows."""
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 4 * 513 * 6)  # tiles of 3 rows of 2 matrices
    core = make(opts, d_model=16, heads=2, dtype=torch.float32)
    for lq, lk in [(13, 13), (9, 513)]:
        tensors, key_mask = inputs(lq, lk, torch.float32, d_model=16)
        for need_weights in (False, True):
            assert_native_equals_fallback(native, core, tensors, key_mask, False, need_weights)
        if opts.get("segment_size", 1) == 1:
            assert_native_equals_fallback(native, core, tensors, key_mask, True, True)


@pytest.mark.parametrize("variant", ["mw", "aw"])
def test_native_fully_masked_rows_are_zero_with_zero_gradients(native, variant):
    core = make(dict(variant=variant))
    tensors, key_mask = inputs(5, 5, torch.float64)
    key_mask[0] = False
    out, weights, grads = fused_run(core, tensors, key_mask, False, True)
    assert native["forward"] and native["backward"]
    assert not any(torch.isnan(g).any() for g in grads if g is not None)
    assert (out[0] == 0).all() and (weights[0] == 0).all()
    assert (grads[0][0] == 0).all()  # q of the empty sequence
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads
                                             if g is not None)


@pytest.mark.parametrize("variant", ["mw", "aw"])
def test_native_dropout_equals_fallback(native, variant, monkeypatch):
    """The same seed draws the same dropout factors on both paths; with need_weights the
    loss also takes the returned weights (dL/dA = keep dL/d(A keep) + dL/d(weights): the
    factors are applied before the kernel instead of inside it)."""
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 8 * 6 * 4)  # several tiles, a draw each
    core = make(dict(variant=variant, segment_size=2), dropout=0.3).train()
    tensors, key_mask = inputs(6, 6, torch.float64)
    for need_weights in (False, True):
        assert_native_equals_fallback(native, core, tensors, key_mask, False, need_weights)
    dropped = fused_run(core, tensors, key_mask, False, False)[0]
    core.eval()
    assert not torch.allclose(dropped, fused_run(core, tensors, key_mask, False, False)[0])


@pytest.mark.parametrize("opts", [dict(), dict(variant="mw"),
                                  dict(boundary="authors", segment_size=2,
                                       boundary_scale="length"),
                                  dict(variant="mw", segment_size=3)],
                         ids=lambda o: "-".join(map(str, o.values())) or "default")
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_native_gradcheck(native, opts, dropout, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 8 * 6 * 2)  # several tiles
    core = make(opts, dropout=dropout, d_model=4).train()
    tensors, key_mask = inputs(3, 6, torch.float64, d_model=4, b=2)
    leaves = [t.requires_grad_() for t in tensors]

    def f(q, k, v, x, y):
        torch.manual_seed(7)  # the same dropout draw for every evaluation
        return core(q, k, v, key_mask=key_mask, need_weights=True, query_input=x,
                    key_input=y)

    assert torch.autograd.gradcheck(f, leaves)
    assert native["forward"] and native["backward"]


def test_native_threads_do_not_change_the_result(native):
    """1 and 2 threads: each row is computed alike whichever thread takes it, so the
    kernels' outputs are equal bit for bit; the model's (its products may sum in another
    order) to rounding."""
    g = torch.Generator().manual_seed(11)
    n, r, lk = 4, 64, 100  # enough work for two threads
    sg, sl, sr, sc, da = (torch.randn(n, r, lk, generator=g) for _ in range(5))
    mask = torch.rand(n, r, lk, generator=g) > 0.2
    j = torch.arange(lk)
    start = j - j % 3
    end = (start + 2).clamp(max=lk - 1)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for seg in (None, (start, end)):
                a = torch.empty_like(sg)
                rows_ext.forward(sg, sl, sr, sc, mask, *(seg or (None, None)), a=a)
                grads = [torch.empty_like(sg) for _ in range(5)]
                rows_ext.backward(sg, sl, sr, sc, mask, *(seg or (None, None)), da, a=grads[0],
                                  dsg=grads[1], dsl=grads[2], dsr=grads[3], dsc=grads[4])
                results.append([a, *grads])
            core = make(dict(), d_model=16, heads=2, dtype=torch.float32)
            tensors, key_mask = inputs(40, 40, torch.float32, d_model=16)
            results.append(fused_run(core, tensors, key_mask, False, True)[2])
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(results[:2], results[3:5]):
        assert all(torch.equal(a, b) for a, b in zip(one, two))
    for a, b in zip(results[2], results[5]):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lk", [1, 3, 17, 513])
@pytest.mark.parametrize("segment_size", [1, 2, 5])
@pytest.mark.parametrize("variant", ["mw", "aw"])
def test_row_kernels_equal_the_expressions(native, variant, segment_size, lk, dtype):
    """The kernels alone against aw_forward / aw_backward (mw_*) run eagerly: on views (the
    three blocks of a stacked product, a tile of a larger weights tensor), with outputs
    written over their inputs (as Rows does), a random mask with fully masked rows, none, and
    dropout factors (applied to dL/dA inside the kernel, and to A)."""
    g = torch.Generator().manual_seed(lk + segment_size)
    n, r = 3, 5
    stacked = torch.randn(n, 3 * r, lk, generator=g, dtype=dtype) * 3
    sc = torch.randn(n, r, lk, generator=g, dtype=dtype) * 3 if variant == "aw" else None
    da = torch.randn(n, r, lk, generator=g, dtype=dtype)
    keep = (torch.rand(n, r, lk, generator=g) > 0.25).to(dtype) / 0.75
    start = end = None
    if segment_size > 1:
        j = torch.arange(lk)
        start = j - j % segment_size
        end = (start + segment_size - 1).clamp(max=lk - 1)
    mask = torch.rand(n, r, lk, generator=g) > 0.3
    mask[0, 1] = False  # a fully masked row
    aw = variant == "aw"
    fwd, bwd = (kernels.aw_forward, kernels.aw_backward) if aw else (kernels.mw_forward,
                                                                     kernels.mw_backward)
    for m in (mask, None):
        blocks = (stacked[:, :r], stacked[:, r:2 * r], stacked[:, 2 * r:])
        args = (*blocks, *((sc,) if aw else ()), m, start, end)
        want_a = fwd(*args)
        want = bwd(*args, da * keep)
        # forward: A into rows 1..r of a larger tensor, A keep over the global scores
        weights = torch.full((n, r + 2, lk), float("nan"), dtype=dtype)
        scores = stacked.clone()
        s_blocks = (scores[:, :r], scores[:, r:2 * r], scores[:, 2 * r:])
        rows_ext.forward(*s_blocks, sc, m, start, end, a=weights[:, 1:r + 1], ad=s_blocks[0],
                         keep=keep)
        tol = TOL[dtype]
        torch.testing.assert_close(weights[:, 1:r + 1], want_a, **tol)
        assert weights[:, 0].isnan().all() and weights[:, -1].isnan().all()
        torch.testing.assert_close(s_blocks[0], want_a * keep, **tol)
        # backward: the gradients over the scores, A keep over dL/dA
        scores = stacked.clone()
        s_blocks = (scores[:, :r], scores[:, r:2 * r], scores[:, 2 * r:])
        c = None if sc is None else sc.clone()
        d = da.clone()
        rows_ext.backward(*s_blocks, c, m, start, end, d, a=d, dsg=s_blocks[0], dsl=s_blocks[1],
                          dsr=s_blocks[2], dsc=c, keep=keep, dkeep=keep)
        got = (d, *s_blocks, *((c,) if aw else ()))
        names = ["A", "dsg", "dsl", "dsr", "dsc"]
        for name, x, y in zip(names[:len(got)], got, (want[0] * keep, *want[1:]), strict=True):
            torch.testing.assert_close(x, y, **tol, msg=lambda s, n=name: f"{n}: {s}")
        if m is not None:  # masked entries and fully masked rows: exact zeros
            for x in got:
                assert (x[~m] == 0).all() and (x[0, 1] == 0).all()


def test_row_kernels_reject_what_they_cannot_take(native):
    sg = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="contiguous keys"):
        rows_ext.forward(sg, sg, sg.transpose(1, 2).contiguous().transpose(1, 2), None, None,
                         None, None, a=torch.empty_like(sg))
    with pytest.raises(ValueError, match="bool"):
        rows_ext.forward(sg, sg, sg, None, torch.ones(2, 3, 4), None, None,
                         a=torch.empty_like(sg))
    assert not rows_ext.supports(sg.half()) and not rows_ext.supports(sg.to(torch.int32))


def test_switched_off_by_the_environment():
    """ATTNREPRO_WINDOW_CPP=0 turns the window's C++ kernels off (CoDA's stay on), the fused
    path then takes the expressions; ATTNREPRO_COMPILE=0 turns both off."""
    code = ("import torch; from attention import _coda_l1_ext as c, _window_rows_ext as w\n"
            "from attention import _window_kernels as k, window\n"
            "x = k.Inputs(*(torch.zeros(2, 3, 4),) * 3, *(None,) * 7)\n"
            "opt = k.Options(window.window('mw'), 0.0, False, (2, 1))\n"
            "print(w.LIBRARY.enabled, c.LIBRARY.enabled, k.Rows(x, None, opt).native)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {key: value for key, value in os.environ.items()
           if key not in ("ATTNREPRO_WINDOW_CPP", "ATTNREPRO_CODA_CPP", "ATTNREPRO_COMPILE")}
    for extra, want in [({"ATTNREPRO_WINDOW_CPP": "0"}, "False True False"),
                        ({"ATTNREPRO_COMPILE": "0"}, "True True False")]:
        proc = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, cwd=root,
                              capture_output=True, text=True, check=True)
        assert proc.stdout.split() == want.split(), proc.stderr


def test_the_window_library_is_built_and_cached_apart(native, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    path = rows_ext.LIBRARY.build()
    assert path.parent == tmp_path / "attnrepro_window_rows" and path.exists()
    assert path.name.startswith("window_rows_")
    assert rows_ext.LIBRARY.build() == path  # cached
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_failing_window_build_falls_back_with_one_warning(monkeypatch, tmp_path):
    """A source that does not compile: one warning, then the expressions (still equal to the
    plain path), and CoDA's library is not affected."""
    break_native_library(monkeypatch, tmp_path, rows_ext.LIBRARY)  # small tiles run eagerly
    core = make(dict(segment_size=2))
    tensors, key_mask = inputs(7, 7, torch.float64)
    with pytest.warns(UserWarning, match="building the window's C\\+\\+ row kernels failed") as rec:
        assert_same(core, tensors, key_mask, False, need_weights=True)
    assert len([w for w in rec if "row kernels" in str(w.message)]) == 1
    assert rows_ext.LIBRARY.library() is None and not rows_ext.supports(tensors[0])
    assert not os.listdir(tmp_path / "cache" / "attnrepro_window_rows")  # no partial library
    assert importlib.import_module("attention._coda_l1_ext").LIBRARY.source.name == "_coda_l1.cpp"
