"""Compositional De-Attention (CoDA), Tay et al., NeurIPS 2019.

Dual affinity (Eq. 1-2) between elements a_i of A and b_j of B:

    E_ij = alpha * F_E(a_i) . F_E(b_j)
    N_ij = -beta * || F_N(a_i) - F_N(b_j) ||_1

Quasi-attention (Eq. 3-6), no softmax, values in [-1, 1]:

    M = tanh(E) * sigmoid(N)                    gate="plain"
    N <- N - mean(N)                            gate="centered"   (Eq. 4)
    M = tanh(E) * 2 * sigmoid(N)                gate="scaled"     (Eq. 5)
    E <- E - mean(E)                            center_e=True     (Eq. 6)

Compositional pooling (Eq. 7): A' = M B, B' = M^T A.  CoDA Transformer (Eq. 10): per head
E = Q K^T / sqrt(d), N = -||q_i - k_j||_1 / sqrt(d) (``scale=False`` drops the 1/sqrt(d),
footnote 3).  Table 9 swaps tanh (``e_fn``) and sigmoid (``n_fn``) for other functions.

Masked entries of M are exactly 0 (never -inf); centering subtracts the mean over the valid
entries of each Lq x Lk matrix.

Memory and speed.  Nothing of size (..., Lq, Lk, d) is ever stored, and neither is M unless
the weights are asked for: :class:`_QuasiAttention` walks over blocks of query rows, keeps
only q, k, v for the backward pass and recomputes each block of M there (as flash attention
does).  The L1 term and its gradient,

    D_ij = sum_t |q_it - k_jt|,    dD/dq_i = sum_j w_ij sign(q_i - k_j),
                                   dD/dk_j = sum_i w_ij sign(k_j - q_i),

are two block kernels written as broadcast expressions and compiled by ``torch.compile``
(inductor emits vectorised C++ loop nests reducing in registers, with no (.., Lq, Lk, d)
buffer).  Without a working compiler (or with ``ATTNREPRO_COMPILE=0``) they fall back to
``torch.cdist(p=1)`` and its backward kernel on the same blocks, also exact and bounded.
Measured at B=8, H=8, L=512, d=64, float32, 2 threads (Xeon Sapphire Rapids, torch 2.13),
forward + backward:

    softmax SDPA (flash kernel)         ~270 ms    48 MB
    this implementation (compiled)      see benchmarks/README.md
    torch.cdist(p=1) + autograd ops    ~1600 ms   472 MB  (cdist's backward alone ~430 ms)

Compile time of the two kernels: a few seconds once per process and dtype (inductor caches
the code on disk).  The backward is not differentiable again (no double backward).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from attention.base import Alignment, AlignmentCore, DecoderCore, Mechanism, MultiHeadCore
from attention.masking import attention_mask, check_mask, pair_mask


class Activation(NamedTuple):
    fn: Callable[[Tensor], Tensor]
    #: derivative from the input x and the output y
    grad: Callable[[Tensor, Tensor], Tensor]


_TANH = Activation(torch.tanh, lambda x, y: 1 - y * y)
_SIGMOID = Activation(torch.sigmoid, lambda x, y: y * (1 - y))
E_FUNCTIONS = {"tanh": _TANH, "sigmoid": _SIGMOID}
N_FUNCTIONS = {
    "sigmoid": _SIGMOID,
    "tanh": _TANH,
    "arctan": Activation(torch.arctan, lambda x, y: 1 / (1 + x * x)),
    # x / sqrt(1 + x^2), derivative (1 + x^2)^(-3/2)
    "algebraic": Activation(lambda x: x * torch.rsqrt(1 + x * x),
                            lambda x, y: torch.rsqrt(1 + x * x) ** 3),
}
GATES = ("plain", "centered", "scaled")

#: bytes of one (rows, Lk) block of the flattened (N, Lq, Lk) quasi-attention matrix
BLOCK_BYTES = 4 << 20
#: compile the block kernels with torch.compile (``ATTNREPRO_COMPILE=0``: run them eagerly)
COMPILE = os.environ.get("ATTNREPRO_COMPILE", "1") != "0"


class _Compiled:
    """``fn`` compiled by ``torch.compile(dynamic=True)`` on first use.  If compiling fails
    (no C++ compiler, an unsupported device) it warns once and runs ``fn`` eagerly."""

    def __init__(self, fn: Callable[..., Tensor | tuple[Tensor, ...]]):
        self.fn, self._compiled, self.failed = fn, None, False

    def active(self) -> bool:
        return COMPILE and not self.failed

    def compiled(self, *args):
        """``fn(*args)`` compiled, or None when compiling is off or has failed."""
        if not self.active():
            return None
        try:
            if self._compiled is None:
                self._compiled = torch.compile(self.fn, dynamic=True)
            return self._compiled(*args)
        except Exception as err:
            if not isinstance(err, _compile_errors()):
                raise
            warnings.warn(f"coda: torch.compile of {self.fn.__name__} failed, running it "
                          f"eagerly (slower): {err!r}", stacklevel=3)
            self.failed = True
            return None

    def __call__(self, *args):
        out = self.compiled(*args)
        return self.fn(*args) if out is None else out


def _compile_errors() -> tuple[type[Exception], ...]:
    import torch._dynamo.exc
    import torch._inductor.exc

    return (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError, OSError)


# -- the L1 term: block kernels ----------------------------------------------------------------
# Each is a broadcast expression over (N, a, b, d) that inductor turns into one loop nest
# reducing in registers, never storing the broadcast.
def _l1_block(x: Tensor, yt: Tensor) -> Tensor:
    """D_ij = sum_t |x_it - y_jt|: x (N,a,d), y^T (N,d,b) -> (N,a,b) (vectorised over j)."""
    return (x.unsqueeze(-1) - yt.unsqueeze(1)).abs().sum(2)  # (N,a,d,b) -> (N,a,b)


def _l1_grads_block(w: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
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


class _L1Kernel(_Compiled):
    """A compiled L1 block kernel, which never materialises the (N, a, b, d) broadcast; None
    when compiling is off or failed (the caller then uses ``torch.cdist``'s kernels).

    ``dims`` names the dimensions of each argument and output ("nad,ndb->nab").  Every size
    is padded to at least 2 with zeros (which add nothing to either kernel) and the results
    cut back, so that one graph per dtype serves every shape: dynamo would otherwise
    specialise and recompile for sizes 1 (a decoder step's single query) and could reach its
    recompile limit, after which it would run the broadcast expression eagerly."""

    def __init__(self, fn: Callable[..., Tensor | tuple[Tensor, ...]], dims: str):
        super().__init__(fn)
        inputs, outputs = dims.split("->")
        self.inputs, self.outputs = inputs.split(","), outputs.split(",")

    def __call__(self, *args: Tensor):
        if not self.active():
            return None
        sizes = {c: t.shape[i] for t, spec in zip(args, self.inputs) for i, c in enumerate(spec)}
        out = self.compiled(*(_pad_to_2(t, spec, sizes) for t, spec in zip(args, self.inputs)))
        if out is None:
            return None
        cut = [o[tuple(slice(sizes[c]) for c in spec)]
               for o, spec in zip(out if len(self.outputs) > 1 else (out,), self.outputs)]
        return tuple(cut) if len(self.outputs) > 1 else cut[0]


def _pad_to_2(t: Tensor, spec: str, sizes: dict[str, int]) -> Tensor:
    t = t.detach().contiguous()
    widths = [p for c in reversed(spec) for p in (0, max(0, 2 - sizes[c]))]
    return F.pad(t, widths) if any(widths) else t


_l1 = _L1Kernel(_l1_block, "nad,ndb->nab")
_l1_grads = _L1Kernel(_l1_grads_block, "nab,nad,nbd->nad,nbd")


class _L1Pair:
    """The L1 term of q (N,Lq,d) and k (N,Lk,d), for blocks qb (N,r,d) of query rows: the
    compiled kernels, or (compiling off or failed) ``torch.cdist`` and its backward kernel,
    exact as well (sign(0) = 0) and memory-bounded, but about 2.5x slower."""

    def __init__(self, k: Tensor):
        self.k = k.contiguous()
        self.kt = k.transpose(1, 2).contiguous()  # (N,d,Lk), once per call

    def distance(self, qb: Tensor) -> Tensor:
        dist = _l1(qb, self.kt)
        return torch.cdist(qb, self.k, p=1) if dist is None else dist  # (N,r,Lk)

    def grads(self, w: Tensor, qb: Tensor, dist: Tensor) -> tuple[Tensor, Tensor]:
        """sum_j w_ij dD_ij/dq_i for the block's rows (N,r,d) and sum_{i in block} w_ij
        dD_ij/dk_j (N,Lk,d); ``dist`` is the block's D."""
        out = _l1_grads(w, qb, self.k)
        if out is not None:
            return out
        cdist_backward = torch.ops.aten._cdist_backward
        return (cdist_backward(w.contiguous(), qb, self.k, 1.0, dist),
                cdist_backward(w.transpose(1, 2).contiguous(), self.k, qb, 1.0,
                               dist.transpose(1, 2).contiguous()))


def _blocks(total: int, rows: int) -> list[tuple[int, int]]:
    return [(i, min(i + rows, total)) for i in range(0, total, rows)]


def _block_rows(n: int, lk: int, like: Tensor) -> int:
    return max(1, BLOCK_BYTES // max(1, n * lk * like.element_size()))


class _L1Distance(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor) -> Tensor:  # (N,Lq,d), (N,Lk,d)
        ctx.save_for_backward(q, k)
        pair = _L1Pair(k)
        out = q.new_empty(q.shape[0], q.shape[1], k.shape[1])
        for i0, i1 in _blocks(q.shape[1], _block_rows(q.shape[0], k.shape[1], q)):
            out[:, i0:i1] = pair.distance(q[:, i0:i1])
        return out  # (N,Lq,Lk)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q, k = ctx.saved_tensors
        pair = _L1Pair(k)
        grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)
        for i0, i1 in _blocks(q.shape[1], _block_rows(q.shape[0], k.shape[1], q)):
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


# -- quasi-attention ---------------------------------------------------------------------------
def _check_options(gate: str, e_fn: str, n_fn: str, alpha: float = 1.0,
                   beta: float = 1.0) -> None:
    if gate not in GATES:
        raise ValueError(f"coda: gate must be one of {GATES}, got {gate!r}")
    if e_fn not in E_FUNCTIONS:
        raise ValueError(f"coda: e_fn must be one of {tuple(E_FUNCTIONS)}, got {e_fn!r}")
    if n_fn not in N_FUNCTIONS:
        raise ValueError(f"coda: n_fn must be one of {tuple(N_FUNCTIONS)}, got {n_fn!r}")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"coda: {name} must be a non-negative number (a temperature, "
                             f"Sec. 2.3), got {value!r}")


class _Options(NamedTuple):
    e_scale: float  # alpha * s, s = 1/sqrt(d) or 1
    n_scale: float  # -beta * s
    gate: str
    e_fn: str
    n_fn: str


def _gate_block(e_raw: Tensor, dist: Tensor, mb: Tensor | None, mean_e: Tensor | None,
                mean_n: Tensor | None, opt: _Options):
    """Eq. 1-6 on one block from q.k and the L1 distance: (E, N, e_fn(E), gate, M)."""
    e = opt.e_scale * e_raw  # Eq. 1
    n = opt.n_scale * dist  # Eq. 2
    if mean_e is not None:
        e = e - mean_e  # Eq. 6
    if mean_n is not None:
        n = n - mean_n  # Eq. 4
    te, gn = E_FUNCTIONS[opt.e_fn].fn(e), N_FUNCTIONS[opt.n_fn].fn(n)
    g = 2 * gn if opt.gate == "scaled" else gn  # Eq. 5
    m = te * g  # Eq. 3
    return e, n, te, gn, (m if mb is None else m.masked_fill(~mb, 0.0))


def _forward_block(e_raw, dist, mb, mean_e, mean_n, keep, opt: _Options):
    """(M, M with dropout) of one block (the first one returned as weights, the second
    multiplied with the values)."""
    m = _gate_block(e_raw, dist, mb, mean_e, mean_n, opt)[-1]
    return m, (m if keep is None else m * keep)


def _backward_block(e_raw, dist, mb, mean_e, mean_n, keep, d_md, d_m, shift_e, shift_n,
                    opt: _Options):
    """Recompute one block and return (M with dropout, dL/d(q.k), dL/dD).

    ``d_md``: gradient of M with dropout (from the products), ``d_m``: of the weights output;
    ``shift_e``/``shift_n``: mean over the valid entries of dL/d(q.k), dL/dD, subtracted
    when E or N is centered (the backward of x - mean(x))."""
    e, n, te, gn, m = _gate_block(e_raw, dist, mb, mean_e, mean_n, opt)
    dm = d_md if keep is None or d_md is None else d_md * keep
    dm = d_m if dm is None else (dm if d_m is None else dm + d_m)
    if mb is not None:
        dm = dm.masked_fill(~mb, 0.0)
    g = 2 * gn if opt.gate == "scaled" else gn
    de = opt.e_scale * (dm * g * E_FUNCTIONS[opt.e_fn].grad(e, te))  # 0 where masked
    gn_grad = N_FUNCTIONS[opt.n_fn].grad(n, gn)
    dn = opt.n_scale * (dm * te * (2 * gn_grad if opt.gate == "scaled" else gn_grad))
    valid = 1.0 if mb is None else mb.to(de.dtype)
    if shift_e is not None:
        de = de - shift_e * valid
    if shift_n is not None:
        dn = dn - shift_n * valid
    return (m if keep is None else m * keep), de, dn


_forward_kernel = _Compiled(_forward_block)
_backward_kernel = _Compiled(_backward_block)


class _Rows:
    """One call of Eq. 1-7 on flattened q (N,Lq,d), k (N,Lk,d), computed block by block of
    query rows; each method's temporaries die with it, so one block is alive at a time."""

    def __init__(self, q: Tensor, k: Tensor, mask: Tensor | None, batch: tuple[int, ...],
                 opt: _Options, dropout: float, seed: int):
        self.q, self.k, self.opt, self.dropout, self.seed = q, k, opt, dropout, seed
        n, lq, lk = q.shape[0], q.shape[1], k.shape[1]
        self.pair = _L1Pair(k)
        self.masks = _MaskRows(mask, batch, n, lq, lk)
        self.blocks = _blocks(lq, _block_rows(n, lk, q))
        self.mean_e: Tensor | None = None
        self.mean_n: Tensor | None = None

    def _block(self, index: int):
        i0, i1 = self.blocks[index]
        qb = self.q[:, i0:i1].contiguous()  # (N,r,d)
        keep = _keep(self.q, (self.q.shape[0], i1 - i0, self.k.shape[1]), self.dropout,
                     self.seed, index)
        return i0, i1, qb, self.masks(i0, i1), keep

    def center(self, center_e: bool, center_n: bool) -> None:
        """The means over the valid entries of E and N (Eq. 4, 6): a first pass."""
        sum_e, sum_n = self.q.new_zeros(self.q.shape[0], 1, 1), self.q.new_zeros(
            self.q.shape[0], 1, 1)
        for index in range(len(self.blocks)):
            _, _, qb, mb, _ = self._block(index)
            if center_e:
                sum_e += _valid_sum(self.opt.e_scale * (qb @ self.pair.kt), mb)
            if center_n:
                sum_n += _valid_sum(self.opt.n_scale * self.pair.distance(qb), mb)
        count = self.masks.count(self.q)
        self.mean_e = sum_e / count if center_e else None
        self.mean_n = sum_n / count if center_n else None

    def forward(self, index: int) -> tuple[Tensor, Tensor]:
        """(M, M with dropout) of block ``index`` (N,r,Lk)."""
        _, _, qb, mb, keep = self._block(index)
        return _forward_kernel(qb @ self.pair.kt, self.pair.distance(qb), mb, self.mean_e,
                               self.mean_n, keep, self.opt)

    def factors(self, index: int) -> tuple[Tensor, Tensor, Tensor]:
        """(F_E(E), F_N(N), M) of block ``index`` (N,r,Lk), uncompiled (analysis only)."""
        _, _, qb, mb, _ = self._block(index)
        _, _, te, gn, m = _gate_block(qb @ self.pair.kt, self.pair.distance(qb), mb,
                                      self.mean_e, self.mean_n, self.opt)
        return te, gn, m

    def backward(self, index: int, grads: _Grads, shifts) -> tuple[Tensor, Tensor] | None:
        """Add block ``index``'s share to ``grads``; with ``shifts=None`` (the first pass of a
        centered backward) return the sums of dL/d(q.k) and dL/dD instead."""
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
        md, de, dn = _backward_kernel(qb @ self.pair.kt, dist, mb, self.mean_e, self.mean_n,
                                      keep, d_md, d_m, shift_e, shift_n, self.opt)
        del d_md
        if shifts is None and (self.mean_e is not None or self.mean_n is not None):
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
    def _grad_values(g: _Grads, md: Tensor, i0: int, i1: int) -> None:
        if g.dv is not None:
            g.dv.baddbmm_(md.transpose(1, 2), g.out[:, i0:i1])  # from A' = M B
        if g.dv_t is not None:
            g.dv_t[:, i0:i1] = md @ g.out_t  # from B' = M^T A


class _Grads:
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


class _QuasiAttention(torch.autograd.Function):
    """(out = M v, out_t = M^T v_t, M) on flattened tensors q (N,Lq,d), k (N,Lk,d),
    v (N,Lk,dv) | None, v_t (N,Lq,dt) | None, block by block over the Lq rows."""

    @staticmethod
    def forward(ctx, q, k, v, v_t, mask, batch, opt: _Options, center_e: bool,
                center_n: bool, dropout: float, need_weights: bool):
        ctx.set_materialize_grads(False)
        seed = int(torch.randint(1 << 62, ())) if dropout > 0 else 0
        rows = _Rows(q, k, mask, batch, opt, dropout, seed)
        if center_e or center_n:
            rows.center(center_e, center_n)
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
        ctx.args = (mask, batch, opt, dropout, seed, rows.mean_e, rows.mean_n)
        return out, out_t, weights

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out, g_out_t, g_weights):
        q, k, v, v_t = ctx.saved_tensors
        mask, batch, opt, dropout, seed, mean_e, mean_n = ctx.args
        rows = _Rows(q, k, mask, batch, opt, dropout, seed)
        rows.mean_e, rows.mean_n = mean_e, mean_n
        grads = _Grads(q, k, v, v_t, g_out, g_out_t, g_weights, ctx.needs_input_grad)
        shifts = None
        if (mean_e is not None or mean_n is not None) and grads.need_qk:
            # centering couples every entry of a matrix to its mean: a first pass sums the
            # gradients of E and N, the second subtracts their mean from the valid entries
            sums = [rows.backward(index, grads, None) for index in range(len(rows.blocks))]
            count = rows.masks.count(q)
            shifts = tuple(None if mean is None else sum(s[i] for s in sums) / count
                           for i, mean in enumerate((mean_e, mean_n)))
        for index in range(len(rows.blocks)):
            rows.backward(index, grads, shifts or (None, None))
        return grads.q, grads.k, grads.dv, grads.dv_t, *([None] * 7)


