"""Compositional De-Attention (CoDA), Tay et al., NeurIPS 2019, Section 2.

Dual affinity (Eq. 1-2) between elements a_i of A and b_j of B:

    E_ij = alpha * F_E(a_i) . F_E(b_j)
    N_ij = -beta * || F_N(a_i) - F_N(b_j) ||_1

Quasi-attention (Eq. 3-6), no softmax, values in [-1, 1]:

    M = tanh(E) * sigmoid(N)                    gate="plain"      (Eq. 3)
    N <- N - mean(N)                            gate="centered"   (Eq. 4)
    M = tanh(E) * 2 * sigmoid(N)                gate="scaled"     (Eq. 5)
    E <- E - mean(E)                            center_e=True     (Eq. 6)

Compositional pooling (Eq. 7): A' = M B, B' = M^T A.  CoDA Transformer (Eq. 10): per head
E = Q K^T / sqrt(d), N = -||q_i - k_j||_1 / sqrt(d) (``scale=False`` drops the 1/sqrt(d),
footnote 3).  Table 9 swaps tanh (``e_fn``) and sigmoid (``n_fn``) for other functions.

Masked entries of M are exactly 0 (never -inf).  Centering (Eq. 4, 6) "centers the matrix
to have a zero mean": the mean is taken over the valid entries only (real keys, real
queries, causally visible), and over

- each Lq x Lk matrix where every query sees every key of its matrix at once: pairwise
  alignment (DecompAtt, Eq. 7, where one M serves both directions) and Transformer encoder
  self-attention (padded query rows excluded);
- each query row where causality requires it: decoder self-attention (a mean over the
  whole matrix would let a future token move earlier rows), Transformer cross-attention
  (its queries are decoder positions, decoded one at a time) and RNN decoder attention
  (one step at a time).  A row's mean then depends on what that query may see only, so an
  incremental step equals its row of the full forward.

The paper's equations on one block of query rows are written out below (``_factors``,
``_forward_block``, ``_backward_block``; for tanh and sigmoid, uncentred, in float32 on CPU
the C++ kernels of :mod:`attention._coda_l1_ext` compute the same in one pass, tested against
these and the naive formula); the memory-bounded L1 term, the blocks of rows and the custom
autograd function live in :mod:`attention._coda_kernels`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from attention import _coda_l1_ext
from attention._coda_kernels import BlockOps, Centering, QuasiAttention, Rows
from attention._coda_kernels import l1_distance as l1_distance
from attention._compiled import TileKernel
from attention._tiling import apply_float32
from attention.base import (
    Alignment,
    AlignmentCore,
    DecoderCore,
    Mechanism,
    MultiHeadCore,
    query_projection,
)
from attention.masking import attention_mask, check_mask, pair_mask


class Activation(NamedTuple):
    fn: Callable[[Tensor], Tensor]
    #: derivative from the input x and the output y
    grad: Callable[[Tensor, Tensor], Tensor]


def _tanh(x: Tensor) -> Tensor:
    """tanh(x); inside a compiled kernel as copysign(-u / (2 + u), x), u = expm1(-2|x|).

    Inductor's vectorised tanh (SLEEF's, 1 ulp) took 2.85 ms per million float32 elements on
    one thread of an Intel Xeon (AVX-512), six times torch's eager tanh, and made the compiled
    Eq. 1-6 blocks 28% of CoDA's step at L=512; the exp form compiles to 1.3 ms with the
    sigmoid and the product (results/coda_floor.md).  Its error is at most 1.5e-7 absolute
    on every float32 (tanh's own rounding: 6e-8); eager code keeps torch.tanh."""
    if not torch.compiler.is_compiling():
        return torch.tanh(x)
    u = torch.expm1(-2 * x.abs())
    return torch.copysign(-u / (2 + u), x)


_TANH = Activation(_tanh, lambda x, y: 1 - y * y)
_SIGMOID = Activation(torch.sigmoid, lambda x, y: y * (1 - y))
E_FUNCTIONS = {"tanh": _TANH, "sigmoid": _SIGMOID}
N_FUNCTIONS = {
    "sigmoid": _SIGMOID,
    "tanh": _TANH,
    "arctan": Activation(torch.arctan, lambda x, y: 1 / (1 + x * x)),
    # x / sqrt(1 + x^2), derivative (1 + x^2)^(-3/2)
    "algebraic": Activation(lambda x: x * torch.rsqrt(1 + x * x),
                            lambda x, y: torch.rsqrt(1 + x * x) ** 3),
}
GATES = ("plain", "centered", "scaled")


class _Options(NamedTuple):
    e_scale: float  # alpha * s, s = 1/sqrt(d) or 1
    n_scale: float  # -beta * s
    gate: str
    e_fn: str
    n_fn: str


# -- Eq. 1-6 on one block of query rows ------------------------------------------------------
def _factors(qk: Tensor, dist: Tensor, mask: Tensor | None, mean_e: Tensor | None,
             mean_n: Tensor | None, opt: _Options):
    """(E, N, F_E(E), F_N(N), M) from q.k and the L1 distance D of one block (N,r,Lk)."""
    e = opt.e_scale * qk  # Eq. 1
    n = opt.n_scale * dist  # Eq. 2
    if mean_e is not None:
        e = e - mean_e  # Eq. 6
    if mean_n is not None:
        n = n - mean_n  # Eq. 4
    te, gn = E_FUNCTIONS[opt.e_fn].fn(e), N_FUNCTIONS[opt.n_fn].fn(n)
    g = 2 * gn if opt.gate == "scaled" else gn  # Eq. 5
    m = te * g  # Eq. 3
    return e, n, te, gn, (m if mask is None else m.masked_fill(~mask, 0.0))


def _forward_block(qk, dist, mask, mean_e, mean_n, keep, opt: _Options):
    """(M, M with dropout) of one block (the first one returned as weights, the second
    multiplied with the values)."""
    m = _factors(qk, dist, mask, mean_e, mean_n, opt)[-1]
    return m, (m if keep is None else m * keep)


def _backward_block(qk, dist, mask, mean_e, mean_n, keep, d_md, d_m, shift_e, shift_n,
                    opt: _Options):
    """Recompute one block and return (M with dropout, dL/d(q.k), dL/dD) by the chain rule
    through Eq. 1-6.

    ``d_md``: gradient of M with dropout (from the products), ``d_m``: of the weights output;
    ``shift_e``/``shift_n``: mean over the valid entries of dL/dE, dL/dN, subtracted when E
    or N is centred per matrix (the backward of x - mean(x))."""
    e, n, te, gn, m = _factors(qk, dist, mask, mean_e, mean_n, opt)
    dm = d_md if keep is None or d_md is None else d_md * keep
    dm = d_m if dm is None else (dm if d_m is None else dm + d_m)
    if mask is not None:
        dm = dm.masked_fill(~mask, 0.0)
    g = 2 * gn if opt.gate == "scaled" else gn
    de = opt.e_scale * (dm * g * E_FUNCTIONS[opt.e_fn].grad(e, te))  # 0 where masked
    gn_grad = N_FUNCTIONS[opt.n_fn].grad(n, gn)
    dn = opt.n_scale * (dm * te * (2 * gn_grad if opt.gate == "scaled" else gn_grad))
    valid = 1.0 if mask is None else mask.to(de.dtype)
    if shift_e is not None:
        de = de - shift_e * valid
    if shift_n is not None:
        dn = dn - shift_n * valid
    return (m if keep is None else m * keep), de, dn


#: run Eq. 1-6 in C++ where it applies (:func:`_native_applies`); tests switch it off to
#: test the compiled blocks on their own
NATIVE_EQ = True


def _native_applies(opt: _Options, mean_e, mean_n, *tensors) -> bool:
    """Whether the C++ kernels of Eq. 1-6 (attention._coda_l1_ext.eq_forward, eq_backward)
    compute this tile: the paper's functions (tanh, sigmoid), neither E nor N centred, float32
    on CPU with the library loaded."""
    return (NATIVE_EQ and opt.e_fn == "tanh" and opt.n_fn == "sigmoid" and mean_e is None
            and mean_n is None and _coda_l1_ext.eq_supports(*tensors))


def _native_forward(qk, dist, mask, mean_e, mean_n, u, p: float, opt: _Options, need_m: bool):
    """:func:`_forward_block` in C++ (None where it does not apply), the dropout applied
    from its uniforms ``u``."""
    if not _native_applies(opt, mean_e, mean_n, qk, dist):
        return None
    return _coda_l1_ext.eq_forward(qk, dist, mask, u, p, opt.e_scale, opt.n_scale,
                                   2.0 if opt.gate == "scaled" else 1.0, need_m)


def _native_backward(qk, dist, mask, mean_e, mean_n, u, p: float, d_md, d_m, opt: _Options):
    """:func:`_backward_block` in C++, uncentred (None where it does not apply)."""
    if not _native_applies(opt, mean_e, mean_n, qk, dist, d_md, d_m):
        return None
    return _coda_l1_ext.eq_backward(qk, dist, mask, u, p, d_md, d_m, opt.e_scale, opt.n_scale,
                                    2.0 if opt.gate == "scaled" else 1.0)


#: where the C++ Eq. 1-6 applies, run it inside the C++ L1 kernel's tiles
#: (:func:`attention._coda_l1_ext.fused_forward`, ``fused_backward``) rather than as a pass of
#: its own over q.k and D; tests switch it off to compare the two
FUSED_EQ = True


def _fused_scales(opt: _Options, mean_e, mean_n, *tensors) -> tuple[float, float, float] | None:
    """(e_scale, n_scale, gate_scale) for the fused kernels where they compute this tile
    (:data:`FUSED_EQ`, and :func:`_native_applies`), else None."""
    if not (FUSED_EQ and _native_applies(opt, mean_e, mean_n, *tensors)):
        return None
    return opt.e_scale, opt.n_scale, 2.0 if opt.gate == "scaled" else 1.0


#: the blocks as the kernels run them (C++ where it applies, fused into the L1 kernel's tiles,
#: else compiled; :mod:`attention._coda_kernels`)
_OPS = BlockOps(factors=_factors, forward=TileKernel(_forward_block, full=(0, 1, 5)),
                backward=TileKernel(_backward_block, full=(0, 1, 5, 6, 7)),
                native_forward=_native_forward, native_backward=_native_backward,
                fused_scales=_fused_scales)


# -- the functional layer --------------------------------------------------------------------
def _check_options(gate: str, e_fn: str, n_fn: str, alpha: float = 1.0,
                   beta: float = 1.0) -> None:
    if gate not in GATES:
        raise ValueError(f"coda: gate must be one of {GATES}, got {gate!r}")
    if e_fn not in E_FUNCTIONS:
        raise ValueError(f"coda: e_fn must be one of {tuple(E_FUNCTIONS)}, got {e_fn!r}")
    if n_fn not in N_FUNCTIONS:
        raise ValueError(f"coda: n_fn must be one of {tuple(N_FUNCTIONS)}, got {n_fn!r}")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"coda: {name} must be a non-negative number (a temperature, "
                             f"Sec. 2.3), got {value!r}")


