"""Answer selection and response selection: WikiQA, TrecQA and the Ubuntu Dialogue Corpus.

CoDA Table 2 (docs/papers.md#coda) trains DecompAtt as a pair classifier on these ranking
sets and reports MAP / MRR (WikiQA, TrecQA) and recall@k (Ubuntu) over each question's
(context's) candidates.  A ranking example is a pair (question or context, candidate answer
or response, label) with label 1 = relevant ("positive") and 0 = not ("negative"), that
belongs to a *group*: its question or context.  The pairs are NLI pairs (premise = question /
context, hypothesis = candidate), so the models read the NLI batches unchanged, plus
``group`` (B,) long: the pair's group id in its split, consecutive 0..Q-1 in order of first
appearance in the file.  A group's candidates can land in different batches (batches are
bucketed by length): gather the scores of a split by ``group`` (or ``index``) to rank.

Formats:

- WikiQA (Yang et al. 2015), ``format="filtered"``: castorini's standard filtered version,
  one folder per split (``train/``, ``dev/``, ``test/``) with line-aligned ``a.toks``
  (question), ``b.toks`` (candidate sentence), ``sim.txt`` (0/1) and ``id.txt`` (question id,
  which defines the group); pre-tokenized and lowercased, tokens separated by spaces.  Its
  questions without a correct answer were removed from every split (train too: 873 of 2,118
  training questions remain).  ``format="tsv"``: the official ``WikiQA-{train,dev,test}.tsv``
  (QuestionID, Question, DocumentID, DocumentTitle, SentenceID, Sentence, Label; raw text,
  grouped by QuestionID).
- TrecQA (Wang et al. 2007, as released by Yao et al. 2013): the jacana pseudo-XML files,
  one ``<QApairs id='..'>`` block per question holding one ``<question>`` and its
  ``<positive>`` / ``<negative>`` candidates; the first line inside each element is the
  tab-separated tokens, the following lines (POS tags, dependencies, NER) are ignored.
- Ubuntu Dialogue Corpus v2 (Lowe et al. 2015, 2017): ``train.csv`` (Context, Utterance,
  Label; one group per row) and ``valid.csv`` / ``test.csv`` (Context, Ground Truth
  Utterance, Distractor_0..Distractor_8; one group of 10 per row: the ground truth first,
  label 1, then the distractors, label 0).  Pre-tokenized (and stemmed / lemmatized by the
  release script); the turn markers ``__eou__`` / ``__eot__`` are kept as tokens.

Evaluation groups (``filter_groups``, for every split but train):

- ``"none"`` keeps every group (TrecQA "raw");
- ``"clean"`` drops the groups without a positive OR without a negative candidate, on which
  MAP / MRR say nothing about the ranking (TrecQA "clean": Wang & Ittycheriah 2015,
  Rao et al. 2016);
- ``"no_positive"`` drops only the groups without a positive candidate: the standard WikiQA
  evaluation (Yang et al. 2015), which is what the filtered WikiQA files already did.

Dropped groups and pairs are counted per split in ``group_stats`` and logged.

Tokens: ``tokenizer="auto"`` (default) splits the pre-tokenized formats on whitespace (TrecQA:
on tabs) and runs spaCy's blank English tokenizer
(:func:`~datamodules.text.spacy_tokenize`) on raw text (WikiQA tsv); ``"whitespace"`` and
``"spacy"`` force one or the other.  A pair whose question or candidate has no token is
dropped and counted (``ReadStats.dropped_empty``), except in TrecQA where an empty token line
is malformed.  A malformed file raises DataFormatError naming the file and line.
"""

from __future__ import annotations

import csv
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any, Literal

import torch

from datamodules.common import DataFormatError, check_sizes, nonempty, read_lines, require_file
from datamodules.nli import NLIDataModule, NLIExample, PairDataset, ReadStats
from datamodules.registry import url_of
from datamodules.text import spacy_tokenize

log = logging.getLogger(__name__)

RankingTokenizer = Literal["auto", "whitespace", "spacy"]
GroupFilter = Literal["none", "clean", "no_positive"]
TOKENIZERS = ("auto", "whitespace", "spacy")
GROUP_FILTERS = ("none", "clean", "no_positive")

