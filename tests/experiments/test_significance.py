"""experiments/harness/significance.py on closed-form cases: identical systems, a proposal better on
every unit, the normal-approximation width of the bootstrap interval, an exactly enumerated
randomization p-value, the seed level (a gain on one seed and a loss on the other; copies of
one run), BLEU from summed statistics against sacreBLEU itself (hand-written sentences and
the real IWSLT'15 tst2012.vi), perplexity's direction, input errors and determinism."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from experiments.harness import significance as sig
from experiments.harness.significance import (
    HOLDS,
    KINDS,
    NOT_SIGNIFICANT,
    REVERSED,
    aggregate,
    approximate_randomization,
    bleu_stats,
    compare,
    format_interval,
    format_p,
    mean_stats,
    paired_bootstrap,
    perplexity_stats,
)
from tests.conftest import perturbed

SAMPLES = 2000


def accuracy(values) -> np.ndarray:
    return mean_stats(np.asarray(values, dtype=float))


# -- closed-form cases ---------------------------------------------------------------------------
@pytest.mark.parametrize("seeds", [1, 3])
def test_identical_systems_have_p_one_zero_diff_and_a_zero_interval(seeds):
    rng = np.random.default_rng(0)
    runs = [mean_stats(rng.random(200)) for _ in range(seeds)]  # AP-like fractional values
    same = [r.copy() for r in runs]
    boot = paired_bootstrap("mean", runs, same, samples=SAMPLES)
    assert (boot.diff, boot.low, boot.high, boot.p_value) == (0.0, 0.0, 0.0, 1.0)
    ar = approximate_randomization("mean", runs, same, samples=SAMPLES)
    assert (ar.diff, ar.p_value) == (0.0, 1.0)
    for test in ("bootstrap", "randomization"):
        c = compare("mean", runs, same, test=test, samples=SAMPLES)
        assert (c.diff, c.low, c.high, c.p_value, c.verdict) == (0.0, 0.0, 0.0, 1.0,
                                                                 NOT_SIGNIFICANT)
        assert c.baseline == c.proposal == pytest.approx(100 * np.mean([r[:, 0].mean()
                                                                        for r in runs]))


def test_identical_bleu_systems_have_p_one():
    hyps = ["the cat sat on the mat", "a dog ran", "", "it is what it is"]
    refs = ["the cat sat on a mat", "the dog ran away", "nothing here", "it is as it is"]
    stats = bleu_stats(hyps, refs)
    c = compare("bleu", [stats], [stats.copy()], samples=500)
    assert (c.diff, c.low, c.high, c.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert approximate_randomization("bleu", [stats], [stats], samples=500).p_value == 1.0


def test_a_proposal_right_everywhere_the_baseline_is_wrong_holds_and_swapped_is_reversed():
    n = SAMPLES
    floor = 1 / (n + 1)  # the smallest p-value: no replicate as extreme as the observation
    # proposal all correct, baseline all wrong
    good, bad = [accuracy(np.ones(60))], [accuracy(np.zeros(60))]
    for test in ("bootstrap", "randomization"):
        c = compare("mean", bad, good, test=test, samples=n)
        assert (c.diff, c.p_value, c.verdict, c.test) == (100.0, floor, HOLDS, test)
        r = compare("mean", good, bad, test=test, samples=n)
        assert (r.diff, r.p_value, r.verdict) == (-100.0, floor, REVERSED)
    # equal on 70 of 100 examples, the proposal right on the 30 the baseline got wrong
    rng = np.random.default_rng(1)
    base = (rng.random(100) < 0.5).astype(float)
    base[:30] = 0
    prop = base.copy()
    prop[:30] = 1
    for test in ("bootstrap", "randomization"):
        c = compare("mean", [accuracy(base)], [accuracy(prop)], test=test, samples=n)
        assert c.diff == pytest.approx(30.0) and c.p_value == floor and c.verdict == HOLDS
        assert 0 < c.low < 30 < c.high < 60
        r = compare("mean", [accuracy(prop)], [accuracy(base)], test=test, samples=n)
        assert r.diff == pytest.approx(-30.0) and r.p_value == floor and r.verdict == REVERSED


def test_bootstrap_interval_width_is_the_normal_approximation_for_large_n():
    rng = np.random.default_rng(2)
    n = 5000
    base = (rng.random(n) < 0.6).astype(float)
    prop = np.where(rng.random(n) < 0.2, 1 - base, base)  # 20% of the examples flipped
    prop[rng.random(n) < 0.05] = 1.0
    d = 100 * (prop - base)  # paired differences in metric units
    expected = 2 * 1.96 * d.std() / np.sqrt(n)
    boot = paired_bootstrap("mean", [accuracy(base)], [accuracy(prop)], samples=SAMPLES)
    assert boot.diff == pytest.approx(d.mean())
    assert boot.high - boot.low == pytest.approx(expected, rel=0.10)
    assert (boot.low + boot.high) / 2 == pytest.approx(d.mean(), abs=0.1 * expected)


def test_randomization_p_matches_the_exact_permutation_p_of_four_units():
    # AP-like values, all dyadic so the enumeration has exact ties
    base = np.array([0.25, 0.5, 0.0, 0.75])
    prop = np.array([0.75, 0.25, 0.75, 0.875])
    d = prop - base
    observed = 100 * d.mean()
    swapped = [100 * np.mean(np.where(mask, -d, d))
               for mask in itertools.product([False, True], repeat=4)]
    exact = np.mean(np.abs(swapped) >= abs(observed))
    assert exact == 6 / 16  # |sum of +-0.5 +-0.25 +-0.75 +-0.125| >= 1.125: 3 signs and negations
    ar = approximate_randomization("mean", [mean_stats(base)], [mean_stats(prop)],
                                   samples=20000, seed=3)
    assert ar.diff == observed
    assert abs(ar.p_value - exact) < 0.03


def test_a_gain_on_one_seed_and_a_loss_on_the_other_is_not_significant():
    rng = np.random.default_rng(4)
    n = 1000
    base1 = (rng.random(n) < 0.7).astype(float)
    base1[:100] = 0
    prop1 = base1.copy()
    prop1[:100] = 1  # seed 1: +10 on the first 100 examples
    base2 = base1.copy()
    base2[:100] = 1
    prop2 = base2.copy()
    prop2[:100] = 0  # seed 2: -10 on the same examples
    baseline, proposal = [accuracy(base1), accuracy(base2)], [accuracy(prop1), accuracy(prop2)]
    one_seed = paired_bootstrap("mean", baseline[:1], proposal[:1], samples=SAMPLES)
    assert one_seed.diff == pytest.approx(10.0) and one_seed.p_value == 1 / (SAMPLES + 1)
    for test in ("bootstrap", "randomization"):
        c = compare("mean", baseline, proposal, test=test, samples=SAMPLES)
        assert c.diff == pytest.approx(0.0, abs=1e-12) and c.verdict == NOT_SIGNIFICANT
        assert c.p_value == 1.0 and (c.seeds, c.units) == (2, n)
        # the outer level draws (1, 1), (2, 2) or one of each: +10, -10 or 0
        assert c.low < -5 and c.high > 5
        assert c.high - c.low > 3 * (one_seed.high - one_seed.low)


def test_copies_of_one_run_are_no_more_evidence_than_the_run():
    """Seeds share the test set: the units are resampled (or swapped) once per replicate for
    every seed, so K identical seeds give the one seed's interval and p-value."""
    rng = np.random.default_rng(5)
    base = (rng.random(800) < 0.6).astype(float)
    prop = np.where(rng.random(800) < 0.1, 1 - base, base)
    one = compare("mean", [accuracy(base)], [accuracy(prop)], samples=SAMPLES)
    three = compare("mean", [accuracy(base)] * 3, [accuracy(prop)] * 3, samples=SAMPLES)
    assert three.diff == pytest.approx(one.diff)
    assert three.high - three.low == pytest.approx(one.high - one.low, rel=0.1)
    assert three.p_value == pytest.approx(one.p_value, abs=0.03)
    ar_one = approximate_randomization("mean", [accuracy(base)], [accuracy(prop)],
                                       samples=SAMPLES)
    ar_three = approximate_randomization("mean", [accuracy(base)] * 3, [accuracy(prop)] * 3,
                                         samples=SAMPLES)
    assert ar_three.p_value == pytest.approx(ar_one.p_value, abs=0.01)


