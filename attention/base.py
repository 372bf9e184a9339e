"""The flag type every mechanism implements, and the three contexts it can be used in.

A *mechanism* (``softmax``, ``coda``, ``window`` ...) is a small picklable object holding
typed options.  It is the value of an attention flag: LightningCLI resolves
``--model.attention coda --model.attention.center_e true`` to ``coda(center_e=True)``
because every mechanism class is named by its registry name.

A mechanism builds the ``nn.Module`` that does the work in each context (docs/design.md):

1. ``multihead(d_model=, n_heads=, dropout=, self_attention=)`` -> a core that maps
   per-head tensors ``q (B,H,Lq,d), k (B,H,Lk,d), v (B,H,Lk,dv)`` to
   ``(out (B,H,Lq,dv), weights (B,H,Lq,Lk) | None)``; see :class:`MultiHeadCore`.
2. ``alignment(dim=)`` -> pairwise alignment of two sequences (DecompAtt, CoDA Eq. 7);
   see :class:`AlignmentCore`.
3. ``decoder(query_dim=, memory_dim=)`` -> decoder-step attention of an RNN decoder over
   encoder memory, all steps at once or one step at a time; see :class:`DecoderCore`.

Masks everywhere are boolean with True = a real token / may attend.  A masked key gets
exactly zero weight in every mechanism.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

CONTEXTS = ("multihead", "alignment", "decoder")


class UnsupportedContext(ValueError):
    """A mechanism asked for in a context where it is not defined."""


class Mechanism:
    """Base of every attention flag.  Subclasses set ``name`` and override the builders
    of the contexts they support; the others raise :class:`UnsupportedContext`."""

    name: ClassVar[str] = ""
    #: why a context is not supported, per context name (shown in the error)
    unsupported: ClassVar[dict[str, str]] = {}

    def options(self) -> dict:
        """The constructor arguments of this flag value (for W&B config, tags, reprs)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def tag(self) -> str:
        """Short human-readable form, e.g. ``coda(center_e=True)``: only non-default options."""
        import inspect

        defaults = {
            p.name: p.default
            for p in inspect.signature(type(self).__init__).parameters.values()
            if p.default is not inspect.Parameter.empty
        }
        changed = {k: v for k, v in self.options().items() if defaults.get(k, object()) != v}
        inner = ",".join(f"{k}={v}" for k, v in changed.items())
        return f"{self.name}({inner})" if inner else self.name

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{self.name}({inner})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.options() == other.options()

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted((k, repr(v)) for k, v in self.options().items()))))

    # -- the three contexts -------------------------------------------------------------
    def multihead(self, *, d_model: int, n_heads: int, dropout: float = 0.0,
                  self_attention: bool = True) -> MultiHeadCore:
        raise self._unsupported("multihead")

    def alignment(self, *, dim: int) -> AlignmentCore:
        raise self._unsupported("alignment")

    def decoder(self, *, query_dim: int, memory_dim: int) -> DecoderCore:
        raise self._unsupported("decoder")

    def supports(self, context: str) -> bool:
        if context not in CONTEXTS:
            raise ValueError(f"unknown attention context {context!r}; expected one of {CONTEXTS}")
        return context not in self.unsupported and getattr(type(self), context) is not getattr(
            Mechanism, context
        )

    def _unsupported(self, context: str) -> UnsupportedContext:
        from attention.registry import supporting

        able = supporting(context)
        reason = self.unsupported.get(context, "it is not defined there")
        return UnsupportedContext(
            f"attention {self.name!r} cannot be used for {context} attention: {reason}. "
            f"Mechanisms that can: {', '.join(able)}"
        )


def _length(x, dim: int) -> int:
    return x.shape[dim] if torch.is_tensor(x) else -1


def _refuse_empty(core: nn.Module, what: dict[str, tuple[Tensor, int]]) -> None:
    """ValueError naming the core, the empty sequences and every shape: attention over an
    empty sequence (no key to weigh, or no query) is undefined for every mechanism."""
    empty = [name for name, (x, dim) in what.items() if _length(x, dim) == 0]
    if empty:
        shapes = ", ".join(f"{name} {tuple(x.shape)}" for name, (x, _) in what.items()
                           if torch.is_tensor(x))
        raise ValueError(f"{type(core).__name__}: {' and '.join(empty)} of length 0 ({shapes}); "
                         f"attention needs at least one query and one key")


def _argument(args: tuple, kwargs: dict, index: int, name: str):
    return args[index] if len(args) > index else kwargs.get(name)


def _check_multihead(core, args, kwargs) -> None:
    _refuse_empty(core, {"queries": (_argument(args, kwargs, 0, "q"), -2),
                         "keys": (_argument(args, kwargs, 1, "k"), -2)})


def _check_alignment(core, args, kwargs) -> None:
    _refuse_empty(core, {"a": (_argument(args, kwargs, 0, "a"), -2),
                         "b": (_argument(args, kwargs, 1, "b"), -2)})


def _check_decoder(core, args, kwargs) -> None:
    memory = _argument(args, kwargs, 1, "memory")
    _refuse_empty(core, {"steps": (_argument(args, kwargs, 0, "s"), 1),
                         "memory": (memory.get("h") if isinstance(memory, dict) else None, 1)})


