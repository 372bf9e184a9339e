"""Decoding shared by every seq2seq model (one implementation): batched beam search with a
length penalty, and greedy decoding as its width-1 case.

A model decodes through one function, ``step(prefix, state) -> (log_probs, state)``, called
once per time step on every live hypothesis at once (N = batch_size * beam_size rows,
batch-major: rows b*K .. b*K+K-1 are the K hypotheses of example b).  ``state`` is the
model's own cache (keys/values of earlier positions, an LSTM's (h, c), the attention's
per-source memory); after each step's selection it is re-indexed with
``reorder(state, index)``, ``index[i]`` being the row that new row i continues.  Rows are never
dropped and ``index`` always stays inside an example's block of K rows, so per-source tensors
repeated K times (:func:`repeat_beams`) stay valid whether or not they are reordered.

Scores (Wu et al. 2016, Eq. 14; fairseq's and tensor2tensor's beam search): a hypothesis
Y = y_1 .. y_|Y| scores

    s(Y) = log P(Y | X) / lp(|Y|)
    gnmt:    lp(|Y|) = ((5 + |Y|) / 6) ** alpha   GNMT Eq. 14; t2t utils/beam_search.py
    fairseq: lp(|Y|) = |Y| ** alpha               fairseq sequence_generator.py (--lenpen)

where |Y| counts the generated tokens, eos included (t2t divides the step-i scores by
((5 + i + 1) / 6) ** alpha, fairseq the scores of eos at step i by (i + 1) ** lenpen, both
with i counted from 0 and bos not counted).  alpha = 0 scores by log P(Y | X) alone.

References: Y. Wu et al. 2016, "Google's Neural Machine Translation System", arXiv:1609.08144;
tensor2tensor/utils/beam_search.py; fairseq/sequence_generator.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import map_tensors, select_rows

LengthPenalty = Literal["gnmt", "fairseq"]
StepFn = Callable[[Tensor, Any], tuple[Tensor, Any]]
ReorderFn = Callable[[Any, Tensor], Any]


class Hypotheses(NamedTuple):
    """What :func:`beam_search` returns.  Ids are without bos; a hypothesis shorter than the
    longest one of its tensor is padded with eos; one cut at its max_len has no eos."""

    tokens: Tensor  # (B, L) the best hypothesis of each example, L = the longest of them
    scores: Tensor  # (B,) its score s(Y)
    nbest: Tensor  # (B, K, L') the K best finished hypotheses, best first
    nbest_scores: Tensor  # (B, K) -inf where an example has fewer than K hypotheses
    nbest_lengths: Tensor  # (B, K) |Y|: generated tokens, eos included when there is one


def lp(length, kind: LengthPenalty, alpha: float):
    """lp(|Y|) of the module docstring, for an int or a tensor of lengths."""
    if torch.is_tensor(length):
        length = length.double()
    if kind == "gnmt":
        return ((5 + length) / 6) ** alpha
    return length**alpha


def repeat_beams(state, beam_size: int):
    """Per-example tensors (B, ...) -> (B * beam_size, ...) in beam search's batch-major row
    order (every row of example b repeated beam_size times), e.g. the encoder memory and its
    mask."""
    return map_tensors(lambda t: t.repeat_interleave(beam_size, dim=0), state)


@torch.no_grad()
def beam_search(step: StepFn, batch_size: int, bos_id: int, eos_id: int,
                max_len: int | Sequence[int] | Tensor, beam_size: int = 4, *, state=None,
                reorder: ReorderFn = select_rows, length_penalty: LengthPenalty = "gnmt",
                alpha: float = 0.0, device=None) -> Hypotheses:
    """Batched beam search: the ``beam_size`` (K) best hypotheses of each example under
    s(Y) = log P(Y|X) / lp(|Y|) (module docstring).

    step(prefix (N, t) ids, state) -> (log_probs (N, V), state): normalised next-token
        log-probabilities (a log_softmax) after each prefix, N = batch_size * K rows in
        batch-major order; every prefix starts with bos.  ``state`` starts as given here.
    reorder(state, index (N,)) -> state: new row i continues row ``index[i]``; called after
        every step but the last.  Default :func:`select_rows` (index_select on dim 0 of every
        tensor in a tensor/dict/list/tuple), so every tensor in ``state`` must have one row per
        hypothesis; keep anything else out of it, or give your own ``reorder``.
    max_len: the most tokens generated, eos included; an int or one per example (B,), e.g.
        ``(a * source_lengths + b).long()`` for fairseq's ``max_len_a`` / ``max_len_b``.  A
        hypothesis reaching it without eos is finished as it is (cut, scored with |Y| =
        max_len), as greedy decoding does (fairseq's max_len does not count eos: it forces eos
        after max_len tokens, i.e. pass max_len + 1 to allow as many words).

    Each step (fairseq's ``BeamSearch``): extend every live hypothesis by every token and take
    the 2K best extensions by log P; those ending in eos among the best K are finished (kept
    if among the K best finished by s), and the K best that do not end in eos live on.  At the
    first step only row 0 of each example is live (the others start at -inf), so the K rows
    do not repeat one hypothesis.  Ties among the 2K go to the lower row and token id, ties
    among finished hypotheses to the one finished first.

    Early stopping (tensor2tensor's bound, made exact): an example is done when it has K
    finished hypotheses and the worst of them scores at least the best score any live one
    could still reach, max over live Y of log P(Y) / max(lp(|Y| + 1), lp(max_len)) (log P can
    only fall as a hypothesis grows, so this bounds every continuation for alpha of either
    sign).  The K finished hypotheses are then exactly those the search would return without
    early stopping.  With alpha = 0 and K = 1 the search stops as soon as eos is the argmax,
    so width 1 is greedy decoding (:func:`greedy_decode`); with alpha != 0 width 1 may search
    on past that eos for a longer hypothesis the penalty prefers (fairseq's rule, stop once K
    hypotheses have finished, would not).  Decoding stops when every example is done; the
    rows of a done example are still passed to ``step`` (and ignored) until then.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if length_penalty not in get_args(LengthPenalty):
        raise ValueError(f"length_penalty must be one of {get_args(LengthPenalty)}, "
                         f"got {length_penalty!r}")
    if device is None and torch.is_tensor(max_len):
        device = max_len.device
    max_lens = _max_lengths(max_len, batch_size, device)  # (B,)
    longest = int(max_lens.max())
    B, K = batch_size, beam_size
    penalty = partial(lp, kind=length_penalty, alpha=alpha)

    block = torch.arange(B, device=device)[:, None] * K  # (B, 1) first row of each example
    prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
    alive = None  # (B, K) log P of the live hypotheses
    fin_tokens = torch.full((B, K, longest), eos_id, dtype=torch.long, device=device)
    fin_lengths = torch.zeros(B, K, dtype=torch.long, device=device)
    fin_scores = None  # (B, K) s(Y) of the finished ones, best first
    done = torch.zeros(B, dtype=torch.bool, device=device)

    for t in range(1, longest + 1):  # t = |Y| of the hypotheses this step makes
        log_probs, state = step(prefix, state)
        if log_probs.dim() != 2 or log_probs.shape[0] != B * K or log_probs.shape[1] < 2:
            raise ValueError(f"step must return log-probabilities of shape (N, V) with "
                             f"N = batch_size * beam_size = {B * K} and V >= 2, got "
                             f"{tuple(log_probs.shape)}")
        V = log_probs.shape[1]
        if alive is None:
            dtype = torch.promote_types(log_probs.dtype, torch.float32)
            alive = torch.full((B, K), -math.inf, dtype=dtype, device=device)
            alive[:, 0] = 0.0  # one hypothesis per example at the start
            fin_scores = torch.full((B, K), -math.inf, dtype=dtype, device=device)

        candidates = (alive[:, :, None] + log_probs.view(B, K, V)).view(B, K * V)
        top, flat = _best_first(candidates, 2 * K)  # (B, 2K)
        parent, token = flat // V, flat % V
        history = prefix[:, 1:].view(B, K, t - 1)
        seqs = torch.cat([history.gather(1, parent[:, :, None].expand(-1, -1, t - 1)),
                          token[:, :, None]], dim=2)  # (B, 2K, t)
        ends = token == eos_id

        # the best K that do not end in eos live on (at most K of the 2K end in eos)
        keep = torch.sort(ends.to(torch.int8), dim=1, stable=True).indices[:, :K]
        alive = top.gather(1, keep)
        alive_parent = parent.gather(1, keep)
        alive_seqs = seqs.gather(1, keep[:, :, None].expand(-1, -1, t))

        # finished: eos among the best K, and at max_len the live ones, cut
        ended = torch.where(ends[:, :K], top[:, :K] / penalty(t), -math.inf)
        at_max = max_lens == t
        cut = torch.where(at_max[:, None], alive / penalty(t), -math.inf)
        pad = (0, longest - t)
        scores = torch.cat([fin_scores, ended, cut], dim=1)  # (B, 3K)
        tokens = torch.cat([fin_tokens, F.pad(seqs[:, :K], pad, value=eos_id),
                            F.pad(alive_seqs, pad, value=eos_id)], dim=1)
        lengths = torch.cat([fin_lengths, torch.full_like(fin_lengths, t).repeat(1, 2)], dim=1)
        scores, best = torch.sort(scores, dim=1, descending=True, stable=True)
        best = best[:, :K]
        keep_old = done[:, None]
        fin_scores = torch.where(keep_old, fin_scores, scores[:, :K])
        fin_tokens = torch.where(keep_old[:, :, None], fin_tokens,
                                 tokens.gather(1, best[:, :, None].expand(-1, -1, longest)))
        fin_lengths = torch.where(keep_old, fin_lengths, lengths.gather(1, best))

        # early stopping: no live hypothesis can beat the worst of K finished ones
        best_lp = torch.clamp(penalty(max_lens), min=penalty(t + 1)).to(alive.dtype)  # (B,)
        reachable = (alive / best_lp[:, None]).amax(dim=1)
        settled = (fin_scores > -math.inf).all(dim=1) & (fin_scores[:, -1] >= reachable)
        done = done | at_max | settled
        if bool(done.all()):
            break
        state = reorder(state, (block + alive_parent).view(B * K))
        prefix = torch.cat([prefix[:, :1], alive_seqs.view(B * K, t)], dim=1)

    best = fin_tokens[:, 0, :int(fin_lengths[:, 0].max())]
    nbest = fin_tokens[:, :, :int(fin_lengths.max())]
    return Hypotheses(best, fin_scores[:, 0], nbest, fin_scores, fin_lengths)


def _max_lengths(max_len, batch_size: int, device) -> Tensor:
    """max_len as a (B,) long tensor, checked."""
    if isinstance(max_len, bool):
        raise ValueError(f"max_len must be an int or {batch_size} ints, got {max_len!r}")
    if isinstance(max_len, int):
        lengths = torch.full((batch_size,), max_len, dtype=torch.long, device=device)
    else:
        lengths = torch.as_tensor(max_len, device=device)
        if lengths.shape != (batch_size,) or lengths.is_floating_point():
            raise ValueError(f"max_len must be an int or {batch_size} ints (one per example), "
                             f"got shape {tuple(lengths.shape)} of {lengths.dtype}")
        lengths = lengths.long()
    if bool((lengths < 1).any()):
        raise ValueError(f"max_len must be at least 1, got {int(lengths.min())}")
    return lengths


def _best_first(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest of each row and their indices, best first, ties by lower index."""
    values, index = scores.topk(k, dim=1)
    index, order = index.sort(dim=1)
    values, order = values.gather(1, order).sort(dim=1, descending=True, stable=True)
    return values, index.gather(1, order)


@torch.no_grad()
def greedy_decode(next_logits: Callable[[Tensor], Tensor], batch_size: int, bos_id: int,
                  eos_id: int, max_len: int | Sequence[int] | Tensor, device=None) -> Tensor:
    """Argmax decoding: :func:`beam_search` of width 1 with alpha = 0.
    ``next_logits(prefix (B,t)) -> (B,V)`` scores the next token after each prefix (which
    starts with bos).  Returns (B, <=max_len) ids without bos; a finished sequence is padded
    with eos; stops early when every sequence has ended."""

    def step(prefix, state):
        logits = next_logits(prefix)
        return logits.log_softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32)), state

    return beam_search(step, batch_size, bos_id, eos_id, max_len, beam_size=1,
                       device=device).tokens