RANKING_LABELS = ("negative", "positive")  # label 1 = relevant candidate
BINARY_LABELS = {"0": 0, "1": 1}
UBUNTU_LABELS = {"0": 0, "1": 1, "0.0": 0, "1.0": 1}  # some releases write floats

WIKIQA_URL = url_of("wikiqa")  # the official archive (datamodules.fetch registry)
WIKIQA_FILTERED_FILES = ("a.toks", "b.toks", "sim.txt", "id.txt")
WIKIQA_FILTERED_HOW = (
    "The filtered WikiQA (a folder per split with a.toks, b.toks, sim.txt, id.txt) has no "
    "official download: it is castorini's release, folder WikiQA/ of "
    "https://github.com/castorini/data; clone it and pass that folder with --data.data_dir "
    f"(or read the official release with format='tsv': {WIKIQA_URL}).")
WIKIQA_TSV_HEADER = ("QuestionID", "Question", "DocumentID", "DocumentTitle", "SentenceID",
                     "Sentence", "Label")
UBUNTU_TRAIN_HEADER = ("Context", "Utterance", "Label")
UBUNTU_EVAL_COLUMNS = ("Context", "Ground Truth Utterance")  # then Distractor_0, 1, ...

Tokenize = Callable[[str], list[str]]


@dataclass
class GroupStats:
    """The groups of one split, beyond :class:`~datamodules.nli.ReadStats`.

    ``questions``: the groups (questions, contexts) read from the file; ``groups``,
    ``candidates``, ``positives``, ``no_positive`` and ``no_negative`` describe the split's
    dataset (after ``filter_groups``); ``dropped_groups`` / ``dropped_candidates``: removed by
    ``filter_groups``; ``empty_groups``: questions left without any pair (none in the file,
    e.g. a TrecQA block with only a question, or every pair dropped as empty).  So
    questions = groups + dropped_groups + empty_groups."""

    questions: int = 0
    groups: int = 0
    candidates: int = 0
    positives: int = 0
    no_positive: int = 0
    no_negative: int = 0
    dropped_groups: int = 0
    dropped_candidates: int = 0
    empty_groups: int = 0


# ----------------------------------------------------------------------------- helpers

def word_tokenizer(tokenizer: str, lowercase: bool = False,
                   split: Callable[[str], list[str]] = str.split) -> Tokenize:
    """Text -> tokens: ``split`` (the format's own separator) for "whitespace", spaCy's
    blank English tokenizer for "spacy"; lowercased on request."""
    if tokenizer not in ("whitespace", "spacy"):
        raise ValueError(f"tokenizer must be 'whitespace' or 'spacy', got {tokenizer!r}")

    def tokenize(text: str) -> list[str]:
        tokens = split(text) if tokenizer == "whitespace" else next(spacy_tokenize([text]))
        return [t.lower() for t in tokens] if lowercase else tokens

    return tokenize


def _pair(question: list[str], candidate: list[str], label: int, line: int, group: int,
          stats: ReadStats) -> NLIExample | None:
    """The example, or None (counted in ``stats.dropped_empty``) when a side has no token."""
    if not question or not candidate:
        stats.dropped_empty += 1
        return None
    stats.examples += 1
    return NLIExample(question, candidate, label, line, group)


def _label(raw: str, labels: dict[str, int], path, line: int) -> int:
    if raw not in labels:
        raise DataFormatError(path, line, "a label " + " | ".join(labels), repr(raw))
    return labels[raw]


class _Groups:
    """Group keys -> ids 0, 1, ... in order of first appearance, counting new ones in
    ``GroupStats.questions``."""

    def __init__(self, stats: GroupStats):
        self.ids: dict[Any, int] = {}
        self.stats = stats

    def __call__(self, key: Any) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.ids)
            self.stats.questions += 1
        return self.ids[key]


def _defaults(stats: ReadStats | None, groups: GroupStats | None) -> tuple[ReadStats,
                                                                           GroupStats]:
    return (stats if stats is not None else ReadStats(),
            groups if groups is not None else GroupStats())


