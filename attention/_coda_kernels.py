"""The machinery behind :mod:`attention.coda`: the memory-bounded L1 term, blocks of query
rows, and the custom autograd function that recomputes each block in the backward pass.

Nothing of size (..., Lq, Lk, d) is ever stored, and neither is M unless the weights are
asked for: :class:`QuasiAttention` walks over blocks of query rows, keeps only q, k, v for
the backward pass and recomputes each block of M there (as flash attention does).  The L1
term and its gradient,

    D_ij = sum_t |q_it - k_jt|,    dD/dq_i = sum_j w_ij sign(q_i - k_j),
                                   dD/dk_j = sum_i w_ij sign(k_j - q_i),

are two block kernels written as broadcast expressions and compiled by ``torch.compile``
through :mod:`attention._compiled` (inductor emits vectorised C++ loop nests reducing in
registers, with no (.., Lq, Lk, d) buffer).  Without a working compiler (or with
``ATTNREPRO_COMPILE=0``) they fall back to ``torch.cdist(p=1)`` and its backward kernel on
the same blocks, also exact and bounded.
Measured at B=8, H=8, L=512, d=64, float32, 2 threads (Xeon Sapphire Rapids, torch 2.13),
forward + backward:

    softmax SDPA (flash kernel)         ~270 ms    48 MB
    this implementation (compiled)      see benchmarks/README.md
    torch.cdist(p=1) + autograd ops    ~1600 ms   472 MB  (cdist's backward alone ~430 ms)

Compile time of the kernels: a few seconds once per process and dtype (inductor caches the
code on disk).  The backward is not differentiable again (no double backward).

The element-wise part of Eq. 1-6 (from q.k and D to M, and its derivative) is the paper's
and lives in :mod:`attention.coda`; it reaches this module as a :class:`BlockOps`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attention._compiled import PaddedKernel

#: bytes of one (rows, Lk) block of the flattened (N, Lq, Lk) quasi-attention matrix
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


l1 = PaddedKernel(l1_block, "nad,ndb->nab")
l1_grads = PaddedKernel(l1_grads_block, "nab,nad,nbd->nad,nbd")


class L1Pair:
    """The L1 term of q (N,Lq,d) and k (N,Lk,d), for blocks qb (N,r,d) of query rows: the
    compiled kernels, or (compiling off or failed) ``torch.cdist`` and its backward kernel,
    exact as well (sign(0) = 0) and memory-bounded, but about 2.5x slower."""

    def __init__(self, k: Tensor):
        self.k = k.contiguous()
        self.kt = k.transpose(1, 2).contiguous()  # (N,d,Lk), once per call

    def distance(self, qb: Tensor) -> Tensor:
        dist = l1(qb, self.kt)
        return torch.cdist(qb, self.k, p=1) if dist is None else dist  # (N,r,Lk)

    def grads(self, w: Tensor, qb: Tensor, dist: Tensor) -> tuple[Tensor, Tensor]:
        """sum_j w_ij dD_ij/dq_i for the block's rows (N,r,d) and sum_{i in block} w_ij
        dD_ij/dk_j (N,Lk,d); ``dist`` is the block's D."""
        out = l1_grads(w, qb, self.k)
        if out is not None:
            return out
        cdist_backward = torch.ops.aten._cdist_backward
        return (cdist_backward(w.contiguous(), qb, self.k, 1.0, dist),
                cdist_backward(w.transpose(1, 2).contiguous(), self.k, qb, 1.0,
                               dist.transpose(1, 2).contiguous()))


def blocks(total: int, rows: int) -> list[tuple[int, int]]:
    return [(i, min(i + rows, total)) for i in range(0, total, rows)]