# -- BLEU ------------------------------------------------------------------------------------
HYPS = [
    "the cat sat on the mat .",
    "there is a cat on the mat",
    "a quick brown dog jumps over the lazy fox",
    "",  # empty hypothesis
    "hello world",  # no 3- or 4-grams
    "Das ist ein Test, nicht wahr?",
    "the the the the the the the",
]
REFS = [
    "the cat is on the mat .",
    "the cat sat on the mat",
    "the quick brown fox jumps over the lazy dog",
    "an empty hypothesis gets nothing",
    "hello there world",
    "Das ist ein Test, oder?",
    "the cat is on the mat",
]


@pytest.mark.parametrize("tokenize", ["none", "13a"])
def test_bleu_of_summed_statistics_equals_sacrebleu_on_hand_written_sentences(tokenize):
    stats = bleu_stats(HYPS, REFS, tokenize=tokenize)
    assert stats.shape == (len(HYPS), 10) and stats.dtype == np.int64
    metric = BLEU(tokenize=tokenize)
    assert aggregate("bleu", stats) == metric.corpus_score(HYPS, [REFS]).score
    # every subset of the sentences: exp smoothing (no 4-gram match), brevity penalty, no
    # 4-grams at all (score 0), no match at all (score 0)
    scores = []
    for size in range(1, len(HYPS) + 1):
        for subset in itertools.combinations(range(len(HYPS)), size):
            subset = list(subset)
            expected = metric.corpus_score([HYPS[i] for i in subset],
                                           [[REFS[i] for i in subset]]).score
            assert aggregate("bleu", stats[subset]) == expected, subset
            scores.append(expected)
    assert 0.0 in scores and 100.0 not in scores and len(set(scores)) > 50
    perfect = metric.corpus_score(["a b c d e"], [["a b c d e"]]).score
    assert perfect == pytest.approx(100.0)  # sacreBLEU's is 100.00000000000004: so is ours
    assert aggregate("bleu", bleu_stats(["a b c d e"], ["a b c d e"], tokenize)) == perfect
    assert aggregate("bleu", bleu_stats(["x y z w"], ["a b c d"], tokenize)) == 0.0


