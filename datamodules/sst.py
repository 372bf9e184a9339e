"""Stanford Sentiment Treebank (Socher et al. 2013): CoDA Table 5 and Differentiable Window
Table 5 (sentence classification).

Two published formats:

- ``ptb``: ``trees/{train,dev,test}.txt`` of trainDevTestTrees_PTB.zip, one binarised PTB
  tree per line, every node labelled 0-4 (very negative .. very positive), e.g.
  ``(3 (2 (2 The) (2 Rock)) (4 ...))``.  A sentence is the leaves of a tree, its label the
  root's.  Tokens are kept as the file writes them (``-LRB-``, ``\\/``, ``n't``).
- ``glue``: GLUE SST-2 ``{train,dev}.tsv``, a ``sentence\\tlabel`` header then one
  lowercased, tokenised sentence (or phrase, in train) and its 0/1 label per row.  GLUE's
  ``test.tsv`` has no labels and is not read.

``granularity``: ``fine`` keeps the 5 classes; ``binary`` maps 0,1 -> 0 (negative) and
3,4 -> 1 (positive) and drops neutral (2) sentences, counted per split in
``stats["dropped_neutral"]`` (8,544 -> 6,920 train and 1,101 -> 872 dev trees, the usual
SST-2 sizes).

``train_phrases`` (ptb only): train on every node of every training tree, each phrase with
its own label (Socher et al. 2013; GLUE's SST-2 train is a lowercased set of such phrases),
instead of the whole sentences.  A phrase that occurs in several trees is kept once (first
occurrence first; every phrase has one label): 159,274 phrases of the 8,544 training trees,
77,616 after ``binary`` drops the 81,658 neutral ones.  Validation and test are always whole
sentences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from datamodules.common import DataFormatError, read_lines, record_data_seed
from datamodules.registry import url_of
from datamodules.text import Example, TextClassificationDataModule, Tokenization, split_tokens

FINE_LABELS = ("very negative", "negative", "neutral", "positive", "very positive")
BINARY_LABELS = ("negative", "positive")
NEUTRAL = 2

_TREE_TOKEN = re.compile(r"\(|\)|[^ ()]+")  # ASCII spaces only: SST has a word "8\xa01/2"


@dataclass(frozen=True)
class SSTTree:
    """A parsed tree: its leaves and, for every node in pre-order (root first), the span of
    leaves it covers and its label."""

    words: tuple[str, ...]
    spans: tuple[tuple[int, int, int], ...]  # (start, end, label): words[start:end]

    @property
    def label(self) -> int:
        return self.spans[0][2]

    def phrases(self) -> list[tuple[tuple[str, ...], int]]:
        """Every node's (words, label), root first."""
        return [(self.words[start:end], label) for start, end, label in self.spans]


def parse_sst_tree(text: str, path: str | Path = "<string>", line: int | None = None) -> SSTTree:
    """One PTB tree ``(label child ...)`` / ``(label word)`` with labels 0-4."""

    def fail(expected: str) -> DataFormatError:
        return DataFormatError(path, line, expected, text)

    tokens = _TREE_TOKEN.findall(text)
    words: list[str] = []
    spans: list[list[int]] = []
    stack: list[list] = []  # [span index, has word, has subtrees] of each open node
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "(":
            if not stack and spans:
                raise fail("one tree per line (text after the root's closing ')')")
            if stack and stack[-1][1]:
                raise fail("a leaf '(label word)' to hold one word and no subtree")
            label = tokens[i + 1] if i + 1 < len(tokens) else ""
            if label not in ("0", "1", "2", "3", "4"):
                raise fail(f"a sentiment label 0-4 after '(' (token {i + 2} is {label!r})")
            if stack:
                stack[-1][2] = True
            stack.append([len(spans), False, False])
            spans.append([len(words), -1, int(label)])
            i += 2
            continue
        if token == ")":
            if not stack:
                raise fail("balanced parentheses (a ')' closes nothing)")
            index, has_word, has_subtrees = stack.pop()
            if not (has_word or has_subtrees):
                raise fail("a word or subtrees in every node (found an empty node)")
            spans[index][1] = len(words)
        else:
            if not stack:
                raise fail(f"a tree starting with '(' (found {token!r} outside any node)")
            if stack[-1][1] or stack[-1][2]:
                raise fail(f"one word per leaf and no words beside subtrees (at {token!r})")
            stack[-1][1] = True
            words.append(token)
        i += 1
    if stack:
        raise fail(f"balanced parentheses ({len(stack)} '(' left open)")
    if not spans:
        raise fail("a tree '(label ...)'")
    return SSTTree(tuple(words), tuple(tuple(s) for s in spans))


def read_sst_ptb(path: str | Path) -> list[SSTTree]:
    """Every tree of a trees/*.txt file (one per line; blank lines are errors)."""
    trees = [parse_sst_tree(text, path, number) for number, text in read_lines(path)]
    if not trees:
        raise DataFormatError(path, None, "at least one tree (one per line)")
    return trees


