"""The attention density matrix (ADM): quantum statistics-inspired attention (docs/papers.md).

At decoder step i over source encodings h_1..h_N the pseudo density matrix Psi_i (N x N,
Eq. 6) has the baseline scores on its diagonal and pair scores off it:

    [Psi_i]_(k,k) = alpha_ik = u^T tanh(W s_i + V h_k + b)          (Eq. 5, Bahdanau)
    [Psi_i]_(j,k) = [M_i]_(j,k),  j != k
    L_(j,k) = tanh(h_j + h_k)                                      (Eq. 9, D-dim)
    MQT:  M_i = w_s * (L s_i)            w_s a scalar             (Eq. 10)
    AQT:  M_i = tanh(L + s_i) w_s        w_s a vector of size D   (Eq. 11)
    omega_i = softmax_k( mean_j [Psi_i]_(j,k) ),  c_i = H omega_i  (Eq. 8)

Padding: j and k run over the real source positions only; padded k get exactly 0 weight.
So the logit of a real k is (alpha_ik + sum_{j real, j != k} M_i[j,k]) / n_real.

Efficiency.  MQT: sum_{j != k} M_i[j,k] = w_s * s_i . P_k with
P_k = sum_{j real, j != k} tanh(h_j + h_k) (:func:`pair_encoding_sum`), computed once per
source in ``precompute``; a decoder step then costs O(N * D) like ordinary attention.  P is
computed by a compiled kernel that stores nothing of size N^2 D, or (no compiler, or |h|
beyond ``EXP_RANGE``) eagerly in blocks of k, so neither pass holds more than
``max(block_elements, B * N * D)`` elements of the (B, N, N, D) tensor L.
AQT has no shortcut (O(T * N^2 * D) work): :func:`aqt_offdiagonal` makes tanh(L) and
exp(2 tanh(L)) once per call and sums w_s . tanh(L + s_i) = w_s . (1 - 2 / (1 + e^2L e^2s_i))
with compiled kernels that never store the T x N^2 x D terms (B=32, T=N=50, D=256, one
thread: 3.9 s forward+backward against 83 s eagerly); without a compiler, or beyond
``AQT_COMPILED_ELEMENTS``, it loops over blocks of (decoder step, source row j) pairs, each
holding at most ``max(block_elements, B * N * D)`` elements of tanh(L + s_i), recomputed in
the backward pass.

h and s must share the dimension D: the decoder projects s when the dimensions differ.
``DensityDecoder.density_matrix`` returns Psi_i itself for one decoder step (heat maps).
Multi-head attention (per head, keys as h, queries as s, scaled dot product as the diagonal):
MQT only without causal masking, because with a causal mask the rows j averaged over depend
on the query and the P_k shortcut no longer holds (:class:`UnsupportedContext`); AQT handles
any per-query mask exactly.  Alignment: both directions, the same way.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from attention._compiled import PaddedKernel
from attention._tiling import apply_float32, without_autocast
from attention.additive import (
    BLOCK_ELEMENTS,
    AdditiveScore,
    align,
    checkpointed,
    row_blocks,
    rows_per_block,
)
from attention.base import (
    AlignmentCore,
    DecoderCore,
    Mechanism,
    MultiHeadCore,
    UnsupportedContext,
    query_projection,
)
from attention.masking import attention_mask, check_mask, masked_softmax, pair_mask

SCHEMES = ("mqt", "aqt")


def _not_diagonal(rows: slice, like: Tensor) -> Tensor:
    """(c, N) in the dtype of ``like`` (..., N, D): 1 where the row j (in ``rows``) is not the
    column k."""
    n = like.shape[-2]
    j = torch.arange(rows.start, rows.stop, device=like.device)
    return (j[:, None] != torch.arange(n, device=like.device)[None, :]).to(like.dtype)


# -- Eq. 9 summed over rows: the MQT shortcut -------------------------------------------------
# The compiled path uses tanh(a + b) = 1 - 2 / (1 + e^2a e^2b): with u = exp(2h) computed once,
# each of the N^2 D pairs costs a multiply, an add and a division instead of a tanh (measured
# ~60x faster than the eager blocked tanh at B=32, N=50, D=256, forward and backward), and
# 1 - tanh^2 = 4 r (1 - r) with r = 1 / (1 + e^2a e^2b).  exp(2h) stays finite only for |h| up
# to ``EXP_RANGE``; beyond it, and without a compiler, the eager blocked tanh path is taken.
# bfloat16 and float16 (autocast, or a model cast to them) are computed in float32 by the same
# kernels (:func:`attention._tiling.apply_float32`): exp(2h) overflows bfloat16 as early as
# float32 but float16 at |h| > 5.5, the sums over N rows of N^2 D terms need more than 8 bits
# of mantissa, and the eager fallback the dtype check used to send them to was 2x (MQT) and
# 7x (AQT) slower than float32's compiled kernels (B=32, N=50, D=256, forward + backward).
EXP_RANGE = {torch.float32: 40.0, torch.float64: 300.0}
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the exp-identity kernels compute tensors of ``dtype`` in."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _pair_sum_block(u_k: Tensor, u: Tensor, weight: Tensor) -> Tensor:
    """sum_j weight[k, j] tanh(h_j + h_k) from u = exp(2h): u_k (B,c,D), u (B,N,D),
    weight (B,c,N) -> (B,c,D).  Zero padding adds nothing (its weights are 0)."""
    t = 1 - 2 / (1 + u_k.unsqueeze(2) * u.unsqueeze(1))  # L_(j,k)  (B,c,N,D)
    return (weight.unsqueeze(-1) * t).sum(2)


def _pair_sum_grad_block(u_m: Tensor, u: Tensor, w_mj: Tensor, w_jm: Tensor, g_m: Tensor,
                         g: Tensor) -> Tensor:
    """The gradient of sum_k g_k . P_k with respect to h_m (B,c,D):
    sum_j (1 - tanh^2(h_m + h_j)) (weight[m, j] g_m + weight[j, m] g_j); w_mj and w_jm (B,c,N)."""
    r = 1 / (1 + u_m.unsqueeze(2) * u.unsqueeze(1))  # (B,c,N,D)
    both = w_mj.unsqueeze(-1) * g_m.unsqueeze(2) + w_jm.unsqueeze(-1) * g.unsqueeze(1)
    return (4 * r * (1 - r) * both).sum(2)


_pair_sum = PaddedKernel(_pair_sum_block, "bkd,bnd,bkn->bkd")
_pair_sum_grad = PaddedKernel(_pair_sum_grad_block, "bkd,bnd,bkn,bkn,bkd,bnd->bkd")


class _CompiledPairSum(torch.autograd.Function):
    """P = pair sums of h (B,N,D) with weight (B,N,N) [k, j], by the compiled kernels; nothing
    of size B N^2 D is stored.  If compiling fails in this very call (it warned), the eager
    blocked path computes the same thing."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor) -> Tensor:
        u = torch.exp(2 * h)
        ctx.save_for_backward(h, u, weight)
        out = _pair_sum(u, u, weight)
        return _pair_tanh_sum(h, weight, BLOCK_ELEMENTS) if out is None else out

    @staticmethod
    @without_autocast
    @once_differentiable
    def backward(ctx, grad: Tensor):
        h, u, weight = ctx.saved_tensors
        grad = grad.contiguous()
        out = _pair_sum_grad(u, u, weight, weight.transpose(1, 2), grad, grad)
        if out is None:
            with torch.enable_grad():
                x = h.detach().requires_grad_()
                (out,) = torch.autograd.grad(_pair_tanh_sum(x, weight, BLOCK_ELEMENTS), x, grad)
        return out, None


