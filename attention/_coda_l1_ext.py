"""CoDA's L1 kernels in C++ (:file:`attention/_coda_l1.cpp`), and its Eq. 1-6 for the paper's
functions in float32 (:file:`attention/_coda_eq.h`), as a pass of its own (:func:`eq_forward`,
:func:`eq_backward`) or fused into the L1 kernel's tiles (:func:`fused_forward`,
:func:`fused_backward`: q.k, D and dL/dM never go to memory), built once per machine and loaded
by :class:`attention._native.NativeLibrary` (the build, its cache and flags per CPU capability,
the fallbacks: see there; cache folder ``attnrepro_coda_l1``).

Used for CPU float32/float64 tensors only (the CoDA functions compute bfloat16 and float16
in float32, under autocast or not, so these kernels run for them too).  Off with
``ATTNREPRO_COMPILE=0`` (as every compiled kernel) or ``ATTNREPRO_CODA_CPP=0`` (this one
only: the torch.compile kernels then run); if the build or the load fails it warns once and
the caller takes its other path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from attention._native import DTYPES, NativeLibrary, ptr


def _declare(lib: ctypes.CDLL) -> None:
    i64, p, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    for dt in DTYPES.values():
        getattr(lib, f"coda_l1_forward_{dt}").argtypes = [p, p, p, p, p, p, p, i64, i64, i64,
                                                         i64, i64, c_int]
        getattr(lib, f"coda_l1_grads_{dt}").argtypes = [p, p, p, p, p, p, i64, i64, i64, i64,
                                                       c_int]
    lib.coda_l1_vector_bytes.restype = c_int
    f32, f64 = ctypes.c_float, ctypes.c_double
    lib.coda_eq_forward_f32.argtypes = [p] * 6 + [i64, f32, f32, f32, f64, c_int]
    lib.coda_eq_backward_f32.argtypes = [p] * 9 + [i64, f32, f32, f32, f64, c_int]
    lib.coda_fused_forward_f32.argtypes = [p] * 6 + [i64] * 4 + [f32, f32, f32, f64, c_int]
    lib.coda_fused_backward_f32.argtypes = [p] * 10 + [i64] * 5 + [f32, f32, f32, f64, c_int]


#: the library (``LIBRARY.enabled``: ``ATTNREPRO_CODA_CPP`` is not 0)
LIBRARY = NativeLibrary(Path(__file__).with_name("_coda_l1.cpp"), "coda_l1",
                        "ATTNREPRO_CODA_CPP", _declare, what="the CoDA L1 kernels",
                        fallback="the torch.compile/cdist path")
#: the loaded library, built on first use; None when off or the build failed (warned once)
library = LIBRARY.library
#: whether the C++ kernels take these tensors (CPU, float32/float64) and are available
supports = LIBRARY.supports


def _operands(q: Tensor, k: Tensor, a: Tensor | None = None, b: Tensor | None = None):
    """The kernels' operands as contiguous tensors outside autograd, with their sizes:
    (q, k, a, b, n, r, d, Lk, d2); d2 is 0 without a and b."""
    q, k = q.detach().contiguous(), k.detach().contiguous()
    if a is not None:
        a, b = a.detach().contiguous(), b.detach().contiguous()
    n, r, d = q.shape
    return q, k, a, b, n, r, d, k.shape[1], 0 if a is None else a.shape[2]


def _forward(q: Tensor, k: Tensor, with_dot: bool, a: Tensor | None = None,
             b: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    q, k, a, b, n, r, d, lk, d2 = _operands(q, k, a, b)
    dist = q.new_empty(n, r, lk)
    dot = q.new_empty(n, r, lk) if with_dot else None
    dot2 = None if a is None else q.new_empty(n, r, lk)
    if dist.numel():
        with torch.profiler.record_function("coda_l1_forward"):
            LIBRARY.function("coda_l1_forward", q.dtype)(
                ptr(q), ptr(k), ptr(dist), ptr(dot), ptr(a), ptr(b), ptr(dot2), n, r, lk, d, d2,
                torch.get_num_threads())
    return dist, dot, dot2


def distance(q: Tensor, k: Tensor) -> Tensor:
    """D (N,r,Lk) = sum_t |q_it - k_jt| of q (N,r,d) and k (N,Lk,d)."""
    return _forward(q, k, False)[0]


def products(q: Tensor, k: Tensor, a: Tensor | None = None,
             b: Tensor | None = None) -> tuple[Tensor, ...]:
    """(q.k, D), each (N,r,Lk), in one pass over the keys (the fused multiply-adds of q.k run
    beside the L1 term's additions); with a (N,r,d2) and b (N,Lk,d2), (q.k, D, a.b)."""
    dist, dot, dot2 = _forward(q, k, True, a, b)
    return (dot, dist) if a is None else (dot, dist, dot2)


def grads(w: Tensor, q: Tensor, k: Tensor, grad_k: Tensor | None, e: Tensor | None = None,
          out: Tensor | None = None) -> Tensor:
    """The gradients of sum_ij (w_ij D_ij + e_ij q_i.k_j) (no e: of sum_ij w_ij D_ij):
    sum_j w_ij sign(q_i - k_j) + e_ij k_j (N,r,d), returned (written into ``out`` if it is a
    contiguous tensor of that shape), and sum_i w_ij sign(k_j - q_i) + e_ij q_i (N,Lk,d),
    added to ``grad_k`` (unless None); w, e (N,r,Lk), q (N,r,d), k (N,Lk,d);
    sign(0) = 0."""
    w, q, k = w.detach().contiguous(), q.detach().contiguous(), k.detach().contiguous()
    e = None if e is None else e.detach().contiguous()
    n, r, d = q.shape
    lk = k.shape[1]
    fits = (out is not None and out.shape == q.shape and out.dtype == q.dtype
            and out.is_contiguous())
    grad_q = out if fits else q.new_empty(n, r, d)
    direct = grad_k is not None and grad_k.is_contiguous() and grad_k.dtype == q.dtype
    acc = grad_k if direct else q.new_zeros(n, lk, d)
    if w.numel() and d:
        with torch.profiler.record_function("coda_l1_grads"):
            LIBRARY.function("coda_l1_grads", q.dtype)(
                ptr(w), ptr(e), ptr(q), ptr(k), ptr(grad_q), ptr(acc), n, r, lk, d,
                torch.get_num_threads())
    else:
        grad_q.zero_()
    if grad_k is not None and not direct:
        grad_k.add_(acc)
    return grad_q


# -- Eq. 1-6 element-wise (float32; attention.coda's blocks for the paper's functions) --------
def eq_supports(*tensors: Tensor | None) -> bool:
    """Whether :func:`eq_forward` and :func:`eq_backward` take these tile tensors (float32 on
    CPU, the library loaded)."""
    present = [t for t in tensors if t is not None]
    return present[0].dtype == torch.float32 and supports(*present)


def _flat(t: Tensor | None, shape: torch.Size) -> Tensor | None:
    """``t`` as a contiguous tensor of the tile's shape (a broadcast mask expanded)."""
    return None if t is None else t.detach().expand(shape).contiguous()


def eq_forward(qk: Tensor, dist: Tensor, mask: Tensor | None, u: Tensor | None, p: float,
               e_scale: float, n_scale: float, gate_scale: float,
               need_m: bool = True) -> tuple[Tensor | None, Tensor]:
    """(M, M with dropout) of a tile from q.k and D (n,r,Lk): M = tanh(e_scale q.k)
    gate_scale sigmoid(n_scale D), 0 where ``mask`` (bool, broadcastable) is False, dropout
    keeping the entries whose uniform ``u`` is at least ``p``, scaled by 1 / (1 - p).  Without
    dropout the two are one tensor; ``need_m=False``: M is None when there is dropout."""
    shape = qk.shape
    qk, dist = qk.detach().contiguous(), dist.detach().contiguous()
    mask, u = _flat(mask, shape), _flat(u, shape)
    md = torch.empty_like(qk)
    m = md if u is None else (torch.empty_like(qk) if need_m else None)
    LIBRARY.library().coda_eq_forward_f32(
        ptr(qk), ptr(dist), ptr(mask), ptr(u), ptr(None if m is md else m), ptr(md),
        qk.numel(), e_scale, n_scale, gate_scale, p, torch.get_num_threads())
    return m, md


def eq_backward(qk: Tensor, dist: Tensor, mask: Tensor | None, u: Tensor | None, p: float,
                d_md: Tensor | None, d_m: Tensor | None, e_scale: float, n_scale: float,
                gate_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(M with dropout, dL/d(q.k), dL/dD) of a tile by the chain rule through
    :func:`eq_forward`, from the gradients of M with dropout (``d_md``) and of M (``d_m``),
    either None."""
    shape = qk.shape
    qk, dist = qk.detach().contiguous(), dist.detach().contiguous()
    mask, u, d_md, d_m = (_flat(t, shape) for t in (mask, u, d_md, d_m))
    md, de, dn = torch.empty_like(qk), torch.empty_like(qk), torch.empty_like(qk)
    LIBRARY.library().coda_eq_backward_f32(
        ptr(qk), ptr(dist), ptr(mask), ptr(u), ptr(d_md), ptr(d_m), ptr(md), ptr(de), ptr(dn),
        qk.numel(), e_scale, n_scale, gate_scale, p, torch.get_num_threads())
    return md, de, dn


# -- q.k, D and Eq. 1-6 in one pass over the L1 kernel's tiles (float32) ----------------------
def fused_forward(q: Tensor, k: Tensor, mask: Tensor | None, u: Tensor | None, p: float,
                  e_scale: float, n_scale: float, gate_scale: float,
                  need_m: bool = True) -> tuple[Tensor | None, Tensor]:
    """:func:`eq_forward` of :func:`products` (q (n,r,d), k (n,Lk,d)) in one pass: Eq. 1-6
    applied to each tile of q.k and D while it is in L1, the same results bit for bit."""
    q, k, _, _, n, r, d, lk, _ = _operands(q, k)
    shape = torch.Size((n, r, lk))
    mask, u = _flat(mask, shape), _flat(u, shape)
    md = q.new_empty(shape)
    m = md if u is None else (q.new_empty(shape) if need_m else None)
    if md.numel():
        with torch.profiler.record_function("coda_fused_forward"):
            LIBRARY.library().coda_fused_forward_f32(
                ptr(q), ptr(k), ptr(mask), ptr(u), ptr(None if m is md else m), ptr(md), n, r,
                lk, d, e_scale, n_scale, gate_scale, p, torch.get_num_threads())
    return m, md


def fused_backward(q: Tensor, k: Tensor, a: Tensor | None, b: Tensor | None,
                   mask: Tensor | None, u: Tensor | None, p: float, d_m: Tensor | None,
                   e_scale: float, n_scale: float, gate_scale: float,
                   need_md: bool = True) -> tuple[Tensor | None, Tensor, Tensor]:
    """:func:`eq_backward` of :func:`products` (q.k, D and d_md = a.b; a (n,r,d2),
    b (n,Lk,d2), or both None: no gradient of M with dropout) in one pass over the tiles:
    (M with dropout, or None without ``need_md``; dL/d(q.k); dL/dD), the same bits."""
    q, k, a, b, n, r, d, lk, d2 = _operands(q, k, a, b)
    shape = torch.Size((n, r, lk))
    mask, u, d_m = (_flat(t, shape) for t in (mask, u, d_m))
    md = q.new_empty(shape) if need_md else None
    de, dn = q.new_empty(shape), q.new_empty(shape)
    if de.numel():
        with torch.profiler.record_function("coda_fused_backward"):
            LIBRARY.library().coda_fused_backward_f32(
                ptr(q), ptr(k), ptr(a), ptr(b), ptr(mask), ptr(u), ptr(d_m), ptr(md), ptr(de),
                ptr(dn), n, r, lk, d, d2, e_scale, n_scale, gate_scale, p,
                torch.get_num_threads())
    return md, de, dn
