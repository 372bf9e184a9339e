"""What this CPU achieves at its best, measured in the process that measures the work compared
with it: probes that take turns with the cases (:func:`benchmarks.take_turns`), so a loaded
machine slows the probe as it slows the cases and the ratio between them holds.

- :func:`matmul_probe`: one (n x n) @ (n x n) matrix product of a dtype (float32: MKL's
  AVX-512 FMA kernels; bfloat16: oneDNN, on AMX tiles where the CPU has them), its
  floating-point operations 2 n^3: the matrix-product peak of the model FLOPs utilisation
  (:mod:`benchmarks.model_cost` ``--mfu``) and of CoDA's floor (:mod:`benchmarks.floor`).
- :func:`rate`: operations per second of a probe's (or a part's) summed times.

Peaks here are achieved rates, not datasheet numbers: a large float32 product reaches
80-95% of the FMA units' nominal rate on one core, and the shares of the machine that other
processes take are in both the probe's times and the cases'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch


class Probe:
    """A timed kernel: ``step()`` runs it once and returns its seconds; ``ops`` is the work of
    one run (floating-point operations, or whatever unit its caller counts)."""

    def __init__(self, fn: Callable[[], object], ops: float, what: str):
        self.fn, self.ops, self.what = fn, ops, what

    def step(self, *_ignored) -> float:
        start = time.perf_counter()
        self.fn()
        return time.perf_counter() - start


def matmul_probe(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 1) -> Probe:
    """``repeats`` products of two (n, n) matrices of ``dtype`` (2 n^3 FLOPs each)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    out = torch.empty(n, n, dtype=dtype)

    def run():
        for _ in range(repeats):
            torch.mm(a, b, out=out)

    name = str(dtype).removeprefix("torch.")
    return Probe(run, 2.0 * n**3 * repeats, f"{n}x{n}x{n} {name} matmul x{repeats}")


def rate(ops: float, times: Sequence[float]) -> float:
    """Operations per second over the summed times (each time one run of ``ops``)."""
    return ops * len(times) / sum(times)