class _MaskRows:
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


def _valid_sum(x: Tensor, mask: Tensor | None) -> Tensor:
    return (x if mask is None else x.masked_fill(~mask, 0.0)).sum((1, 2), keepdim=True)


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


def _prepare(q: Tensor, k: Tensor, v: Tensor | None, v_t: Tensor | None, mask: Tensor | None,
             alpha: float, beta: float, scale: bool, gate: str, e_fn: str, n_fn: str):
    """Check the arguments of every entry point; (batch, options, flatten) where ``flatten``
    turns (*batch', L, x) broadcastable tensors into (N, L, x)."""
    _check_options(gate, e_fn, n_fn, alpha, beta)
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"coda: q and k must have the same last size, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if v is not None and v.shape[-2] != lk:
        raise ValueError(f"coda: v must have one row per key ({lk}), got {tuple(v.shape)}")
    if v_t is not None and v_t.shape[-2] != lq:
        raise ValueError(f"coda: v_t must have one row per query ({lq}), got {tuple(v_t.shape)}")
    shapes = [t.shape[:-2] for t in (q, k, v, v_t) if t is not None]
    if mask is not None:
        check_mask(mask)
        if mask.dim() < 2 or mask.shape[-2] not in (1, lq) or mask.shape[-1] not in (1, lk):
            raise ValueError(f"coda: mask must be broadcastable to (..., {lq}, {lk}), got "
                             f"{tuple(mask.shape)}")
        shapes.append(mask.shape[:-2])
    try:
        batch = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError as err:
        raise ValueError(f"coda: the leading (batch) sizes of q, k, v and mask do not broadcast: "
                         f"{[tuple(t) for t in shapes]}") from err

    def flat(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])

    s = 1 / math.sqrt(d) if scale else 1.0
    return batch, _Options(float(alpha * s), float(-beta * s), gate, e_fn, n_fn), flat