def _pair_tanh_block(h_k: Tensor, h: Tensor, weight: Tensor) -> Tensor:
    pair = torch.tanh(h_k.unsqueeze(-2) + h.unsqueeze(-3))  # L_(j,k), k in block  (B,c,N,D)
    return (weight.unsqueeze(-2) @ pair).squeeze(-2)  # sum over j  (B,c,D)


def _pair_tanh_sum(h: Tensor, weight: Tensor, block_elements: int) -> Tensor:
    """The eager path: tanh itself, in blocks of k rows recomputed in the backward pass, so
    neither pass holds more than ``max(block_elements, B * N * D)`` elements of L."""
    b, n, d = h.shape
    size = rows_per_block(b * n * d, block_elements)
    return torch.cat([checkpointed(_pair_tanh_block, h[:, ks], h, weight[:, ks])
                      for ks in row_blocks(n, size)], dim=1)


def _compiled_pairs_apply(h: Tensor) -> bool:
    bound = EXP_RANGE.get(_kernel_dtype(h.dtype))
    return (_pair_sum.active() and bound is not None and h.numel() > 0
            and bool(h.detach().abs().max() <= bound))


def pair_encoding_sum(h: Tensor, mask: Tensor | None = None, *,
                      block_elements: int = BLOCK_ELEMENTS) -> Tensor:
    """P_k = sum_{j != k, mask_j} tanh(h_j + h_k) for h (..., N, D), mask (..., N) -> (..., N, D).

    Compiled (see above; nothing of size N^2 D is stored), or eagerly in blocks of k holding
    at most ``max(block_elements, batch * N * D)`` elements of L at once, in the forward and
    the backward pass."""
    n, d = h.shape[-2:]
    lead = h.shape[:-2]
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=h.device)
    weight = off_diagonal.to(h.dtype)  # [k, j]
    if mask is not None:
        weight = weight * check_mask(mask).to(h.dtype).unsqueeze(-2)  # (..., N, N)
    flat = h.reshape(-1, n, d)
    weight = weight.expand(*lead, n, n).reshape(-1, n, n)
    if _compiled_pairs_apply(flat):
        out = apply_float32(_CompiledPairSum, flat, weight)  # bfloat16 and float16 in float32
    else:
        out = _pair_tanh_sum(flat, weight, block_elements)
    return out.reshape(*lead, n, d)


