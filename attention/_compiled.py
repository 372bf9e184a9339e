"""torch.compile'd block kernels shared by the mechanisms (CoDA's L1 term, the density
matrix's pair sums): a broadcast expression over a few dimensions that inductor turns into
one vectorised C++ loop nest reducing in registers, never storing the broadcast.

``ATTNREPRO_COMPILE=0`` turns compiling off; without a working compiler a kernel warns once
and its caller takes its eager path.  Both paths are tested against each other.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

#: compile the block kernels with torch.compile (``ATTNREPRO_COMPILE=0``: run them eagerly)
COMPILE = os.environ.get("ATTNREPRO_COMPILE", "1") != "0"


#: inductor options of every block kernel.  ``cpp.dynamic_threads``: the generated loops are
#: always split over OpenMP's threads at run time.  Without it inductor writes a serial loop
#: nest when the shapes it compiles with are small (its size hints: dynamic=True compiles once
#: for all sizes), and its on-disk cache serves that serial kernel to every later process with
#: the same thread count whatever its sizes.  Measured: after ``python -m benchmarks.attention
#: --quick`` (d=8, L=8-16) had filled the cache, CoDA's forward + backward at L=512 took 248 ms
#: (2.27x SDPA) instead of about 200 ms, its two compiled kernels twice as long.
OPTIONS = {"cpp.dynamic_threads": True}


class Compiled:
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
                _cache_per_capability()
                self._compiled = torch.compile(self.fn, dynamic=True, options=OPTIONS)
            return self._compiled(*args)
        except Exception as err:
            if not isinstance(err, _compile_errors()):
                raise
            warnings.warn(f"attnrepro: torch.compile of {self.fn.__name__} failed, running it "
                          f"eagerly (slower): {err!r}", stacklevel=3)
            self.failed = True
            return None

    def __call__(self, *args):
        out = self.compiled(*args)
        return self.fn(*args) if out is None else out


def _cache_per_capability() -> None:
    """Inductor's kernel cache, one per CPU capability: its cache keys do not include
    ``ATEN_CPU_CAPABILITY``, so a graph compiled under AVX-512 was served from the cache to a
    process told to use AVX2 (torch's switch for running as another machine would).
    Measured: tests/attention/test_coda.py::test_compiled_kernels_match_the_paper under
    ATEN_CPU_CAPABILITY=avx2 ended in a fatal error, and the CoDA MLU smoke fit gave a NaN
    loss at step 0 (validation already NaN), on a cache filled by an AVX-512 run; each was
    fine with a cache of its own.

    Applies when ``TORCHINDUCTOR_CACHE_DIR`` is unset or holds inductor's default folder:
    inductor writes its default into the variable whenever it first asks for its folder
    (importing ``torch._dynamo``, as Lightning does, is enough), so "set to the default"
    cannot be told from "never set".  Any other value is the user's choice and kept.  Run
    when this module is imported and again before each first compile (:class:`Compiled`),
    so that the order in which a script imports Lightning and :mod:`attention` does not
    matter; inductor reads the variable each time it looks for a cached kernel."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default) != default:
        return
    capability = torch.backends.cpu.get_cpu_capability().lower()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}_{capability}"


_cache_per_capability()  # at import, and again before a first compile (Compiled.compiled)


def _compile_errors() -> tuple[type[Exception], ...]:
    import torch._dynamo.exc
    import torch._inductor.exc

    return (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError, OSError)


class PaddedKernel(Compiled):
    """A compiled broadcast-and-reduce kernel (inductor never materialises the broadcast);
    None when compiling is off or failed (the caller then takes its own eager path).

    ``dims`` names the dimensions of each argument and output (e.g. "nad,ndb->nab").  Every
    size is padded to at least 2 with zeros (each kernel is written so that zeros add nothing)
    and the results cut back, so that one graph per dtype serves every shape: dynamo would otherwise
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
