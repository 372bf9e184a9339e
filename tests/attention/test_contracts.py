"""The contracts every attention mechanism keeps, written once over the registry (as xformers'
tests/test_attentions.py): in each context a mechanism supports (attention/base.py),

(a) an incremental step equals the matching row of the full forward: a decoder step, and
    causal multi-head attention of the last queries over the keys so far (query i sees keys
    j <= i + (Lk - Lq));
(b) beam search's reordering of the decoder memory equals precomputing it for the reordered
    sources;
(c) padded keys get exactly zero weight;
(d) padding changes nothing: garbage at the padded positions (keys and queries; in
    cross-attention the padded target tokens, which the core sees as ordinary queries) leaves
    the real outputs and weights as they were, and a right-padded sequence gives what it
    gives alone;
(e) causal attention ignores the future: changing position > i leaves rows <= i unchanged,
    and future keys get exactly zero weight;
(f) incremental decoding with cached keys and values (MultiHeadAttention's ``cache``) equals
    the full forward: causal self-attention fed one or two positions at a time, and
    cross-attention with its memory projected once, reordered as beam search does;
(g) an empty sequence (no key, no query, no decoder step, an empty source) is refused with one
    ValueError naming the core and the shapes, whatever the mechanism, and
    MultiHeadAttention answers no query with an empty output.

A mechanism added to the registry gets every test here; its own file keeps only the tests
against its paper's formulas.  float64 throughout, dropout 0 (eval mode).  Where a mechanism
documents that it refuses a context (an error naming the reason), the test checks that error
and skips.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from attention import REGISTRY, Mechanism, MultiHeadAttention, UnsupportedContext, build
from lit_models.decoding import select_rows

DT = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)
GARBAGE = 100.0  # scale of the random values written into padded positions

#: every registered mechanism with its defaults, then the options that take other code paths
VARIANTS = [build(name) for name in REGISTRY] + [
    build("coda", center_e=True),
    build("coda", gate="centered"),
    # the window's variants and boundaries, the "length" scale counting the visible keys
    build("window", variant="mw", boundary_scale="length"),
    build("window", boundary="authors", boundary_scale="length"),
    build("window", variant="mw", boundary="authors", boundary_scale="length"),
    build("window", segment_size=2),
    build("window", variant="mw", segment_size=2),
    build("localness", window=3),
    build("relative", max_distance=2),  # distances clipped within these lengths
    build("relative", max_distance=2, values=False),
    build("luong", score="dot"),
    build("density", scheme="aqt", block_elements=30),  # several blocks of (step, row j)
    build("structured", score="additive"),
]

# the shapes: a batch of right-padded sequences, the last one padded most
D_MODEL, N_HEADS = 8, 2
SELF_LENGTHS = (6, 3)  # self-attention (queries = keys); 3 of 6 is a partial segment of 2
TARGET_LENGTHS, SOURCE_LENGTHS = (5, 3), (7, 4)  # cross-attention: queries, keys
A_LENGTHS, B_LENGTHS, DIM = (5, 3), (3, 4), 6  # alignment
STEPS, QUERY_DIM, MEMORY_DIM, MEMORY_LENGTHS = 4, 5, 6, (7, 4, 6)  # decoder


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    """CoDA's block kernels eagerly: the same expressions (test_coda.py tests the compiled
    ones), without compile time for float64."""
    monkeypatch.setattr(importlib.import_module("attention._compiled"), "COMPILE", False)


# -- cases -----------------------------------------------------------------------------------
def cases(context: str, modes: tuple[str, ...] | None = None):
    """pytest params of every variant that supports ``context``: the mechanism, or
    (mechanism, mode) for each of ``modes``."""
    supported = [m for m in VARIANTS if m.supports(context)]
    if modes is None:
        return [pytest.param(m, id=m.tag()) for m in supported]
    return [pytest.param(m, mode, id=f"{m.tag()}-{mode}") for m in supported for mode in modes]


def refused(mechanism: Mechanism, mode: str) -> tuple[type[Exception], str] | None:
    """The documented error of a mechanism that cannot run multi-head attention in ``mode``."""
    if mechanism.name == "relative" and mode == "cross":
        return UnsupportedContext, "cross attention.*same sequence"
    if mechanism.name == "density" and mechanism.scheme == "mqt" and mode == "causal":
        return UnsupportedContext, "'density'.*causal"
    if mechanism.name == "window" and mechanism.segment_size > 1 and mode == "causal":
        return ValueError, "cannot point to unfinished segments"
    return None


def lengths_mask(lengths: tuple[int, ...]) -> torch.Tensor:
    """(B, max length) boolean, True at the first lengths[b] positions (right padding)."""
    return torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]


def randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=DT)


def with_garbage(x: torch.Tensor, mask: torch.Tensor, g) -> torch.Tensor:
    """x (B, L, D) with random values of scale GARBAGE where mask (B, L) is False."""
    return torch.where(mask[..., None], x, GARBAGE * randn(*x.shape, g=g))


# -- multi-head attention: self, causal self, cross --------------------------------------------
MODES = ("self", "causal", "cross")


def block(mechanism: Mechanism, mode: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(D_MODEL, N_HEADS, mechanism,
                              self_attention=mode != "cross").double().eval()


def attend(mha: MultiHeadAttention, mode: str, queries, keys, mask):
    """(out (B,Lq,D), weights (B,H,Lq,Lk))."""
    return mha(queries, keys, mask, causal=mode == "causal", need_weights=True)


def multihead(mechanism: Mechanism, mode: str):
    """(MultiHeadAttention, queries (B,Lq,D), keys (B,Lk,D), key mask (B,Lk)); where the
    mechanism documents that it refuses ``mode``, check its error and skip."""
    g = torch.Generator().manual_seed(1)
    if mode == "cross":
        mask = lengths_mask(SOURCE_LENGTHS)
        queries = randn(len(TARGET_LENGTHS), max(TARGET_LENGTHS), D_MODEL, g=g)
        keys = randn(*mask.shape, D_MODEL, g=g)
    else:
        mask = lengths_mask(SELF_LENGTHS)
        queries = keys = randn(*mask.shape, D_MODEL, g=g)
    error = refused(mechanism, mode)
    if error is not None:
        with pytest.raises(error[0], match=error[1]):
            attend(block(mechanism, mode), mode, queries, keys, mask)
        pytest.skip(f"{mechanism.tag()} refuses {mode} attention (documented)")
    return block(mechanism, mode), queries, keys, mask


def query_mask(mode: str, key_mask: torch.Tensor) -> torch.Tensor:
    """(B, Lq): the real queries.  Cross-attention cores see no query mask: a padded target
    token is a query like any other, and must change no real row."""
    return lengths_mask(TARGET_LENGTHS) if mode == "cross" else key_mask


def same(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, expected, **TIGHT, msg=lambda text: f"{what}: {text}")


@pytest.mark.parametrize("mechanism,mode", cases("multihead", MODES))
def test_multihead_padded_keys_get_zero_weight(mechanism, mode):
    mha, queries, keys, mask = multihead(mechanism, mode)
    _, weights = attend(mha, mode, queries, keys, mask)
    padded = ~mask[:, None, None, :].expand_as(weights)  # every query row, padded ones too
    assert (weights[padded] == 0).all()


@pytest.mark.parametrize("mechanism,mode", cases("multihead", MODES))
def test_multihead_padding_changes_nothing(mechanism, mode):
    mha, queries, keys, mask = multihead(mechanism, mode)
    out, weights = attend(mha, mode, queries, keys, mask)
    real_queries = query_mask(mode, mask)
    g = torch.Generator().manual_seed(2)
    keys_g = with_garbage(keys, mask, g)
    queries_g = keys_g if mode != "cross" else with_garbage(queries, real_queries, g)
    out_g, weights_g = attend(mha, mode, queries_g, keys_g, mask)
    for n in range(len(mask)):
        rows, real = slice(0, int(real_queries[n].sum())), int(mask[n].sum())
        same(out_g[n, rows], out[n, rows], f"sequence {n}: garbage at padded positions, output")
        same(weights_g[n, :, rows], weights[n, :, rows], f"sequence {n}: garbage, weights")
        alone, alone_weights = attend(mha, mode, queries[n:n + 1, rows], keys[n:n + 1, :real],
                                      None)
        same(out[n, rows], alone[0], f"sequence {n}: padded vs alone, output")
        same(weights[n, :, rows, :real], alone_weights[0], f"sequence {n}: padded vs alone, "
             "weights")


@pytest.mark.parametrize("mechanism,mode", cases("multihead", ("causal",)))
def test_causal_attention_ignores_the_future(mechanism, mode):
    mha, x, _, mask = multihead(mechanism, mode)
    out, weights = attend(mha, mode, x, x, mask)
    assert (weights.triu(1) == 0).all()  # future keys: exactly zero weight
    g = torch.Generator().manual_seed(3)
    length = x.shape[1]
    for i in range(length - 1):
        past = (torch.arange(length) <= i).expand(mask.shape)
        changed = with_garbage(x, past, g)  # every position > i
        out_c, weights_c = attend(mha, mode, changed, changed, mask)
        same(out_c[:, :i + 1], out[:, :i + 1], f"positions > {i} changed, output of rows <= {i}")
        same(weights_c[:, :, :i + 1], weights[:, :, :i + 1],
             f"positions > {i} changed, weights of rows <= {i}")
        assert not torch.allclose(out_c[:, i + 1:], out[:, i + 1:])  # and the change is seen


@pytest.mark.parametrize("mechanism,mode", cases("multihead", ("causal",)))
def test_causal_step_equals_the_full_row(mechanism, mode):
    """The new query (and the new two, and the whole prefix) over the keys so far, as in
    cached decoding, equal those rows of the full causal attention."""
    mha, x, _, mask = multihead(mechanism, mode)
    out, weights = attend(mha, mode, x, x, mask)
    for t in range(x.shape[1]):
        for first in sorted({t, max(t - 1, 0), 0}):
            out_t, weights_t = attend(mha, mode, x[:, first:t + 1], x[:, :t + 1],
                                      mask[:, :t + 1])
            same(out_t, out[:, first:t + 1], f"queries {first}..{t} over keys 0..{t}, output")
            same(weights_t, weights[:, :, first:t + 1, :t + 1],
                 f"queries {first}..{t} over keys 0..{t}, weights")


@pytest.mark.parametrize("mechanism,mode", cases("multihead", ("causal", "cross")))
def test_cached_incremental_attention_equals_the_full_forward(mechanism, mode):
    """(f): the decoder's two attention modules run step by step with a cache, as beam
    search runs them, give the rows of the full forward; after a reorder of the cache (beam
    search's parents), the rows of the reordered sequences."""
    mha, queries, keys, mask = multihead(mechanism, mode)
    full, full_weights = attend(mha, mode, queries, keys, mask)
    for chunk in (1, 2):
        cache, rows, weight_rows = {}, [], []
        for first in range(0, queries.shape[1], chunk):
            new = slice(first, first + chunk)
            if mode == "cross":
                out, weights = mha(queries[:, new], keys, mask, need_weights=True, cache=cache)
            else:
                out, weights = mha(queries[:, new], queries[:, new], mask[:, new], causal=True,
                                   need_weights=True, cache=cache)
            rows.append(out)
            weight_rows.append(torch.nn.functional.pad(
                weights, (0, full_weights.shape[-1] - weights.shape[-1])))
        same(torch.cat(rows, 1), full, f"{chunk} position(s) per step, output")
        same(torch.cat(weight_rows, 2), full_weights, f"{chunk} position(s) per step, weights")

    # beam search: after two steps, continue the sequences in reversed order
    cache, t = {}, 2
    for i in range(t):
        kv = keys if mode == "cross" else queries[:, i:i + 1]
        kv_mask = mask if mode == "cross" else mask[:, i:i + 1]
        mha(queries[:, i:i + 1], kv, kv_mask, causal=mode != "cross", cache=cache)
    index = torch.arange(len(mask)).flip(0)
    cache = select_rows(cache, index)
    kv = keys[index] if mode == "cross" else queries[index, t:t + 1]
    kv_mask = mask[index] if mode == "cross" else mask[index, t:t + 1]
    out, _ = mha(queries[index, t:t + 1], kv, kv_mask, causal=mode != "cross", cache=cache)
    same(out, full[index, t:t + 1], "reordered cache, output")


# -- pairwise alignment ------------------------------------------------------------------------
def alignment(mechanism: Mechanism):
    """(core, (a (B,La,D), b (B,Lb,D), mask_a, mask_b, value_a (B,La,Dv), value_b (B,Lb,Dv)))."""
    torch.manual_seed(0)
    core = mechanism.alignment(dim=DIM).double().eval()
    g = torch.Generator().manual_seed(1)
    mask_a, mask_b = lengths_mask(A_LENGTHS), lengths_mask(B_LENGTHS)
    a, b = randn(*mask_a.shape, DIM, g=g), randn(*mask_b.shape, DIM, g=g)
    value_a, value_b = randn(*mask_a.shape, 3, g=g), randn(*mask_b.shape, 3, g=g)
    return core, (a, b, mask_a, mask_b, value_a, value_b)


def align(core, a, b, mask_a, mask_b, value_a, value_b):
    return core(a, b, mask_a, mask_b, value_a=value_a, value_b=value_b)


@pytest.mark.parametrize("mechanism", cases("alignment"))
def test_alignment_padded_positions_get_zero_weight(mechanism):
    """Padded keys get no weight in either direction, and padded tokens have no alignment
    of their own (weights_a: b_j for a_i, weights_b: a_i for b_j, both La x Lb)."""
    core, inputs = alignment(mechanism)
    out = align(core, *inputs)
    mask_a, mask_b = inputs[2], inputs[3]
    padded = ~(mask_a[:, :, None] & mask_b[:, None, :])
    assert (out.weights_a[padded] == 0).all() and (out.weights_b[padded] == 0).all()


@pytest.mark.parametrize("mechanism", cases("alignment"))
def test_alignment_padding_changes_nothing(mechanism):
    core, (a, b, mask_a, mask_b, value_a, value_b) = alignment(mechanism)
    out = align(core, a, b, mask_a, mask_b, value_a, value_b)
    g = torch.Generator().manual_seed(2)
    garbage = align(core, with_garbage(a, mask_a, g), with_garbage(b, mask_b, g), mask_a, mask_b,
                    with_garbage(value_a, mask_a, g), with_garbage(value_b, mask_b, g))
    for n in range(len(mask_a)):
        la, lb = int(mask_a[n].sum()), int(mask_b[n].sum())
        alone = align(core, a[n:n + 1, :la], b[n:n + 1, :lb], None, None, value_a[n:n + 1, :la],
                      value_b[n:n + 1, :lb])
        real = {"a_aligned": (slice(0, la),), "b_aligned": (slice(0, lb),),
                "weights_a": (slice(0, la), slice(0, lb)),
                "weights_b": (slice(0, la), slice(0, lb))}
        for field, index in real.items():
            batched = getattr(out, field)[(n, *index)]
            same(getattr(garbage, field)[(n, *index)], batched,
                 f"sequence {n}: garbage at padded positions, {field}")
            same(batched, getattr(alone, field)[0], f"sequence {n}: padded vs alone, {field}")


# -- decoder attention over encoder memory -----------------------------------------------------
def decoder(mechanism: Mechanism):
    """(core, s (B,T,Dq), h (B,N,Dm), mask (B,N))."""
    # luong's dot score s . h needs one dimension (its documented limit, test_luong.py)
    query_dim = MEMORY_DIM if mechanism == build("luong", score="dot") else QUERY_DIM
    torch.manual_seed(0)
    core = mechanism.decoder(query_dim=query_dim, memory_dim=MEMORY_DIM).double().eval()
    g = torch.Generator().manual_seed(1)
    mask = lengths_mask(MEMORY_LENGTHS)
    return (core, randn(len(mask), STEPS, query_dim, g=g), randn(*mask.shape, MEMORY_DIM, g=g),
            mask)


@pytest.mark.parametrize("mechanism", cases("decoder"))
def test_decoder_step_equals_the_forward_row(mechanism):
    core, s, h, mask = decoder(mechanism)
    memory = core.precompute(h, mask)
    context, weights = core(s, memory)
    for t in range(STEPS):
        context_t, weights_t = core.step(s[:, t], memory)
        same(context_t, context[:, t], f"step {t}, context")
        same(weights_t, weights[:, t], f"step {t}, weights")


@pytest.mark.parametrize("mechanism", cases("decoder"))
def test_decoder_reorder_equals_the_step_on_reordered_sources(mechanism):
    """Beam search: the memory reordered (beams repeated and permuted, then reordered again)
    gives the step of the memory precomputed for the reordered sources."""
    core, s, h, mask = decoder(mechanism)
    memory = core.precompute(h, mask)
    beams = torch.tensor([2, 0, 2, 1, 1])
    again = torch.tensor([4, 0, 3, 0])
    reordered = core.reorder(memory, beams)
    twice = core.reorder(reordered, again)
    for t in range(STEPS):
        for index, mem in ((beams, reordered), (beams[again], twice)):
            context, weights = core.step(s[index, t], mem)
            fresh = core.step(s[index, t], core.precompute(h[index], mask[index]))
            same(context, fresh[0], f"step {t}, beams {index.tolist()}, context")
            same(weights, fresh[1], f"step {t}, beams {index.tolist()}, weights")
            unordered = core.step(s[:, t], memory)
            same(context, unordered[0][index], f"step {t}, beams {index.tolist()}, context")
            same(weights, unordered[1][index], f"step {t}, beams {index.tolist()}, weights")


@pytest.mark.parametrize("mechanism", cases("decoder"))
def test_decoder_padded_keys_get_zero_weight(mechanism):
    core, s, h, mask = decoder(mechanism)
    memory = core.precompute(h, mask)
    _, weights = core(s, memory)
    assert (weights[~mask[:, None, :].expand_as(weights)] == 0).all()
    _, weights_t = core.step(s[:, 0], memory)
    assert (weights_t[~mask] == 0).all()


@pytest.mark.parametrize("mechanism", cases("decoder"))
def test_decoder_padding_changes_nothing(mechanism):
    core, s, h, mask = decoder(mechanism)
    context, weights = core(s, core.precompute(h, mask))
    h_g = with_garbage(h, mask, torch.Generator().manual_seed(2))
    context_g, weights_g = core(s, core.precompute(h_g, mask))
    same(context_g, context, "garbage at padded positions, context")
    same(weights_g, weights, "garbage at padded positions, weights")
    for n in range(len(mask)):
        real = int(mask[n].sum())
        alone, alone_weights = core(s[n:n + 1], core.precompute(h[n:n + 1, :real], None))
        same(context[n], alone[0], f"sequence {n}: padded vs alone, context")
        same(weights[n, :, :real], alone_weights[0], f"sequence {n}: padded vs alone, weights")


# -- (g) empty sequences -----------------------------------------------------------------------
EMPTY = r"of length 0 \(.*\); attention needs at least one query and one key"


@pytest.mark.parametrize("mechanism", cases("multihead"))
def test_multihead_no_query_gives_an_empty_output(mechanism):
    """Cross attention of no target position (MultiHeadAttention answers it; relative,
    self-only, is asked the same over its own keys)."""
    self_only = mechanism.name == "relative"
    mha = block(mechanism, "self" if self_only else "cross")
    g = torch.Generator().manual_seed(1)
    keys = randn(2, 4, D_MODEL, g=g)
    queries = randn(2, 0, D_MODEL, g=g)
    out, weights = mha(queries, keys, lengths_mask((4, 2)), need_weights=True)
    assert out.shape == (2, 0, D_MODEL) and weights.shape == (2, N_HEADS, 0, 4)
    out.sum().backward()  # an empty loss term trains nothing and breaks nothing
    grad = mha.out_proj.weight.grad
    assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("mechanism,mode", cases("multihead", MODES))
def test_multihead_no_key_is_refused(mechanism, mode):
    mha, queries, keys, mask = multihead(mechanism, mode)
    empty = keys[:, :0]
    with pytest.raises(ValueError, match=f"keys {EMPTY}"):
        mha(queries if mode == "cross" else empty, empty, mask[:, :0],
            causal=mode == "causal")
    core_q = torch.zeros(2, N_HEADS, 0, D_MODEL // N_HEADS, dtype=DT)
    with pytest.raises(ValueError, match=f"{type(mha.core).__name__}: queries and keys {EMPTY}"):
        mha.core(core_q, core_q, core_q, causal=mode == "causal")


@pytest.mark.parametrize("mechanism", cases("alignment"))
@pytest.mark.parametrize("empty", ["a", "b"])
def test_alignment_empty_sequence_is_refused(mechanism, empty):
    core, (a, b, mask_a, mask_b, value_a, value_b) = alignment(mechanism)
    if empty == "a":
        a, mask_a, value_a = a[:, :0], mask_a[:, :0], value_a[:, :0]
    else:
        b, mask_b, value_b = b[:, :0], mask_b[:, :0], value_b[:, :0]
    with pytest.raises(ValueError, match=f"{type(core).__name__}: {empty} {EMPTY}"):
        align(core, a, b, mask_a, mask_b, value_a, value_b)


@pytest.mark.parametrize("mechanism", cases("decoder"))
def test_decoder_empty_source_or_no_step_is_refused(mechanism):
    core, s, h, mask = decoder(mechanism)
    name = type(core).__name__
    with pytest.raises(ValueError, match=f"{name}: memory {EMPTY}"):
        core.precompute(h[:, :0], mask[:, :0])
    memory = core.precompute(h, mask)
    with pytest.raises(ValueError, match=f"{name}: steps {EMPTY}"):
        core(s[:, :0], memory)
    with pytest.raises(ValueError, match=f"{name}: memory {EMPTY}"):
        core(s, {**memory, "h": h[:, :0]})  # a memory made by hand, not by precompute