def test_vectorised_bleu_equals_sacrebleu_on_resampled_sums():
    stats = bleu_stats(HYPS, REFS, tokenize="13a")
    rng = np.random.default_rng(6)
    sums = rng.integers(0, 4, size=(300, len(HYPS))) @ stats
    batch = KINDS["bleu"].aggregate(sums.astype(float))
    metric = BLEU(tokenize="13a")
    expected = [metric._compute_score_from_stats([int(x) for x in row]).score for row in sums]
    assert batch.shape == (300,) and batch.tolist() == expected


@pytest.mark.parametrize("tokenize", ["none", "13a"])
def test_bleu_equals_sacrebleu_on_real_iwslt15_lines(shared, tokenize):
    refs = shared("iwslt15_en_vi/tst2012.vi").read_text(encoding="utf-8").splitlines()[:300]
    hyps = [perturbed(i, line) for i, line in enumerate(refs)]
    stats = bleu_stats(hyps, refs, tokenize=tokenize)
    metric = BLEU(tokenize=tokenize)
    score = metric.corpus_score(hyps, [refs]).score
    assert 20 < score < 90
    assert aggregate("bleu", stats) == score
    rng = np.random.default_rng(7)
    sums = np.stack([stats[rng.integers(0, len(refs), len(refs))].sum(0) for _ in range(100)])
    expected = [metric._compute_score_from_stats([int(x) for x in row]).score for row in sums]
    assert KINDS["bleu"].aggregate(sums.astype(float)).tolist() == expected
    # a second system: its gain on these lines is significant by both tests
    better = [perturbed(i, line) if i % 2 else line for i, line in enumerate(refs)]
    c = compare("bleu", [stats], [bleu_stats(better, refs, tokenize)], samples=500)
    assert c.verdict == HOLDS and c.proposal == metric.corpus_score(better, [refs]).score


