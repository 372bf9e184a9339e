"""Paired significance of a paper's claimed gain (proposal vs baseline) over seeds and test
units, for ``report``: does "the proposal is better than the baseline" hold beyond the noise
of the random seed and of the test sample?

Units and statistics
--------------------
Every metric here is a function of *summed* per-unit statistics.  A test unit has a stats
vector, the units of one run form an ``(N, S)`` array, and the corpus metric is
``aggregate(stats.sum(0))``:

* ``"mean"``: ``(value, 1)`` per unit, metric ``100 * sum(value) / sum(1)``: accuracy and
  exact match (value 0/1 per example).  For MAP and MRR **the unit is the question group**
  (all candidate answers of one question), its value the group's average precision or
  reciprocal rank: the groups, not the candidate pairs, are what is resampled or swapped,
  as the metric averages over questions.
* ``"bleu"``: sacreBLEU's ten sufficient statistics per sentence (hypothesis length,
  closest reference length, matching 1..4-grams, hypothesis 1..4-grams; :func:`bleu_stats`),
  metric corpus BLEU of the summed statistics with sacreBLEU's default ``exp`` smoothing,
  equal to ``BLEU(tokenize=...).corpus_score(hyps, [refs]).score`` to the last bit.  Corpus
  BLEU is not a mean of sentence scores, which is why everything works on summed statistics.
* ``"perplexity"``: ``(sum of token nll, number of tokens)`` per unit (sentence), metric
  ``exp(sum nll / sum tokens)``; lower is better.

:data:`KINDS` gives each kind's vectorised aggregate (``(R, S)`` summed statistics to ``(R,)``
metrics, so that thousands of resamples are scored with numpy at once) and its direction.

Seeds are the outer level
-------------------------
A comparison gets one stats array per seed for each system, seed k of the baseline paired with
seed k of the proposal (same initialisation stream and data order), all over the same N units
in the same order.  The observed difference is the mean over seeds of
``metric(proposal_k) - metric(baseline_k)``.  Both sources of noise are simulated in one
bootstrap replicate, seeds as the outer level:

1. the K seed *pairs* are drawn with replacement (with one seed this is the identity);
2. the N units are drawn with replacement -- the same unit indices for baseline and proposal
   (paired), and the same for every drawn seed pair of the replicate: the seeds were all
   evaluated on one and the same test set, so the test set is resampled once per replicate
   (units are crossed with seeds, not nested in them);
3. the replicate is the mean over the drawn pairs of ``metric(proposal) - metric(baseline)`` on
   the resampled units.

Resampling the units independently for each drawn seed would treat K runs on one test set as
K independent test sets and shrink the unit-level spread by about 1/K: three copies of the
same run would then count as three times the evidence of one.  With the test set shared, K
copies of one run give the same interval as that run alone, and the outer level adds what the
seeds really disagree on.  It is coarse with few seeds (two seeds give three distinct seed
multisets) but it is what makes a gain seen with one seed and lost with another not
significant, however many units.

Tests
-----
* Paired bootstrap (Koehn 2004, as in sacreBLEU's ``--paired-bs``): the replicates give a
  percentile confidence interval of the difference; for the p-value the replicate differences
  are centred on their mean to simulate the null hypothesis of no difference, and
  ``p = (1 + #{|d* - mean(d*)| >= |observed|}) / (1 + samples)`` (two-sided).
* Approximate randomization (Riezler & Maxwell 2005; Noreen 1989): under the null the two
  systems' outputs are exchangeable unit by unit, so a replicate swaps, per unit with
  probability 1/2, the baseline's and the proposal's stats of that unit, and recomputes the
  mean-over-seeds difference d'; ``p = (1 + #{|d'| >= |observed|}) / (1 + samples)``.  With
  several seeds a unit is swapped in all seed pairs or in none, for the reason given above
  (independent coins per seed would make K copies of one run K times as significant).  Seeds
  are not resampled here, so this p-value is about these runs (are the two systems' outputs
  distinguishable on this test set?) and does not include the seed-to-seed spread, which only
  the bootstrap (and its interval) simulates.

Differences equal up to 1e-9 (relative) count as ties (``>=``), so that summing in another
order cannot split a tie; identical systems therefore get ``p == 1`` exactly.  This differs
from sacreBLEU 2.6's ``_compute_p_value``, which counts strictly greater values (identical
systems get ``1 / (1 + samples)`` there) and, for the bootstrap, centres the absolute
differences ``|d*| - mean(|d*|)`` instead of ``d* - mean(d*)``.

Replicates are computed in chunks, each array at most about 50 MB (``_CHUNK_BYTES``): a
bootstrap resample is a count vector over the units (how often each unit was drawn), and the
summed statistics of a chunk of replicates are one matrix product ``counts @ stats``; a
randomization replicate is a 0/1 swap mask ``m`` over the units and shifts the sums by
``m @ (P - B)``.

Verdict
-------
Relative to the claim "the proposal is better" (higher, or lower for perplexity):
``"holds"`` if ``p < alpha`` and the observed difference is in the better direction,
``"reversed"`` if ``p < alpha`` and it is in the worse direction, else ``"not significant"``.
:func:`compare` reports both systems' mean metric, the difference, its bootstrap interval
(always), the p-value of the chosen test and the verdict; ``test="auto"`` is the bootstrap for
every kind (for MAP/MRR over a few hundred question groups callers may choose
``"randomization"``, the test Dror et al. recommend there).

References
----------
* P. Koehn. Statistical significance tests for machine translation evaluation. EMNLP 2004.
* S. Riezler and J. T. Maxwell III. On some pitfalls in automatic evaluation and significance
  testing for MT. ACL 2005 Workshop on Intrinsic and Extrinsic Evaluation Measures.
* R. Dror, G. Baumer, S. Shlomov and R. Reichart. The Hitchhiker's Guide to Testing
  Statistical Significance in Natural Language Processing. ACL 2018.
* M. Post. A call for clarity in reporting BLEU scores. WMT 2018 (sacreBLEU).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "KINDS", "Kind", "BootstrapResult", "RandomizationResult", "Comparison",
    "HOLDS", "REVERSED", "NOT_SIGNIFICANT", "TESTS",
    "aggregate", "bleu_stats", "mean_stats", "perplexity_stats",
    "paired_bootstrap", "approximate_randomization", "compare", "verdict",
    "format_interval", "format_p", "METRIC_KINDS", "metric_name", "run_units",
    "units_file", "read_rows",
]

HOLDS, REVERSED, NOT_SIGNIFICANT = "holds", "reversed", "not significant"
TESTS = ("bootstrap", "randomization", "auto")

#: no array of a chunk of replicates is larger than about this many bytes
_CHUNK_BYTES = 50_000_000
#: bytes per replicate and unit budgeted for a chunk: the bootstrap's int64 indices and counts
#: and float64 weights (at most two alive at once), the randomization's coins and float64
#: swap mask; with room to spare, so a single array stays well under ``_CHUNK_BYTES``
_BYTES_PER_UNIT = 48
#: relative tolerance under which two differences count as equal (ties count as "as extreme")
_TIE = 1e-9

# BLEU's exp and log through the C library, as sacreBLEU computes them with ``math``: numpy's
# SIMD exp/log may differ from it in the last bit, and the BLEU here must equal sacreBLEU's.
# These are a few calls per replicate (not per unit).
_math_exp = np.frompyfunc(math.exp, 1, 1)
_math_log = np.frompyfunc(math.log, 1, 1)


# -- metrics from summed statistics ------------------------------------------------------------
def _mean_metric(sums: np.ndarray) -> np.ndarray:
    return 100.0 * sums[:, 0] / sums[:, 1]


def _perplexity_metric(sums: np.ndarray) -> np.ndarray:
    return np.exp(sums[:, 0] / sums[:, 1])


def _bleu_metric(sums: np.ndarray) -> np.ndarray:
    """Corpus BLEU (0-100) of each row of summed sacreBLEU statistics ``(hyp_len, ref_len,
    correct_1..4, total_1..4)``, as ``BLEU.compute_bleu`` with ``smooth_method='exp'``,
    ``effective_order=False``, ``max_ngram_order=4`` computes it, operation for operation."""
    sys_len, ref_len = sums[:, 0], sums[:, 1]
    correct, total = sums[:, 2:6], sums[:, 6:10]
    score = np.zeros(len(sums))
    # sacreBLEU returns 0 when no n-gram matches at all; when some order has no hypothesis
    # n-gram its loop stops and the missing precisions enter as log(0) := -9999999999, whose
    # exp underflows to 0 -- also 0 (and sys_len == 0 implies both)
    ok = (correct > 0).any(axis=1) & (total > 0).all(axis=1)
    if ok.any():
        c, t = correct[ok], total[ok]
        zero = c == 0
        # 'exp' smoothing (NIST mteval-v13a): the k-th order without a match gets 100 / (2^k t)
        halvings = np.cumsum(zero, axis=1)
        precisions = np.where(zero, 100.0 / (2.0 ** halvings * t), 100.0 * c / t)
        logs = _math_log(precisions).astype(np.float64)
        # Python's sum() of the four logs, in its order
        mean_log = (((logs[:, 0] + logs[:, 1]) + logs[:, 2]) + logs[:, 3]) / 4
        s, r = sys_len[ok], ref_len[ok]
        short = s < r
        bp = np.ones(len(s))
        if short.any():
            bp[short] = _math_exp(1 - r[short] / s[short]).astype(np.float64)
        score[ok] = bp * _math_exp(mean_log).astype(np.float64)
    return score


@dataclass(frozen=True)
class Kind:
    """A metric computed from summed per-unit statistics of ``columns`` columns;
    ``aggregate`` maps summed statistics ``(R, columns)`` to ``(R,)`` metric values."""

    name: str
    columns: int
    aggregate: Callable[[np.ndarray], np.ndarray]
    higher_is_better: bool
    stats: str  # what the columns are


KINDS: dict[str, Kind] = {
    "mean": Kind("mean", 2, _mean_metric, True, "(value, 1) per unit; 100 * mean value"),
    "bleu": Kind("bleu", 10, _bleu_metric, True,
                 "sacreBLEU (hyp_len, ref_len, correct_1..4, total_1..4) per sentence"),
    "perplexity": Kind("perplexity", 2, _perplexity_metric, False,
                       "(sum of token nll, tokens) per unit; exp(nll / tokens)"),
}


def _kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of "
                         + ", ".join(repr(k) for k in KINDS))
    return KINDS[kind]


def aggregate(kind: str, stats) -> float:
    """The corpus metric of per-unit ``stats`` ``(N, S)`` (summed over units first), or of
    already summed statistics ``(S,)``."""
    k = _kind(kind)
    a = np.asarray(stats, dtype=np.float64)
    if a.ndim not in (1, 2) or a.shape[-1] != k.columns:
        raise ValueError(f"stats for kind {kind!r} must have shape (units, {k.columns}) or "
                         f"({k.columns},), got {a.shape}")
    sums = a.sum(axis=0) if a.ndim == 2 else a
    return float(k.aggregate(sums[None, :])[0])


def bleu_stats(hypotheses: list[str], references: list[str],
               tokenize: str = "none") -> np.ndarray:
    """sacreBLEU's BLEU sufficient statistics per sentence, ``(N, 10)`` int64: hypothesis
    length, closest reference length, matching 1..4-grams, hypothesis 1..4-grams; one
    reference per hypothesis, tokenized by sacreBLEU's ``tokenize`` (``"none"``: the text's
    own whitespace tokens, the papers' tokenized BLEU; ``"13a"``: sacreBLEU's default)."""
    from sacrebleu.metrics import BLEU

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"bleu_stats needs one reference per hypothesis: got "
                         f"{len(hypotheses)} hypotheses and {len(references)} references")
    if not hypotheses:
        return np.zeros((0, 10), dtype=np.int64)
    # force=True only silences sacreBLEU's "looks tokenized" warning; the statistics are the same
    metric = BLEU(tokenize=tokenize, force=True)
    stats = metric._extract_corpus_statistics(hypotheses, [references])
    return np.asarray(stats, dtype=np.int64).reshape(len(hypotheses), 10)


def mean_stats(values) -> np.ndarray:
    """``(N, 2)`` stats of kind ``"mean"`` from per-unit values (0/1 correctness, or a
    question group's AP / RR)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    return np.stack([v, np.ones_like(v)], axis=1)


def perplexity_stats(nll, tokens) -> np.ndarray:
    """``(N, 2)`` stats of kind ``"perplexity"`` from per-unit summed token nll (nats) and
    token counts."""
    nll = np.asarray(nll, dtype=np.float64).reshape(-1)
    tokens = np.asarray(tokens, dtype=np.float64).reshape(-1)
    if nll.shape != tokens.shape:
        raise ValueError(f"perplexity_stats needs one token count per nll: got {nll.size} "
                         f"nll and {tokens.size} token counts")
    return np.stack([nll, tokens], axis=1)


# -- input checks ------------------------------------------------------------------------------
def _runs(kind: Kind, baseline, proposal) -> tuple[np.ndarray, np.ndarray]:
    """The two systems' stats as float64 ``(K, N, S)`` arrays, after checking them."""
    systems = {}
    for name, runs in (("baseline", baseline), ("proposal", proposal)):
        if isinstance(runs, np.ndarray) and runs.ndim != 3:
            raise ValueError(f"{name} must be a list of stats arrays, one per seed, got one "
                             f"array of shape {runs.shape} (one seed is [stats])")
        if not isinstance(runs, Sequence | np.ndarray):
            raise ValueError(f"{name} must be a list of stats arrays, one per seed, got "
                             f"{type(runs).__name__}")
        if len(runs) == 0:
            raise ValueError(f"{name} has no seeds (an empty list of stats arrays)")
        systems[name] = runs
    kb, kp = len(baseline), len(proposal)
    if kb != kp:
        raise ValueError(f"baseline has {kb} seeds and proposal has {kp}; seeds are paired "
                         f"(seed k with seed k), so both need the same number")
    units = None
    arrays = {}
    for name, runs in systems.items():
        out = []
        for k, run in enumerate(runs):
            a = np.asarray(run, dtype=np.float64)
            if a.ndim != 2 or a.shape[1] != kind.columns:
                raise ValueError(f"{name} seed {k}: stats of kind {kind.name!r} must have shape "
                                 f"(units, {kind.columns}), got {a.shape}")
            if a.shape[0] == 0:
                raise ValueError(f"{name} seed {k} has no units")
            if units is None:
                units = a.shape[0]
            elif a.shape[0] != units:
                raise ValueError(f"{name} seed {k} has {a.shape[0]} units and baseline seed 0 "
                                 f"has {units}; all stats must cover the same units in the "
                                 f"same order")
            if not np.isfinite(a).all():
                raise ValueError(f"{name} seed {k} has non-finite stats")
            if kind.name == "bleu" and (a < 0).any():
                raise ValueError(f"{name} seed {k}: BLEU statistics must be >= 0")
            if kind.name != "bleu" and ((a[:, 1] < 0).any() or a[:, 1].sum() <= 0):
                raise ValueError(f"{name} seed {k}: column 1 ({_DENOMINATOR[kind.name]}) must "
                                 f"be >= 0 with a positive total")
            out.append(a)
        arrays[name] = np.stack(out)
    return arrays["baseline"], arrays["proposal"]


_DENOMINATOR = {"mean": "count", "perplexity": "tokens"}


def _check_samples(samples: int) -> None:
    if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def _chunk_size(units: int, samples: int) -> int:
    """Replicates per chunk so that no array of a chunk exceeds about ``_CHUNK_BYTES``."""
    return max(1, min(samples, _CHUNK_BYTES // (_BYTES_PER_UNIT * units)))


def _observed(kind: Kind, b: np.ndarray, p: np.ndarray) -> tuple[float, float, float]:
    """(mean baseline metric, mean proposal metric, mean over seeds of the difference)."""
    mb, mp = kind.aggregate(b.sum(axis=1)), kind.aggregate(p.sum(axis=1))
    return float(mb.mean()), float(mp.mean()), float((mp - mb).mean())


def _at_least_as_extreme(values: np.ndarray, observed: float) -> int:
    threshold = abs(observed) - _TIE * max(1.0, abs(observed))
    return int(np.count_nonzero(np.abs(values) >= threshold))


# -- the two tests -----------------------------------------------------------------------------
@dataclass(frozen=True)
class BootstrapResult:
    """Observed difference (proposal - baseline, mean over seeds), its percentile interval
    ``[low, high]`` at level ``1 - alpha`` and the two-sided p-value of the null "no difference"."""

    diff: float
    low: float
    high: float
    p_value: float
    samples: int


@dataclass(frozen=True)
class RandomizationResult:
    """Observed difference (proposal - baseline, mean over seeds) and the two-sided
    approximate-randomization p-value."""

    diff: float
    p_value: float
    samples: int


def _bootstrap_replicates(kind: Kind, b: np.ndarray, p: np.ndarray, samples: int,
                          rng: np.random.Generator) -> np.ndarray:
    seeds, units, width = b.shape
    # (N, K * S): every seed's stats side by side, so one product gives all seeds' sums
    flat_b = np.ascontiguousarray(b.transpose(1, 0, 2)).reshape(units, seeds * width)
    flat_p = np.ascontiguousarray(p.transpose(1, 0, 2)).reshape(units, seeds * width)
    chunk = _chunk_size(units, samples)
    out = np.empty(samples)
    for start in range(0, samples, chunk):
        c = min(chunk, samples - start)
        # inner level: one resample of the test units per replicate, as counts per unit; the
        # same indices for baseline and proposal (paired) and for every seed of the replicate
        idx = rng.integers(0, units, size=(c, units))
        idx += np.arange(c)[:, None] * units
        counts = np.bincount(idx.ravel(), minlength=c * units).reshape(c, units)
        del idx
        weights = counts.astype(np.float64)
        del counts
        # two products of the same shape: identical systems give bit-identical sums
        sums_b = (weights @ flat_b).reshape(c * seeds, width)
        sums_p = (weights @ flat_p).reshape(c * seeds, width)
        del weights
        per_seed = (kind.aggregate(sums_p) - kind.aggregate(sums_b)).reshape(c, seeds)
        if seeds == 1:
            out[start:start + c] = per_seed[:, 0]
        else:
            # outer level: the seed pairs drawn with replacement, mean of their differences
            pick = rng.integers(0, seeds, size=(c, seeds))
            out[start:start + c] = np.take_along_axis(per_seed, pick, axis=1).mean(axis=1)
    return out


def paired_bootstrap(kind: str, baseline: list[np.ndarray], proposal: list[np.ndarray],
                     samples: int = 10000, seed: int = 0,
                     alpha: float = 0.05) -> BootstrapResult:
    """Two-level paired bootstrap (module docstring): seed pairs drawn with replacement, then
    the units, with the same indices for both systems and every drawn pair; the percentile
    interval at level ``1 - alpha`` and Koehn's p-value."""
    k = _kind(kind)
    _check_samples(samples)
    _check_alpha(alpha)
    b, p = _runs(k, baseline, proposal)
    _, _, observed = _observed(k, b, p)
    replicates = _bootstrap_replicates(k, b, p, samples, np.random.default_rng(seed))
    low, high = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    count = _at_least_as_extreme(replicates - replicates.mean(), observed)
    return BootstrapResult(diff=observed, low=float(low), high=float(high),
                           p_value=(1 + count) / (1 + samples), samples=samples)


def approximate_randomization(kind: str, baseline: list[np.ndarray],
                              proposal: list[np.ndarray], samples: int = 10000,
                              seed: int = 0) -> RandomizationResult:
    """Approximate randomization (module docstring): swap the two systems' stats of each unit
    (in every seed) with probability 1/2; p = (1 + #{|d'| >= |observed|}) / (1 + samples)."""
    k = _kind(kind)
    _check_samples(samples)
    b, p = _runs(k, baseline, proposal)
    _, _, observed = _observed(k, b, p)
    rng = np.random.default_rng(seed)
    seeds, units, width = b.shape
    sum_b, sum_p = b.sum(axis=1).reshape(-1), p.sum(axis=1).reshape(-1)  # (K * S,)
    delta = np.ascontiguousarray((p - b).transpose(1, 0, 2)).reshape(units, seeds * width)
    chunk = _chunk_size(units, samples)
    replicates = np.empty(samples)
    for start in range(0, samples, chunk):
        c = min(chunk, samples - start)
        # one fair coin per replicate and unit, 1 = swap the two systems' stats of that unit
        # (in every seed: the seeds share the test set, see the module docstring)
        bits = rng.integers(0, 256, size=(c, (units + 7) // 8), dtype=np.uint8)
        swap = np.unpackbits(bits, axis=1, count=units).astype(np.float64)
        del bits
        shift = swap @ delta  # (c, K * S): what moves from the proposal's sums to the baseline's
        del swap
        diff = (k.aggregate((sum_p - shift).reshape(c * seeds, width))
                - k.aggregate((sum_b + shift).reshape(c * seeds, width)))
        replicates[start:start + c] = diff.reshape(c, seeds).mean(axis=1)
    count = _at_least_as_extreme(replicates, observed)
    return RandomizationResult(diff=observed, p_value=(1 + count) / (1 + samples),
                               samples=samples)


# -- the comparison ------------------------------------------------------------------------------
def verdict(kind: str, diff: float, p_value: float, alpha: float = 0.05) -> str:
    """``"holds"``, ``"reversed"`` or ``"not significant"`` for the claim "the proposal is
    better" (higher, or lower for perplexity)."""
    if p_value >= alpha or diff == 0:
        return NOT_SIGNIFICANT
    better = diff > 0 if _kind(kind).higher_is_better else diff < 0
    return HOLDS if better else REVERSED


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean of ``values`` and their sample standard deviation (0 for one value)."""
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def _plus(x: float) -> str:
    return f"{round(x, 2) + 0.0:+.2f}"  # + 0.0: no "-0.00"


def format_interval(diff: float, low: float, high: float) -> str:
    """``"+0.95 [-0.40, +2.31]"``."""
    return f"{_plus(diff)} [{_plus(low)}, {_plus(high)}]"


def format_p(p_value: float) -> str:
    """``"p=0.012"``; below 0.001 ``"p<0.001"``."""
    return "p<0.001" if p_value < 0.001 else f"p={p_value:.3f}"


@dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare`: both systems' metric (mean over seeds), the observed
    difference proposal - baseline with its bootstrap interval, the p-value of ``test`` and the
    verdict on "the proposal is better"."""

    baseline: float
    proposal: float
    diff: float
    low: float
    high: float
    p_value: float
    test: str  # "bootstrap" or "randomization"
    seeds: int
    units: int
    verdict: str
    kind: str = "mean"
    alpha: float = 0.05
    samples: int = 10000

    def row(self) -> dict[str, str]:
        """Short strings for a markdown table: baseline, proposal, diff (with interval), p,
        verdict."""
        return {"baseline": f"{self.baseline:.2f}", "proposal": f"{self.proposal:.2f}",
                "diff": format_interval(self.diff, self.low, self.high),
                "p": format_p(self.p_value), "verdict": self.verdict}


def compare(kind: str, baseline: list[np.ndarray], proposal: list[np.ndarray], *,
            test: str = "auto", samples: int = 10000, seed: int = 0,
            alpha: float = 0.05) -> Comparison:
    """Compare a proposal with its baseline (per-seed stats arrays, paired by seed): the
    bootstrap interval always, the p-value of ``test`` (``"auto"``: the bootstrap), the
    verdict at level ``alpha``."""
    k = _kind(kind)
    if test not in TESTS:
        raise ValueError(f"test must be 'bootstrap', 'randomization' or 'auto', got {test!r}")
    _check_samples(samples)
    _check_alpha(alpha)
    b, p = _runs(k, baseline, proposal)
    mean_b, mean_p, observed = _observed(k, b, p)
    boot = paired_bootstrap(kind, list(b), list(p), samples=samples, seed=seed, alpha=alpha)
    used = "bootstrap" if test == "auto" else test
    if used == "randomization":
        p_value = approximate_randomization(kind, list(b), list(p), samples=samples,
                                            seed=seed).p_value
    else:
        p_value = boot.p_value
    return Comparison(baseline=mean_b, proposal=mean_p, diff=observed, low=boot.low,
                      high=boot.high, p_value=p_value, test=used, seeds=b.shape[0],
                      units=b.shape[1], verdict=verdict(kind, observed, p_value, alpha),
                      kind=kind, alpha=alpha, samples=samples)


# -- a run's units, from the per-example files its test wrote ----------------------------------
#: logged metric name (``test/<name>[_<split>]``) -> kind of its units
METRIC_KINDS = {"acc": "mean", "accuracy": "mean", "exact_match": "mean", "f1": "mean",
                "map": "mean", "mrr": "mean", "p@1": "mean", "bleu": "bleu",
                "perplexity": "perplexity"}


def metric_name(key: str) -> tuple[str, str] | None:
    """``test/<name><suffix>`` -> (name, suffix) for a metric whose units the per-example
    files give (``test/acc_hard`` -> ("acc", "_hard")); None for any other key."""
    if not key.startswith("test/"):
        return None
    rest = key[len("test/"):]
    for name in sorted(METRIC_KINDS, key=len, reverse=True):
        if rest == name or rest.startswith(name + "_"):
            return name, rest[len(name):]
    return None


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (the run's test wrote no per-example "
                                "predictions; test its checkpoint again to write them)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _ranking_values(rows: list[dict], name: str) -> tuple[list[int], list[float]]:
    """Per question group with a positive candidate (the others are skipped, as the
    logged MAP/MRR skip them): its AP, RR or P@1, candidates ordered by score, ties by
    position in the file (lit_models.metrics.GroupedRanking's order)."""
    groups: dict[int, list[tuple[float, int, int]]] = {}
    for r in rows:
        groups.setdefault(int(r["group"]), []).append((-float(r["score"]), int(r["id"]),
                                                        int(r["gold"])))
    ids, values = [], []
    for group in sorted(groups):
        labels = [gold for *_, gold in sorted(groups[group])]
        if not any(labels):
            continue
        hits = [rank for rank, gold in enumerate(labels, 1) if gold]
        if name == "map":
            value = sum(k / rank for k, rank in enumerate(hits, 1)) / len(hits)
        elif name == "mrr":
            value = 1 / hits[0]
        else:  # p@1
            value = float(labels[0] == 1)
        ids.append(group)
        values.append(value)
    return ids, values


def units_file(run_dir: str | Path, key: str) -> tuple[Path, str | None]:
    """The per-example file of a run folder that :func:`run_units` reads for logged test
    metric ``key``, and the field of its rows that holds a variant of the metric (None for
    the metric itself): ``hypotheses-test<suffix>.jsonl`` for BLEU, else
    ``predictions-test<suffix>.jsonl``, or ``predictions-test.jsonl`` when a suffix names a
    variant held per example in its field ``<name><suffix>`` (e.g. ``f1_quasar``).  Raises
    ValueError for a metric whose units these files do not give."""
    run_dir = Path(run_dir)
    parsed = metric_name(key)
    if parsed is None:
        raise ValueError(f"no per-example units for {key!r}: paired tests cover "
                         f"test/{{{', '.join(METRIC_KINDS)}}}[_<split>]")
    name, suffix = parsed
    if name == "bleu":
        return run_dir / f"hypotheses-test{suffix}.jsonl", None
    path = run_dir / f"predictions-test{suffix}.jsonl"
    whole = run_dir / "predictions-test.jsonl"
    if suffix and not path.exists() and whole.exists():  # a variant of the metric, not a split?
        if any(name + suffix in r for r in read_rows(whole)):
            return whole, name + suffix
    return path, None


def run_units(run_dir: str | Path, key: str) -> tuple[str, list[int], np.ndarray]:
    """(kind, unit ids, stats) of logged test metric ``key`` from the per-example file of a
    run folder that :func:`units_file` names (accuracy: prediction == gold; exact match:
    ``correct``; F1: ``f1``; MAP / MRR / P@1: per question ``group``; perplexity: per
    sentence ``nll`` and ``tokens``; a variant of the metric: the rows that carry its field)
    or, for BLEU, ``hypotheses-test.jsonl`` scored the way ``bleu-test.json`` says the run's
    BLEU was (tokenized, with compound splitting for WMT'14 En-De).  Raises
    FileNotFoundError when the run has no such file and ValueError for a metric whose units
    these files do not give."""
    run_dir = Path(run_dir)
    path, variant = units_file(run_dir, key)
    name, suffix = metric_name(key)
    kind = METRIC_KINDS[name]
    rows = read_rows(path)
    if variant:
        return kind, *_field_units(rows, variant, path)
    if name == "bleu":
        report = json.loads((run_dir / f"bleu-test{suffix}.json").read_text()) \
            if (run_dir / f"bleu-test{suffix}.json").exists() else {}
        bleu_kind = report.get("bleu", {}).get("kind", "tokenized")
        if bleu_kind not in ("tokenized", "tokenized+compound_split"):
            raise ValueError(f"{run_dir}: paired BLEU needs the tokenized BLEU, the run's is "
                             f"{bleu_kind!r}")
        hyps, refs = [r["hypothesis"] for r in rows], [r["reference"] for r in rows]
        if bleu_kind == "tokenized+compound_split":
            from lit_models.bleu import split_compounds

            hyps, refs = [split_compounds(h) for h in hyps], [split_compounds(r) for r in refs]
        return kind, [int(r["id"]) for r in rows], bleu_stats(hyps, refs, tokenize="none")
    if name in ("map", "mrr", "p@1"):
        ids, values = _ranking_values(rows, name)
        return kind, ids, mean_stats(values)
    ids = [int(r["id"]) for r in rows]
    if name == "perplexity":
        return kind, ids, perplexity_stats([r["nll"] for r in rows], [r["tokens"] for r in rows])
    if name == "exact_match":
        return kind, ids, mean_stats([float(r["correct"]) for r in rows])
    if name == "f1":
        return kind, *_field_units(rows, "f1", path)
    return kind, ids, mean_stats([float(r["prediction"] == r["gold"]) for r in rows])


def _field_units(rows: list[dict], field: str, path: Path) -> tuple[list[int], np.ndarray]:
    """(ids, stats) of the per-example values in field ``field`` of the rows that carry it
    (a metric over part of the examples, e.g. SearchQA's unigram half, is in those rows
    only)."""
    units = [r for r in rows if field in r]
    if not units:
        raise ValueError(f"{path}: no row has a {field!r} field (the per-example values of "
                         f"test/{field})")
    return [int(r["id"]) for r in units], mean_stats([float(r[field]) for r in units])