def _prepare(q: Tensor, k: Tensor, v: Tensor | None, v_t: Tensor | None, mask: Tensor | None,
             alpha: float, beta: float, scale: bool, gate: str, e_fn: str, n_fn: str):
    """Check the arguments of every entry point; (batch, options, flatten) where ``flatten``
    turns (*batch', L, x) broadcastable tensors into (N, L, x)."""
    _check_options(gate, e_fn, n_fn, alpha, beta)
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"coda: q and k must have the same last size, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if v is not None and v.shape[-2] != lk:
        raise ValueError(f"coda: v must have one row per key ({lk}), got {tuple(v.shape)}")
    if v_t is not None and v_t.shape[-2] != lq:
        raise ValueError(f"coda: v_t must have one row per query ({lq}), got {tuple(v_t.shape)}")
    shapes = [t.shape[:-2] for t in (q, k, v, v_t) if t is not None]
    if mask is not None:
        check_mask(mask)
        if mask.dim() < 2 or mask.shape[-2] not in (1, lq) or mask.shape[-1] not in (1, lk):
            raise ValueError(f"coda: mask must be broadcastable to (..., {lq}, {lk}), got "
                             f"{tuple(mask.shape)}")
        shapes.append(mask.shape[:-2])
    try:
        batch = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError as err:
        raise ValueError(f"coda: the leading (batch) sizes of q, k, v and mask do not broadcast: "
                         f"{[tuple(t) for t in shapes]}") from err

    def flat(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])

    s = 1 / math.sqrt(d) if scale else 1.0
    return batch, _Options(float(alpha * s), float(-beta * s), gate, e_fn, n_fn), flat


