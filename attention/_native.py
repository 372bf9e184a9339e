"""The project's C++ kernels (:file:`attention/_coda_l1.cpp`,
:file:`attention/_window_rows.cpp`, :file:`attention/_crf_chain.cpp`,
:file:`attention/_additive_pairs.cpp`), each built once per
machine by one :class:`NativeLibrary`.

Each file has a plain C interface and includes no torch header, so it is compiled directly
with the C++ compiler (``$CXX`` or ``c++``; a second or two; no ninja, no Python headers) into
torch's extension cache (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions/<py>_cpu``,
folder ``attnrepro_<name>``) and loaded with :mod:`ctypes` (which releases the GIL during
the calls).  The library's name carries a hash of the source, the headers beside it
(:file:`attention/_simd.h`: vectors and threads, shared by all), the flags and the compiler,
so an edit rebuilds it, and a shared cache holds one build per CPU capability.

Instruction set: no ``-march=native``.  The flags follow torch's own run-time CPU detection,
:func:`torch.backends.cpu.get_cpu_capability`: ``AVX512`` builds with ``-mavx512f -mavx512bw
-mavx512dq -mavx512vl -mavx2 -mfma`` (64-byte vectors), ``AVX2`` with ``-mavx2 -mfma`` (32
bytes), anything else (older x86, ARM) with the compiler's defaults (16 bytes: SSE2, NEON).
``ATEN_CPU_CAPABILITY=avx2`` (torch's own switch) therefore also selects the AVX2 build.

Loading tries OpenMP (sharing torch's libgomp and its threads) with those flags, then without
OpenMP (std::thread), then without either.  Every library is off with ``ATTNREPRO_COMPILE=0``
(as every compiled kernel) and each with its own variable (``ATTNREPRO_CODA_CPP=0``,
``ATTNREPRO_WINDOW_CPP=0``, ``ATTNREPRO_CRF_CPP=0``, ``ATTNREPRO_ADDITIVE_CPP=0``); if the
build or the load fails it warns once and its callers take their other path.  The kernels take
CPU float32/float64 tensors only.
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
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from attention import _compiled

_BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-ffp-contract=fast"]
_ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
#: the dtypes the kernels take, and their entry points' suffixes
DTYPES = {torch.float32: "f32", torch.float64: "f64"}


def isa_flags() -> list[str]:
    """The instruction-set flags for this machine, from torch's run-time CPU detection."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        return []
    return list(_ISA_FLAGS.get(capability, []))


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


class NativeLibrary:
    """One C++ source built into the extension cache and loaded on first use.

    ``name``: the library's name (``attnrepro_<name>`` its cache folder, ``<name>_<hash>.so``
    its file); ``env``: the variable that switches it off with ``0``; ``declare(lib)`` sets
    the entry points' argtypes; ``what`` and ``fallback`` name the kernels and the callers'
    other path in the warning of a failed build."""

    def __init__(self, source: Path, name: str, env: str,
                 declare: Callable[[ctypes.CDLL], None], what: str, fallback: str):
        self.source, self.name, self.declare = source, name, declare
        self.what, self.fallback = what, fallback
        #: ``<env>=0``: never use these kernels (the callers' other path runs instead)
        self.enabled = os.environ.get(env, "1") != "0"
        #: seconds the last build took (None: loaded from the cache or not built)
        self.build_seconds: float | None = None
        self._lock = threading.Lock()
        self._library: ctypes.CDLL | None = None
        self._failed = False

    def cache_dir(self) -> Path:
        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        if root is None:
            from torch.utils.cpp_extension import get_default_build_root

            root = os.path.join(get_default_build_root(),
                                f"py{sys.version_info.major}{sys.version_info.minor}_cpu")
        return Path(root) / f"attnrepro_{self.name}"

    def library_path(self, cxx: str, flags: list[str]) -> Path:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                                 check=True).stdout
        headers = [h.read_text() for h in sorted(self.source.parent.glob("_*.h"))]
        key = hashlib.sha256("\0".join([self.source.read_text(), *headers, " ".join(flags),
                                        version, platform.machine()]).encode()).hexdigest()[:16]
        return self.cache_dir() / f"{self.name}_{key}.so"

    def build(self, openmp: bool = True, isa: bool = True) -> Path:
        """Compile the library into the cache unless it is there; its path.  ``openmp``: with
        -fopenmp; ``isa``: with :func:`isa_flags`."""
        cxx = compiler()
        if cxx is None:
            raise OSError("no C++ compiler ($CXX, c++ or g++) on PATH")
        flags = _BASE_FLAGS + (["-fopenmp"] if openmp else []) + (isa_flags() if isa else [])
        path = self.library_path(cxx, flags)
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        # compile to a private name, then rename: concurrent processes never load a partial file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        try:
            proc = subprocess.run([cxx, *flags, str(self.source), "-o", tmp],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise OSError(f"{cxx} failed: {proc.stderr.strip()[-2000:]}")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.build_seconds = time.perf_counter() - start
        return path

    def _load(self) -> ctypes.CDLL:
        """The library with OpenMP (sharing torch's libgomp and its threads) and the CPU's
        vector instructions; failing that (a compiler without OpenMP or AVX-512 support),
        without OpenMP (std::thread), then without either."""
        error: OSError | None = None
        for openmp, isa in ((True, True), (False, True), (False, False)):
            try:
                lib = ctypes.CDLL(str(self.build(openmp, isa)))
                break
            except OSError as err:
                error = err
        else:
            raise error
        self.declare(lib)
        return lib

    def library(self) -> ctypes.CDLL | None:
        """The loaded library, built on first use; None when off or the build failed (warned
        once)."""
        if not (self.enabled and _compiled.COMPILE) or self._failed:
            return None
        if self._library is None:
            with self._lock:
                if self._library is None and not self._failed:
                    try:
                        self._library = self._load()
                    except (OSError, subprocess.SubprocessError, AttributeError) as err:
                        self._failed = True
                        warnings.warn(f"attnrepro: building {self.what} failed, using "
                                      f"{self.fallback} (slower): {err}", stacklevel=3)
                        return None
        return self._library

    def supports(self, *tensors: Tensor) -> bool:
        """Whether the kernels take these tensors (CPU, float32/float64, one dtype) and are
        available."""
        t = tensors[0]
        return (t.device.type == "cpu" and t.dtype in DTYPES
                and all(x.device == t.device and x.dtype == t.dtype for x in tensors)
                and self.library() is not None)

    def function(self, stem: str, dtype: torch.dtype):
        """The entry point ``<stem>_<f32|f64>`` for ``dtype``."""
        return getattr(self.library(), f"{stem}_{DTYPES[dtype]}")


def ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