# ----------------------------------------------------------------------------- readers

def _misaligned(paths: list[Path], rows: tuple) -> DataFormatError:
    """The error for line-aligned files of unequal length: names the odd file(s) out."""
    line = next(r[0] for r in rows if r is not None)
    ended = [p for p, r in zip(paths, rows) if r is None]
    going = [p for p, r in zip(paths, rows) if r is not None]
    names = ", ".join(p.name for p in paths)
    if len(ended) <= len(going):  # these files are short
        return DataFormatError(ended[0], line, f"line {line}, as in {going[0].name} ({names} "
                               "are line-aligned)", f"end of file after {line - 1} lines")
    text = rows[paths.index(going[0])][1]
    return DataFormatError(going[0], line, f"the end of the file after {line - 1} lines, as "
                           f"{ended[0].name} ({names} are line-aligned)", text)


def read_wikiqa_filtered(folder: str | os.PathLike, tokenizer: str = "whitespace",
                         lowercase: bool = False, stats: ReadStats | None = None,
                         groups: GroupStats | None = None) -> Iterator[NLIExample]:
    """One split folder of the filtered WikiQA: line i of ``a.toks`` (question), ``b.toks``
    (candidate), ``sim.txt`` (0 | 1) and ``id.txt`` (question id = group) is pair i.  Files of
    different lengths, a label other than 0 / 1 or an empty question id raise
    DataFormatError."""
    folder = Path(folder)
    paths = [require_file(folder / name, f"WikiQA filtered {name}", WIKIQA_FILTERED_HOW)
             for name in WIKIQA_FILTERED_FILES]
    stats, groups = _defaults(stats, groups)
    tokenize, group_of = word_tokenizer(tokenizer, lowercase), _Groups(groups)
    last = (None, [])  # the question repeats for each of its candidates: tokenized once
    lines = zip_longest(*(read_lines(p) for p in paths))
    for rows in nonempty(lines, folder, "line-aligned " + ", ".join(WIKIQA_FILTERED_FILES)
                         + " with at least one line"):
        if None in rows:
            raise _misaligned(paths, rows)
        number = rows[0][0]
        question, candidate, label, qid = (text for _, text in rows)
        label = _label(label.strip(), BINARY_LABELS, paths[2], number)
        if not qid.strip():
            raise DataFormatError(paths[3], number, "a question id", repr(qid))
        if question != last[0]:
            last = (question, tokenize(question))
        example = _pair(last[1], tokenize(candidate), label, number, group_of(qid.strip()),
                        stats)
        if example is not None:
            yield example


def read_wikiqa_tsv(path: str | os.PathLike, tokenizer: str = "spacy", lowercase: bool = False,
                    stats: ReadStats | None = None,
                    groups: GroupStats | None = None) -> Iterator[NLIExample]:
    """An official ``WikiQA-*.tsv``: a header row (QuestionID Question DocumentID
    DocumentTitle SentenceID Sentence Label), then one candidate sentence per row, grouped
    by QuestionID; blank lines are skipped."""
    stats, groups = _defaults(stats, groups)
    tokenize, group_of = word_tokenizer(tokenizer, lowercase), _Groups(groups)
    lines = read_lines(path)
    _, header = next(lines, (1, None))
    if header is None:
        raise DataFormatError(path, None, "the tab-separated header " + " ".join(WIKIQA_TSV_HEADER)
                              + " and at least one row")
    if tuple(header.removeprefix("\ufeff").split("\t")) != WIKIQA_TSV_HEADER:
        raise DataFormatError(path, 1, "the tab-separated header " + " ".join(WIKIQA_TSV_HEADER),
                              header)
    last = (None, [])
    for number, line in nonempty(lines, path, "at least one row after the header"):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(WIKIQA_TSV_HEADER):
            raise DataFormatError(path, number, f"{len(WIKIQA_TSV_HEADER)} tab-separated fields "
                                  f"({' '.join(WIKIQA_TSV_HEADER)})", f"{len(fields)} fields")
        qid, question, sentence = fields[0].strip(), fields[1], fields[5]
        label = _label(fields[6].strip(), BINARY_LABELS, path, number)
        if not qid:
            raise DataFormatError(path, number, "a QuestionID", repr(fields[0]))
        if question != last[0]:
            last = (question, tokenize(question))
        example = _pair(last[1], tokenize(sentence), label, number, group_of(qid), stats)
        if example is not None:
            yield example