def rows_see_different_keys(mask: Tensor | None) -> bool:
    """Whether two query rows of ``mask`` (..., Lq, Lk) that see any key see different keys
    (fully masked rows, padded queries, do not count)."""
    if mask is None or mask.shape[-2] == 1:
        return False
    rows = mask.reshape(-1, mask.shape[-2], mask.shape[-1])  # (N,Lq,Lk)
    seen = rows.any(-1, keepdim=True)  # (N,Lq,1)
    union = rows.any(-2, keepdim=True)  # (N,1,Lk): what the rows see together
    return bool(((rows != union) & seen).any())


def centring_rows(mask: Tensor | None, gate: str, center_e: bool,
                  center_rows: bool | None) -> bool:
    """``center_rows`` of the functional layer: as given; unset, False (per matrix) unless
    centering is asked for under a mask whose rows see different keys, which raises: per
    matrix, a later token would move earlier rows."""
    if center_rows is not None:
        return bool(center_rows)
    if (center_e or gate == "centered") and rows_see_different_keys(mask):
        raise ValueError(
            "coda: centering (gate='centered' or center_e=True) under a mask whose query rows "
            "see different keys (e.g. causal): pass center_rows=True to centre each row over "
            "what its query may see (the models' choice), or center_rows=False to centre over "
            "the whole matrix (later tokens then move earlier rows)")
    return False


