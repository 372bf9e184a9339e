"""The differentiable window's row kernels in C++ (:file:`attention/_window_rows.cpp`), built once
per machine and loaded by :class:`attention._native.NativeLibrary` (cache folder
``attnrepro_window_rows``).

Each call takes a tile's score blocks, (n, r, Lk) tensors whose keys are contiguous (views
with any matrix and row strides: the three blocks of one stacked matmul, a tile of the
returned weights) and turns each row into the MW or AW weights (Eq. 7-17), or back into the
score gradients, in a few passes while the row is in cache; see the .cpp file.  Outputs may
share memory with the inputs they replace (forward: ``a`` and ``ad`` with any score block;
backward: ``a`` with ``da``, ``dsg``, ``dsl``, ``dsr``, ``dsc`` with ``sg``, ``sl``, ``sr``,
``sc``), so the backward pass writes its gradients over the score blocks.

Used by :mod:`attention._window_kernels` for CPU float32/float64 tiles; off with
``ATTNREPRO_COMPILE=0`` (as every compiled kernel) or ``ATTNREPRO_WINDOW_CPP=0`` (this one
only: the torch.compile'd expressions of _window_kernels.py then run); if the build or the load
fails it warns once and those run.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from attention._native import DTYPES, NativeLibrary, ptr

#: the argument slots of the C interface (enum Slot of the .cpp file), in order
SLOTS = ("sg", "sl", "sr", "sc", "mask", "keep", "dkeep", "da", "a", "ad", "dsg", "dsl", "dsr",
         "dsc")


class _Arg(ctypes.Structure):
    """struct Arg: a block's data and its matrix and row strides, in elements."""

    _fields_ = [("data", ctypes.c_void_p), ("matrix_stride", ctypes.c_int64),
                ("row_stride", ctypes.c_int64)]


def _declare(lib: ctypes.CDLL) -> None:
    i64, p, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    for dt in DTYPES.values():
        for stem in ("window_rows_forward", "window_rows_backward"):
            getattr(lib, f"{stem}_{dt}").argtypes = [ctypes.POINTER(_Arg), p, p, i64, i64, i64,
                                                     c_int]
    lib.window_rows_vector_bytes.restype = c_int


#: the library (``LIBRARY.enabled``: ``ATTNREPRO_WINDOW_CPP`` is not 0)
LIBRARY = NativeLibrary(Path(__file__).with_name("_window_rows.cpp"), "window_rows",
                        "ATTNREPRO_WINDOW_CPP", _declare, what="the window's C++ row kernels",
                        fallback="the torch.compile'd kernels")


def supports(t: Tensor) -> bool:
    """Whether the C++ kernels take the score blocks like ``t`` (CPU, float32/float64) and are
    available."""
    return LIBRARY.supports(t)


_ARGS = _Arg * len(SLOTS)
_SLOT = {name: index for index, name in enumerate(SLOTS)}


def _args(blocks: dict[str, Tensor | None], shape: tuple[int, int, int], dtype: torch.dtype):
    args = _ARGS()
    for name, t in blocks.items():
        if t is None:
            continue
        stride = t.stride()
        want = torch.bool if name == "mask" else dtype
        if t.dtype != want or t.shape != shape or (shape[2] > 1 and stride[2] != 1):
            raise ValueError(f"window rows: {name} must be a {want} block of shape {shape} with "
                             f"contiguous keys, got {t.dtype} {tuple(t.shape)} strides {stride}")
        args[_SLOT[name]] = _Arg(t.data_ptr(), stride[0], stride[1])
    return args


def _call(stem: str, blocks: dict[str, Tensor | None], start: Tensor | None,
          end: Tensor | None) -> None:
    sg = blocks["sg"]
    n, r, lk = sg.shape
    if not sg.numel():
        return
    if start is not None:
        start, end = start.contiguous(), end.contiguous()
        if start.dtype != torch.int64 or end.dtype != torch.int64:
            raise ValueError("window rows: start and end must be int64")
    args = _args(blocks, (n, r, lk), sg.dtype)
    call = LIBRARY.function(stem, sg.dtype)
    if not torch.autograd._profiler_enabled():  # (a record_function costs ~6 us: small tiles)
        call(args, ptr(start), ptr(end), n, r, lk, torch.get_num_threads())
        return
    with torch.profiler.record_function(stem):
        call(args, ptr(start), ptr(end), n, r, lk, torch.get_num_threads())


def forward(sg: Tensor, sl: Tensor, sr: Tensor, sc: Tensor | None, mask: Tensor | None,
            start: Tensor | None, end: Tensor | None, *, a: Tensor | None = None,
            ad: Tensor | None = None, keep: Tensor | None = None) -> None:
    """The weights of a tile from its (already scaled) global, left, right and, for AW (``sc``
    given), local scores: A written into ``a`` and A * ``keep`` (the dropout factors) into
    ``ad``, each unless None.  ``mask`` (bool, True = attend), ``start``/``end`` (int64 (Lk),
    each key's segment) as :func:`attention._window_kernels.aw_forward`."""
    if ad is not None and keep is None:
        raise ValueError("window rows: ad needs keep")
    _call("window_rows_forward", dict(sg=sg, sl=sl, sr=sr, sc=sc, mask=mask, keep=keep, a=a,
                                      ad=ad), start, end)


def backward(sg: Tensor, sl: Tensor, sr: Tensor, sc: Tensor | None, mask: Tensor | None,
             start: Tensor | None, end: Tensor | None, da: Tensor, *, a: Tensor | None,
             dsg: Tensor, dsl: Tensor, dsr: Tensor, dsc: Tensor | None = None,
             keep: Tensor | None = None, dkeep: Tensor | None = None) -> None:
    """From dL/dA (``da``, times ``dkeep`` unless None): dL/d the global, left, right (and, for
    AW, local) scores into ``dsg``, ``dsl``, ``dsr`` (``dsc``), and A (times ``keep`` unless
    None) into ``a`` (unless None), as :func:`attention._window_kernels.aw_backward` /
    ``mw_backward``."""
    if (sc is None) != (dsc is None):
        raise ValueError("window rows: AW takes sc and dsc, MW neither")
    _call("window_rows_backward", dict(sg=sg, sl=sl, sr=sr, sc=sc, mask=mask, keep=keep,
                                       dkeep=dkeep, da=da, a=a, dsg=dsg, dsl=dsl, dsr=dsr,
                                       dsc=dsc), start, end)