def block_rows(n: int, lk: int, like: Tensor) -> int:
    return max(1, BLOCK_BYTES // max(1, n * lk * like.element_size()))


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
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q, k = ctx.saved_tensors
        pair = L1Pair(k)
        grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)
        for i0, i1 in blocks(q.shape[1], block_rows(q.shape[0], k.shape[1], q)):
            qb = q[:, i0:i1].contiguous()
            grad_q[:, i0:i1], grad_kb = pair.grads(grad[:, i0:i1], qb, pair.distance(qb))
            grad_k += grad_kb
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
    return _L1Distance.apply(qf, kf).view(*batch, lq, lk)


# -- the quasi-attention, block by block of query rows -----------------------------------------
class BlockOps(NamedTuple):
    """The element-wise part of Eq. 1-6 on one block, from q.k and D (attention.coda):

    factors(qk, dist, mask, mean_e, mean_n, opt) -> (E, N, F_E(E), F_N(N), M)
    forward(qk, dist, mask, mean_e, mean_n, keep, opt) -> (M, M with dropout)
    backward(qk, dist, mask, mean_e, mean_n, keep, d_md, d_m, shift_e, shift_n, opt)
        -> (M with dropout, dL/d(q.k), dL/dD)
    """

    factors: Callable
    forward: Callable
    backward: Callable


class Centering(NamedTuple):
    """Which of E and N are centred (Eq. 6, Eq. 4), and over what: every valid entry of
    each Lq x Lk matrix (``rows=False``) or of each query row (``rows=True``)."""

    e: bool = False
    n: bool = False
    rows: bool = False

    def any(self) -> bool:
        return self.e or self.n


class MaskRows:
    """Rows i0:i1 of a mask broadcastable to (*batch, Lq, Lk), flattened to (N, rows, Lk)
    block by block (the whole expanded mask is never copied)."""

    def __init__(self, mask: Tensor | None, batch: tuple[int, ...], n: int, lq: int, lk: int):
        self.mask, self.batch, self.n, self.lq, self.lk = mask, batch, n, lq, lk

    def __call__(self, i0: int, i1: int) -> Tensor | None:
        if self.mask is None:
            return None
        rows = self.mask if self.mask.shape[-2] == 1 else self.mask[..., i0:i1, :]
        return rows.expand(*self.batch, i1 - i0, self.lk).reshape(self.n, i1 - i0, self.lk)

    def count(self, like: Tensor) -> Tensor | float:
        """Valid entries per matrix (N,1,1), at least 1 (an empty matrix has mean 0)."""
        if self.mask is None:
            return float(self.lq * self.lk)
        full = self.mask.expand(*self.batch, self.lq, self.lk)
        return full.sum((-2, -1)).reshape(self.n, 1, 1).clamp(min=1).to(like.dtype)


def _row_count(mb: Tensor | None, lk: int, like: Tensor) -> Tensor | float:
    """Valid entries per row of a block (N,r,1), at least 1 (an empty row has mean 0)."""
    return float(lk) if mb is None else mb.sum(-1, keepdim=True).clamp(min=1).to(like.dtype)


def _valid_sum(x: Tensor, mask: Tensor | None, dims: tuple[int, ...]) -> Tensor:
    return (x if mask is None else x.masked_fill(~mask, 0.0)).sum(dims, keepdim=True)


def _keep(like: Tensor, shape: tuple[int, ...], p: float, seed: int,
          index: int) -> Tensor | None:
    """Dropout factors of block ``index`` (0 or 1/(1-p)), regenerated from the seed in the
    backward pass instead of stored; None without dropout."""
    if p <= 0:
        return None
    gen = torch.Generator(device=like.device)
    gen.manual_seed(seed + index)
    keep = torch.rand(shape, generator=gen, device=like.device, dtype=like.dtype) >= p
    return keep.to(like.dtype) / (1 - p)