def _coda(q: Tensor, k: Tensor, v: Tensor | None, mask: Tensor | None = None, *,
          v_t: Tensor | None = None, need_weights: bool = True, dropout: float = 0.0,
          alpha: float = 1.0, beta: float = 1.0, scale: bool = True, gate: str = "plain",
          center_e: bool = False, e_fn: str = "tanh", n_fn: str = "sigmoid"):
    """Every context's entry point: (M v | None, M^T v_t | None, M | None).

    q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv), v_t (..., Lq, dt); mask boolean
    broadcastable to (..., Lq, Lk).  ``dropout`` applies to M in the products only."""
    if not 0 <= dropout < 1:
        raise ValueError(f"coda: dropout must be in [0, 1), got {dropout!r}")
    batch, opt, flat = _prepare(q, k, v, v_t, mask, alpha, beta, scale, gate, e_fn, n_fn)
    lq, lk = q.shape[-2], k.shape[-2]
    out, out_t, weights = _QuasiAttention.apply(
        flat(q), flat(k), flat(v), flat(v_t), mask, batch, opt, center_e, gate == "centered",
        dropout, need_weights)
    return (None if out is None else out.view(*batch, lq, -1),
            None if out_t is None else out_t.view(*batch, lk, -1),
            None if weights is None else weights.view(*batch, lq, lk))