def _coda(q: Tensor, k: Tensor, v: Tensor | None, mask: Tensor | None = None, *,
          v_t: Tensor | None = None, need_weights: bool = True, dropout: float = 0.0,
          alpha: float = 1.0, beta: float = 1.0, scale: bool = True, gate: str = "plain",
          center_e: bool = False, center_rows: bool = False, e_fn: str = "tanh",
          n_fn: str = "sigmoid"):
    """Every context's entry point: (M v | None, M^T v_t | None, M | None).

    q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv), v_t (..., Lq, dt); mask boolean
    broadcastable to (..., Lq, Lk).  ``dropout`` applies to M in the products only.
    ``center_rows``: centre E and N per query row instead of per matrix."""
    if not 0 <= dropout < 1:
        raise ValueError(f"coda: dropout must be in [0, 1), got {dropout!r}")
    batch, opt, flat = _prepare(q, k, v, v_t, mask, alpha, beta, scale, gate, e_fn, n_fn)
    lq, lk = q.shape[-2], k.shape[-2]
    centering = Centering(e=center_e, n=gate == "centered", rows=center_rows)
    out, out_t, weights = apply_float32(  # bfloat16 and float16 in float32
        QuasiAttention, flat(q), flat(k), flat(v), flat(v_t), mask, batch, _OPS, opt,
        centering, dropout, need_weights)
    return (None if out is None else out.view(*batch, lq, -1),
            None if out_t is None else out_t.view(*batch, lk, -1),
            None if weights is None else weights.view(*batch, lq, lk))


@torch.no_grad()
def quasi_attention_factors(
    q: Tensor, k: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0, beta: float = 1.0,
    scale: bool = True, gate: str = "plain", center_e: bool = False,
    center_rows: bool | None = None, e_fn: str = "tanh", n_fn: str = "sigmoid",
) -> tuple[Tensor, Tensor, Tensor]:
    """The three matrices of the paper's Figure 2, (F_E(E), F_N(N), M) each (..., Lq, Lk):
    tanh(E) and sigmoid(N) by default (after the centering options; F_N(N) before the 2x of
    ``gate="scaled"``) and M of Eq. 3-6.  For analysis: no gradient.  M is 0 where ``mask``
    is False; the other two are computed there as well (select the valid entries with the
    mask)."""
    center_rows = centring_rows(mask, gate, center_e, center_rows)
    batch, opt, flat = _prepare(q, k, None, None, mask, alpha, beta, scale, gate, e_fn, n_fn)
    rows = Rows(flat(q), flat(k), mask, batch, _OPS, opt,
                Centering(center_e, gate == "centered", center_rows), 0.0, 0)
    rows.center()
    parts = [rows.factors(index) for index in range(len(rows.blocks))]
    shape = (*batch, q.shape[-2], k.shape[-2])
    return tuple(torch.cat(ts, dim=1).view(shape) for ts in zip(*parts))


