"""Answer-string metrics of extractive QA (CoDA Table 1: SearchQA and Quasar-T, EM / F1).

Three protocols, each with its own normalisation, every score the max over the gold answers:

- SQuAD v1.1 (Rajpurkar et al. 2016; the official ``evaluate-v1.1.py``, which DecaProp's
  ``span_evaluate.py`` copies): lowercase, strip punctuation, drop the articles a/an/the,
  collapse whitespace; EM = the normalised strings are equal; F1 over the bags of tokens
  (token counts, ``Counter`` intersection).  :func:`exact_match`, :func:`f1`.
- Quasar's official metric (Dhingra et al. 2017, ``metric.py`` of the Quasar release):
  lowercase, drop article tokens, strip punctuation inside each token and join the tokens
  WITHOUT spaces, so EM ignores word boundaries ("new york" = "newyork"); F1 over the SETS
  of whitespace tokens, each cleaned the same way (a token that cleans to "" stays in the
  set as "").  :func:`quasar_exact_match`, :func:`quasar_f1`.
- DecaProp's SearchQA protocol (Tay et al. 2018, its ``train_span.py``): a question whose
  first gold answer is one word is a "unigram" question, scored by EM of a span decoded
  with at most 1 token; every other question an "n-gram" question, scored by F1 of a span
  decoded with at most 3 tokens.  Unigram EM averages over the unigram questions only,
  n-gram F1 over the n-gram questions only.  :func:`searchqa_protocol`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

PUNCTUATION = frozenset(string.punctuation)
ARTICLES = ("a", "an", "the")
#: DecaProp's SearchQA protocol: the longest span (tokens) decoded per kind of question
PROTOCOL_SPAN = {"unigram": 1, "ngram": 3}
#: the metric each half of the protocol logs, and the field of a prediction row holding it
PROTOCOL_METRIC = {"unigram": "exact_match_unigram", "ngram": "f1_ngram"}


# -- SQuAD v1.1 ---------------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, punctuation removed, articles removed, whitespace
    collapsed (in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _max_over(score: Callable[[str, str], float], prediction: str,
              golds: Sequence[str]) -> float:
    """The best score of ``prediction`` against any gold answer (0 without gold answers)."""
    return max((score(prediction, gold) for gold in golds), default=0.0)


def _exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _harmonic(common: int, predicted: int, true: int) -> float:
    """F1 from the tokens in common and the sizes of the prediction and the gold answer."""
    if common == 0:
        return 0.0
    precision, recall = common / predicted, common / true
    return 2 * precision * recall / (precision + recall)


def _f1(prediction: str, gold: str) -> float:
    pred, true = normalize_answer(prediction).split(), normalize_answer(gold).split()
    return _harmonic(sum((Counter(pred) & Counter(true)).values()), len(pred), len(true))


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """SQuAD EM (0 or 1), max over the gold answers."""
    return _max_over(_exact, prediction, golds)


def f1(prediction: str, golds: Sequence[str]) -> float:
    """SQuAD bag-of-tokens F1 in [0, 1], max over the gold answers."""
    return _max_over(_f1, prediction, golds)


# -- Quasar's official metric -------------------------------------------------------------------
def quasar_clean(text: str) -> str:
    """Quasar's ``_clean_string``: lowercase, article tokens dropped, punctuation removed from
    each token, the tokens joined without spaces."""
    tokens = [t for t in text.lower().split() if t not in ARTICLES]
    return "".join("".join(ch for ch in t if ch not in PUNCTUATION) for t in tokens)


def _quasar_exact(prediction: str, gold: str) -> float:
    return float(quasar_clean(prediction) == quasar_clean(gold))


def _quasar_f1(prediction: str, gold: str) -> float:
    true = {quasar_clean(t) for t in gold.split()}
    pred = {quasar_clean(t) for t in prediction.split()}
    return _harmonic(len(true & pred), len(pred), len(true))


def quasar_exact_match(prediction: str, golds: Sequence[str]) -> float:
    """Quasar's official EM (spaces ignored), max over the gold answers."""
    return _max_over(_quasar_exact, prediction, golds)


def quasar_f1(prediction: str, golds: Sequence[str]) -> float:
    """Quasar's official F1 over token sets, max over the gold answers."""
    return _max_over(_quasar_f1, prediction, golds)


# -- DecaProp's SearchQA protocol ---------------------------------------------------------------
def searchqa_protocol(golds: Sequence[str]) -> Literal["unigram", "ngram"]:
    """Which half of DecaProp's SearchQA protocol a question belongs to: ``unigram`` when its
    first gold answer is one whitespace token (scored by EM of a 1-token span), else
    ``ngram`` (scored by F1 of a span of at most 3 tokens)."""
    return "unigram" if golds and len(golds[0].split()) == 1 else "ngram"
