"""Additive attention's scores in C++ (:file:`attention/_additive_pairs.cpp`), built once per
machine and loaded by :class:`attention._native.NativeLibrary` (cache folder
``attnrepro_additive_pairs``).

:func:`scores` computes u . tanh(wq_i + vk_j) (Eq. 5 of the attention-density-matrix paper)
for every pair with a hand-written backward pass, never forming the (..., Lq, Lk, A) tanh
tensor that :func:`attention.additive.additive_scores` otherwise builds in checkpointed blocks
of query rows (its other path; the two agree to rounding: tests/attention/test_additive.py).
Memory: the scores only; time: the tanh is computed twice (forward, and again in the backward
pass), as the checkpointed blocks do, but in registers.

Used by :func:`attention.additive.additive_scores` for CPU float32/float64 operands, so by
``additive`` in every context and by ``structured``'s and ``density``'s additive scores; off
with ``ATTNREPRO_COMPILE=0`` (as every compiled kernel) or ``ATTNREPRO_ADDITIVE_CPP=0`` (this
one only); if the build or the load fails it warns once and the blocked path runs.  Not twice
differentiable (the backward is not itself recorded).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from attention._native import DTYPES, NativeLibrary


def _declare(lib: ctypes.CDLL) -> None:
    i64, p, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    for dt in DTYPES.values():
        forward = getattr(lib, f"additive_forward_{dt}")
        forward.argtypes = [p, p, p, p, i64, i64, i64, i64, c_int]
        forward.restype = None
        backward = getattr(lib, f"additive_backward_{dt}")
        backward.argtypes = [p, p, p, p, p, p, p, i64, i64, i64, i64, c_int]
        backward.restype = None


#: the library (``LIBRARY.enabled``: ``ATTNREPRO_ADDITIVE_CPP`` is not 0)
LIBRARY = NativeLibrary(Path(__file__).with_name("_additive_pairs.cpp"), "additive_pairs",
                        "ATTNREPRO_ADDITIVE_CPP", _declare, what="additive attention's C++ scores",
                        fallback="the blocked tanh tensor")


def supports(wq: Tensor, vk: Tensor, u: Tensor) -> bool:
    """Whether the C++ kernels take these operands (CPU, one dtype of float32/float64, no empty
    dimension) and are available."""
    return min(wq.shape[-2:].numel(), vk.shape[-2:].numel(), u.numel()) > 0 and \
        LIBRARY.supports(wq, vk, u)


class _Scores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wq: Tensor, vk: Tensor, u: Tensor) -> Tensor:
        batch = torch.broadcast_shapes(wq.shape[:-2], vk.shape[:-2], u.shape[:-1])
        (lq, a), lk = wq.shape[-2:], vk.shape[-2]
        q = wq.detach().expand(*batch, lq, a).contiguous()
        kt = vk.detach().expand(*batch, lk, a).transpose(-1, -2).contiguous()  # (..., A, Lk)
        uu = u.detach().expand(*batch, a).contiguous()
        rows = q.numel() // (lq * a)
        out = torch.empty(*batch, lq, lk, dtype=q.dtype)
        if rows:
            LIBRARY.function("additive_forward", q.dtype)(
                q.data_ptr(), kt.data_ptr(), uu.data_ptr(), out.data_ptr(), rows, lq, lk, a,
                torch.get_num_threads())
        ctx.save_for_backward(q, kt, uu)
        ctx.shapes = wq.shape, vk.shape, u.shape
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        q, kt, uu = ctx.saved_tensors
        wq_shape, vk_shape, u_shape = ctx.shapes
        (lq, a), lk = q.shape[-2:], kt.shape[-1]
        rows = q.numel() // (lq * a)
        grad = grad.to(q.dtype).contiguous()
        dq = torch.empty_like(q)
        dkt = torch.zeros_like(kt)
        du = torch.zeros(uu.shape, dtype=torch.float64)
        if rows:
            LIBRARY.function("additive_backward", q.dtype)(
                q.data_ptr(), kt.data_ptr(), uu.data_ptr(), grad.data_ptr(), dq.data_ptr(),
                dkt.data_ptr(), du.data_ptr(), rows, lq, lk, a, torch.get_num_threads())
        return (dq.sum_to_size(wq_shape), dkt.transpose(-1, -2).sum_to_size(vk_shape),
                du.to(q.dtype).sum_to_size(u_shape))


def scores(wq: Tensor, vk: Tensor, u: Tensor) -> Tensor:
    """u . tanh(wq_i + vk_j) for wq (..., Lq, A), vk (..., Lk, A) and u (..., A) (batch
    dimensions broadcast, e.g. u (H, A), one per head) -> (..., Lq, Lk); check
    :func:`supports` first."""
    return _Scores.apply(wq, vk, u)