def quasi_attention_matrix(
    q: Tensor, k: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0, beta: float = 1.0,
    scale: bool = True, gate: str = "plain", center_e: bool = False,
    center_rows: bool | None = None, e_fn: str = "tanh", n_fn: str = "sigmoid",
) -> Tensor:
    """M (..., Lq, Lk) of Eq. 3-6 (Eq. 10 with ``scale``); zero where ``mask`` is False.
    ``center_rows`` as in :func:`quasi_attention`."""
    return _coda(q, k, None, mask, alpha=alpha, beta=beta, scale=scale, gate=gate,
                 center_e=center_e, center_rows=centring_rows(mask, gate, center_e, center_rows),
                 e_fn=e_fn, n_fn=n_fn)[2]


def quasi_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, alpha: float = 1.0,
    beta: float = 1.0, scale: bool = True, gate: str = "plain", center_e: bool = False,
    center_rows: bool | None = None, e_fn: str = "tanh", n_fn: str = "sigmoid",
) -> tuple[Tensor, Tensor]:
    """CoDA on per-head tensors: q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv);
    mask boolean broadcastable to (..., Lq, Lk), True = may attend.  Centering (``gate=
    "centered"``, ``center_e``) is over the valid entries of each matrix
    (``center_rows=False``) or of each query row (``center_rows=True``).  Left unset,
    ``center_rows`` is False unless the mask lets its query rows see different keys (a
    causal mask, cross-attention over decoded positions): there a mean over the whole matrix
    would let a later token move earlier rows, so the choice must be given explicitly
    (:func:`centring_rows` raises).
    Returns (M v (..., Lq, dv), M (..., Lq, Lk)).  Exported as ``attention.functional.coda``."""
    out, _, m = _coda(q, k, v, mask, alpha=alpha, beta=beta, scale=scale, gate=gate,
                      center_e=center_e, center_rows=centring_rows(mask, gate, center_e,
                                                                   center_rows),
                      e_fn=e_fn, n_fn=n_fn)
    return out, m  # Eq. 7 / Eq. 10


# -- the flag and its three contexts ---------------------------------------------------------
class coda(Mechanism):  # noqa: N801 - flag classes are named by their registry names
    """Compositional De-Attention.  ``scale=None`` and ``gate=None`` follow the paper in
    each context: in multi-head and decoder attention (Eq. 10) 1/sqrt(d) and ``scaled``
    (2 * sigmoid: "we either apply centering ... or 2 * sigmoid ... to ensure the value is in
    [0, 1]"; Table 8's uncentred NMT row, the best, leaves the scaling); in pairwise
    alignment (Eq. 1-3) no 1/sqrt(d) and the ``plain`` gate sigmoid(N).  Centering is per
    matrix or per query row as the module docstring says."""

    name = "coda"

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, scale: bool | None = None,
                 gate: Literal["plain", "centered", "scaled"] | None = None,
                 center_e: bool = False,
                 e_fn: Literal["tanh", "sigmoid"] = "tanh",
                 n_fn: Literal["sigmoid", "tanh", "arctan", "algebraic"] = "sigmoid"):
        _check_options("plain" if gate is None else gate, e_fn, n_fn, alpha, beta)
        if scale is not None and not isinstance(scale, bool):
            raise ValueError(f"coda: scale must be true, false or null, got {scale!r}")
        self.alpha, self.beta, self.scale = alpha, beta, scale
        self.gate, self.center_e, self.e_fn, self.n_fn = gate, center_e, e_fn, n_fn

    def kwargs(self, default_scale: bool, default_gate: str) -> dict:
        return dict(alpha=self.alpha, beta=self.beta,
                    scale=default_scale if self.scale is None else self.scale,
                    gate=default_gate if self.gate is None else self.gate,
                    center_e=self.center_e, e_fn=self.e_fn, n_fn=self.n_fn)

    def multihead(self, *, d_model, n_heads, dropout=0.0, self_attention=True):
        return CodaMultiHead(self.kwargs(True, "scaled"), dropout, self_attention)  # Eq. 10

    def alignment(self, *, dim):
        return CodaAlignment(self.kwargs(False, "plain"))  # Eq. 1-3

    def decoder(self, *, query_dim, memory_dim):
        return CodaDecoder(self.kwargs(True, "scaled"), query_dim, memory_dim)  # Eq. 10


