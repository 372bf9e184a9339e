"""Beam search and greedy decoding (lit_models/decoding.py) on tiny "language models": fixed
random tables of log-probabilities conditioned on the example, the position and the last
token.  Beam search against exhaustive search over every sequence (both length penalties,
several alphas, per-example max lengths), width 1 against an argmax loop, the reorder hook's
parent indices, early stopping by counting calls, and argument errors."""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import pytest
import torch

from lit_models.decoding import (
    beam_search,
    greedy_decode,
    repeat_beams,
    select_rows,
)

BOS, EOS = 0, 1


def random_table(batch: int, positions: int, vocab: int, seed: int, eos_bias: float = 0.0):
    """log P(next | example, position, last token): (B, T, V, V), float64."""
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(batch, positions, vocab, vocab, generator=g, dtype=torch.float64)
    logits[..., EOS] += eos_bias
    return logits.log_softmax(-1)


def table_step(table, beam_size: int):
    """step() of the table model: row r belongs to example r // beam_size."""

    def step(prefix, state):
        example = torch.arange(prefix.shape[0]) // beam_size
        return table[example, prefix.shape[1] - 1, prefix[:, -1]], state

    return step


def score(table, b: int, seq: tuple[int, ...], kind: str, alpha: float) -> float:
    """s(Y) = log P(Y) / lp(|Y|), summed left to right as beam search does; |Y| counts eos."""
    log_p, last = 0.0, BOS
    for position, token in enumerate(seq):
        log_p += table[b, position, last, token].item()
        last = token
    n = len(seq)
    lp = ((5 + n) / 6) ** alpha if kind == "gnmt" else n**alpha
    return log_p / lp


def every_sequence(vocab: int, max_len: int):
    """Every output: non-eos tokens then eos (|Y| <= max_len), or max_len non-eos tokens."""
    words = [v for v in range(vocab) if v != EOS]
    for n in range(max_len):
        yield from (body + (EOS,) for body in itertools.product(words, repeat=n))
    yield from itertools.product(words, repeat=max_len)


def hypothesis(tokens, length) -> tuple[int, ...]:
    return tuple(tokens[: int(length)].tolist())


@pytest.mark.parametrize("kind, alpha", [("gnmt", 0.0), ("gnmt", 0.6), ("gnmt", 2.0),
                                         ("fairseq", 1.0), ("fairseq", 0.5),
                                         ("fairseq", -0.5)])
def test_wide_beam_is_exhaustive_search(kind, alpha):
    vocab, max_lens = 4, [1, 3, 5, 4]
    table = random_table(len(max_lens), max(max_lens), vocab, seed=1)
    # wide enough that nothing is pruned: K >= the candidates of the last step, V * 3^4
    beam = vocab * (vocab - 1) ** (max(max_lens) - 1)
    out = beam_search(table_step(table, beam), len(max_lens), BOS, EOS, torch.tensor(max_lens),
                      beam, length_penalty=kind, alpha=alpha)
    assert out.nbest.shape[:2] == (len(max_lens), beam)
    for b, max_len in enumerate(max_lens):
        ranked = sorted(every_sequence(vocab, max_len),
                        key=lambda seq, b=b: score(table, b, seq, kind, alpha), reverse=True)
        best = [(seq, score(table, b, seq, kind, alpha)) for seq in ranked[:beam]]
        found = [(hypothesis(out.nbest[b, k], out.nbest_lengths[b, k]),
                  out.nbest_scores[b, k].item()) for k in range(len(best))]
        assert [seq for seq, _ in found] == [seq for seq, _ in best]
        assert [s for _, s in found] == pytest.approx([s for _, s in best], rel=1e-12)
        assert bool((out.nbest_scores[b, len(best):] == -math.inf).all())  # fewer than K exist
        n = len(ranked[0])
        assert hypothesis(out.tokens[b], n) == ranked[0]
        assert bool((out.tokens[b, n:] == EOS).all())  # padded with eos
        assert out.scores[b].item() == pytest.approx(best[0][1], rel=1e-12)
    assert out.tokens.shape[1] == int(out.nbest_lengths[:, 0].max())
    assert out.nbest.shape[2] == int(out.nbest_lengths.max())