@torch.no_grad()
def quasi_attention_factors(
    q: Tensor, k: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0, beta: float = 1.0,
    scale: bool = True, gate: str = "plain", center_e: bool = False, e_fn: str = "tanh",
    n_fn: str = "sigmoid",
) -> tuple[Tensor, Tensor, Tensor]:
    """The three matrices of the paper's Figure 2, (F_E(E), F_N(N), M) each (..., Lq, Lk):
    tanh(E) and sigmoid(N) by default (after the centering options; F_N(N) before the 2x of
    ``gate="scaled"``) and M of Eq. 3-6.  For analysis: no gradient.  M is 0 where ``mask``
    is False; the other two are computed there as well (select the valid entries with the
    mask)."""
    batch, opt, flat = _prepare(q, k, None, None, mask, alpha, beta, scale, gate, e_fn, n_fn)
    rows = _Rows(flat(q), flat(k), mask, batch, opt, 0.0, 0)
    if center_e or gate == "centered":
        rows.center(center_e, gate == "centered")
    parts = [rows.factors(index) for index in range(len(rows.blocks))]
    shape = (*batch, q.shape[-2], k.shape[-2])
    return tuple(torch.cat(ts, dim=1).view(shape) for ts in zip(*parts))


def quasi_attention_matrix(
    q: Tensor, k: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0, beta: float = 1.0,
    scale: bool = True, gate: str = "plain", center_e: bool = False, e_fn: str = "tanh",
    n_fn: str = "sigmoid",
) -> Tensor:
    """M (..., Lq, Lk) of Eq. 3-6 (Eq. 10 with ``scale``); zero where ``mask`` is False."""
    return _coda(q, k, None, mask, alpha=alpha, beta=beta, scale=scale, gate=gate,
                 center_e=center_e, e_fn=e_fn, n_fn=n_fn)[2]