def mqt_offdiagonal(s: Tensor, pairs: Tensor, w_s: Tensor) -> Tensor:
    """sum_{j != k} [M_i]_(j,k) = w_s * s_i . P_k (Eq. 10) for s (..., T, D), P (..., N, D)
    -> (..., T, N)."""
    return w_s * (s @ pairs.transpose(-2, -1))


# -- Eq. 11 ----------------------------------------------------------------------------------
def _aqt_block(h_j: Tensor, h: Tensor, s_t: Tensor, w_col: Tensor, visible: Tensor,
               rows: slice) -> Tensor:
    pair = torch.tanh(h_j.unsqueeze(-2) + h.unsqueeze(-3))  # L_(j,k)  (..., cj, N, D)
    m = torch.tanh(pair.unsqueeze(-4) + s_t[..., :, None, None, :])  # (..., ct, cj, N, D)
    e = (m @ w_col).squeeze(-1)  # [M_t]_(j,k)  (..., ct, cj, N)
    weight = visible.unsqueeze(-1) * _not_diagonal(rows, h)  # (..., ct, cj, N)
    return (weight * e).sum(-2)  # sum over j  (..., ct, N)


#: the compiled AQT path holds tanh(L) and exp(2 tanh(L)) (batch x N x N x D each); beyond
#: this many elements it takes the eager blocked path
AQT_COMPILED_ELEMENTS = 1 << 26


def _aqt_block_kernel(e: Tensor, v: Tensor, vis: Tensor, off: Tensor, w: Tensor) -> Tensor:
    """sum_j vis[b,i,j] off[j,k] sum_d w[b,d] tanh(t_jk + s_i) by tanh(a + b) =
    1 - 2 / (1 + e^2a e^2b): e = exp(2 t) (B,N,N,D) [j,k], v = exp(2 s) (B,T,D), vis (B,T,N),
    off (N,N), w (B,D) -> (B,T,N).  Zero padding adds nothing (its weights are 0)."""
    m = 1 - 2 / (1 + e.unsqueeze(1) * v[:, :, None, None, :])  # (B,T,J,K,D)
    weight = vis.unsqueeze(-1) * off  # (B,T,J,K)
    return (weight.unsqueeze(-1) * m * w[:, None, None, None, :]).sum((2, 4))