class CodaMultiHead(MultiHeadCore):
    """Eq. 10 per head.  Centred options: per matrix in (non-causal) self-attention, whose
    padded query rows are masked like its padded keys; per query row in causal
    self-attention and in cross-attention."""

    def __init__(self, options: dict, dropout: float, self_attention: bool = True):
        super().__init__()
        self.options, self.dropout, self.self_attention = options, dropout, self_attention
        self.centred = options["center_e"] or options["gate"] == "centered"

    def mask(self, q: Tensor, k: Tensor, key_mask: Tensor | None, causal: bool
             ) -> tuple[Tensor | None, bool]:
        """(the mask M is computed under, center_rows) of a forward call."""
        mask = attention_mask(key_mask, q.shape[-2], k.shape[-2], causal, device=q.device)
        per_matrix = self.self_attention and not causal and q.shape[-2] == k.shape[-2]
        if self.centred and per_matrix and key_mask is not None:
            mask = mask & key_mask[:, None, :, None]  # padded queries leave the mean
        return mask, not per_matrix

    def forward(self, q, k, v, *, key_mask=None, causal=False, need_weights=False,
                query_input=None, key_input=None):
        mask, center_rows = self.mask(q, k, key_mask, causal)
        out, _, m = _coda(q, k, v, mask, need_weights=need_weights,  # (B,H,Lq,dv), (B,H,Lq,Lk)
                          dropout=self.dropout if self.training else 0.0,
                          center_rows=center_rows, **self.options)
        return out, m

    def factors(self, q, k, *, key_mask=None, causal=False) -> tuple[Tensor, Tensor, Tensor]:
        """(tanh(E), sigmoid(N), M) (B,H,Lq,Lk) of the forward call with these arguments
        (Figure 2; no gradient)."""
        mask, center_rows = self.mask(q, k, key_mask, causal)
        return quasi_attention_factors(q, k, mask, center_rows=center_rows, **self.options)


class CodaAlignment(AlignmentCore):
    """Eq. 1-7: one M for both directions, centred per matrix over the real pairs."""

    def __init__(self, options: dict):
        super().__init__()
        self.options = options

    def forward(self, a, b, mask_a=None, mask_b=None, *, value_a=None, value_b=None):
        mask = pair_mask(mask_a, mask_b)  # broadcastable to (B,La,Lb)
        value_a = a if value_a is None else value_a
        value_b = b if value_b is None else value_b
        a_aligned, b_aligned, m = _coda(a, b, value_b, mask, v_t=value_a, **self.options)
        return Alignment(a_aligned, b_aligned, m, m)  # Eq. 7: A' = M B, B' = M^T A

    def factors(self, a, b, mask_a=None, mask_b=None) -> tuple[Tensor, Tensor, Tensor]:
        """(tanh(E), sigmoid(N), M) (B,La,Lb) of this alignment (Figure 2; no gradient)."""
        return quasi_attention_factors(a, b, pair_mask(mask_a, mask_b), **self.options)


class CodaDecoder(DecoderCore):
    """Eq. 10 for decoder states over the memory, one row per step (centred per row)."""

    def __init__(self, options: dict, query_dim: int, memory_dim: int):
        super().__init__()
        self.options = options
        # E and N compare s_i with h_j, so s is mapped to the memory's dimension when they differ
        self.query_proj = query_projection(query_dim, memory_dim)

    def build_memory(self, h, mask=None):
        return {"h": h, "mask": mask}

    def forward(self, s, memory):
        h, mask = memory["h"], memory["mask"]
        out, _, m = _coda(self.query_proj(s), h, h, None if mask is None else mask[:, None, :],
                          center_rows=True, **self.options)
        return out, m  # (B,T,Dm), (B,T,N)

    def factors(self, s, memory) -> tuple[Tensor, Tensor, Tensor]:
        """(tanh(E), sigmoid(N), M) (B,T,N) of ``forward(s, memory)`` (no gradient)."""
        h, mask = memory["h"], memory["mask"]
        return quasi_attention_factors(self.query_proj(s), h,
                                       None if mask is None else mask[:, None, :],
                                       center_rows=True, **self.options)