class Rows:
    """One call of Eq. 1-7 on flattened q (N,Lq,d), k (N,Lk,d), computed block by block of
    query rows; each method's temporaries die with it, so one block is alive at a time."""

    def __init__(self, q: Tensor, k: Tensor, mask: Tensor | None, batch: tuple[int, ...],
                 ops: BlockOps, opt, centering: Centering, dropout: float, seed: int):
        self.q, self.k, self.ops, self.opt = q, k, ops, opt
        self.centering, self.dropout, self.seed = centering, dropout, seed
        n, lq, lk = q.shape[0], q.shape[1], k.shape[1]
        self.pair = L1Pair(k)
        self.masks = MaskRows(mask, batch, n, lq, lk)
        self.blocks = blocks(lq, block_rows(n, lk, q))
        #: the means of E and N over the valid entries, (N,1,1) per matrix or (N,Lq,1) per row
        self.mean_e: Tensor | None = None
        self.mean_n: Tensor | None = None

    def _block(self, index: int):
        i0, i1 = self.blocks[index]
        qb = self.q[:, i0:i1].contiguous()  # (N,r,d)
        keep = _keep(self.q, (self.q.shape[0], i1 - i0, self.k.shape[1]), self.dropout,
                     self.seed, index)
        return i0, i1, qb, self.masks(i0, i1), keep

    def _means(self, i0: int, i1: int) -> tuple[Tensor | None, Tensor | None]:
        if not self.centering.rows:
            return self.mean_e, self.mean_n
        return tuple(None if m is None else m[:, i0:i1] for m in (self.mean_e, self.mean_n))

    def center(self) -> None:
        """The means over the valid entries of E and N (Eq. 6, Eq. 4): a first pass."""
        c = self.centering
        if not c.any():
            return
        n, lq = self.q.shape[:2]
        shape = (n, lq, 1) if c.rows else (n, 1, 1)
        sum_e, sum_n = self.q.new_zeros(shape), self.q.new_zeros(shape)
        for index in range(len(self.blocks)):
            i0, i1, qb, mb, _ = self._block(index)
            if c.rows:
                count = _row_count(mb, self.k.shape[1], self.q)
                if c.e:
                    sum_e[:, i0:i1] = _valid_sum(self.opt.e_scale * (qb @ self.pair.kt), mb,
                                                 (2,)) / count
                if c.n:
                    sum_n[:, i0:i1] = _valid_sum(self.opt.n_scale * self.pair.distance(qb), mb,
                                                 (2,)) / count
            else:
                if c.e:
                    sum_e += _valid_sum(self.opt.e_scale * (qb @ self.pair.kt), mb, (1, 2))
                if c.n:
                    sum_n += _valid_sum(self.opt.n_scale * self.pair.distance(qb), mb, (1, 2))
        count = 1.0 if c.rows else self.masks.count(self.q)
        self.mean_e = sum_e / count if c.e else None
        self.mean_n = sum_n / count if c.n else None

    def forward(self, index: int) -> tuple[Tensor, Tensor]:
        """(M, M with dropout) of block ``index`` (N,r,Lk)."""
        i0, i1, qb, mb, keep = self._block(index)
        return self.ops.forward(qb @ self.pair.kt, self.pair.distance(qb), mb,
                                *self._means(i0, i1), keep, self.opt)

    def factors(self, index: int) -> tuple[Tensor, Tensor, Tensor]:
        """(F_E(E), F_N(N), M) of block ``index`` (N,r,Lk), uncompiled (analysis only)."""
        i0, i1, qb, mb, _ = self._block(index)
        _, _, te, gn, m = self.ops.factors(qb @ self.pair.kt, self.pair.distance(qb), mb,
                                           *self._means(i0, i1), self.opt)
        return te, gn, m

    def backward(self, index: int, grads: Grads, shifts) -> tuple[Tensor, Tensor] | None:
        """Add block ``index``'s share to ``grads``; with ``shifts=None`` (the first pass of a
        backward centred per matrix) return the sums of dL/d(q.k) and dL/dD instead."""
        i0, i1, qb, mb, keep = self._block(index)
        g = grads
        if not g.need_qk:
            self._grad_values(g, self.forward(index)[1], i0, i1)
            return None
        d_md = None  # dL/d(M with dropout) from the products
        if g.out is not None:
            d_md = g.out[:, i0:i1] @ g.v.transpose(1, 2)  # (N,r,Lk)
        if g.out_t is not None:
            part = g.v_t[:, i0:i1] @ g.out_t.transpose(1, 2)
            d_md = part if d_md is None else d_md + part
        d_m = None if g.weights is None else g.weights[:, i0:i1]
        shift_e, shift_n = shifts or (None, None)
        dist = self.pair.distance(qb)
        md, de, dn = self.ops.backward(qb @ self.pair.kt, dist, mb, *self._means(i0, i1), keep,
                                       d_md, d_m, shift_e, shift_n, self.opt)
        del d_md
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
        self._grad_values(g, md, i0, i1)
        del md  # (one block alive at a time: the peak is the L1 gradient kernel's)
        grad_qb, grad_kb = self.pair.grads(dn, qb, dist)  # de = dL/d(q.k), dn = dL/dD
        if g.q is not None:
            g.q[:, i0:i1] = grad_qb.baddbmm_(de, self.pair.k)
        if g.k is not None:
            g.k.baddbmm_(de.transpose(1, 2), qb).add_(grad_kb)
        return None

    @staticmethod
    def _grad_values(g: Grads, md: Tensor, i0: int, i1: int) -> None:
        if g.dv is not None:
            g.dv.baddbmm_(md.transpose(1, 2), g.out[:, i0:i1])  # from A' = M B
        if g.dv_t is not None:
            g.dv_t[:, i0:i1] = md @ g.out_t  # from B' = M^T A


