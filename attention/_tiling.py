"""What the recomputing kernels (:mod:`attention._coda_kernels`,
:mod:`attention._window_kernels`) share: tiles of a broadcast mask, and dropout masks
regenerated per tile from a seed, so neither is ever stored whole."""

from __future__ import annotations

import torch
from torch import Tensor


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
    if p <= 0:
        return None
    gen = torch.Generator(device=like.device)
    gen.manual_seed(seed + index)
    keep = torch.rand(shape, generator=gen, device=like.device, dtype=like.dtype) >= p
    return keep.to(like.dtype) / (1 - p)