# -- perplexity, kinds, formatting -----------------------------------------------------------
def test_perplexity_lower_is_better():
    rng = np.random.default_rng(8)
    tokens = rng.integers(5, 30, 400).astype(float)
    base = perplexity_stats(tokens * 4.0 + rng.normal(0, 2, 400), tokens)
    prop = perplexity_stats(tokens * 3.9 + rng.normal(0, 2, 400), tokens)
    assert aggregate("perplexity", base) == pytest.approx(
        np.exp(base[:, 0].sum() / tokens.sum()))
    assert not KINDS["perplexity"].higher_is_better
    c = compare("perplexity", [base], [prop], samples=SAMPLES)
    assert c.diff < 0 and c.p_value < 0.05 and c.verdict == HOLDS
    assert c.low < c.diff < c.high < 0
    assert compare("perplexity", [prop], [base], samples=SAMPLES).verdict == REVERSED


def test_kinds_and_batched_aggregates():
    assert {k: (v.columns, v.higher_is_better) for k, v in KINDS.items()} == {
        "mean": (2, True), "bleu": (10, True), "perplexity": (2, False)}
    sums = np.array([[3.0, 4.0], [1.0, 2.0], [0.0, 5.0]])
    assert KINDS["mean"].aggregate(sums).tolist() == [75.0, 50.0, 0.0]
    assert KINDS["perplexity"].aggregate(sums) == pytest.approx(np.exp([0.75, 0.5, 0.0]))
    assert aggregate("mean", accuracy([1, 0, 1, 1])) == 75.0
    assert aggregate("mean", [3.0, 4.0]) == 75.0  # already summed


def test_compare_auto_is_the_bootstrap_and_randomization_changes_only_p():
    rng = np.random.default_rng(9)
    base = accuracy(rng.random(300) < 0.5)
    prop = accuracy(rng.random(300) < 0.55)
    auto = compare("mean", [base], [prop], samples=500)
    boot = compare("mean", [base], [prop], test="bootstrap", samples=500)
    ar = compare("mean", [base], [prop], test="randomization", samples=500)
    assert auto == boot and auto.test == "bootstrap" and ar.test == "randomization"
    assert (ar.diff, ar.low, ar.high) == (boot.diff, boot.low, boot.high)
    assert ar.p_value == approximate_randomization("mean", [base], [prop], samples=500).p_value


def test_formatting_for_the_markdown_table():
    assert format_interval(0.95, -0.4, 2.31) == "+0.95 [-0.40, +2.31]"
    assert format_interval(-1e-12, 0.0, 0.0) == "+0.00 [+0.00, +0.00]"
    assert format_p(0.0123) == "p=0.012" and format_p(1.0) == "p=1.000"
    assert format_p(1 / 10001) == "p<0.001"
    good, bad = [accuracy(np.ones(20))], [accuracy(np.zeros(20))]
    assert compare("mean", bad, good, samples=100).row() == {
        "baseline": "0.00", "proposal": "100.00", "diff": "+100.00 [+100.00, +100.00]",
        "p": "p=0.010", "verdict": "holds"}


# -- input errors, determinism, chunking -------------------------------------------------------
def message(excinfo) -> str:
    return str(excinfo.value)