class MultiHeadCore(nn.Module):
    """Context 1: the per-head part of multi-head self/cross attention.

    forward(q (B,H,Lq,d), k (B,H,Lk,d), v (B,H,Lk,dv), *, key_mask (B,Lk) bool | None,
            causal: bool, need_weights: bool,
            query_input (B,Lq,D) | None, key_input (B,Lk,D) | None)
        -> (out (B,H,Lq,dv), weights (B,H,Lq,Lk) | None)

    ``causal`` lets query i see keys j <= i + (Lk - Lq).  ``query_input``/``key_input`` are
    the un-projected inputs, for mechanisms with projections of their own (window
    boundaries, additive-window local keys, localness centres).  ``weights`` are returned
    (attention or quasi-attention, exactly 0 at masked keys) when ``need_weights``.
    No query or no key (Lq = 0 or Lk = 0) is refused with a ValueError naming the shapes;
    :class:`attention.MultiHeadAttention` answers no query with an empty output itself.
    """

    def __init__(self):
        super().__init__()
        self.register_forward_pre_hook(_check_multihead, with_kwargs=True)

    def check_causal(self) -> None:
        """Raise :class:`UnsupportedContext` if this core, as configured, cannot attend
        causally; models call it when they build a decoder's self-attention, so a run with
        such options stops before training (``forward(causal=True)`` refuses them too)."""


class AlignmentCore(nn.Module):
    """Context 2: pairwise alignment (DecompAtt Eq. 4, CoDA Eq. 7), both directions.

    forward(a (B,La,D), b (B,Lb,D), mask_a (B,La), mask_b (B,Lb), *,
            value_a (B,La,Dv) | None, value_b (B,Lb,Dv) | None)
        -> Alignment(a_aligned (B,La,Dv), b_aligned (B,Lb,Dv),
                     weights_a (B,La,Lb), weights_b (B,La,Lb))

    ``a``/``b`` are the features the scores are computed from (F(a), F(b) in DecompAtt);
    the values pooled default to ``a``/``b``.  ``a_aligned[i]`` pools ``value_b`` for a_i
    (beta_i), ``b_aligned[j]`` pools ``value_a`` for b_j (alpha_j).  ``weights_a[i, j]`` is
    the weight of b_j for a_i, ``weights_b[i, j]`` the weight of a_i for b_j (both in the
    La x Lb layout so they can be plotted together); CoDA has one matrix M for both.
    An empty sequence (La = 0 or Lb = 0) is refused with a ValueError naming the shapes.
    """

    def __init__(self):
        super().__init__()
        self.register_forward_pre_hook(_check_alignment, with_kwargs=True)


class Alignment(NamedTuple):
    a_aligned: Tensor
    b_aligned: Tensor
    weights_a: Tensor
    weights_b: Tensor


def query_projection(query_dim: int, memory_dim: int) -> nn.Module:
    """Maps decoder states to the memory's dimension for mechanisms that compare s_i with
    h_j directly (dot products, L1 distances, L s_i): the identity when the sizes agree,
    else a linear map without bias."""
    if query_dim == memory_dim:
        return nn.Identity()
    return nn.Linear(query_dim, memory_dim, bias=False)


def map_tensors(fn: Callable[[Tensor], Tensor], state):
    """``fn`` applied to every tensor of a tensor, dict, list, tuple or named tuple (nested);
    anything else is kept as it is."""
    if torch.is_tensor(state):
        return fn(state)
    if isinstance(state, dict):
        return {key: map_tensors(fn, value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        items = [map_tensors(fn, value) for value in state]
        return type(state)(*items) if hasattr(state, "_fields") else type(state)(items)
    return state


def select_rows(state, index: Tensor):
    """Row ``index[i]`` of every tensor (dim 0) becomes row i: how beam search reorders its
    state (lit_models.decoding) and a DecoderCore its memory."""
    return map_tensors(lambda t: t.index_select(0, index.to(t.device)), state)


class DecoderCore(nn.Module):
    """Context 3: attention of decoder states over encoder memory (RNN seq2seq).

    precompute(h (B,N,Dm), mask (B,N)) -> memory: whatever depends only on the source,
        computed once per source (key projections, the density matrix's pairwise sums);
        mechanisms implement it as ``build_memory`` (a dict holding the states as ``h``).
    forward(s (B,T,Dq), memory) -> (context (B,T,Dm), weights (B,T,N))  all steps at once
    step(s_t (B,Dq), memory) -> (context (B,Dm), weights (B,N))         one step (beam search)

    ``step`` must equal the corresponding row of ``forward``.  Beam search reorders the
    memory with :meth:`reorder` (index_select on the batch dimension of every tensor).
    No step (T = 0) or an empty memory (N = 0, the memory's ``h``) is refused with a
    ValueError naming the shapes.
    """

    def __init__(self):
        super().__init__()
        self.register_forward_pre_hook(_check_decoder, with_kwargs=True)

    def precompute(self, h: Tensor, mask: Tensor | None = None) -> dict:
        """The memory of encoder states h (B,N,Dm) with ``mask`` (B,N): what
        :meth:`build_memory` makes, after refusing an empty source (N = 0)."""
        _refuse_empty(self, {"memory": (h, 1)})
        return self.build_memory(h, mask)

    def build_memory(self, h: Tensor, mask: Tensor | None) -> dict:
        """What depends only on the source (each mechanism's own); its ``h`` is the states."""
        raise NotImplementedError

    def step(self, s_t: Tensor, memory: dict) -> tuple[Tensor, Tensor]:
        context, weights = self(s_t.unsqueeze(1), memory)
        return context.squeeze(1), weights.squeeze(1)

    @staticmethod
    def reorder(memory: dict, index: Tensor) -> dict:
        return select_rows(memory, index)