def sst_examples(trees: list[SSTTree], granularity: Literal["binary", "fine"] = "binary",
                 phrases: bool = False) -> tuple[list[Example], int]:
    """(words, label) of the root (or, with ``phrases``, of every node, unique pairs) and how
    many neutral ones ``binary`` dropped."""
    if granularity not in ("binary", "fine"):
        raise ValueError(f"granularity must be 'binary' or 'fine', got {granularity!r}")
    if phrases:
        pairs = list(dict.fromkeys(p for tree in trees for p in tree.phrases()))
    else:
        pairs = [(tree.words, tree.label) for tree in trees]
    if granularity == "fine":
        return [(list(words), label) for words, label in pairs], 0
    kept = [(list(words), int(label > NEUTRAL)) for words, label in pairs if label != NEUTRAL]
    return kept, len(pairs) - len(kept)


def read_glue_sst2(path: str | Path) -> list[Example]:
    """GLUE SST-2 ``sentence\\tlabel`` rows (header first) as (words, 0/1)."""
    examples = []
    for number, text in read_lines(path):
        if number == 1:
            if text.split("\t") != ["sentence", "label"]:
                raise DataFormatError(path, 1, "the header 'sentence\\tlabel' (GLUE's test.tsv "
                                      "has no labels and cannot be read)", text)
            continue
        fields = text.split("\t")
        if len(fields) != 2:
            raise DataFormatError(path, number, "'sentence<TAB>label' (2 fields)", text)
        sentence, label = fields
        if label not in ("0", "1"):
            raise DataFormatError(path, number, "label 0 or 1", label)
        words = split_tokens(sentence)
        if not words:
            raise DataFormatError(path, number, "a non-empty sentence", text)
        examples.append((words, int(label)))
    if not examples:
        raise DataFormatError(path, None, "the header 'sentence\\tlabel' and at least one row")
    return examples


class SSTDataModule(TextClassificationDataModule):
    """SST sentence classification from PTB trees or GLUE SST-2 tsv files (see the module
    docstring for ``granularity`` and ``train_phrases``).

    File names default to the published ones (``trees/``: train.txt, dev.txt, test.txt;
    GLUE: train.tsv, dev.tsv; the shared copy's glue_sst2_train.part90/part10.tsv when those
    are what the folder has); a file set to None is not read.
    """

    name = "sst"

    @property
    def dataset(self) -> str:
        """The registry entry: the PTB trees or GLUE's SST-2."""
        return "sst" if self.format == "ptb" else "sst2"

    def __init__(self, data_dir: str | None = None, format: Literal["ptb", "glue"] = "ptb",
                 granularity: Literal["binary", "fine"] = "binary", train_phrases: bool = False,
                 train_file: str | None = None, val_file: str | None = None,
                 test_file: str | None = None, tokenization: Tokenization = "word",
                 bpe_vocab_size: int = 8192, min_freq: int = 1,
                 max_vocab_size: int | None = None, lowercase: bool = False,
                 batch_size: int = 32, max_len: int | None = 512,
                 max_train_examples: int | None = None, num_workers: int = 0,
                 seed: int | None = None):
        if format not in ("ptb", "glue"):
            raise ValueError(f"format must be 'ptb' or 'glue', got {format!r}")
        if granularity not in ("binary", "fine"):
            raise ValueError(f"granularity must be 'binary' or 'fine', got {granularity!r}")
        if format == "glue" and (granularity == "fine" or train_phrases):
            raise ValueError("GLUE SST-2 has binary labels of sentences and phrases only: "
                             "use format='ptb' for granularity='fine' or train_phrases")
        self.format, self.granularity, self.train_phrases = format, granularity, train_phrases
        if format == "ptb":
            self.shared_subdir, self.archive_subdir = "sst_ptb", "trees"
            self.archive_url = url_of("sst")  # trainDevTestTrees_PTB.zip
        else:
            self.shared_subdir, self.archive_subdir = "sst2_glue", "SST-2"
            self.archive_url = url_of("sst2")  # GLUE's SST-2.zip
        super().__init__(data_dir, tokenization, bpe_vocab_size, min_freq, max_vocab_size,
                         lowercase, batch_size, max_len, max_train_examples, num_workers, seed)
        self.save_hyperparameters()
        record_data_seed(self, self.seed)
        self.files = {"train": train_file, "val": val_file, "test": test_file}
        self.stats["dropped_neutral"] = {}
        self.labels = FINE_LABELS if granularity == "fine" else BINARY_LABELS

    def split_files(self, split: str) -> list[Path]:
        name = self.files[split]
        if name is None:
            candidates = {("ptb", "train"): ["train.txt"], ("ptb", "val"): ["dev.txt"],
                          ("ptb", "test"): ["test.txt"],
                          ("glue", "train"): ["train.tsv", "glue_sst2_train.part90.tsv"],
                          ("glue", "val"): ["dev.tsv", "glue_sst2_train.part10.tsv"],
                          ("glue", "test"): []}[self.format, split]
            if not candidates:
                return []
            name = next((c for c in candidates if (self.data_dir / c).exists()), candidates[0])
        return [self.data_dir / name]

    def read_examples(self, split: str, limit: int | None = None) -> list[Example]:
        (path,) = self.split_files(split)
        if self.format == "glue":
            self.stats["dropped_neutral"][split] = 0
            return read_glue_sst2(path)
        phrases = self.train_phrases and split == "train"
        examples, dropped = sst_examples(read_sst_ptb(path), self.granularity, phrases)
        self.stats["dropped_neutral"][split] = dropped
        return examples