def _aqt_slope(e: Tensor, v: Tensor, vis: Tensor, off: Tensor, g: Tensor) -> Tensor:
    """g[b,i,k] vis[b,i,j] off[j,k] (1 - tanh^2(t_jk + s_i)) (B,T,J,K,D), 1 - tanh^2 =
    4 r (1 - r) with r = 1 / (1 + e v)."""
    r = 1 / (1 + e.unsqueeze(1) * v[:, :, None, None, :])
    weight = vis.unsqueeze(-1) * off * g.unsqueeze(2)  # (B,T,J,K)
    return weight.unsqueeze(-1) * (4 * r * (1 - r))


def _aqt_grad_s_kernel(e, v, vis, off, w, g):
    """d/ds_i (B,T,D) of sum g . output."""
    return _aqt_slope(e, v, vis, off, g).sum((2, 3)) * w[:, None, :]


def _aqt_grad_t_kernel(e, v, vis, off, w, g):
    """d/dt_jk (B,N,N,D) of sum g . output."""
    return _aqt_slope(e, v, vis, off, g).sum(1) * w[:, None, None, :]


def _aqt_grad_w_kernel(e, v, vis, off, g):
    """d/dw (B,D) of sum g . output."""
    m = 1 - 2 / (1 + e.unsqueeze(1) * v[:, :, None, None, :])
    weight = vis.unsqueeze(-1) * off * g.unsqueeze(2)
    return (weight.unsqueeze(-1) * m).sum((1, 2, 3))


_AQT_IN = "bnnd,btd,btn,nn"
_aqt_forward = PaddedKernel(_aqt_block_kernel, f"{_AQT_IN},bd->btn")
_aqt_grad_s = PaddedKernel(_aqt_grad_s_kernel, f"{_AQT_IN},bd,btn->btd")
_aqt_grad_t = PaddedKernel(_aqt_grad_t_kernel, f"{_AQT_IN},bd,btn->bnnd")
_aqt_grad_w = PaddedKernel(_aqt_grad_w_kernel, f"{_AQT_IN},btn->bd")


def _in_steps(kernel: PaddedKernel, sum_steps: bool, e: Tensor, v: Tensor, vis: Tensor,
              off: Tensor, *rest: Tensor) -> Tensor:
    """``kernel``, compiled; or (compiling failed) its expression eagerly over blocks of
    decoder steps, each holding about ``BLOCK_ELEMENTS`` of the (B,T,N,N,D) broadcast.  The
    per-step arguments (``v``, ``vis`` and the (B,T,N) cotangent, last in ``rest`` when
    given) are cut by step; outputs over steps are concatenated, or summed when
    ``sum_steps``."""
    out = kernel(e, v, vis, off, *rest)
    if out is not None:
        return out
    size = rows_per_block(e.numel(), BLOCK_ELEMENTS)
    cotangent = len(rest) > 0 and rest[-1].dim() == 3  # (B,T,N); w is (B,D)
    parts = []
    for ts in row_blocks(v.shape[1], size):
        extra = [*rest[:-1], rest[-1][:, ts]] if cotangent else list(rest)
        parts.append(kernel.fn(e, v[:, ts], vis[:, ts], off, *extra))
    return sum(parts) if sum_steps else torch.cat(parts, dim=1)


