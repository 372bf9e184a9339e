"""The machinery behind :mod:`attention.coda`: the memory-bounded L1 term, tiles of the
quasi-attention matrix, and the custom autograd function that recomputes each tile in the
backward pass.

Nothing of size (..., Lq, Lk, d) is ever stored, and neither is M unless the weights are
asked for: :class:`QuasiAttention` walks over tiles (a group of whole Lq x Lk matrices of
about BLOCK_BYTES, or blocks of rows of one larger matrix), keeps only q, k, v for the
backward pass and recomputes each tile of M there (as flash attention does).  The L1 term
and its gradient,

    D_ij = sum_t |q_it - k_jt|,    dD/dq_i = sum_j w_ij sign(q_i - k_j),
                                   dD/dk_j = sum_i w_ij sign(k_j - q_i),

have no matrix-product form (L^2 d work in additions and comparisons).  Three paths, each
exact (sign(0) = 0) and bounded in memory:

- CPU float32/float64: C++ kernels (:mod:`attention._coda_l1_ext`, built once per machine),
  which also compute q.k beside D in one pass over the keys (the multiply-adds run in the
  execution ports the L1 term leaves idle), dL/d(M v) v^T beside them in the backward pass,
  and the gradients of q.k beside those of D: of the products only M v and M^T dL/d(M v)
  remain matrix products.
- otherwise two block kernels written as broadcast expressions and compiled by
  ``torch.compile`` through :mod:`attention._compiled` (inductor emits vectorised C++ loop
  nests reducing in registers), beside matrix products for q.k;
- without a working compiler (or with ``ATTNREPRO_COMPILE=0``) ``torch.cdist(p=1)`` and its
  backward kernel on the same tiles.

bfloat16 and float16 inputs (autocast, or a model cast to them) are computed in float32
(:func:`attention._tiling.apply_float32`): the L1 sums over d need it, the C++ kernels take
it, and torch.cdist has no bfloat16 kernel.

Measured at B=8, H=8, d=64, float32, forward + backward against softmax SDPA: see
benchmarks/README.md (and attention._coda_l1_ext for the kernels' own numbers).  The
backward is not differentiable again (no double backward).

The element-wise part of Eq. 1-6 (from q.k and D to M, and its derivative) is the paper's
and lives in :mod:`attention.coda`; it reaches this module as a :class:`BlockOps` (compiled
blocks, and for the paper's functions in float32 the C++ kernels
:func:`attention._coda_l1_ext.eq_forward` and :func:`~attention._coda_l1_ext.eq_backward`,
which apply the mask and the dropout from the tile's uniforms themselves).  Where those apply,
they run fused into the C++ forward kernel's tiles
(:func:`~attention._coda_l1_ext.fused_forward`, :func:`~attention._coda_l1_ext.fused_backward`,
``attention.coda.FUSED_EQ``): q.k, D and dL/dM are then never written to memory, the results
the same bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attention import _coda_l1_ext
from attention._compiled import PaddedKernel
from attention._tiling import (
    MaskTiles,
    apply_float32,
    dropout_uniform,
    keep_factors,
    without_autocast,
)

#: bytes of one block (tile) of the flattened (N, Lq, Lk) quasi-attention matrix
BLOCK_BYTES = 4 << 20


# -- the L1 term: block kernels ----------------------------------------------------------------
# Each is a broadcast expression over (N, a, b, d) that inductor turns into one loop nest
# reducing in registers, never storing the broadcast.
def l1_block(x: Tensor, yt: Tensor) -> Tensor:
    """D_ij = sum_t |x_it - y_jt|: x (N,a,d), y^T (N,d,b) -> (N,a,b) (vectorised over j)."""
    return (x.unsqueeze(-1) - yt.unsqueeze(1)).abs().sum(2)  # (N,a,d,b) -> (N,a,b)


def l1_grads_block(w: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of sum_ij w_ij D_ij: sum_j w_ij sign(x_i - y_j) (N,a,d) and
    sum_i w_ij sign(y_j - x_i) (N,b,d); w (N,a,b), x (N,a,d), y (N,b,d).

    sign(0) = 0 as in autograd's abs: ties x_it == y_jt are common (shared tokens and
    parameters in DecompAtt, ReLU zeros).  Written as where(x > y, w, where(x == y, 0, -w)):
    fewer vector operations than w * sign(x - y) (measured 1.6x faster than it compiled, and
    1.6x slower than ignoring ties)."""
    xi, yj, wij = x.unsqueeze(2), y.unsqueeze(1), w.unsqueeze(-1)  # (N,a,1,d) (N,1,b,d) (N,a,b,1)
    tie = xi == yj
    return (torch.where(xi > yj, wij, torch.where(tie, 0, -wij)).sum(2),
            torch.where(yj > xi, wij, torch.where(tie, 0, -wij)).sum(1))