class Grads:
    """The incoming gradients (of M v, M^T v_t, M) and the accumulating input gradients."""

    def __init__(self, q, k, v, v_t, out, out_t, weights, needs_input_grad):
        need_q, need_k, need_v, need_vt = needs_input_grad[:4]
        self.out, self.out_t, self.weights, self.v, self.v_t = out, out_t, weights, v, v_t
        self.need_qk = (need_q or need_k) and not (out is None and out_t is None
                                                   and weights is None)
        self.q = torch.zeros_like(q) if need_q else None
        self.k = torch.zeros_like(k) if need_k else None
        self.dv = torch.zeros_like(v) if need_v and out is not None else None
        self.dv_t = torch.zeros_like(v_t) if need_vt and out_t is not None else None


class QuasiAttention(torch.autograd.Function):
    """(out = M v, out_t = M^T v_t, M) on flattened tensors q (N,Lq,d), k (N,Lk,d),
    v (N,Lk,dv) | None, v_t (N,Lq,dt) | None, block by block over the Lq rows."""

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
        for index, (i0, i1) in enumerate(rows.blocks):
            m, md = rows.forward(index)
            if out is not None:
                out[:, i0:i1] = md @ v  # Eq. 7 / Eq. 10: A' = M B
            if out_t is not None:
                out_t.baddbmm_(md.transpose(1, 2), v_t[:, i0:i1])  # Eq. 7: B' = M^T A
            if weights is not None:
                weights[:, i0:i1] = m
            del m, md
        ctx.save_for_backward(q, k, v, v_t)
        ctx.args = (mask, batch, ops, opt, centering, dropout, seed, rows.mean_e, rows.mean_n)
        return out, out_t, weights

    @staticmethod
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
            # entries (centering per row does it within each block)
            sums = [rows.backward(index, grads, None) for index in range(len(rows.blocks))]
            count = rows.masks.count(q)
            shifts = tuple(None if mean is None else sum(s[i] for s in sums) / count
                           for i, mean in enumerate((mean_e, mean_n)))
        for index in range(len(rows.blocks)):
            rows.backward(index, grads, shifts or (None, None))
        return grads.q, grads.k, grads.dv, grads.dv_t, *([None] * 7)