def test_mismatched_or_empty_inputs_raise_clear_errors():
    a, b = accuracy(np.ones(5)), accuracy(np.zeros(5))
    cases = [
        (("mean", [a], [accuracy(np.ones(4))]),
         "proposal seed 0 has 4 units and baseline seed 0 has 5; all stats must cover the "
         "same units in the same order"),
        (("mean", [a, a], [b, accuracy(np.ones(6))]),
         "proposal seed 1 has 6 units and baseline seed 0 has 5; all stats must cover the "
         "same units in the same order"),
        (("mean", [a, a], [b]),
         "baseline has 2 seeds and proposal has 1; seeds are paired (seed k with seed k), so "
         "both need the same number"),
        (("mean", [], [b]), "baseline has no seeds (an empty list of stats arrays)"),
        (("mean", [a], []), "proposal has no seeds (an empty list of stats arrays)"),
        (("mean", [np.zeros((0, 2))], [np.zeros((0, 2))]), "baseline seed 0 has no units"),
        (("bleu", [a], [b]),
         "baseline seed 0: stats of kind 'bleu' must have shape (units, 10), got (5, 2)"),
        (("mean", [a], [np.ones(5)]),
         "proposal seed 0: stats of kind 'mean' must have shape (units, 2), got (5,)"),
        (("mean", a, [b]),
         "baseline must be a list of stats arrays, one per seed, got one array of shape "
         "(5, 2) (one seed is [stats])"),
        (("accuracy", [a], [b]),
         "unknown kind 'accuracy'; expected one of 'mean', 'bleu', 'perplexity'"),
        (("mean", [a], [np.full((5, 2), np.nan)]), "proposal seed 0 has non-finite stats"),
        (("perplexity", [a], [np.zeros((5, 2))]),
         "proposal seed 0: column 1 (tokens) must be >= 0 with a positive total"),
    ]
    for args, expected in cases:
        for function in (paired_bootstrap, approximate_randomization, compare):
            with pytest.raises(ValueError) as excinfo:
                function(*args, samples=10)
            assert message(excinfo) == expected, function.__name__
    with pytest.raises(ValueError) as excinfo:
        compare("mean", [a], [b], test="t")
    assert message(excinfo) == "test must be 'bootstrap', 'randomization' or 'auto', got 't'"
    with pytest.raises(ValueError) as excinfo:
        paired_bootstrap("mean", [a], [b], samples=0)
    assert message(excinfo) == "samples must be a positive integer, got 0"
    with pytest.raises(ValueError) as excinfo:
        compare("mean", [a], [b], alpha=1.5)
    assert message(excinfo) == "alpha must be in (0, 1), got 1.5"
    with pytest.raises(ValueError) as excinfo:
        bleu_stats(["a"], ["a", "b"])
    assert message(excinfo) == ("bleu_stats needs one reference per hypothesis: got 1 "
                                "hypotheses and 2 references")


def test_same_seed_same_result_other_seed_other_replicates():
    rng = np.random.default_rng(10)
    base = [mean_stats(rng.random(300)) for _ in range(3)]
    prop = [mean_stats(rng.random(300)) for _ in range(3)]
    for test in ("bootstrap", "randomization"):
        first = compare("mean", base, prop, test=test, samples=500, seed=11)
        assert compare("mean", base, prop, test=test, samples=500, seed=11) == first
        other = compare("mean", base, prop, test=test, samples=500, seed=12)
        assert other.diff == first.diff and (other.low, other.high) != (first.low, first.high)


def test_chunks_stay_under_50_mb_and_do_not_change_the_statistics(monkeypatch):
    for units in (4, 1000, 10_000, 10**6):
        chunk = sig._chunk_size(units, 10_000)
        assert 1 <= chunk <= 10_000
        assert chunk == 1 or chunk * units * sig._BYTES_PER_UNIT <= 50_000_000
    rng = np.random.default_rng(13)
    base = [accuracy(rng.random(500) < 0.6) for _ in range(2)]
    prop = [accuracy(rng.random(500) < 0.65) for _ in range(2)]
    whole = paired_bootstrap("mean", base, prop, samples=SAMPLES)
    whole_ar = approximate_randomization("mean", base, prop, samples=SAMPLES)
    # chunks of 7 replicates (the last one shorter): the same distribution, other draws
    monkeypatch.setattr(sig, "_CHUNK_BYTES", 7 * 500 * sig._BYTES_PER_UNIT)
    assert sig._chunk_size(500, SAMPLES) == 7
    chunked = paired_bootstrap("mean", base, prop, samples=SAMPLES)
    chunked_ar = approximate_randomization("mean", base, prop, samples=SAMPLES)
    assert chunked.diff == whole.diff and chunked.samples == SAMPLES
    assert chunked.high - chunked.low == pytest.approx(whole.high - whole.low, rel=0.1)
    assert chunked.p_value == pytest.approx(whole.p_value, abs=0.03)
    assert chunked_ar.p_value == pytest.approx(whole_ar.p_value, abs=0.03)
    same = paired_bootstrap("mean", base, [b.copy() for b in base], samples=SAMPLES)
    assert (same.low, same.high, same.p_value) == (0.0, 0.0, 1.0)