class NativeKernel:
    """A C++ kernel of :mod:`attention._coda_l1_ext` (``native``), used by :class:`L1Pair` for
    the CPU float32 and float64 tensors it takes (:meth:`takes`), beside ``fallback``, the
    torch.compile'd kernel (a :class:`PaddedKernel`: None when compiling is off or failed),
    which calling this object calls.  Replacing the module's ``l1``/``l1_grads`` by plain
    PaddedKernels leaves the compiled path alone (tests)."""

    def __init__(self, native: Callable, fallback: PaddedKernel):
        self.native, self.fallback = native, fallback

    @property
    def failed(self) -> bool:
        return self.fallback.failed

    @staticmethod
    def takes(*tensors: Tensor) -> bool:
        return _coda_l1_ext.supports(*tensors)

    def __call__(self, *args: Tensor):
        return self.fallback(*args)


#: natively (x (N,a,d), y (N,b,d)) -> D (and :func:`attention._coda_l1_ext.products`);
#: compiled (x, y^T) -> D
l1 = NativeKernel(_coda_l1_ext.distance, PaddedKernel(l1_block, "nad,ndb->nab"))
#: natively (w, x, y, grad_y, e=None) -> grad_x, adding grad_y's share in place; compiled
#: (w, x, y) -> (grad_x, grad_y's share), without the e term
l1_grads = NativeKernel(_coda_l1_ext.grads,
                        PaddedKernel(l1_grads_block, "nab,nad,nbd->nad,nbd"))


def _native(kernel, *tensors: Tensor) -> bool:
    return isinstance(kernel, NativeKernel) and kernel.takes(*tensors)


class L1Pair:
    """The L1 term of q (N,Lq,d) and k (N,Lk,d), for blocks qb (n,r,d) of query rows of the
    matrices ``ns`` (a slice of the N): the C++ kernels, the compiled kernels, or (compiling
    off or failed) ``torch.cdist`` and its backward kernel, exact as well (sign(0) = 0) and
    memory-bounded, but slower.  The C++ kernels also compute q.k and its gradient in the
    same passes (:meth:`products`, :meth:`grads`)."""

    def __init__(self, k: Tensor):
        self.k = k.contiguous()
        self._kt: Tensor | None = None

    @property
    def kt(self) -> Tensor:
        """k^T (N,d,Lk), made once per call if the compiled kernel needs it."""
        if self._kt is None:
            self._kt = self.k.transpose(1, 2).contiguous()
        return self._kt

    def distance(self, qb: Tensor, ns: slice = slice(None)) -> Tensor:
        """D (n,r,Lk) of a block qb (n,r,d) of the matrices ``ns``."""
        k = self.k[ns]
        if _native(l1, qb, k):
            return l1.native(qb, k)
        dist = l1(qb, self.kt[ns])
        return torch.cdist(qb, k, p=1) if dist is None else dist

    def products(self, qb: Tensor, ns: slice = slice(None), a: Tensor | None = None,
                 b: Tensor | None = None) -> tuple[Tensor, ...]:
        """(q.k, D) (n,r,Lk) of a block qb (n,r,d) of the matrices ``ns``, and a.b (n,r,Lk)
        if a (n,r,d') and b (n,Lk,d') are given: natively in one pass over the keys, else
        matrix products and the L1 kernel."""
        k = self.k[ns]
        if _native(l1, qb, k, *([] if a is None else [a, b])):
            return _coda_l1_ext.products(qb, k, a, b)
        out = (qb @ k.transpose(1, 2), self.distance(qb, ns))
        return out if a is None else (*out, a @ b.transpose(1, 2))

    def grads(self, w: Tensor, qb: Tensor, dist: Tensor, grad_k: Tensor | None,
              ns: slice = slice(None), e: Tensor | None = None,
              out: Tensor | None = None) -> Tensor:
        """The gradients of sum_ij (w_ij D_ij + e_ij q_i.k_j) over the block (e: optional):
        for the block's rows q_i (n,r,d), returned (written into ``out`` natively, if given),
        and for k_j (n,Lk,d), added to ``grad_k`` (unless None); ``dist`` is the block's D,
        ``ns`` its matrices."""
        kernel, k = l1_grads, self.k[ns]
        if _native(kernel, w, qb, k):
            return kernel.native(w, qb, k, grad_k, e, out)
        both = kernel(w, qb, k)
        if both is None:
            cdist_backward = torch.ops.aten._cdist_backward
            both = (cdist_backward(w.contiguous(), qb, k, 1.0, dist),
                    cdist_backward(w.transpose(1, 2).contiguous(), k, qb, 1.0,
                                   dist.transpose(1, 2).contiguous()) if grad_k is not None
                    else None)
        grad_q = both[0] if e is None else both[0].baddbmm_(e, k)
        if grad_k is not None:
            grad_k.add_(both[1])
            if e is not None:
                grad_k.baddbmm_(e.transpose(1, 2), qb)
        return grad_q


