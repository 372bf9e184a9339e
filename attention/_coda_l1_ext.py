"""CoDA's L1 kernels in C++ (:file:`attention/_coda_l1.cpp`), built once per machine.

The file has a plain C interface and includes no torch header, so it is compiled directly
with the C++ compiler (``$CXX`` or ``c++``; about a second; no ninja, no Python headers) into
torch's extension cache (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions/<py>_cpu``,
folder ``attnrepro_coda_l1``) and loaded with :mod:`ctypes` (which releases the GIL during
the calls).  The library's name carries a hash of the source, the flags and the compiler, so
an edit rebuilds it, and a shared cache holds one build per CPU capability.

Instruction set: no ``-march=native``.  The flags follow torch's own run-time CPU detection,
:func:`torch.backends.cpu.get_cpu_capability`: ``AVX512`` builds with ``-mavx512f -mavx512bw
-mavx512dq -mavx512vl -mavx2 -mfma`` (64-byte vectors), ``AVX2`` with ``-mavx2 -mfma`` (32
bytes), anything else (older x86, ARM) with the compiler's defaults (16 bytes: SSE2, NEON).
``ATEN_CPU_CAPABILITY=avx2`` (torch's own switch) therefore also selects the AVX2 build.

Used for CPU float32/float64 tensors only (the CoDA functions compute bfloat16 and float16
in float32, under autocast or not, so these kernels run for them too).  Off with
``ATTNREPRO_COMPILE=0`` (as every compiled kernel) or ``ATTNREPRO_CODA_CPP=0`` (this one
only: the torch.compile kernels then run); if the build or the load fails it warns once and
the caller takes its other path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

from attention import _compiled

SOURCE = Path(__file__).with_name("_coda_l1.cpp")
#: ``ATTNREPRO_CODA_CPP=0``: never use the C++ kernels (the torch.compile ones run instead)
ENABLED = os.environ.get("ATTNREPRO_CODA_CPP", "1") != "0"
_BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-ffp-contract=fast"]
_ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
_DTYPES = {torch.float32: "f32", torch.float64: "f64"}

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failed = False
#: seconds the last build took (None: loaded from the cache or not built)
build_seconds: float | None = None


def isa_flags() -> list[str]:
    """The instruction-set flags for this machine, from torch's run-time CPU detection."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        return []
    return list(_ISA_FLAGS.get(capability, []))


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def _cache_dir() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch.utils.cpp_extension import get_default_build_root

        root = os.path.join(get_default_build_root(),
                            f"py{sys.version_info.major}{sys.version_info.minor}_cpu")
    return Path(root) / "attnrepro_coda_l1"


def library_path(compiler: str, flags: list[str]) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             check=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(flags), version,
                                    platform.machine()]).encode()).hexdigest()[:16]
    return _cache_dir() / f"coda_l1_{key}.so"


def build(openmp: bool = True, isa: bool = True) -> Path:
    """Compile the library into the cache unless it is there; its path.  ``openmp``: with
    -fopenmp; ``isa``: with :func:`isa_flags`."""
    global build_seconds
    compiler = _compiler()
    if compiler is None:
        raise OSError("no C++ compiler ($CXX, c++ or g++) on PATH")
    flags = _BASE_FLAGS + (["-fopenmp"] if openmp else []) + (isa_flags() if isa else [])
    path = library_path(compiler, flags)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # compile to a private name, then rename: concurrent processes never load a partial file
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *flags, str(SOURCE), "-o", tmp], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise OSError(f"{compiler} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    build_seconds = time.perf_counter() - start
    return path


def _load() -> ctypes.CDLL:
    """The library with OpenMP (sharing torch's libgomp and its threads) and the CPU's
    vector instructions; failing that (a compiler without OpenMP or AVX-512 support), without
    OpenMP (std::thread), then without either."""
    error: OSError | None = None
    for openmp, isa in ((True, True), (False, True), (False, False)):
        try:
            lib = ctypes.CDLL(str(build(openmp, isa)))
            break
        except OSError as err:
            error = err
    else:
        raise error
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    for dt in _DTYPES.values():
        getattr(lib, f"coda_l1_forward_{dt}").argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr,
                                                         i64, i64, i64, i64, i64, c_int]
        getattr(lib, f"coda_l1_grads_{dt}").argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, i64, i64,
                                                       i64, i64, c_int]
    lib.coda_l1_vector_bytes.restype = c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None when off or the build failed (warned
    once)."""
    global _library, _failed
    if not (ENABLED and _compiled.COMPILE) or _failed:
        return None
    if _library is None:
        with _lock:
            if _library is None and not _failed:
                try:
                    _library = _load()
                except (OSError, subprocess.SubprocessError, AttributeError) as err:
                    _failed = True
                    warnings.warn(f"attnrepro: building the CoDA L1 kernels failed, using the "
                                  f"torch.compile/cdist path (slower): {err}", stacklevel=3)
                    return None
    return _library


def supports(*tensors: Tensor) -> bool:
    """Whether the C++ kernels take these tensors (CPU, float32/float64, no autograd graph
    needed) and are available."""
    t = tensors[0]
    return (t.device.type == "cpu" and t.dtype in _DTYPES
            and all(x.device == t.device and x.dtype == t.dtype for x in tensors)
            and library() is not None)


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


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
            getattr(library(), f"coda_l1_forward_{_DTYPES[q.dtype]}")(
                _ptr(q), _ptr(k), _ptr(dist), _ptr(dot), _ptr(a), _ptr(b), _ptr(dot2), n, r, lk,
                d, d2, torch.get_num_threads())
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
            getattr(library(), f"coda_l1_grads_{_DTYPES[q.dtype]}")(
                _ptr(w), _ptr(e), _ptr(q), _ptr(k), _ptr(grad_q), _ptr(acc), n, r, lk, d,
                torch.get_num_threads())
    else:
        grad_q.zero_()
    if grad_k is not None and not direct:
        grad_k.add_(acc)
    return grad_q
