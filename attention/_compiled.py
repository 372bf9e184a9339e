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


#: the graphs one compiled kernel may keep (dynamo's ``recompile_limit`` while it runs; its
#: default is 8).  Sizes never make a new graph (dynamic shapes, sizes 1 padded to 2); kinds
#: of call do, each once: dropout's keep or none, CoDA's means per matrix, per query row or
#: none, a mask of the key or of every entry or none, tensors of training or of
#: ``torch.inference_mode`` (dynamo guards on their dispatch keys).  The CoDA MLU smoke fit
#: with ``gate=centered`` made 9 graphs of ``_forward_block`` (measured: the 9th hit the
#: default limit, so its test decoding ran the kernel eagerly, with dynamo's warning); the
#: kinds of every context together stay far below this.
KINDS_LIMIT = 32


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
            return self._run(*args)
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

    def _run(self, *args):
        """The compiled graph without duck sizing: dynamo would otherwise guard on every
        equality of two sizes it happened to see first (a decoder's q and k lengths equal at
        one step) and compile again when they differ; and with room for one graph per kind
        of call (:data:`KINDS_LIMIT`)."""
        from torch.fx.experimental import _config

        with _config.patch(use_duck_shape=False), \
                torch._dynamo.config.patch(recompile_limit=KINDS_LIMIT):
            return self._compiled(*args)


class TileKernel(Compiled):
    """A compiled element-wise kernel over tiles (n, r, Lk), one graph per kind of call
    whatever the sizes: the arguments at positions ``full`` have the tile's shape, every
    other tensor argument broadcasts against it (a key mask (n,1,Lk), means (n,1,1)).  Sizes
    1 of the tile are padded to 2 with zeros and the outputs (each of the tile's shape) cut
    back; padding is exact because the kernel is element-wise.  Without it dynamo would
    compile anew for a decoder step's single query and single key, and from the ninth graph
    on (its ``recompile_limit``) run the kernel eagerly.  Measured on the CoDA MLU smoke fit
    before this: 8 recompiles of ``_forward_block`` and the limit's warning at test time."""

    def __init__(self, fn: Callable[..., Tensor | tuple[Tensor, ...]], full: tuple[int, ...]):
        super().__init__(fn)
        self.full = full

    def __call__(self, *args):
        if not self.active():
            return self.fn(*args)
        shape = args[self.full[0]].shape
        widths = [p for size in reversed(shape) for p in (0, max(0, 2 - size))]
        padded = args if not any(widths) else tuple(
            _pad_like(a, shape, full=i in self.full) for i, a in enumerate(args))
        out = self.compiled(*padded)
        if out is None:  # compiling failed: the eager kernel on the arguments as given
            return self.fn(*args)
        if not any(widths):
            return out
        cut = tuple(slice(size) for size in shape)
        return (tuple(o[cut].contiguous() for o in out) if isinstance(out, tuple)
                else out[cut].contiguous())


def _pad_like(a, shape: torch.Size, full: bool):
    """``a`` padded with zeros as :class:`TileKernel` pads a tile of ``shape``: a tile's
    argument (``full``) in every dimension of size below 2, to 2; a broadcasting tensor only
    where the tile's size is 1 and its own is 1 as well, so that a key mask (n,1,Lk) of a
    single query and a mask of the tile's shape give one graph.  Anything else: as given."""
    if not isinstance(a, Tensor) or a.dim() != len(shape):
        return a
    widths = [p for i in reversed(range(len(shape))) for p in (
        0, max(0, 2 - shape[i]) if full else int(shape[i] == 1 and a.shape[i] == 1))]
    return F.pad(a, widths) if any(widths) else a


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
