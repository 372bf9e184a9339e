"""The fused multi-head window (attention._window_kernels) against the plain autograd path
of attention.window (values and gradients of every input and parameter, float32 and float64,
padding, causality, segments, need_weights, several tiles), its compiled kernels against
their eager expressions, dropout, and the memory bound: what autograd keeps for the backward
pass is O(L * d) per head, not O(L^2)."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch

from attention.window import window

kernels = importlib.import_module("attention._window_kernels")
compiled = importlib.import_module("attention._compiled")

B, H, D_MODEL = 3, 2, 8


@pytest.fixture
def eager(monkeypatch):
    """The kernels' expressions without compiling (compiled ones: test_compiled_*)."""
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