_TREC_TAG = re.compile(r"</?(QApairs|question|positive|negative)\b[^>]*>")
_TREC_OPEN = re.compile(r"<(question|positive|negative)>")
_TREC_BLOCK = re.compile(r"<QApairs(\s[^>]*)?>")


def _tabs(line: str) -> list[str]:
    return [t for t in line.strip().split("\t") if t]


def read_trecqa(path: str | os.PathLike, tokenizer: str = "whitespace", lowercase: bool = False,
                stats: ReadStats | None = None,
                groups: GroupStats | None = None) -> Iterator[NLIExample]:
    """A jacana TrecQA file: ``<QApairs id='..'>`` blocks (one group each, in file order)
    of one ``<question>`` followed by ``<positive>`` (label 1) and ``<negative>`` (label 0)
    candidates; inside each element the first line is the tab-separated tokens and the
    rest is ignored.  Every tag on a line of its own.  A tag out of place, an unclosed
    element or block, a second question or an empty token line raise DataFormatError (an
    unclosed tag is reported at the line that opened it, or where it should have closed)."""
    stats, groups = _defaults(stats, groups)
    tokenize = word_tokenizer(tokenizer, lowercase, split=_tabs)
    block: int | None = None  # line of the open <QApairs>
    element: tuple[str, int] | None = None  # (name, line) of the open element
    tokens_next = False  # the line after an opening element tag: its tokens
    question: list[str] | None = None
    group, blocks = -1, 0
    for number, raw in read_lines(path):
        line = raw.strip()
        if element is not None:
            name, opened = element
            if line == f"</{name}>" and not tokens_next:
                element = None
            elif _TREC_TAG.fullmatch(line):
                what = f"the tokens of the <{name}> of line {opened}" if tokens_next \
                    else f"</{name}> closing the <{name}> of line {opened}"
                raise DataFormatError(path, number, what, line)
            elif tokens_next:
                tokens_next = False
                if not line:
                    raise DataFormatError(path, number, f"the tab-separated tokens of the "
                                          f"<{name}> of line {opened}", "an empty line")
                tokens = tokenize(raw)
                if name == "question":
                    if not tokens:
                        raise DataFormatError(path, number, "a question with tokens", raw)
                    question = tokens
                else:
                    example = _pair(question, tokens, int(name == "positive"), number, group,
                                    stats)
                    if example is not None:
                        yield example
            continue  # annotation lines: POS tags, dependencies, named entities
        if not line:
            continue
        if _TREC_BLOCK.fullmatch(line):
            if block is not None:
                raise DataFormatError(path, number, f"</QApairs> closing the <QApairs> of line "
                                      f"{block}", line)
            block, question, blocks = number, None, blocks + 1
            group = groups.questions  # every block is a question, in file order
            groups.questions += 1
        elif line == "</QApairs>":
            if block is None:
                raise DataFormatError(path, number, "a <QApairs> opening the block", line)
            if question is None:
                raise DataFormatError(path, number, f"a <question> in the <QApairs> block of "
                                      f"line {block}", line)
            block = None
        elif match := _TREC_OPEN.fullmatch(line):
            name = match.group(1)
            if block is None:
                raise DataFormatError(path, number, f"<{name}> inside a <QApairs> block", line)
            if name == "question" and question is not None:
                raise DataFormatError(path, number, f"one <question> in the <QApairs> block of "
                                      f"line {block}", line)
            if name != "question" and question is None:
                raise DataFormatError(path, number, f"the <question> of the <QApairs> block of "
                                      f"line {block} before its candidates", line)
            element, tokens_next = (name, number), True
        else:
            where = f" in the <QApairs> block of line {block}" if block is not None else ""
            raise DataFormatError(path, number, f"a <QApairs>, </QApairs>, <question>, "
                                  f"<positive> or <negative> tag{where}", line)
    if element is not None:
        raise DataFormatError(path, element[1], f"</{element[0]}> closing this <{element[0]}>",
                              "end of file")
    if block is not None:
        raise DataFormatError(path, block, "</QApairs> closing this <QApairs>", "end of file")
    if not blocks:
        raise DataFormatError(path, None, "at least one <QApairs> block")