class _CompiledAQT(torch.autograd.Function):
    """Eq. 11 summed over rows j, from the pairs L = tanh(h_j + h_k) (B,N,N,D) [j,k] and
    e = exp(2 L) (no gradient), for flat s (B,T,D), w (B,D), visible (B,T,N), by the compiled
    kernels: the T x N^2 x D terms are never stored, and L and e (bounded: e^-2..e^2) can be
    made once per source (:func:`aqt_pairs`) for every decoder step.  The gradient of L
    goes on through autograd (to h, once per source)."""

    @staticmethod
    def forward(ctx, pair, e, s, w, visible):
        n = pair.shape[1]
        off = (~torch.eye(n, dtype=torch.bool, device=pair.device)).to(pair.dtype)
        v = torch.exp(2 * s)  # inf or 0 beyond exp's range: tanh(L + s) = +-1, slope 0
        ctx.save_for_backward(e, v, w, visible, off)
        return _in_steps(_aqt_forward, False, e, v, visible, off, w)

    @staticmethod
    @without_autocast
    @once_differentiable
    def backward(ctx, grad):
        e, v, w, visible, off = ctx.saved_tensors
        grad = grad.contiguous()
        g_s = _in_steps(_aqt_grad_s, False, e, v, visible, off, w, grad)
        g_t = _in_steps(_aqt_grad_t, True, e, v, visible, off, w, grad)
        g_w = _in_steps(_aqt_grad_w, True, e, v, visible, off, grad)
        return g_t, None, g_s, g_w, None


def aqt_pairs(h: Tensor) -> tuple[Tensor, Tensor]:
    """(L, exp(2 L)) for h (B,N,D): L = tanh(h_j + h_k) (B,N,N,D) [j,k], with its gradient
    to h; exp(2 L) without.  What :func:`aqt_offdiagonal` needs of the source, once; in
    float32 for bfloat16 and float16 h (the kernels' dtype)."""
    h = h.to(_kernel_dtype(h.dtype))
    pair = torch.tanh(h.unsqueeze(2) + h.unsqueeze(1))
    return pair, torch.exp(2 * pair.detach())


def aqt_compiled(batch: int, n: int, d: int, dtype: torch.dtype) -> bool:
    """Whether :func:`aqt_offdiagonal` takes the compiled path for these sizes."""
    return (_aqt_forward.active() and _kernel_dtype(dtype) in EXP_RANGE
            and batch * n * n * d <= AQT_COMPILED_ELEMENTS)


