"""What the recomputing kernels (:mod:`attention._coda_kernels`,
:mod:`attention._window_kernels`) share: tiles of a broadcast mask, and dropout masks
regenerated per tile from a seed, so neither is ever stored whole; and how their autograd
functions take bfloat16 and float16 (autocast or a model cast to them): in float32."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
from torch import Tensor

#: the dtypes the kernels take in float32 (:func:`apply_float32`)
_LOW_PRECISION = (torch.bfloat16, torch.float16)


class MaskTiles:
    """Tiles of a mask broadcastable to (*batch, Lq, Lk) over N = prod(batch) flattened
    matrices, each tile (matrices, rows, Lk) contiguous (the expanded mask is never copied)."""

    def __init__(self, mask: Tensor | None, batch: tuple[int, ...], n: int, lq: int, lk: int):
        self.mask, self.batch, self.n, self.lq, self.lk = mask, batch, n, lq, lk
        if mask is not None:
            own = (1,) * (len(batch) + 2 - mask.dim()) + tuple(mask.shape)
            #: the mask's own matrices, and the one each of the N flattened matrices uses
            self.flat = mask.reshape(-1, *own[-2:])
            self.index = torch.arange(self.flat.shape[0], device=mask.device).view(
                own[:-2]).expand(batch).reshape(n)
            self.identity = self.flat.shape[0] == n

    def __call__(self, matrices: slice, rows: slice) -> Tensor | None:
        """The mask of those matrices and query rows (matrices, rows, Lk); None without one."""
        if self.mask is None:
            return None
        tile = self.flat if self.flat.shape[1] == 1 else self.flat[:, rows]
        tile = tile[matrices] if self.identity else tile.index_select(0, self.index[matrices])
        return tile.expand(matrices.stop - matrices.start, rows.stop - rows.start,
                           self.lk).contiguous()

    def count(self, like: Tensor) -> Tensor | float:
        """Valid entries per matrix (N,1,1), at least 1 (an empty matrix has mean 0)."""
        if self.mask is None:
            return float(self.lq * self.lk)
        full = self.mask.expand(*self.batch, self.lq, self.lk)
        return full.sum((-2, -1)).reshape(self.n, 1, 1).clamp(min=1).to(like.dtype)


def dropout_keep(like: Tensor, shape: tuple[int, ...], p: float, seed: int,
                 index: int) -> Tensor | None:
    """Dropout factors of tile ``index`` (0 or 1/(1-p)), regenerated from the seed in the
    backward pass instead of stored; None without dropout."""
    return keep_factors(dropout_uniform(like, shape, p, seed, index), p)


def dropout_uniform(like: Tensor, shape: tuple[int, ...], p: float, seed: int,
                    index: int) -> Tensor | None:
    """The uniforms behind :func:`dropout_keep`'s factors of tile ``index`` (kept where at
    least ``p``), for kernels that apply the dropout themselves; None without dropout."""
    if p <= 0:
        return None
    gen = torch.Generator(device=like.device)
    gen.manual_seed(seed + index)
    return torch.rand(shape, generator=gen, device=like.device, dtype=like.dtype)


def keep_factors(u: Tensor | None, p: float) -> Tensor | None:
    """Dropout factors (0 or 1/(1-p)) from :func:`dropout_uniform`'s uniforms."""
    return None if u is None else (u >= p).to(u.dtype) / (1 - p)


# -- low precision -----------------------------------------------------------------------
# The kernels accumulate into preallocated tensors in place (baddbmm_, out=), mix their inputs
# with float32 parameters (the window's boundary weights), call C++ kernels built for float32
# and float64 only, and take long sums (the L1 term over d, the window's cumulative sums over
# the keys) that bfloat16's 8-bit mantissa would ruin.  Under autocast their inputs arrive in
# mixed dtypes (bf16 projections beside float32 parameters and eager float32 ops such as
# cdist), which crashed them; in a model cast to bfloat16, torch.cdist (CoDA's eager path)
# has no bfloat16 kernel.  So they run in float32: under autocast as its own float32 ops
# (softmax, cdist) do, autocast off and float32 out; otherwise returning the inputs' dtype.
def apply_float32(function: type[torch.autograd.Function], *args):
    """``function.apply(*args)`` with its bfloat16/float16 tensor arguments cast to float32
    (outside the function, so autograd returns their gradients in their own dtype) and
    autocast off while it runs.  Its outputs are float32 under autocast, else cast back to
    the low-precision dtype of the arguments.  Its backward must be
    :func:`without_autocast`."""
    tensors = [a for a in args if torch.is_tensor(a)]
    devices = {t.device.type for t in tensors}
    autocast = any(torch.is_autocast_enabled(device) for device in devices)
    low = [t.dtype for t in tensors if t.dtype in _LOW_PRECISION]
    if not autocast and not low:
        return function.apply(*args)
    args = tuple(a.float() if torch.is_tensor(a) and a.dtype in _LOW_PRECISION else a
                 for a in args)
    with _autocast_off(devices):
        out = function.apply(*args)
    if autocast:
        return out
    if torch.is_tensor(out):
        return out.to(low[0])
    return type(out)(None if o is None else o.to(low[0]) for o in out)


def without_autocast(backward: Callable) -> Callable:
    """A kernel function's ``backward`` run with autocast off: the autograd engine runs it
    under the autocast state of the code that calls ``.backward()``, which may be inside an
    autocast region, while the saved tensors are float32 (:func:`apply_float32`)."""

    @functools.wraps(backward)
    def run(ctx, *grads):
        devices = {g.device.type for g in grads if torch.is_tensor(g)} or {"cpu"}
        with _autocast_off(devices):
            return backward(ctx, *grads)

    return run


def _autocast_off(devices: set[str]):
    stack = contextlib.ExitStack()
    for device in devices:
        stack.enter_context(torch.autocast(device, enabled=False))
    return stack