def blocks(total: int, rows: int) -> list[tuple[int, int]]:
    return [(i, min(i + rows, total)) for i in range(0, total, rows)]


def block_rows(n: int, lk: int, like: Tensor) -> int:
    return max(1, BLOCK_BYTES // max(1, n * lk * like.element_size()))


def tiles(n: int, lq: int, lk: int, q: Tensor) -> list[tuple[int, int, int, int]]:
    """(n0, n1, i0, i1): the matrices n0:n1 and query rows i0:i1 of each tile of the (N, Lq,
    Lk) matrix of q (N,Lq,d), up to max(BLOCK_BYTES, half the size of q) as a tensor (a few
    such tensors are alive at a time: the peak memory stays within a constant factor of the
    inputs', and large inputs take few tiles, each a parallel region of its own): a group of
    whole matrices, or blocks of rows of one matrix where a matrix is larger.  Either way
    the slice [n0:n1, i0:i1] of a contiguous (N, L, x) tensor is contiguous (no copies in or
    out), and the products multiply whole (L, d) x (d, Lk) matrices of a group of heads, not
    thin slices of rows."""
    budget = max(BLOCK_BYTES, q.numel() * q.element_size() // 2)
    size = max(1, lk * q.element_size())
    rows = max(1, min(lq, budget // size))
    group = max(1, min(n, budget // (rows * size))) if rows == lq else 1
    return [(n0, min(n0 + group, n), i0, i1) for n0 in range(0, n, group)
            for i0, i1 in blocks(lq, rows)]


class _L1Distance(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor) -> Tensor:  # (N,Lq,d), (N,Lk,d)
        ctx.save_for_backward(q, k)
        pair = L1Pair(k)
        out = q.new_empty(q.shape[0], q.shape[1], k.shape[1])
        for i0, i1 in blocks(q.shape[1], block_rows(q.shape[0], k.shape[1], q)):
            out[:, i0:i1] = pair.distance(q[:, i0:i1])
        return out  # (N,Lq,Lk)

    @staticmethod
    @without_autocast
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q, k = ctx.saved_tensors
        pair = L1Pair(k)
        grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)
        for i0, i1 in blocks(q.shape[1], block_rows(q.shape[0], k.shape[1], q)):
            qb = q[:, i0:i1].contiguous()
            grad_q[:, i0:i1] = pair.grads(grad[:, i0:i1], qb, pair.distance(qb), grad_k)
        return grad_q, grad_k


def l1_distance(q: Tensor, k: Tensor) -> Tensor:
    """||q_i - k_j||_1 for q (..., Lq, d), k (..., Lk, d) -> (..., Lq, Lk), differentiable.

    Forward and backward work on blocks of rows: no (..., Lq, Lk, d) tensor is allocated."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"l1_distance: q and k must have the same last size, got {tuple(q.shape)}"
                         f" and {tuple(k.shape)}")
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    qf = q.expand(*batch, lq, d).reshape(-1, lq, d)
    kf = k.expand(*batch, lk, d).reshape(-1, lk, d)
    return apply_float32(_L1Distance, qf, kf).view(*batch, lq, lk)


# -- the quasi-attention, block by block of query rows -----------------------------------------
class BlockOps(NamedTuple):
    """The element-wise part of Eq. 1-6 on one block, from q.k and D (attention.coda):

    factors(qk, dist, mask, mean_e, mean_n, opt) -> (E, N, F_E(E), F_N(N), M)
    forward(qk, dist, mask, mean_e, mean_n, keep, opt) -> (M, M with dropout)
    backward(qk, dist, mask, mean_e, mean_n, keep, d_md, d_m, shift_e, shift_n, opt)
        -> (M with dropout, dL/d(q.k), dL/dD)

    and, optionally, kernels that take the dropout's uniforms u (:func:`dropout_uniform`)
    and rate p instead of its factors and return None where they do not apply (the caller
    then runs the two above):

    native_forward(qk, dist, mask, mean_e, mean_n, u, p, opt, need_m) -> (M | None, M with
        dropout)
    native_backward(qk, dist, mask, mean_e, mean_n, u, p, d_md, d_m, opt) -> as backward

    and whether those run fused into the C++ L1 kernel's tiles
    (:func:`attention._coda_l1_ext.fused_forward`, ``fused_backward``), with which scales:

    fused_scales(opt, mean_e, mean_n, *tensors) -> (e_scale, n_scale, gate_scale) | None
    """

    factors: Callable
    forward: Callable
    backward: Callable
    native_forward: Callable | None = None
    native_backward: Callable | None = None
    fused_scales: Callable | None = None


class Centering(NamedTuple):
    """Which of E and N are centred (Eq. 6, Eq. 4), and over what: every valid entry of
    each Lq x Lk matrix (``rows=False``) or of each query row (``rows=True``)."""

    e: bool = False
    n: bool = False
    rows: bool = False

    def any(self) -> bool:
        return self.e or self.n


def _row_count(mb: Tensor | None, lk: int, like: Tensor) -> Tensor | float:
    """Valid entries per row of a block (N,r,1), at least 1 (an empty row has mean 0)."""
    return float(lk) if mb is None else mb.sum(-1, keepdim=True).clamp(min=1).to(like.dtype)


def _valid_sum(x: Tensor, mask: Tensor | None, dims: tuple[int, ...]) -> Tensor:
    return (x if mask is None else x.masked_fill(~mask, 0.0)).sum(dims, keepdim=True)


class Rows:
    """One call of Eq. 1-7 on flattened q (N,Lq,d), k (N,Lk,d), computed tile by tile (a
    group of matrices or a block of one matrix's query rows: :func:`tiles`); each method's
    temporaries die with it, so one tile is alive at a time."""

    def __init__(self, q: Tensor, k: Tensor, mask: Tensor | None, batch: tuple[int, ...],
                 ops: BlockOps, opt, centering: Centering, dropout: float, seed: int):
        self.q, self.k, self.ops, self.opt = q, k, ops, opt
        self.centering, self.dropout, self.seed = centering, dropout, seed
        n, lq, lk = q.shape[0], q.shape[1], k.shape[1]
        self.pair = L1Pair(k)
        self.masks = MaskTiles(mask, batch, n, lq, lk)
        #: (n0, n1, i0, i1) of the tiles the forward and backward passes walk over
        self.tiles = tiles(n, lq, lk, q)
        #: blocks of rows of all N matrices (:meth:`factors`, whose blocks are concatenated)
        self.blocks = blocks(lq, block_rows(n, lk, q))
        #: the means of E and N over the valid entries, (N,1,1) per matrix or (N,Lq,1) per row
        self.mean_e: Tensor | None = None
        self.mean_n: Tensor | None = None

    def _tile(self, index: int, dropout: bool = True):
        n0, n1, i0, i1 = self.tiles[index]
        qb = self.q[n0:n1, i0:i1].contiguous()  # (n,r,d)
        u = dropout_uniform(self.q, (n1 - n0, i1 - i0, self.k.shape[1]),
                            self.dropout if dropout else 0.0, self.seed, index)
        return slice(n0, n1), i0, i1, qb, self.masks(slice(n0, n1), slice(i0, i1)), u

    def _means(self, ns: slice, i0: int, i1: int) -> tuple[Tensor | None, Tensor | None]:
        rows = slice(i0, i1) if self.centering.rows else slice(None)
        return tuple(None if m is None else m[ns, rows] for m in (self.mean_e, self.mean_n))

    def center(self) -> None:
        """The means over the valid entries of E and N (Eq. 6, Eq. 4): a first pass."""
        c = self.centering
        if not c.any():
            return
        n, lq = self.q.shape[:2]
        shape = (n, lq, 1) if c.rows else (n, 1, 1)
        sum_e, sum_n = self.q.new_zeros(shape), self.q.new_zeros(shape)
        for index in range(len(self.tiles)):
            ns, i0, i1, qb, mb, _ = self._tile(index, dropout=False)
            if c.e and c.n:
                qk, dist = self.pair.products(qb, ns)
            else:
                qk = qb @ self.pair.k[ns].transpose(1, 2) if c.e else None
                dist = self.pair.distance(qb, ns) if c.n else None
            for total, on, scale, x in ((sum_e, c.e, self.opt.e_scale, qk),
                                        (sum_n, c.n, self.opt.n_scale, dist)):
                if not on:
                    continue
                if c.rows:
                    total[ns, i0:i1] = (_valid_sum(scale * x, mb, (2,))
                                        / _row_count(mb, self.k.shape[1], self.q))
                else:
                    total[ns] += _valid_sum(scale * x, mb, (1, 2))
            del qk, dist
        count = 1.0 if c.rows else self.masks.count(self.q)
        self.mean_e = sum_e / count if c.e else None
        self.mean_n = sum_n / count if c.n else None

    def _fused(self, qb: Tensor, ns: slice, means, *others: Tensor | None):
        """The scales of Eq. 1-6 if the fused C++ kernels compute this tile (the C++ L1
        kernels take it and :attr:`BlockOps.fused_scales` says so), else None."""
        k = self.pair.k[ns]
        if self.ops.fused_scales is None or not (_native(l1, qb, k) and _native(l1_grads, qb, k)):
            return None
        return self.ops.fused_scales(self.opt, *means, qb, k,
                                     *(t for t in others if t is not None))

    def forward(self, index: int, need_m: bool = True) -> tuple[Tensor | None, Tensor]:
        """(M, M with dropout) of tile ``index`` (n,r,Lk); ``need_m=False``: M may be None."""
        ns, i0, i1, qb, mb, u = self._tile(index)
        means = self._means(ns, i0, i1)
        scales = self._fused(qb, ns, means)
        if scales is not None:  # q.k, D and Eq. 1-6 in one pass over the L1 kernel's tiles
            return _coda_l1_ext.fused_forward(qb, self.pair.k[ns], mb, u, self.dropout,
                                              *scales, need_m)
        qk, dist = self.pair.products(qb, ns)
        if self.ops.native_forward is not None:
            out = self.ops.native_forward(qk, dist, mb, *means, u, self.dropout, self.opt,
                                          need_m)
            if out is not None:
                return out
        return self.ops.forward(qk, dist, mb, *means, keep_factors(u, self.dropout), self.opt)

    def factors(self, index: int) -> tuple[Tensor, Tensor, Tensor]:
        """(F_E(E), F_N(N), M) of block ``index`` of rows of all matrices (N,r,Lk),
        uncompiled (analysis only)."""
        i0, i1 = self.blocks[index]
        n, every = self.q.shape[0], slice(None)
        qb = self.q[:, i0:i1].contiguous()
        _, _, te, gn, m = self.ops.factors(qb @ self.pair.k.transpose(1, 2),
                                           self.pair.distance(qb),
                                           self.masks(slice(0, n), slice(i0, i1)),
                                           *self._means(every, i0, i1), self.opt)
        return te, gn, m

    def backward(self, index: int, grads: Grads, shifts) -> tuple[Tensor, Tensor] | None:
        """Add tile ``index``'s share to ``grads``; with ``shifts=None`` (the first pass of a
        backward centred per matrix) return the sums of dL/d(q.k) and dL/dD over each of its
        matrices (n,1,1) instead.  ``shifts``: (N,1,1) or None each."""
        ns, i0, i1, qb, mb, u = self._tile(index)
        g = grads
        if not g.need_qk:
            self._grad_values(g, self.forward(index, need_m=False)[1], ns, i0, i1)
            return None
        a, b = (None, None) if g.out is None else (g.out[ns, i0:i1], g.v[ns])
        d_m = None if g.weights is None else g.weights[ns, i0:i1]
        shift_e, shift_n = (None if s is None else s[ns] for s in (shifts or (None, None)))
        means = self._means(ns, i0, i1)
        scales = (None if g.out_t is not None or shift_e is not None or shift_n is not None
                  else self._fused(qb, ns, means, a, b, d_m))
        if scales is not None:
            # q.k, D and dL/d(M with dropout) = dL/d(M v) v^T recomputed and Eq. 1-6's
            # derivative applied in one pass over the L1 kernel's tiles
            dist = None  # (the C++ gradient kernel does not need D)
            md, de, dn = _coda_l1_ext.fused_backward(
                qb, self.pair.k[ns], a, b, mb, u, self.dropout, d_m, *scales,
                need_md=g.dv is not None or g.dv_t is not None)
        else:
            md, de, dn, dist = self._backward_separately(qb, ns, i0, i1, mb, u, means, a, b,
                                                         d_m, shift_e, shift_n, g)
        c = self.centering
        if c.rows:  # the backward of x - rowmean(x): subtract each row's mean gradient
            count = _row_count(mb, self.k.shape[1], qb)
            valid = 1.0 if mb is None else mb.to(de.dtype)
            if c.e:
                de = de - de.sum(2, keepdim=True) / count * valid  # de is 0 where masked
            if c.n:
                dn = dn - dn.sum(2, keepdim=True) / count * valid
        elif shifts is None and c.any():
            return de.sum((1, 2), keepdim=True), dn.sum((1, 2), keepdim=True)
        self._grad_values(g, md, ns, i0, i1)
        del md  # (one tile alive at a time: the peak is the L1 gradient kernel's)
        # dn = dL/dD, de = dL/d(q.k)
        out = None if g.q is None else g.q[ns, i0:i1]
        grad_qb = self.pair.grads(dn, qb, dist, None if g.k is None else g.k[ns], ns, de, out)
        if out is not None and grad_qb.data_ptr() != out.data_ptr():
            out.copy_(grad_qb)
        return None

    def _backward_separately(self, qb, ns, i0, i1, mb, u, means, a, b, d_m, shift_e, shift_n,
                             g: Grads) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(M with dropout, dL/d(q.k), dL/dD, D) of a tile: q.k, D and dL/d(M with dropout)
        from the products (dL/d(M v) v^T in the same pass), then Eq. 1-6's derivative (C++
        where it applies, else the compiled block)."""
        qk, dist, *d_md = self.pair.products(qb, ns, a, b)
        d_md = d_md[0] if d_md else None  # (n,r,Lk)
        if g.out_t is not None:
            part = g.v_t[ns, i0:i1] @ g.out_t[ns].transpose(1, 2)
            d_md = part if d_md is None else d_md + part
        out = None
        if self.ops.native_backward is not None and shift_e is None and shift_n is None:
            out = self.ops.native_backward(qk, dist, mb, *means, u, self.dropout, d_md, d_m,
                                           self.opt)
        if out is None:
            out = self.ops.backward(qk, dist, mb, *means, keep_factors(u, self.dropout), d_md,
                                    d_m, shift_e, shift_n, self.opt)
        return (*out, dist)

    @staticmethod
    def _grad_values(g: Grads, md: Tensor, ns: slice, i0: int, i1: int) -> None:
        if g.dv is not None:
            g.dv[ns].baddbmm_(md.transpose(1, 2), g.out[ns, i0:i1])  # from A' = M B
        if g.dv_t is not None:
            torch.bmm(md, g.out_t[ns], out=g.dv_t[ns, i0:i1])  # from B' = M^T A


class Grads:
    """The incoming gradients (of M v, M^T v_t, M) and the accumulating input gradients
    (contiguous: the L1 kernel adds to the gradient of k in place)."""

    def __init__(self, q, k, v, v_t, out, out_t, weights, needs_input_grad):
        need_q, need_k, need_v, need_vt = needs_input_grad[:4]
        self.out, self.out_t, self.weights, self.v, self.v_t = out, out_t, weights, v, v_t
        self.need_qk = (need_q or need_k) and not (out is None and out_t is None
                                                   and weights is None)
        self.q = q.new_zeros(q.shape) if need_q else None
        self.k = k.new_zeros(k.shape) if need_k else None
        self.dv = v.new_zeros(v.shape) if need_v and out is not None else None
        self.dv_t = v_t.new_zeros(v_t.shape) if need_vt and out_t is not None else None


class QuasiAttention(torch.autograd.Function):
    """(out = M v, out_t = M^T v_t, M) on flattened tensors q (N,Lq,d), k (N,Lk,d),
    v (N,Lk,dv) | None, v_t (N,Lq,dt) | None, tile by tile (:func:`tiles`)."""

    @staticmethod
    def forward(ctx, q, k, v, v_t, mask, batch, ops: BlockOps, opt, centering: Centering,
                dropout: float, need_weights: bool):
        ctx.set_materialize_grads(False)
        seed = int(torch.randint(1 << 62, ())) if dropout > 0 else 0
        rows = Rows(q, k, mask, batch, ops, opt, centering, dropout, seed)
        rows.center()
        n, lq, lk = q.shape[0], q.shape[1], k.shape[1]
        out = q.new_empty(n, lq, v.shape[2]) if v is not None else None
        out_t = q.new_zeros(n, lk, v_t.shape[2]) if v_t is not None else None
        weights = q.new_empty(n, lq, lk) if need_weights else None
        for index, (n0, n1, i0, i1) in enumerate(rows.tiles):
            ns = slice(n0, n1)
            m, md = rows.forward(index, need_m=weights is not None)
            if out is not None:
                torch.bmm(md, v[ns], out=out[ns, i0:i1])  # Eq. 7 / Eq. 10: A' = M B
            if out_t is not None:
                out_t[ns].baddbmm_(md.transpose(1, 2), v_t[ns, i0:i1])  # Eq. 7: B' = M^T A
            if weights is not None:
                weights[ns, i0:i1] = m
            del m, md
        ctx.save_for_backward(q, k, v, v_t)
        ctx.args = (mask, batch, ops, opt, centering, dropout, seed, rows.mean_e, rows.mean_n)
        return out, out_t, weights

    @staticmethod
    @without_autocast
    @once_differentiable
    def backward(ctx, g_out, g_out_t, g_weights):
        q, k, v, v_t = ctx.saved_tensors
        mask, batch, ops, opt, centering, dropout, seed, mean_e, mean_n = ctx.args
        rows = Rows(q, k, mask, batch, ops, opt, centering, dropout, seed)
        rows.mean_e, rows.mean_n = mean_e, mean_n
        grads = Grads(q, k, v, v_t, g_out, g_out_t, g_weights, ctx.needs_input_grad)
        shifts = None
        if centering.any() and not centering.rows and grads.need_qk:
            # centering per matrix couples every entry to the matrix's mean: a first pass
            # sums the gradients of E and N, the second subtracts their mean from the valid
            # entries (centering per row does it within each tile)
            totals = (q.new_zeros(q.shape[0], 1, 1), q.new_zeros(q.shape[0], 1, 1))
            for index, (n0, n1, _, _) in enumerate(rows.tiles):
                for total, part in zip(totals, rows.backward(index, grads, None)):
                    total[n0:n1] += part
            count = rows.masks.count(q)
            shifts = tuple(None if mean is None else total / count
                           for total, mean in zip(totals, (mean_e, mean_n)))
        for index in range(len(rows.tiles)):
            rows.backward(index, grads, shifts or (None, None))
        return grads.q, grads.k, grads.dv, grads.dv_t, *([None] * 7)
