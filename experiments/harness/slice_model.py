"""Slices of a test set, as an experiment script declares them beside its grids: where does a
claimed gain come from?  A :class:`Slicing` puts each test unit of a run's per-example file
(``predictions-test.jsonl``, ``hypotheses-test.jsonl``) into one slice, from the file's
fields alone: MLU problems by operator, sentences by gold label, questions by their number
of candidates.  ``report <grid> --slices [NAME ...]`` tests each claim of the grid within
each slice (experiments/harness/slices.py) and prints the tables
(experiments/harness/slice_report.py).

A slice is either a label of the unit (:func:`by_label`) or a bin of a number of the unit
(:func:`by_value`): fixed edges, or quantiles of the test set (quartiles: four bins of
about a quarter of the units each; their edges come from the baseline's test units, so that
both cells and every seed are cut at the same numbers).  The unit is what the claim's metric
averages over: an example (field ``id``) or, for MAP and MRR, a question (field
``group``, all its candidate rows).

This module declares; it reads no file and imports nothing of experiments/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Slicing", "by_label", "by_value", "value_bins", "bin_label", "gold_label",
           "input_length", "model_tokens", "SENTIMENT_SLICES", "CLASSIFICATION_SLICES",
           "NLI_SLICES", "RANKING_SLICES", "TRANSLATION_SLICES"]


@dataclass(frozen=True)
class Slicing:
    """One way to cut the test units into slices.

    ``of(rows)`` gives a unit's slice from its rows (one row per example; a question's
    candidate rows for ``unit="group"``): a label (str) or, with ``bins``, a number that
    the bins cut.  ``bins``: an int ``q`` (q quantiles of the baseline's units: 4 =
    quartiles) or the inner edges ``(e1, e2, ...)``: bins ``<= e1``, ``(e1, e2]``, ...,
    ``> ek``.  ``labels``: the slices in the order printed, each printed even when no unit
    falls into it (more found are printed after them, in sorted order).  ``fields``: the
    fields every row must have (a file without them gets one line saying so instead of the
    slice's rows)."""

    name: str
    title: str
    of: Callable[[list[dict]], object]
    fields: tuple[str, ...] = ()
    unit: str = "id"
    bins: int | tuple[float, ...] | None = None
    labels: tuple[str, ...] = ()
    unit_name: str = ""  # what a bin's number counts ("tokens"), shown after each bin

    def __post_init__(self):
        if isinstance(self.bins, int) and self.bins < 2:
            raise ValueError(f"slicing {self.name!r}: bins={self.bins} must be at least 2 "
                             "quantiles")
        if isinstance(self.bins, tuple) and list(self.bins) != sorted(set(self.bins)):
            raise ValueError(f"slicing {self.name!r}: bin edges {self.bins} must increase")


def by_label(name: str, title: str, of: Callable[[list[dict]], str], *,
             fields: tuple[str, ...] = (), labels: tuple[str, ...] = (),
             unit: str = "id") -> Slicing:
    """Slices named by a label of the unit (``of``: the unit's rows -> its label)."""
    return Slicing(name, title, of, fields=fields, labels=labels, unit=unit)


def by_value(name: str, title: str, of: Callable[[list[dict]], float], *,
             bins: int | tuple[float, ...], fields: tuple[str, ...] = (), unit: str = "id",
             unit_name: str = "") -> Slicing:
    """Slices that are bins of a number of the unit (``of``: the unit's rows -> the
    number): ``bins`` quantiles of the baseline's units, or fixed inner edges."""
    return Slicing(name, title, of, fields=fields, unit=unit, bins=bins, unit_name=unit_name)


def _number(x: float) -> str:
    return f"{x:g}" if float(x) != int(x) else str(int(x))


def value_bins(edges: tuple[float, ...] | list[float]) -> list[tuple[float | None, float | None]]:
    """The bins of inner edges ``e1 <= ... <= ek``: ``(None, e1]``, ``(e1, e2]``, ...,
    ``(ek, None)``."""
    bounds = [None, *edges, None]
    return list(zip(bounds[:-1], bounds[1:]))


def bin_label(k: int, low: float | None, high: float | None, quantiles: int | None,
              unit_name: str = "") -> str:
    """A bin's printed name: ``Q2: (12, 17] tokens`` for the second of quartiles,
    ``<= 10`` / ``(10, 20]`` / ``> 40`` for fixed edges."""
    if low is None and high is None:
        span = "all"
    elif low is None:
        span = f"<= {_number(high)}"
    elif high is None:
        span = f"> {_number(low)}"
    else:
        span = f"({_number(low)}, {_number(high)}]"
    span += f" {unit_name}" if unit_name else ""
    return f"Q{k + 1}: {span}" if quantiles else span


# -- the tasks' default slices -----------------------------------------------------------------
def gold_label(names: tuple[str, ...] = (), title: str = "gold label") -> Slicing:
    """By the example's gold class: its name in ``names`` (the dataset's label order), else
    the id as written."""

    def of(rows: list[dict]) -> str:
        gold = rows[0]["gold"]
        return names[gold] if isinstance(gold, int) and 0 <= gold < len(names) else str(gold)

    return by_label("label", title, of, fields=("gold",), labels=tuple(names))


def input_length(fields: tuple[str, ...], title: str) -> Slicing:
    """By the quartile of the example's number of input tokens: the space-separated tokens of
    ``fields`` together (the predictions files write the input as the model's tokens joined
    by spaces)."""
    return by_value("length", title,
                    lambda rows: sum(len(str(rows[0][f]).split()) for f in fields),
                    bins=4, fields=fields, unit_name="tokens")


def model_tokens(title: str) -> Slicing:
    """By the quartile of the number of tokens the model read: the row's ``tokens`` (the
    classifiers write it beside the input text, the decoded words, whose count differs;
    ``keep`` keeps it when it leaves the text out)."""
    return by_value("length", title, lambda rows: int(rows[0]["tokens"]), bins=4,
                    fields=("tokens",), unit_name="tokens")


def _correct_answers(rows: list[dict]) -> str:
    return "one correct" if sum(int(r["gold"]) == 1 for r in rows) == 1 else "several correct"


#: sentiment classification (CoDA Table 5; the predictions' ``input``: BPE tokens)
SENTIMENT_SLICES = {s.name: s for s in (
    gold_label(("negative", "positive")),
    model_tokens("input length, quartiles of the BPE tokens the model read"))}

#: classification on several datasets (DW Table 5: SST, IMDB, SVA): the label ids as written
CLASSIFICATION_SLICES = {s.name: s for s in (
    gold_label(title="gold label id (SST, IMDB: 0 negative, 1 positive; SVA: 0 singular, "
                     "1 plural)"),
    model_tokens("input length, quartiles of the tokens the model read"))}

#: NLI (premise and hypothesis: the model's words); the label ids are the dataset's order
NLI_SLICES = {s.name: s for s in (
    gold_label(title="gold label id (the dataset's order: SNLI 0 entailment, 1 neutral, "
                     "2 contradiction; SciTail 0 entailment, 1 neutral; DNLI 0 positive, "
                     "1 neutral, 2 negative)"),
    input_length(("premise", "hypothesis"), "premise + hypothesis length, quartiles of "
                                            "tokens"))}

#: answer and response selection: the unit is a question (MAP / MRR average over questions)
RANKING_SLICES = {s.name: s for s in (
    by_value("candidates", "number of candidate answers of the question, quartiles",
             len, bins=4, fields=("group", "gold"), unit="group", unit_name="candidates"),
    by_label("correct", "correct answers among the question's candidates", _correct_answers,
             fields=("group", "gold"), labels=("one correct", "several correct"),
             unit="group"))}

#: translation: corpus BLEU of each bucket's sentences (BLEU is not a mean of sentence scores)
TRANSLATION_SLICES = {s.name: s for s in (
    by_value("source_length", "source length in tokens (corpus BLEU of the bucket's "
                              "sentences)",
             lambda rows: len(str(rows[0]["source"]).split()), bins=(10, 20, 30, 40),
             fields=("source",), unit_name="tokens"),)}