def reference_greedy(table, max_len: int):
    """Argmax decoding written out: one token per step, eos after the end, stop when all
    have ended."""
    batch = table.shape[0]
    prefix = torch.full((batch, 1), BOS)
    done = torch.zeros(batch, dtype=torch.bool)
    for _ in range(max_len):
        logits = table[torch.arange(batch), prefix.shape[1] - 1, prefix[:, -1]]
        token = logits.argmax(-1).masked_fill(done, EOS)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
        done |= token == EOS
        if done.all():
            break
    return prefix[:, 1:]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_len", [1, 3, 8])
def test_width_one_is_greedy(seed, max_len):
    table = random_table(5, max_len, vocab=6, seed=seed, eos_bias=1.0)
    expected = reference_greedy(table, max_len)
    step = table_step(table, beam_size=1)
    assert torch.equal(greedy_decode(lambda prefix: step(prefix, None)[0], 5, BOS, EOS, max_len),
                       expected)
    out = beam_search(step, 5, BOS, EOS, max_len, beam_size=1)
    assert torch.equal(out.tokens, expected)
    assert out.nbest.shape == (5, 1, expected.shape[1])


class Cache(NamedTuple):
    seen: torch.Tensor  # (N, t) the prefix each row was given at the previous step
    hidden: tuple  # (h, c) like an LSTM's, one row per hypothesis
    beam: int  # not a tensor: kept as it is


