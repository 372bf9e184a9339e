"""CoDA's L1 kernels in C++ (:file:`attention/_coda_l1.cpp`), built once per machine and loaded
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


#: the library (``LIBRARY.enabled``: ``ATTNREPRO_CODA_CPP`` is not 0)
LIBRARY = NativeLibrary(Path(__file__).with_name("_coda_l1.cpp"), "coda_l1",
                        "ATTNREPRO_CODA_CPP", _declare, what="the CoDA L1 kernels",
                        fallback="the torch.compile/cdist path")
#: the loaded library, built on first use; None when off or the build failed (warned once)
library = LIBRARY.library
#: whether the C++ kernels take these tensors (CPU, float32/float64) and are available
supports = LIBRARY.supports


def _forward(q: Tensor, k: Tensor, with_dot: bool, a: Tensor | None = None,
             b: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    q, k = q.detach().contiguous(), k.detach().contiguous()
    if a is not None:
        a, b = a.detach().contiguous(), b.detach().contiguous()
    n, r, d = q.shape
    lk = k.shape[1]
    d2 = 0 if a is None else a.shape[2]
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