def _csv_rows(path: str | os.PathLike) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of every record of a CSV file (fields may hold commas, quotes
    and newlines); the lines come from :func:`~datamodules.common.read_lines` (its errors:
    undecodable text by line, a missing, unreadable or directory path), broken quoting is
    a DataFormatError at its line."""
    counted = 0

    def lines() -> Iterator[str]:
        nonlocal counted
        for number, text in read_lines(path, keepends=True):
            counted = number
            yield text

    reader = csv.reader(lines(), strict=True)
    while True:
        start = counted + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataFormatError(path, counted, "CSV records", str(err)) from None
        yield start, row


def read_ubuntu(path: str | os.PathLike, tokenizer: str = "whitespace", lowercase: bool = False,
                max_context_tokens: int | None = None, stats: ReadStats | None = None,
                groups: GroupStats | None = None) -> Iterator[NLIExample]:
    """An Ubuntu Dialogue Corpus v2 CSV file, told apart by its header: training
    (Context,Utterance,Label; label 0 | 1 | 0.0 | 1.0; each row its own group) or
    evaluation (Context,Ground Truth Utterance,Distractor_0,...; each row one group: the
    ground truth, label 1, then the distractors, label 0).  ``max_context_tokens`` keeps
    the last n tokens of each context (the turns nearest the response).  Blank lines are
    skipped."""
    if max_context_tokens is not None and max_context_tokens < 1:
        raise ValueError(f"max_context_tokens must be positive, got {max_context_tokens}")
    stats, groups = _defaults(stats, groups)
    tokenize = word_tokenizer(tokenizer, lowercase)
    rows = _csv_rows(path)
    _, header = next(rows, (1, None))
    if header is None:
        raise DataFormatError(path, None, "a CSV header row and at least one row")
    if header and header[0].startswith("\ufeff"):
        header[0] = header[0][1:]
    n = len(header) - len(UBUNTU_EVAL_COLUMNS)
    distractors = tuple(f"Distractor_{i}" for i in range(n))
    training = tuple(header) == UBUNTU_TRAIN_HEADER
    if not training and not (n >= 1 and tuple(header) == UBUNTU_EVAL_COLUMNS + distractors):
        raise DataFormatError(path, 1, "the header Context,Utterance,Label (training) or "
                              "Context,Ground Truth Utterance,Distractor_0,...,Distractor_8 "
                              "(evaluation)", ",".join(header))
    for number, row in nonempty(rows, path, "at least one row after the header"):
        if not row:
            continue
        if len(row) != len(header):
            raise DataFormatError(path, number, f"{len(header)} comma-separated fields "
                                  f"({','.join(header)})", f"{len(row)} fields")
        context = tokenize(row[0])
        if max_context_tokens is not None:
            context = context[-max_context_tokens:]
        group = groups.questions  # one group per row
        groups.questions += 1
        if training:
            label = _label(row[2], UBUNTU_LABELS, path, number)
            candidates = [(row[1], label)]
        else:
            candidates = [(text, int(k == 0)) for k, text in enumerate(row[1:])]
        for text, label in candidates:
            example = _pair(context, tokenize(text), label, number, group, stats)
            if example is not None:
                yield example


# ----------------------------------------------------------------------------- DataModules

def _consecutive(examples: Iterable[NLIExample]) -> Iterator[NLIExample]:
    """Group ids renumbered 0, 1, ... in order of first appearance (after drops)."""
    ids: dict[int, int] = {}
    for ex in examples:
        yield ex._replace(group=ids.setdefault(ex.group, len(ids)))


def count_groups(dataset: PairDataset, stats: GroupStats) -> GroupStats:
    """Fill the dataset's counts into ``stats``: groups, candidates, positives and the
    groups without a positive / without a negative."""
    groups, labels = dataset.groups, dataset.labels
    q = int(groups.max()) + 1 if len(groups) else 0
    size = torch.bincount(groups, minlength=q)
    positives = torch.zeros(q, dtype=torch.long).index_add_(0, groups, labels)
    if not (size > 0).all():
        raise ValueError(f"{dataset.path}: group ids are not consecutive")
    stats.groups, stats.candidates = q, len(labels)
    stats.positives = int(positives.sum())
    stats.no_positive = int((positives == 0).sum())
    stats.no_negative = int((positives == size).sum())
    return stats


class RankingDataModule(NLIDataModule):
    """What the ranking DataModules share: NLI batches (premise = question / context,
    hypothesis = candidate, label 1 = relevant) plus ``group`` (B,) long, the pair's group
    id in its split (0..Q-1, in order of first appearance in the file).  After ``setup``,
    ``group_stats[split]`` (:class:`GroupStats`) counts each split's groups, candidates,
    positives, the groups without a positive / negative and what was dropped; they are
    logged at INFO.

    Subclasses implement :meth:`read_groups`.

    Args:
        tokenizer: "auto" (whitespace tokens for pre-tokenized formats, spaCy for raw text),
            "whitespace" or "spacy".
        filter_groups: which evaluation groups (every split but train) to drop: "none",
            "clean" (groups without a positive or without a negative candidate) or
            "no_positive" (groups without a positive candidate).  Counted and logged.
        Other arguments: see :class:`~datamodules.nli.NLIDataModule`.
    """

    label_names = RANKING_LABELS
    name = "ranking"
    raw_text: bool = False  # whether the files hold raw text ("auto" tokenizer: spaCy)

    def __init__(self, tokenizer: RankingTokenizer = "auto", filter_groups: GroupFilter = "none",
                 **kwargs):
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"{type(self).__name__} tokenizer must be 'auto', 'whitespace' or "
                             f"'spacy', got {tokenizer!r}")
        if filter_groups not in GROUP_FILTERS:
            raise ValueError(f"filter_groups must be 'none', 'clean' or 'no_positive', got "
                             f"{filter_groups!r}")
        super().__init__(tokenizer="spacy", **kwargs)  # NLI's own choices do not apply
        self.tokenizer = ("spacy" if self.raw_text else "whitespace") if tokenizer == "auto" \
            else tokenizer
        self.filter_groups = filter_groups
        self.group_stats: dict[str, GroupStats] = {}

    def read_groups(self, path: Path, stats: ReadStats,
                    groups: GroupStats) -> Iterator[NLIExample]:
        """The pairs of a split's file (group ids in order of first appearance), counting
        what was read in ``stats`` and the questions in ``groups.questions``."""
        raise NotImplementedError

    def read(self, path: Path, stats: ReadStats) -> Iterator[NLIExample]:
        return self.read_groups(path, stats, GroupStats())

    def read_split(self, split: str, path: Path, stats: ReadStats) -> Iterator[NLIExample]:
        groups = self.group_stats[split] = GroupStats()
        examples = self.read_groups(path, stats, groups)
        if split != "train" and self.filter_groups != "none":
            examples = self._filter(split, path, list(examples), stats, groups)
        return _consecutive(examples)

    def _filter(self, split: str, path: Path, examples: list[NLIExample], stats: ReadStats,
                groups: GroupStats) -> list[NLIExample]:
        """The pairs of the groups ``filter_groups`` keeps; the others counted."""
        seen: dict[int, list[bool]] = {}  # group -> [has a positive, has a negative]
        for ex in examples:
            seen.setdefault(ex.group, [False, False])[ex.label == 0] = True
        need_negative = self.filter_groups == "clean"
        dropped = {g for g, (pos, neg) in seen.items() if not pos or (need_negative and not neg)}
        kept = [ex for ex in examples if ex.group not in dropped]
        groups.dropped_groups, groups.dropped_candidates = len(dropped), len(examples) - len(kept)
        stats.examples -= groups.dropped_candidates  # examples = the pairs in the dataset
        if examples and not kept:
            raise DataFormatError(path, None, "at least one group left to evaluate on",
                                  f"filter_groups={self.filter_groups!r} dropped all "
                                  f"{len(seen)} groups of the {self.name} {split} split")
        return kept

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        super().setup(stage)
        for split, data in self.datasets.items():
            g = count_groups(data, self.group_stats[split])
            g.empty_groups = g.questions - g.groups - g.dropped_groups
            log.info("%s %s: %d groups, %d candidates, %d positive; %d groups without a "
                     "positive, %d without a negative; filter_groups=%r dropped %d groups "
                     "(%d pairs); %d questions without any pair", self.name, split, g.groups,
                     g.candidates, g.positives, g.no_positive, g.no_negative,
                     self.filter_groups, g.dropped_groups, g.dropped_candidates, g.empty_groups)


def _fingerprint(paths: Iterable[Path]) -> list[tuple[str, int, int]]:
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in paths if p.exists()]


class WikiQADataModule(RankingDataModule):
    """WikiQA (Yang et al. 2015; 3,047 questions, 29,258 candidate sentences).

    ``format="filtered"`` (default) reads castorini's filtered version: split folders
    ``train_folder`` / ``val_folder`` / ``test_folder`` (default train, dev, test) under
    ``data_dir`` (default: the shared ``wikiqa/filtered``, which has train and dev only: pass
    ``test_folder="dev"`` there), whitespace tokens.  ``format="tsv"`` reads the official
    ``WikiQA-{train,dev,test}.tsv`` (names overridable by ``train_file`` / ``val_file`` /
    ``test_file``) under ``data_dir`` or its ``WikiQACorpus`` folder, fetched by
    ``prepare_data`` from the official archive; spaCy tokens.  The standard evaluation of
    the tsv files drops the questions without a correct answer: ``filter_groups=
    "no_positive"`` (the filtered files have none left).  Other arguments: see
    :class:`RankingDataModule`.
    """

    name = "wikiqa"
    url = WIKIQA_URL
    archive_folder = "WikiQACorpus"

    @property
    def dataset(self) -> str:
        """The registry entry: the official release (tsv) or castorini's filtered one."""
        return "wikiqa" if self.format == "tsv" else "wikiqa_filtered"

    def __init__(self, format: Literal["filtered", "tsv"] = "filtered",
                 train_folder: str | None = None, val_folder: str | None = None,
                 test_folder: str | None = None, train_file: str | None = None,
                 val_file: str | None = None, test_file: str | None = None, **kwargs):
        if format not in ("filtered", "tsv"):
            raise ValueError(f"WikiQA format must be 'filtered' or 'tsv', got {format!r}")
        folders = {"train": train_folder, "val": val_folder, "test": test_folder}
        files = {"train": train_file, "val": val_file, "test": test_file}
        other = files if format == "filtered" else folders
        wrong = [f"{split}_{'file' if other is files else 'folder'}"
                 for split, v in other.items() if v is not None]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} do(es) not apply to WikiQA format {format!r}")
        self.format, self.raw_text = format, format == "tsv"
        if format == "filtered":  # no official archive; default: the shared folder
            self.shared_folder, self.url, self.archive_folder = "wikiqa/filtered", "", ""
            self.how_to_get = WIKIQA_FILTERED_HOW
        super().__init__(**kwargs)
        if format == "filtered":
            published = {"train": "train", "val": "dev", "test": "test"}
            self.files = {s: folders[s] or published[s] for s in published}
        else:
            self.files = {s: files[s] or f"WikiQA-{p}.tsv"
                          for s, p in (("train", "train"), ("val", "dev"), ("test", "test"))}

    def read_groups(self, path: Path, stats: ReadStats,
                    groups: GroupStats) -> Iterator[NLIExample]:
        reader = read_wikiqa_filtered if self.format == "filtered" else read_wikiqa_tsv
        return reader(path, self.tokenizer, self.lowercase, stats, groups)

    def vocab_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"format": self.format}
        if self.format == "filtered":  # the training "file" is a folder: key by its files
            train = self.path("train")
            settings["files"] = _fingerprint(train / n for n in WIKIQA_FILTERED_FILES)
        return settings