@pytest.mark.parametrize("kind, alpha", [("gnmt", 0.6), ("fairseq", 1.0)])
def test_reorder_gives_each_row_its_parent(kind, alpha):
    """A cache that records each row's prefix: after reorder it must be the new prefix
    without its last token.  The model reads the token before last from the cache, so a
    wrong parent would also change the scores."""
    batch, beam, vocab, max_len = 3, 4, 5, 6
    table = random_table(batch, max_len, vocab, seed=7)
    before_last = random_table(1, 1, vocab, seed=8)[0, 0]  # (V, V) added log-odds
    seen_by_step, indices = [set() for _ in range(batch)], []

    def step(prefix, cache):
        n, t = prefix.shape
        assert torch.equal(cache.seen, prefix[:, :-1])
        assert torch.equal(cache.hidden[0][:, 0], cache.seen.sum(1))
        example = torch.arange(n) // beam
        for row in range(n):
            seen_by_step[row // beam].add(tuple(prefix[row, 1:].tolist()))
        earlier = cache.seen[:, -1] if t > 1 else torch.full((n,), BOS)
        log_probs = (table[example, t - 1, prefix[:, -1]] + before_last[earlier]).log_softmax(-1)
        state = prefix.sum(1, keepdim=True)
        return log_probs, Cache(prefix, (state, -state), cache.beam)

    def reorder(cache, index):
        indices.append(index)
        return select_rows(cache, index)

    empty = torch.zeros(batch * beam, 0, dtype=torch.long)
    zeros = torch.zeros(batch * beam, 1, dtype=torch.long)
    start = Cache(empty, (zeros, zeros), beam)
    out = beam_search(step, batch, BOS, EOS, max_len, beam, state=start, reorder=reorder,
                      length_penalty=kind, alpha=alpha)

    assert indices, "reorder was never called"
    for index in indices:  # a parent is always a row of the same example
        assert torch.equal(index // beam, torch.arange(batch * beam) // beam)
    for b in range(batch):
        for k in range(beam):
            seq = hypothesis(out.nbest[b, k], out.nbest_lengths[b, k])
            assert seq[:-1] in seen_by_step[b]
            log_p, earlier, last = 0.0, BOS, BOS
            for position, token in enumerate(seq):
                row = table[b, position, last] + before_last[earlier]
                log_p += row.log_softmax(-1)[token].item()
                earlier, last = last, token
            n = len(seq)
            lp = ((5 + n) / 6) ** alpha if kind == "gnmt" else n**alpha
            assert out.nbest_scores[b, k].item() == pytest.approx(log_p / lp, rel=1e-9)


def counting_step(log_probs_row, beam_size: int):
    """Every row gets the same next-token distribution; counts the calls."""
    calls = []

    def step(prefix, state):
        calls.append(prefix.shape[1])
        return log_probs_row.expand(prefix.shape[0], -1), state

    return step, calls


@pytest.mark.parametrize("kind, alpha, expected_calls", [("gnmt", 0.0, 2), ("gnmt", 0.6, 3),
                                                         ("fairseq", 1.0, 11)])
def test_early_stopping(kind, alpha, expected_calls):
    """P(eos) = 0.97 at every step, K = 3.  Step 1 finishes [eos]; step 2 finishes two of
    length 2 (log P = log 0.0097), and the live ones have log P = 2 log 0.01.  alpha = 0:
    they can no longer win, stop after 2 calls.  The bound divides by lp(max_len = 20):
    gnmt 0.6 needs 3 log 0.01 / 2.353 < log 0.0097 / 1.097 (3 calls); fairseq 1.0 needs
    t log 0.01 / 20 < log 0.0097 / 2, t = 11 calls."""
    log_probs = torch.tensor([0.01, 0.97, 0.01, 0.005, 0.005]).log()
    step, calls = counting_step(log_probs, 3)
    out = beam_search(step, 2, BOS, EOS, 20, 3, length_penalty=kind, alpha=alpha)
    assert len(calls) == expected_calls < 20
    assert out.tokens.tolist() == [[EOS], [EOS]]
    assert out.nbest_lengths.tolist() == [[1, 2, 2]] * 2


def test_without_eos_runs_to_max_len_and_cuts():
    log_probs = torch.tensor([0.1, 0.0, 0.5, 0.4]).log()  # eos impossible
    step, calls = counting_step(log_probs, 2)
    out = beam_search(step, 2, BOS, EOS, torch.tensor([2, 5]), 2)
    assert len(calls) == 5
    assert out.nbest_lengths.tolist() == [[2, 2], [5, 5]]
    assert out.tokens.tolist() == [[2, 2, EOS, EOS, EOS], [2, 2, 2, 2, 2]]
    assert out.scores.tolist() == pytest.approx([2 * math.log(0.5), 5 * math.log(0.5)])


def test_state_helpers():
    state = {"h": torch.arange(6).view(3, 2), "pair": (torch.arange(3), 5), "name": "x"}
    picked = select_rows(state, torch.tensor([2, 2, 0]))
    assert picked["h"].tolist() == [[4, 5], [4, 5], [0, 1]]
    assert picked["pair"][0].tolist() == [2, 2, 0] and picked["pair"][1] == 5
    assert picked["name"] == "x"
    repeated = repeat_beams(state, 2)
    assert repeated["pair"][0].tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("kwargs, message", [
    ({"beam_size": 0}, "beam_size must be at least 1, got 0"),
    ({"beam_size": -2}, "beam_size must be at least 1"),
    ({"max_len": 0}, "max_len must be at least 1, got 0"),
    ({"max_len": torch.tensor([3, 0])}, "max_len must be at least 1, got 0"),
    ({"max_len": torch.tensor([3, 4, 5])}, r"one per example\), got shape \(3,\)"),
    ({"max_len": torch.tensor([3.0, 4.0])}, "2 ints"),
    ({"length_penalty": "t2t"}, "length_penalty must be one of"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
])
def test_bad_arguments(kwargs, message):
    args = {"batch_size": 2, "max_len": 4, "beam_size": 2} | kwargs
    step = table_step(random_table(2, 4, 4, seed=0), beam_size=max(args["beam_size"], 1))
    with pytest.raises(ValueError, match=message):
        beam_search(step, args.pop("batch_size"), BOS, EOS, **args)


def test_step_of_wrong_shape():
    def step(prefix, state):
        return torch.zeros(prefix.shape[0] // 2, 4), state

    with pytest.raises(ValueError, match=r"N = batch_size \* beam_size = 6 .* got \(3, 4\)"):
        beam_search(step, 2, BOS, EOS, 4, beam_size=3)
