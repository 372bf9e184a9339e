"""Structured attention's linear-chain CRF in C++ (:file:`attention/_crf_chain.cpp`), built once
per machine and loaded by :class:`attention._native.NativeLibrary` (cache folder
``attnrepro_crf_chain``).

:func:`chain` computes the segmentation CRF's marginals p(z_j = 1), or struct-attn's weights
lam * p / sum(p), of every chain (the last dimension of ``theta``) with a hand-written
backward pass (the expectation semiring: dL/dtheta and dL/dW in O(N) per chain, see the .cpp
file), where :func:`attention.structured.forward_backward` loops over positions in Python and
autograd records every step.  The two agree to rounding (tests/attention/test_structured.py
checks them against each other and against enumeration).

Used by :mod:`attention.structured` for CPU float32/float64 scores; off with
``ATTNREPRO_COMPILE=0`` (as every compiled kernel) or ``ATTNREPRO_CRF_CPP=0`` (this one only:
the log-space Python recursion then runs); if the build or the load fails it warns once and
that runs.  Not twice differentiable (the backward is not itself recorded).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from attention._native import DTYPES, NativeLibrary, ptr


def _declare(lib: ctypes.CDLL) -> None:
    i64, p, c_int, c_double = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_double
    for dt in DTYPES.values():
        forward = getattr(lib, f"crf_chain_forward_{dt}")
        forward.argtypes = [p, p, p, p, i64, i64, c_int, c_double, c_int]
        forward.restype = i64
        backward = getattr(lib, f"crf_chain_backward_{dt}")
        backward.argtypes = [p, p, p, p, p, p, i64, i64, c_int, c_double, c_int]
        backward.restype = i64


#: the library (``LIBRARY.enabled``: ``ATTNREPRO_CRF_CPP`` is not 0)
LIBRARY = NativeLibrary(Path(__file__).with_name("_crf_chain.cpp"), "crf_chain",
                        "ATTNREPRO_CRF_CPP", _declare, what="structured attention's C++ CRF",
                        fallback="the Python forward-backward")


def supports(theta: Tensor) -> bool:
    """Whether the C++ kernels take scores like ``theta`` (CPU, float32/float64) and are
    available."""
    return LIBRARY.supports(theta)


class OutOfRange(ArithmeticError):
    """Some chain's marginals are all below about 1e-290 (scores around -670 and lower): the
    caller takes the log-space recursion."""


def _operands(theta: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None, int, int]:
    theta = theta.detach().contiguous()
    n = theta.shape[-1]
    rows = theta.numel() // n if n else 0
    if mask is not None:
        mask = torch.broadcast_to(mask, theta.shape).contiguous()
    return theta, mask, rows, n


class _Chain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, theta: Tensor, transition: Tensor, mask: Tensor | None, normalise: bool,
                lam: float) -> Tensor:
        flat, mask_c, rows, n = _operands(theta, mask)
        w = transition.detach().to(torch.float64).contiguous()
        out = torch.empty_like(flat)
        if rows and n:
            bad = LIBRARY.function("crf_chain_forward", flat.dtype)(
                flat.data_ptr(), ptr(mask_c), w.data_ptr(), out.data_ptr(), rows, n,
                int(normalise), float(lam), torch.get_num_threads())
            if bad:
                raise OutOfRange(f"{bad} chain(s) with every marginal below 1e-290")
        else:
            out.zero_()
        ctx.save_for_backward(flat, w)
        ctx.mask, ctx.normalise, ctx.lam = mask_c, normalise, lam
        ctx.transition_dtype = transition.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        flat, w = ctx.saved_tensors
        n = flat.shape[-1]
        rows = flat.numel() // n if n else 0
        grad = grad.to(flat.dtype).contiguous()
        dtheta = torch.zeros_like(flat)
        dw = torch.zeros(4, dtype=torch.float64)
        if rows and n:
            LIBRARY.function("crf_chain_backward", flat.dtype)(
                flat.data_ptr(), ptr(ctx.mask), w.data_ptr(), grad.data_ptr(),
                dtheta.data_ptr(), dw.data_ptr(), rows, n, int(ctx.normalise), float(ctx.lam),
                torch.get_num_threads())
        return dtheta, dw.view(2, 2).to(ctx.transition_dtype), None, None, None


def chain(theta: Tensor, transition: Tensor, mask: Tensor | None, *, normalise: bool,
          lam: float = 1.0, fallback: Callable[[], Tensor]) -> Tensor:
    """p(z_j = 1) (``normalise`` False) or lam * p / sum(p) over each chain's real positions
    (True) of the segmentation CRF with unary scores ``theta`` (..., N), transition (2, 2) and
    mask (bool, broadcastable to theta, True = in the chain; None: all); exactly 0 at masked
    positions and for chains without a real position.  ``fallback()`` gives the same from the
    log-space recursion, for chains out of this kernel's range."""
    if transition.shape != (2, 2):
        raise ValueError(f"the segmentation CRF needs a (2, 2) transition matrix, got "
                         f"{tuple(transition.shape)}")
    try:
        return _Chain.apply(theta, transition, mask, normalise, lam)
    except OutOfRange:
        return fallback()