class TrecQADataModule(RankingDataModule):
    """TrecQA (Wang et al. 2007) in the jacana format of Yao et al. 2013: ``train_file``
    (default ``TRAIN-ALL.xml``, 1,229 questions; ``TRAIN.xml`` is the 94-question manually
    judged set), ``val_file`` (``DEV.xml``), ``test_file`` (``TEST.xml``) under ``data_dir``
    (default: the shared ``trecqa``, which has TRAIN.xml and DEV.xml only).  ``version``
    "raw" keeps every question of dev and test; "clean" drops those with only positive or
    only negative candidates (``filter_groups="clean"``, as in Wang & Ittycheriah 2015 and
    Rao et al. 2016).  Tokens: the tab-separated first line of each element.  Other
    arguments: see :class:`RankingDataModule`.
    """

    name = "trecqa"
    dataset = "trecqa"
    shared_folder = "trecqa"
    how_to_get = ("TrecQA has no official download left (jacana-qa-naacl2013-data-results."
                  "tar.bz2 from http://cs.jhu.edu/~xuchen/packages/); castorini keeps "
                  "TRAIN.xml, TRAIN-ALL.xml, DEV.xml and TEST.xml in TrecQA/data/ of "
                  "https://github.com/castorini/data: pass that folder with --data.data_dir.")

    def __init__(self, version: Literal["raw", "clean"] = "raw",
                 train_file: str = "TRAIN-ALL.xml", val_file: str = "DEV.xml",
                 test_file: str = "TEST.xml", **kwargs):
        if version not in ("raw", "clean"):
            raise ValueError(f"TrecQA version must be 'raw' or 'clean', got {version!r}")
        given = kwargs.pop("filter_groups", None)
        if version == "clean" and given not in (None, "clean"):
            raise ValueError(f"TrecQA version='clean' means filter_groups='clean', got "
                             f"filter_groups={given!r}")
        self.version = version
        super().__init__(filter_groups=given or ("clean" if version == "clean" else "none"),
                         **kwargs)
        self.files = {"train": train_file, "val": val_file, "test": test_file}

    def read_groups(self, path: Path, stats: ReadStats,
                    groups: GroupStats) -> Iterator[NLIExample]:
        return read_trecqa(path, self.tokenizer, self.lowercase, stats, groups)


