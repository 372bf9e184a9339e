"""The machinery behind the multi-head fast path of :mod:`attention.window`: the soft window
(Eq. 7-11) and the MW / AW weights (Eq. 12-17) fused block by block of query rows, in a
custom autograd function that keeps only the O(L * d) inputs for the backward pass and
recomputes each block there (as flash attention does).

Per block of r query rows (all B * H heads at once) the forward pass forms the global,
left, right (and for AW local) scores (N, r, Lk) with one batched matmul each, turns them
into the weights with one fused kernel (the two boundary softmaxes, their cumulative sums,
Eq. 9-11 and the final softmax or product) and multiplies the weights with the values; no
(L x L) matrix of any head outlives its block.  The backward pass recomputes the block's
scores, runs one fused kernel for the chain rule back to the four score blocks, and
accumulates the matmul gradients of q, k, v, the boundary and local projections.

The derivative through the window (m = L_b R_a + R_b L_a, L_b the cumulative sum of phi_l,
L_a = sum_j phi_l - L_b + phi_l its reverse; segments pick L_b at the end and L_a at the
start of each token's segment) is

    dphi_l[i] = sum_{j >= start(i)} dL_b'[j]  +  sum_{j <= end(i)} dL_a'[j]

(dL_b' = dm * R_a etc., per token after the segment gather), one cumulative sum for tokens
(dphi = sum(dL_b) + dL_b + cumsum(dL_a - dL_b)) and two for segments.

On CPU (float32, float64) the kernels are C++ (:mod:`attention._window_rows_ext`,
attention/_window_rows.cpp, built once per machine): each score row (Lk keys, in L1 cache)
goes through the softmaxes, the cumulative sums, Eq. 9-11 and the final softmax or product
in a few passes, where the compiled expressions stream every (n, r, Lk) block through memory
once per operation (inductor does not fuse a cumulative sum with anything); and the backward
kernel writes the score gradients over the score blocks and A over dL/dA, so a backward tile
needs no memory beyond its scores.  Elsewhere (another device, ``ATTNREPRO_WINDOW_CPP=0``, a
failed build) the kernels are the expressions below.  Both are tested against each other and
against the plain autograd path.

With ``paper`` boundaries the three score blocks come from one product, [q; q W_l s; q W_r s]
k^T (n, 3r, Lk), and so do their gradients: [dsg; dsl; dsr] k gives dL/d(q), dL/d(q W_l s),
dL/d(q W_r s) in one product, and [dsg; dsl; dsr]^T [q; q W_l s; q W_r s] dL/dk in another.

The score scales are folded into the query rows before the matmuls ((s q) k^T), so the
kernels take no float options: one compiled graph per dtype and structure (mask or none,
segments or tokens, AW or MW).  The expressions are compiled through
:class:`attention._compiled.Compiled` (eager without a compiler or with
``ATTNREPRO_COMPILE=0``, which also turns the C++ kernels off; blocks with a size below 2
always run eagerly, so that dynamo never specialises on size 1).  The backward is not
differentiable again (no double backward).
bfloat16 and float16 inputs (autocast, or a model cast to them) are computed in float32
(:func:`attention._tiling.apply_float32`): the cumulative sums over the keys need it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attention import _window_rows_ext as rows_ext
from attention._compiled import Compiled
from attention._tiling import MaskTiles, apply_float32, dropout_keep, without_autocast

if TYPE_CHECKING:  # (attention.window imports this module)
    from attention.window import window

#: bytes of one (N, rows, Lk) block of scores; a block step holds about a dozen of them
BLOCK_BYTES = 2 << 20


# -- the block kernels (written as plain expressions; compiled through Compiled) -----------
def _softmax(s: Tensor, mask: Tensor | None) -> Tensor:
    """attention.masking.masked_softmax over the last dim (masked entries and fully masked
    rows exactly 0)."""
    if mask is None:
        return torch.softmax(s, -1)
    s = s.masked_fill(~mask, float("-inf"))
    top = s.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(s - top)
    return e / e.sum(-1, keepdim=True).clamp(min=torch.finfo(e.dtype).tiny)


def _softmax_grad(p: Tensor, dp: Tensor) -> Tensor:
    return p * (dp - (dp * p).sum(-1, keepdim=True))


def _window(phi_l: Tensor, phi_r: Tensor, start: Tensor | None, end: Tensor | None):
    """(L_b, L_a, R_b, R_a, m): the four factors of Eq. 9 (per token or segment, Eq. 10-11)
    and the window, as :func:`attention.window.window_mask` computes them."""
    l_before, r_before = phi_l.cumsum(-1), phi_r.cumsum(-1)
    l_after = l_before[..., -1:] - l_before + phi_l
    r_after = r_before[..., -1:] - r_before + phi_r
    if start is not None:
        l_before, r_before = l_before.index_select(-1, end), r_before.index_select(-1, end)
        l_after, r_after = l_after.index_select(-1, start), r_after.index_select(-1, start)
    return l_before, l_after, r_before, r_after, l_before * r_after + r_before * l_after


def _boundary_grad(d_before: Tensor, d_after: Tensor, start: Tensor | None,
                   end: Tensor | None) -> Tensor:
    """dL/dphi from the gradients of its cumulative sum (``d_before``) and reverse cumulative
    sum (``d_after``), both per token after the segment gather."""
    if start is None:
        return (d_before.sum(-1, keepdim=True) + d_before
                + (d_after - d_before).cumsum(-1))
    c_before = d_before.cumsum(-1)
    reverse = c_before[..., -1:] - c_before + d_before  # sum_{j >= i}
    return reverse.index_select(-1, start) + d_after.cumsum(-1).index_select(-1, end)


def _window_grad(dm: Tensor, phi_l: Tensor, phi_r: Tensor, factors, start, end):
    """(dL/d left scores, dL/d right scores) from dL/dm (the boundary softmaxes' backward)."""
    l_before, l_after, r_before, r_after = factors
    d_phi_l = _boundary_grad(dm * r_after, dm * r_before, start, end)
    d_phi_r = _boundary_grad(dm * l_after, dm * l_before, start, end)
    return _softmax_grad(phi_l, d_phi_l), _softmax_grad(phi_r, d_phi_r)


def aw_forward(sg: Tensor, sl: Tensor, sr: Tensor, sc: Tensor, mask: Tensor | None,
               start: Tensor | None, end: Tensor | None) -> Tensor:
    """AW weights softmax(global + m_hat * local) (Eq. 14-17) from the (already scaled)
    global, left, right and local scores of a block."""
    m = _window(_softmax(sl, mask), _softmax(sr, mask), start, end)[-1]
    return _softmax(sg + m * sc, mask)


def aw_backward(sg, sl, sr, sc, mask, start, end, da):
    """(A, dL/d global, left, right, local scores) from dL/dA of a block."""
    phi_l, phi_r = _softmax(sl, mask), _softmax(sr, mask)
    *factors, m = _window(phi_l, phi_r, start, end)
    a = _softmax(sg + m * sc, mask)
    dz = _softmax_grad(a, da)
    dsl, dsr = _window_grad(dz * sc, phi_l, phi_r, factors, start, end)
    return a, dz, dsl, dsr, dz * m


def mw_forward(sg: Tensor, sl: Tensor, sr: Tensor, mask: Tensor | None,
               start: Tensor | None, end: Tensor | None) -> Tensor:
    """MW weights softmax(global) * m_hat (Eq. 12) of a block."""
    m = _window(_softmax(sl, mask), _softmax(sr, mask), start, end)[-1]
    return _softmax(sg, mask) * m


def mw_backward(sg, sl, sr, mask, start, end, da):
    """(A, dL/d global, left, right scores) from dL/dA of a block."""
    phi_l, phi_r = _softmax(sl, mask), _softmax(sr, mask)
    *factors, m = _window(phi_l, phi_r, start, end)
    p = _softmax(sg, mask)
    dsl, dsr = _window_grad(da * p, phi_l, phi_r, factors, start, end)
    return p * m, _softmax_grad(p, da * m), dsl, dsr


KERNELS = {"aw": (Compiled(aw_forward), Compiled(aw_backward)),
           "mw": (Compiled(mw_forward), Compiled(mw_backward))}


#: tiles of fewer score entries run their kernels eagerly (compiling would not pay)
MIN_COMPILED = 1 << 14


def _run(kernel: Compiled, *args):
    """The compiled kernel, or its expression eagerly for small tiles and tiles with a
    size below 2 (so that dynamo never specialises a graph on size 1)."""
    first = args[0]
    if min(first.shape) < 2 or first.numel() < MIN_COMPILED:
        return kernel.fn(*args)
    return kernel(*args)


# -- one call, tile by tile ---------------------------------------------------------------
def _t(x: Tensor) -> Tensor:
    return x.transpose(1, 2).contiguous()


def _scaled(x: Tensor, s: Tensor | float) -> Tensor:
    """x * s, or x itself for s = 1.0 (the default boundary scale)."""
    return x if isinstance(s, float) and s == 1.0 else x * s


class Tile(NamedTuple):
    """Matrices n0:n1 of the N = B * H flattened ones, query rows i0:i1."""

    index: int
    n: slice
    rows: slice


def tiles(n: int, lq: int, lk: int, element_size: int, heads: int = 1) -> list[Tile]:
    """Tiles of about BLOCK_BYTES: whole rows of as many matrices as fit (larger matmuls
    than a few rows of every matrix), else blocks of rows of two matrices (a compiled kernel
    never sees a tile of one matrix, a size 1).  A tile of whole matrices holds a multiple
    of ``heads`` of them where at least that many fit, starting at a multiple: all heads of
    some batch entries (:meth:`Rows.boundary_rows` then multiplies by the per-head boundary
    weights in one product per head)."""
    per_tile = max(1, BLOCK_BYTES // (element_size * max(1, lk)))  # rows of scores
    rows = min(max(1, lq), max(1, per_tile // min(n, 2)))
    matrices = min(max(1, n), max(1, per_tile // rows))
    if rows == lq and heads > 1 and matrices >= heads and n % heads == 0:
        matrices -= matrices % heads
    out: list[Tile] = []
    for n0 in range(0, n, matrices):
        for i0 in range(0, lq, rows):
            out.append(Tile(len(out), slice(n0, min(n0 + matrices, n)),
                            slice(i0, min(i0 + rows, lq))))
    return out


class Options(NamedTuple):
    """One call's options: the window's settings (variant, segment_size, boundary_scale)
    read from the :class:`attention.window.window` flag the core holds, where they are held
    once, beside what belongs to the call.  The scores' scale 1/sqrt(d) follows from q."""

    settings: window
    dropout: float
    need_weights: bool
    batch: tuple[int, ...]  # (B, H): the mask broadcasts to (B, H, Lq, Lk)


class Inputs(NamedTuple):
    """Flattened (N = B * H) tensors of one call.  ``paper``: boundary weights w (2, H, d, e),
    the boundary query rows q W and keys k; else (``authors``) projections lq, rq (N, Lq, e),
    lk, rk (N, Lk, e).  ``cq``, ``ck``: AW local projections (N, L, e) or None (MW)."""

    q: Tensor
    k: Tensor
    v: Tensor
    w: Tensor | None
    lq: Tensor | None
    lk: Tensor | None
    rq: Tensor | None
    rk: Tensor | None
    cq: Tensor | None
    ck: Tensor | None


class Scores(NamedTuple):
    """A tile's scaled query rows (qs, ls, rs, cs) and score blocks (sg, sl, sr, sc); with
    ``paper`` boundaries also ``rows`` = [qs; ls; rs] (n, 3r, d) and ``stacked`` = [sg; sl; sr]
    (n, 3r, Lk), the product of rows and k^T, of which sg, sl, sr are views."""

    qs: Tensor
    ls: Tensor
    rs: Tensor
    cs: Tensor | None
    sg: Tensor
    sl: Tensor
    sr: Tensor
    sc: Tensor | None
    scale: Tensor | float  # the boundary scores' multiplier
    rows: Tensor | None
    stacked: Tensor | None


class Rows:
    """The score tiles of one call; each method's temporaries die with it."""

    def __init__(self, x: Inputs, mask: Tensor | None, opt: Options):
        self.x, self.opt, self.settings = x, opt, opt.settings
        #: of the global (and AW local) scores
        self.scale = 1.0 / math.sqrt(x.q.shape[-1])
        n, lq, lk = x.q.shape[0], x.q.shape[1], x.k.shape[1]
        self.masks = MaskTiles(mask, opt.batch, n, lq, lk)
        heads = 1 if x.w is None else x.w.shape[1]
        self.tiles = tiles(n, lq, lk, x.q.element_size(), heads)
        self.start = self.end = None
        segment = self.settings.segment_size
        if segment > 1:
            j = torch.arange(lk, device=x.q.device)
            self.start = j - j % segment
            self.end = (self.start + segment - 1).clamp(max=lk - 1)
        #: the C++ row kernels take the tiles (else the compiled expressions)
        self.native = rows_ext.supports(x.q)
        self.w = None
        if x.w is not None:  # (2, H, d, e) -> (H, d, 2e): [W_l | W_r] of each head
            d, e = x.w.shape[2:]
            self.w = x.w.permute(1, 2, 0, 3).reshape(heads, d, 2 * e)
        self._cached: tuple[tuple[int, int], dict[str, Tensor | None]] = ((-1, -1), {})

    def _per_matrices(self, n: slice, name: str, make: Callable[[], Tensor | None]):
        """``make()`` for the matrices ``n``, kept while the tiles stay on them (they come
        matrices first: the row tiles of the same matrices one after the other), so that
        k^T, v^T and the heads' boundary weights are made once per group of matrices, not
        once per row tile (4 times at L=1024)."""
        key, cache = self._cached
        if key != (n.start, n.stop):
            cache = {}
            self._cached = ((n.start, n.stop), cache)
        if name not in cache:
            cache[name] = make()
        return cache[name]

    def _t(self, n: slice, name: str, x: Tensor) -> Tensor:
        """x[n] transposed, contiguous (a transposed view makes the batched matmul about 2x
        slower), once per group of matrices."""
        return self._per_matrices(n, name, lambda: _t(x[n]))

    def _heads(self, n: slice) -> Tensor | None:
        """The head of each flattened matrix of ``n`` (N = B * H, head-minor), or None when
        the slice holds whole groups of H (then viewed as (b, H, ...))."""
        heads = self.w.shape[0]
        if (n.stop - n.start) % heads == 0 and n.start % heads == 0:
            return None
        return self._per_matrices(
            n, "heads", lambda: torch.arange(n.start, n.stop, device=self.w.device) % heads)

    def _head_weights(self, n: slice) -> Tensor:
        """The boundary weights (n, d, 2e) of each matrix of ``n`` (per matrix tiles)."""
        return self._per_matrices(n, "w", lambda: self.w[self._heads(n)])

    def boundary_rows(self, t: Tile) -> Tensor:
        """q W = [q W_l | q W_r] (n, r, 2e) of a tile's query rows (``paper`` boundaries):
        one product per head over all the tile's rows of that head, or per matrix."""
        q, heads = self.x.q[t.n, t.rows], self.w.shape[0]
        index = self._heads(t.n)
        if index is None:
            b, r, d = q.shape[0] // heads, q.shape[1], q.shape[2]
            return torch.einsum("bhrd,hde->bhre", q.view(b, heads, r, d),
                                self.w).reshape(q.shape[0], r, -1)
        return q @ self._head_weights(t.n)

    def boundary_grads(self, t: Tile, d_lr: Tensor, g: Grads) -> Tensor | None:
        """From dL/d(q W) (n, r, 2e) of a tile: add dL/dW to ``g.w`` (H, d, 2e) and return
        dL/dq's share (n, r, d), or None if q needs none."""
        q, heads = self.x.q[t.n, t.rows], self.w.shape[0]
        index = self._heads(t.n)
        gq = None
        if index is None:
            b, r, d = q.shape[0] // heads, q.shape[1], q.shape[2]
            d4 = d_lr.view(b, heads, r, -1)
            if g.w is not None:
                g.w.add_(torch.einsum("bhrd,bhre->hde", q.view(b, heads, r, d), d4))
            if g.q is not None:
                gq = torch.einsum("bhre,hde->bhrd", d4, self.w).reshape(q.shape)
            return gq
        if g.w is not None:
            g.w.index_add_(0, index, q.transpose(1, 2) @ d_lr)
        if g.q is not None:
            gq = d_lr @ self._head_weights(t.n).transpose(1, 2)
        return gq

    def boundary_scale(self, mb: Tensor | None) -> Tensor | float:
        """The boundary scores' multiplier for the tile's rows: a float or (n, r, 1)."""
        if self.settings.boundary_scale != "length":
            return float(self.settings.boundary_scale)
        if mb is None:
            return float(self.x.k.shape[1])
        return mb.sum(-1, keepdim=True).to(self.x.q.dtype)

    def scores(self, t: Tile, mb: Tensor | None) -> Scores:
        x, n, rows, r = self.x, t.n, t.rows, t.rows.stop - t.rows.start
        s = self.boundary_scale(mb)
        qs = x.q[n, rows] * self.scale
        kt = self._t(n, "k", x.k)
        stacked_rows = stacked = None
        if self.w is not None:  # paper: [q; q W_l s; q W_r s] k^T in one matmul
            lr = _scaled(self.boundary_rows(t), s)  # (n, r, 2e)
            e = lr.shape[-1] // 2
            ls, rs = lr[..., :e], lr[..., e:]
            stacked_rows = torch.cat([qs, ls, rs], 1)
            stacked = stacked_rows @ kt  # (n, 3r, Lk)
            sg, sl, sr = stacked[:, :r], stacked[:, r:2 * r], stacked[:, 2 * r:]
        else:
            ls, rs = _scaled(x.lq[n, rows], s), _scaled(x.rq[n, rows], s)
            sg = qs @ kt
            sl, sr = ls @ self._t(n, "lk", x.lk), rs @ self._t(n, "rk", x.rk)
        cs = sc = None
        if x.cq is not None:
            cs = x.cq[n, rows] * self.scale
            sc = cs @ self._t(n, "ck", x.ck)
        return Scores(qs, ls, rs, cs, sg, sl, sr, sc, s, stacked_rows, stacked)

    def keep(self, t: Tile, seed: int) -> Tensor | None:
        shape = (t.n.stop - t.n.start, t.rows.stop - t.rows.start, self.x.k.shape[1])
        return dropout_keep(self.x.q, shape, self.opt.dropout, seed, t.index)

    def weights(self, t: Tile, seed: int, a_out: Tensor | None) -> Tensor:
        """A tile's weights with dropout (what multiplies v); A itself is written into
        ``a_out`` (the tile's rows of the returned weights) unless None.  The C++ kernel
        writes straight into ``a_out`` and into the global scores' block (each row of
        scores is read before its weights are written)."""
        mb = self.masks(t.n, t.rows)
        c = self.scores(t, mb)
        keep = self.keep(t, seed)
        if self.native:
            if keep is None:
                a = c.sg if a_out is None else a_out
                rows_ext.forward(c.sg, c.sl, c.sr, c.sc, mb, self.start, self.end, a=a)
                return a
            rows_ext.forward(c.sg, c.sl, c.sr, c.sc, mb, self.start, self.end, a=a_out,
                             ad=c.sg, keep=keep)
            return c.sg
        if self.settings.variant == "aw":
            a = _run(KERNELS["aw"][0], c.sg, c.sl, c.sr, c.sc, mb, self.start, self.end)
        else:
            a = _run(KERNELS["mw"][0], c.sg, c.sl, c.sr, mb, self.start, self.end)
        if a_out is not None:
            a_out.copy_(a)
        return a if keep is None else a * keep

    def _block_grads(self, c: Scores, mb: Tensor | None, da: Tensor, keep: Tensor | None,
                     dkeep: Tensor | None, need_a: bool) -> tuple[Tensor | None, ...]:
        """(A with dropout (None unless ``need_a``), dL/d sg, sl, sr, sc (None for MW)) of a
        tile from dL/dA (``da``, times ``dkeep`` unless None).  With ``paper`` boundaries the
        first three gradients are always in ``c.stacked``.  The C++ kernel writes them over
        the score blocks and A over ``da`` (each row read before it is written)."""
        if self.native:
            if da.shape[-1] > 1 and da.stride(-1) != 1:  # (an expanded dL/d(returned weights))
                da = da.contiguous()
            a = da if need_a else None
            rows_ext.backward(c.sg, c.sl, c.sr, c.sc, mb, self.start, self.end, da, a=a,
                              dsg=c.sg, dsl=c.sl, dsr=c.sr, dsc=c.sc,
                              keep=keep if need_a else None, dkeep=dkeep)
            return a, c.sg, c.sl, c.sr, c.sc
        if dkeep is not None:
            da = da * dkeep
        if self.settings.variant == "aw":
            a, dsg, dsl, dsr, dsc = _run(KERNELS["aw"][1], c.sg, c.sl, c.sr, c.sc, mb,
                                         self.start, self.end, da)
        else:
            a, dsg, dsl, dsr = _run(KERNELS["mw"][1], c.sg, c.sl, c.sr, mb, self.start,
                                    self.end, da)
            dsc = None
        if c.stacked is not None:  # the products of Rows.backward take them stacked
            for block, grad in ((c.sg, dsg), (c.sl, dsl), (c.sr, dsr)):
                block.copy_(grad)
            dsg, dsl, dsr = c.sg, c.sl, c.sr
        a = None if not need_a else (a if keep is None else a * keep)
        return a, dsg, dsl, dsr, dsc

    def backward(self, t: Tile, g: Grads, seed: int, g_out: Tensor | None,
                 g_weights: Tensor | None) -> None:
        """Add a tile's share to the input gradients ``g``."""
        x, n, rows = self.x, t.n, t.rows
        mb = self.masks(t.n, t.rows)
        c = self.scores(t, mb)
        keep = self.keep(t, seed)
        # dL/dA = dL/d(A with dropout) * keep (+ dL/d(returned weights)); the C++ kernel
        # multiplies by keep itself when nothing is added
        da = dkeep = None
        if g_out is not None:
            go = g_out[n, rows]
            da = go @ self._t(n, "v", x.v)  # dL/d(A with dropout)
            if keep is not None:
                if g_weights is None:
                    dkeep = keep
                else:
                    da.mul_(keep)
        if g_weights is not None:
            da = g_weights[n, rows] if da is None else da.add_(g_weights[n, rows])
        need_a = g.v is not None and g_out is not None
        ad, dsg, dsl, dsr, dsc = self._block_grads(c, mb, da, keep, dkeep, need_a)
        del da
        first = rows.start == 0  # (the first row tile of these matrices: _acc)
        if need_a:
            _acc(g.v[n], ad.transpose(1, 2), go, first)
        del ad
        k = x.k[n]
        if c.stacked is not None:  # paper: ls = q W_l s, scores ls k^T; [dsg; dsl; dsr] stacked
            r = rows.stop - rows.start
            if g.k is not None:  # dsg^T qs + dsl^T ls + dsr^T rs
                _acc(g.k[n], c.stacked.transpose(1, 2), c.rows, first)
            gq = None
            if g.q is not None or g.w is not None:
                d_rows = c.stacked @ k  # dL/d(qs, ls, rs) (n, 3r, d)
                if g.q is not None:
                    gq = d_rows[:, :r] * self.scale
                d_lr = _scaled(torch.cat([d_rows[:, r:2 * r], d_rows[:, 2 * r:]], -1), c.scale)
                share = self.boundary_grads(t, d_lr, g)  # dL/d(q W) (n, r, 2e)
                if share is not None:
                    gq += share
        else:
            gq = (dsg @ k) * self.scale if g.q is not None else None
            if g.k is not None:
                _acc(g.k[n], dsg.transpose(1, 2), c.qs, first)
            for dsb, side_k, grad_q, grad_k, scaled in (
                    (dsl, x.lk, g.lq, g.lk, c.ls), (dsr, x.rk, g.rq, g.rk, c.rs)):
                if grad_q is not None:
                    grad_q[n, rows] = _scaled(dsb @ side_k[n], c.scale)
                if grad_k is not None:
                    _acc(grad_k[n], dsb.transpose(1, 2), scaled, first)
        if dsc is not None:
            if g.cq is not None:
                g.cq[n, rows] = (dsc @ x.ck[n]) * self.scale
            if g.ck is not None:
                _acc(g.ck[n], dsc.transpose(1, 2), c.cs, first)
        if gq is not None:
            g.q[n, rows] = gq


class Grads:
    """The input gradients asked for, written tile by tile: those of the query rows (q, lq,
    rq, cq) assigned, those of the keys and values (k, v, lk, rk, ck) accumulated over the
    row tiles of their matrices, where the first (rows from 0) overwrites (:func:`_acc`), so
    that none of them is zeroed first (8 MiB each at B H = 64, L = 512, d = 64); the boundary
    weights' (H, d, 2e) accumulated from zeros.  ``written``: which of them every tile's
    backward writes (else zeros: no tiles, or v without dL/d out)."""

    def __init__(self, x: Inputs, needs: tuple[bool, ...], written: tuple[bool, ...]):
        self.q, self.k, self.v, self.w, self.lq, self.lk, self.rq, self.rk, self.cq, \
            self.ck = (None if t is None or not need
                       else torch.empty_like(t) if write else torch.zeros_like(t)
                       for t, need, write in zip(x, needs, written, strict=True))
        if self.w is not None:  # accumulated per head: (H, d, 2e)
            heads, d, e = x.w.shape[1:]
            self.w = x.q.new_zeros(heads, d, 2 * e)


def _acc(target: Tensor, b1: Tensor, b2: Tensor, first: bool) -> None:
    """target += b1 @ b2, or target = b1 @ b2 for the first row tile of its matrices."""
    target.baddbmm_(b1, b2, beta=0.0 if first else 1.0)


class WindowAttention(torch.autograd.Function):
    """(out = A v, A or None) of :class:`Inputs`, tile by tile of query rows."""

    @staticmethod
    def forward(ctx, opt: Options, mask: Tensor | None, *tensors: Tensor | None):
        ctx.set_materialize_grads(False)
        x = Inputs(*tensors)
        seed = int(torch.randint(1 << 62, ())) if opt.dropout > 0 else 0
        rows = Rows(x, mask, opt)
        n, lq, lk = x.q.shape[0], x.q.shape[1], x.k.shape[1]
        out = x.q.new_empty(n, lq, x.v.shape[2])
        weights = x.q.new_empty(n, lq, lk) if opt.need_weights else None
        for t in rows.tiles:
            ad = rows.weights(t, seed, None if weights is None else weights[t.n, t.rows])
            out[t.n, t.rows] = ad @ x.v[t.n]
            del ad
        ctx.save_for_backward(*tensors)
        ctx.args = (mask, opt, seed)
        return out, weights

    @staticmethod
    @without_autocast
    @once_differentiable
    def backward(ctx, g_out, g_weights):
        x = Inputs(*ctx.saved_tensors)
        mask, opt, seed = ctx.args
        if g_out is not None:
            # dL/d out arrives as the model's layout made it (heads merged back: a permuted
            # view); its tiles feed two products per tile, which on a non-contiguous operand
            # copy every matrix first (measured at SST's sizes, B H = 1024, L = 11: 2,000
            # copies per backward, 15% of the window's time); one copy here instead
            g_out = g_out.contiguous()
        rows = Rows(x, mask, opt)
        run = bool(rows.tiles) and (g_out is not None or g_weights is not None)
        written = [run] * len(x)
        written[2] = run and g_out is not None  # v
        g = Grads(x, ctx.needs_input_grad[2:], tuple(written))
        if run:
            for t in rows.tiles:
                rows.backward(t, g, seed, g_out, g_weights)
        gw = None
        if g.w is not None:  # (H, d, 2e) -> (2, H, d, e)
            heads, d, e = x.w.shape[1:]
            gw = g.w.view(heads, d, 2, e).permute(2, 0, 1, 3).contiguous()
        return None, None, g.q, g.k, g.v, gw, g.lq, g.lk, g.rq, g.rk, g.cq, g.ck


def window_attention(x: Inputs, mask: Tensor | None, opt: Options) -> tuple[Tensor,
                                                                             Tensor | None]:
    """Run :class:`WindowAttention` on flattened inputs: (out (N, Lq, dv), A (N, Lq, Lk) or
    None); bfloat16 and float16 in float32 (:func:`attention._tiling.apply_float32`)."""
    return apply_float32(WindowAttention, opt, mask, *x)