def aqt_offdiagonal(h: Tensor, s: Tensor, w_s: Tensor, visible: Tensor | None = None, *,
                    block_elements: int = BLOCK_ELEMENTS,
                    pairs: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """sum_{j != k, visible_ij} w_s . tanh(tanh(h_j + h_k) + s_i) (Eq. 11) for h (..., N, D),
    s (..., T, D), w_s (D,) or (*trailing batch dims, D) (e.g. (H, D)) -> (..., T, N).

    ``visible`` (boolean, broadcastable to (..., T, N)) says which rows j each query
    averages over (padding, causality).  Compiled (:class:`_CompiledAQT`) when
    :func:`aqt_compiled` says so, with ``pairs`` = :func:`aqt_pairs` of h (flattened to
    (batch, N, D)) when the caller made them once per source; else eagerly in blocks of
    (query, row j) pairs holding at most ``max(block_elements, batch * N * D)`` elements of
    tanh(L + s_i) at once, in the forward and the backward pass."""
    (n, d), t = h.shape[-2:], s.shape[-2]
    batch = torch.broadcast_shapes(h.shape[:-2], s.shape[:-2], w_s.shape[:-1])
    visible = h.new_ones(t, n) if visible is None else check_mask(visible, "visible").to(h.dtype)
    visible = visible.expand(torch.broadcast_shapes(visible.shape, (t, n)))  # (..., T, N)
    if pairs is not None or aqt_compiled(math.prod(batch), n, d, h.dtype):
        h, s, w_s, visible = (x.expand(*batch, *x.shape[-k:]).reshape(-1, *x.shape[-k:])
                              for x, k in ((h, 2), (s, 2), (w_s, 1), (visible, 2)))
        pair, e = aqt_pairs(h) if pairs is None else pairs
        # bfloat16 and float16 in float32
        return apply_float32(_CompiledAQT, pair, e, s, w_s, visible).reshape(*batch, t, n)
    return _aqt_eager(h, s, w_s, visible, block_elements)


def _aqt_eager(h: Tensor, s: Tensor, w_s: Tensor, visible: Tensor,
               block_elements: int) -> Tensor:
    (n, d), t = h.shape[-2:], s.shape[-2]
    batch = torch.broadcast_shapes(h.shape[:-2], s.shape[:-2])
    pairs = rows_per_block(math.prod(batch) * n * d, block_elements)  # (step, row j) pairs
    cj = min(n, pairs)
    ct = max(1, min(t, pairs // cj))
    w_col = w_s[..., None, None, :, None]  # (..., 1, 1, D, 1)
    out = []
    for steps in row_blocks(t, ct):
        total = 0
        for rows in row_blocks(n, cj):
            total = total + checkpointed(_aqt_block, h[..., rows, :], h, s[..., steps, :],
                                         w_col, visible[..., steps, rows], rows)
        out.append(total)
    return torch.cat(out, dim=-2)


# -- Eq. 8 -----------------------------------------------------------------------------------
def density_weights(diagonal: Tensor, offdiagonal: Tensor, mask: Tensor | None = None) -> Tensor:
    """omega = softmax_k( mean_j [Psi]_(j,k) ) (Eq. 8) from the diagonal alpha (..., T, N) and
    the column sums of the off-diagonal part (..., T, N); ``mask`` (broadcastable, True = real)
    gives the rows j and columns k of each query.  Masked k get exactly 0."""
    if mask is None:
        rows = diagonal.shape[-1]
    else:
        mask = torch.broadcast_to(check_mask(mask), diagonal.shape)
        rows = mask.sum(-1, keepdim=True).clamp(min=1)  # real rows j per query
    return masked_softmax((diagonal + offdiagonal) / rows, mask)


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"density: scheme must be one of {SCHEMES}, got {scheme!r}")


def density_context(scores: Tensor, h: Tensor, s: Tensor, w_s: Tensor, scheme: str = "mqt",
                    mask: Tensor | None = None, *,
                    block_elements: int = BLOCK_ELEMENTS) -> tuple[Tensor, Tensor]:
    """The attention density matrix on plain tensors (Eq. 6-11).

    scores (B,T,N): the diagonal alpha_ij (baseline scores); h (B,N,D) source encodings;
    s (B,T,D) decoder states; w_s a scalar tensor ("mqt") or a (D,) tensor ("aqt");
    mask (B,N) boolean, True = real token.  Returns (context (B,T,D), omega (B,T,N)).
    Exported as ``attention.functional.density_context``.
    """
    _check_scheme(scheme)
    if h.dim() != 3 or s.dim() != 3 or scores.dim() != 3:
        raise ValueError(f"density_context expects scores (B,T,N), h (B,N,D), s (B,T,D); got "
                         f"scores {tuple(scores.shape)}, h {tuple(h.shape)}, s {tuple(s.shape)}")
    (b, n, d), t = h.shape, s.shape[1]
    if tuple(scores.shape) != (b, t, n) or s.shape[0] != b or s.shape[2] != d:
        raise ValueError(f"density_context: h {tuple(h.shape)} and s {tuple(s.shape)} must share "
                         f"B and D and scores must be (B,T,N) = {(b, t, n)}, got "
                         f"{tuple(scores.shape)}")
    expected = () if scheme == "mqt" else (d,)
    if not torch.is_tensor(w_s) or tuple(w_s.shape) != expected:
        raise ValueError(f"density_context: w_s for scheme {scheme!r} must have shape {expected}, "
                         f"got {tuple(w_s.shape) if torch.is_tensor(w_s) else type(w_s).__name__}")
    if mask is not None and tuple(check_mask(mask).shape) != (b, n):
        raise ValueError(f"density_context: mask must be (B,N) = {(b, n)}, got "
                         f"{tuple(mask.shape)}")
    rows = None if mask is None else mask[:, None, :]  # (B,1,N)
    if scheme == "mqt":
        off = mqt_offdiagonal(s, pair_encoding_sum(h, mask, block_elements=block_elements), w_s)
    else:
        off = aqt_offdiagonal(h, s, w_s, rows, block_elements=block_elements)
    omega = density_weights(scores, off, rows)  # (B,T,N)
    return omega @ h, omega


# -- the flag ---------------------------------------------------------------------------------
def _pair_weight(scheme: str, shape_mqt: tuple, shape_aqt: tuple) -> nn.Parameter:
    """w_s, uniform in (-0.1, 0.1) like the tensorflow/nmt code the paper builds on."""
    return nn.Parameter(torch.empty(shape_mqt if scheme == "mqt" else shape_aqt)
                        .uniform_(-0.1, 0.1))


class density(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Attention density matrix, MQT (Eq. 10) or AQT (Eq. 11).  ``hidden``: size of the additive
    baseline score (None = memory dimension); ``block_elements``: the most elements of any
    pairwise temporary held at once (see the module docstring)."""

    name = "density"

    def __init__(self, scheme: Literal["mqt", "aqt"] = "mqt", hidden: int | None = None,
                 block_elements: int = BLOCK_ELEMENTS):
        _check_scheme(scheme)
        if hidden is not None and hidden < 1:
            raise ValueError(f"density: hidden must be a positive size or None, got {hidden}")
        if block_elements < 1:
            raise ValueError(f"density: block_elements must be positive, got {block_elements}")
        self.scheme, self.hidden, self.block_elements = scheme, hidden, block_elements

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return DensityMultiHead(self.scheme, n_heads, d_model // n_heads, dropout,
                                self.block_elements)

    def alignment(self, *, dim):
        return DensityAlignment(self.scheme, dim, self.hidden or dim, self.block_elements)

    def decoder(self, *, query_dim, memory_dim):
        return DensityDecoder(self.scheme, query_dim, memory_dim, self.hidden or memory_dim,
                              self.block_elements)


class DensityDecoder(DecoderCore):
    def __init__(self, scheme: str, query_dim: int, memory_dim: int, hidden: int,
                 block_elements: int):
        super().__init__()
        self.scheme, self.block_elements = scheme, block_elements
        self.score = AdditiveScore(query_dim, memory_dim, hidden, block_elements)  # alpha_ij
        # L s_i and tanh(L + s_i) need s in the memory's dimension
        self.query_proj = query_projection(query_dim, memory_dim)
        self.w_s = _pair_weight(scheme, (), (memory_dim,))

    def build_memory(self, h, mask=None):
        memory = {"h": h, "mask": check_mask(mask), "keys": self.score.keys(h)}
        if self.scheme == "mqt":  # P_k, once per source
            memory["pairs"] = pair_encoding_sum(h, mask, block_elements=self.block_elements)
        elif aqt_compiled(h.shape[0], h.shape[1], h.shape[2], h.dtype):  # L, exp(2L), once
            memory["pairs"] = aqt_pairs(h)
        return memory

    def forward(self, s, memory):
        h, mask = memory["h"], memory["mask"]
        rows = None if mask is None else mask[:, None, :]  # (B,1,N)
        diagonal = self.score(s, memory["keys"])  # alpha (B,T,N)
        s = self.query_proj(s)  # (B,T,D)
        if self.scheme == "mqt":
            off = mqt_offdiagonal(s, memory["pairs"], self.w_s)
        else:
            off = aqt_offdiagonal(h, s, self.w_s, rows, block_elements=self.block_elements,
                                  pairs=memory.get("pairs"))
        omega = density_weights(diagonal, off, rows)  # (B,T,N)
        return omega @ h, omega

    def density_matrix(self, s_t: Tensor, memory: dict) -> Tensor:
        """Psi_i (B,N,N) of one decoder step s_t (B,Dq) over ``memory`` (``precompute``):
        [Psi]_(k,k) = alpha_ik (Eq. 5), [Psi]_(j,k) = [M_i]_(j,k) for j != k (Eq. 9-11).

        Rows and columns of padded positions are 0, so softmax_k(sum_j Psi[j,k] / n_real)
        over the real k is the step's omega (Eq. 8).  For inspection (heat maps), not for
        training: the pairs L_(j,k) are made in blocks of rows j, at most
        ``max(block_elements, B * N * D)`` elements at a time, but Psi itself is B*N*N."""
        h, mask = memory["h"], memory["mask"]
        alpha = self.score(s_t.unsqueeze(1), memory["keys"]).squeeze(1)  # (B,N)
        s = self.query_proj(s_t)  # (B,D)
        b, n, d = h.shape
        blocks = []
        for js in row_blocks(n, rows_per_block(b * n * d, self.block_elements)):
            pair = torch.tanh(h[:, js, None, :] + h[:, None, :, :])  # L_(j,k)  (B,c,N,D)
            if self.scheme == "mqt":
                m = self.w_s * (pair @ s[:, None, :, None]).squeeze(-1)  # w_s (L s_i)  (B,c,N)
            else:
                m = torch.tanh(pair + s[:, None, None, :]) @ self.w_s  # (B,c,N)
            blocks.append(m)
        eye = torch.eye(n, dtype=torch.bool, device=h.device)
        psi = torch.where(eye, alpha[:, None, :], torch.cat(blocks, dim=1))  # (B,N,N)
        if mask is not None:
            psi = psi.masked_fill(~(mask[:, :, None] & mask[:, None, :]), 0.0)
        return psi


class DensityMultiHead(MultiHeadCore):
    def __init__(self, scheme: str, n_heads: int, head_dim: int, dropout: float,
                 block_elements: int):
        super().__init__()
        self.scheme, self.dropout, self.block_elements = scheme, dropout, block_elements
        self.w_s = _pair_weight(scheme, (n_heads, 1, 1), (n_heads, head_dim))  # one per head

    def check_causal(self) -> None:
        if self.scheme == "mqt":
            raise UnsupportedContext(
                "attention 'density' (scheme='mqt') cannot be used for causal multihead "
                "attention: the rows j averaged over depend on the query, so the per-source "
                "sums P_k do not apply and the exact sum costs Lq*Lk^2*d per head; use "
                "scheme='aqt' or another mechanism for causal self-attention")

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        if causal:
            self.check_causal()
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        diagonal = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B,H,Lq,Lk)
        if self.scheme == "mqt":
            keys = None if key_mask is None else key_mask[:, None, :]  # (B,1,Lk)
            pairs = pair_encoding_sum(k, keys, block_elements=self.block_elements)  # (B,H,Lk,d)
            off = mqt_offdiagonal(q, pairs, self.w_s)
        else:
            off = aqt_offdiagonal(k, q, self.w_s, mask, block_elements=self.block_elements)
        weights = density_weights(diagonal, off, mask)
        out = F.dropout(weights, self.dropout, self.training) @ v  # (B,H,Lq,dv)
        return out, (weights if need_weights else None)


class DensityAlignment(AlignmentCore):
    def __init__(self, scheme: str, dim: int, hidden: int, block_elements: int):
        super().__init__()
        self.scheme, self.block_elements = scheme, block_elements
        self.score = AdditiveScore(dim, dim, hidden, block_elements)
        self.w_s = _pair_weight(scheme, (), (dim,))

    def _offdiagonal(self, queries, memory, memory_mask, visible):
        if self.scheme == "mqt":
            pairs = pair_encoding_sum(memory, memory_mask, block_elements=self.block_elements)
            return mqt_offdiagonal(queries, pairs, self.w_s)
        return aqt_offdiagonal(memory, queries, self.w_s, visible,
                               block_elements=self.block_elements)

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        scores = self.score(a, self.score.keys(b))  # alpha: a_i queries, b_j keys (B,La,Lb)
        pairs = pair_mask(mask_a, mask_b)  # (B,La,Lb)-broadcastable
        pairs_t = None if pairs is None else pairs.transpose(1, 2)
        weights_a = density_weights(scores, self._offdiagonal(a, b, mask_b, pairs), pairs)
        weights_b = density_weights(scores.transpose(1, 2),
                                    self._offdiagonal(b, a, mask_a, pairs_t), pairs_t)
        return align(weights_a, weights_b.transpose(1, 2), a, b, value_a, value_b)