class UbuntuDataModule(RankingDataModule):
    """Ubuntu Dialogue Corpus v2 (Lowe et al. 2017): ``train_file`` (``train.csv``, 1M
    context / response / label rows, half of them label 1), ``val_file`` (``valid.csv``) and
    ``test_file`` (``test.csv``), each context with its ground truth and 9 distractors: one
    group of 10 candidates, the ground truth first (recall@k over 10).  Whitespace tokens
    (the corpus is tokenized; ``__eou__`` / ``__eot__`` end utterances / turns and stay
    tokens).  ``max_context_tokens`` keeps only the last n tokens of each context (contexts
    run to hundreds of tokens; the most recent turns matter most).  Other arguments: see
    :class:`RankingDataModule`.
    """

    name = "ubuntu"
    dataset = "ubuntu"
    how_to_get = ("The Ubuntu Dialogue Corpus v2 CSV files are built by "
                  "https://github.com/rkadlec/ubuntu-ranking-dataset-creator (or downloaded as "
                  "ubuntu_dialogs_corpus v2 by the Hugging Face datasets loader, which asks for "
                  "them by hand): pass the folder with train.csv, valid.csv and test.csv with "
                  "--data.data_dir.")

    def __init__(self, train_file: str = "train.csv", val_file: str = "valid.csv",
                 test_file: str = "test.csv", max_context_tokens: int | None = None, **kwargs):
        check_sizes(type(self).__name__, max_context_tokens=max_context_tokens)
        super().__init__(**kwargs)
        self.max_context_tokens = max_context_tokens
        self.files = {"train": train_file, "val": val_file, "test": test_file}

    def read_groups(self, path: Path, stats: ReadStats,
                    groups: GroupStats) -> Iterator[NLIExample]:
        return read_ubuntu(path, self.tokenizer, self.lowercase, self.max_context_tokens, stats,
                           groups)

    def vocab_settings(self) -> dict[str, Any]:
        return {"max_context_tokens": self.max_context_tokens}