def quasi_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0,
    beta: float = 1.0, scale: bool = True, gate: str = "plain", center_e: bool = False,
    e_fn: str = "tanh", n_fn: str = "sigmoid",
) -> tuple[Tensor, Tensor]:
    """CoDA on per-head tensors: q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv);
    mask boolean broadcastable to (..., Lq, Lk), True = may attend.
    Returns (M v (..., Lq, dv), M (..., Lq, Lk)).  Exported as ``attention.functional.coda``."""
    out, _, m = _coda(q, k, v, mask, alpha=alpha, beta=beta, scale=scale, gate=gate,
                      center_e=center_e, e_fn=e_fn, n_fn=n_fn)
    return out, m  # Eq. 7 / Eq. 10


class coda(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Compositional De-Attention.  ``scale=None`` and ``gate=None`` follow the paper in
    each context: in multi-head and decoder attention (Eq. 10) 1/sqrt(d) and ``scaled``
    (2 * sigmoid: "we either apply centering ... or 2 * sigmoid ... to ensure the value is in
    [0, 1]"; Table 8's uncentred NMT row, the best, leaves the scaling); in pairwise
    alignment (Eq. 1-3) no 1/sqrt(d) and the ``plain`` gate sigmoid(N)."""

    name = "coda"

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, scale: bool | None = None,
                 gate: Literal["plain", "centered", "scaled"] | None = None,
                 center_e: bool = False,
                 e_fn: Literal["tanh", "sigmoid"] = "tanh",
                 n_fn: Literal["sigmoid", "tanh", "arctan", "algebraic"] = "sigmoid"):
        _check_options("plain" if gate is None else gate, e_fn, n_fn, alpha, beta)
        if scale is not None and not isinstance(scale, bool):
            raise ValueError(f"coda: scale must be true, false or null, got {scale!r}")
        self.alpha, self.beta, self.scale = alpha, beta, scale
        self.gate, self.center_e, self.e_fn, self.n_fn = gate, center_e, e_fn, n_fn

    def kwargs(self, default_scale: bool, default_gate: str) -> dict:
        return dict(alpha=self.alpha, beta=self.beta,
                    scale=default_scale if self.scale is None else self.scale,
                    gate=default_gate if self.gate is None else self.gate,
                    center_e=self.center_e, e_fn=self.e_fn, n_fn=self.n_fn)

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return CodaMultiHead(self.kwargs(True, "scaled"), dropout)  # Eq. 10

    def alignment(self, *, dim):
        return CodaAlignment(self.kwargs(False, "plain"))  # Eq. 1-3

    def decoder(self, *, query_dim, memory_dim):
        return CodaDecoder(self.kwargs(True, "scaled"), query_dim, memory_dim)  # Eq. 10


class CodaMultiHead(MultiHeadCore):
    def __init__(self, options: dict, dropout: float):
        super().__init__()
        self.options, self.dropout = options, dropout

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        out, _, m = _coda(q, k, v, mask, need_weights=need_weights,  # (B,H,Lq,dv), (B,H,Lq,Lk)
                          dropout=self.dropout if self.training else 0.0, **self.options)
        return out, m


class CodaAlignment(AlignmentCore):
    def __init__(self, options: dict):
        super().__init__()
        self.options = options

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        mask = pair_mask(mask_a, mask_b)  # broadcastable to (B,La,Lb)
        value_a = a if value_a is None else value_a
        value_b = b if value_b is None else value_b
        a_aligned, b_aligned, m = _coda(a, b, value_b, mask, v_t=value_a, **self.options)
        return Alignment(a_aligned, b_aligned, m, m)  # Eq. 7: A' = M B, B' = M^T A

    def factors(self, a, b, mask_a=None, mask_b=None) -> tuple[Tensor, Tensor, Tensor]:
        """(tanh(E), sigmoid(N), M) (B,La,Lb) of this alignment (Figure 2; no gradient)."""
        return quasi_attention_factors(a, b, pair_mask(mask_a, mask_b), **self.options)


class CodaDecoder(DecoderCore):
    def __init__(self, options: dict, query_dim: int, memory_dim: int):
        super().__init__()
        self.options = options
        # E and N compare s_i with h_j, so s is mapped to the memory's dimension when they differ
        self.query_proj = (nn.Identity() if query_dim == memory_dim
                           else nn.Linear(query_dim, memory_dim, bias=False))

    def precompute(self, h, mask=None):
        return {"h": h, "mask": mask}

    def forward(self, s, memory):
        h, mask = memory["h"], memory["mask"]
        out, _, m = _coda(self.query_proj(s), h, h, None if mask is None else mask[:, None, :],
                          **self.options)
        return out, m  # (B,T,Dm), (B,T,N)
