"""Open-domain QA data: SearchQA and Quasar-T, the two columns of CoDA Table 1, read in their
published formats for an extractive reader (lit_models/decaprop.py).

- SearchQA (Dunn et al. 2017), the txt splits ``train.txt``, ``val.txt``, ``test.txt``: one
  question per line, ``<s> snippet </s>  <s> snippet </s> ... ||| question ||| answer``.
  The snippets (the text between ``<s>`` and ``</s>``) are joined into one context, as
  DecaProp's pipeline does (nusnlp/amanda's convert_data.py); tokens are the file's
  whitespace-separated words.
- Quasar-T (Dhingra et al. 2017): ``questions/{train,dev,test}_questions.json.gz``, JSON
  lines ``{"uid", "question", "answer", "tags"}``, and ``contexts/{short,long}/
  {split}_contexts.json.gz``, JSON lines ``{"uid", "contexts": [[score, text], ...]}`` in
  the same order (a uid that differs from its question's is an error naming both lines).
  The contexts of a question are joined in file order (which ones DecaProp used is not
  published: ``context="short"`` by default); tokens by spaCy's blank English tokenizer, as
  DecaProp's Quasar-T preparation.  A gunzipped ``.json`` is read where the ``.json.gz`` is
  absent.

Answer spans are labelled at token level: the FIRST occurrence of the answer's tokens in the
context, exactly, else ignoring case (convert_data.py's order); a question whose answer
does not occur has no span (start = end = -1).  Training contexts are cut to a window of
``train_window`` words around that first occurrence (half before, half after; near an edge
the other side takes the rest: convert_data.py's ``cut_context``); training questions
without a span are dropped and counted (DecaProp's pipeline kept them, labelled at token 0:
a span that is not the answer).  Evaluation contexts are whole, truncated to
``max_context`` tokens (DecaProp's tmax = 1000); a span cut off by the truncation is
absent.  Questions are truncated to ``max_question`` tokens (qmax = 25).

The vocabulary (lowercased tokens, DecaProp's ``use_lower``) is built from every split:
``embeddings`` are frozen GloVe vectors (zero rows for words without one, as DecaProp), so
the evaluation words need rows too.  Without a vectors file the model trains an embedding
of its own (a warning says so when the file named is absent).

Batches: ``question`` (B,Lq) long, ``question_mask`` (B,Lq) bool, ``context`` (B,Lc),
``context_mask``, ``start`` / ``end`` (B,) long (-1: no span), ``index`` (B,) the position
in the split, and per example ``context_text`` (the context's tokens, original case,
joined by single spaces: the predicted answer string is a slice of it), ``answers`` (list
of gold answer strings) and ``qid``.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from datamodules.common import (
    PAD,
    UNK,
    DataFormatError,
    Vocab,
    VocabLinks,
    bucketed_loader,
    cache_dir,
    check_sizes,
    data_seed,
    open_data,
    pad,
    read_lines,
    record_data_seed,
    settings_key,
    shared_data_dir,
)
from datamodules.fetch import ensure
from datamodules.text import PackedPairs, PackedSequences, spacy_tokenize
from fileio import build_once

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
SNIPPET = re.compile(r"<s>(.*?)</s>", re.I | re.S)
#: a question row of a reader: (qid, question tokens, context tokens, gold answers,
#: tokens of the answer to label, line)
Row = tuple[str, list[str], list[str], list[str], list[str], int]


class QAExample(NamedTuple):
    qid: str
    question: list[str]  # tokens
    context: list[str]  # tokens
    answers: list[str]  # gold answer strings
    span: tuple[int, int] | None  # first token, last token of the labelled answer
    line: int  # of the question in its file


# -- span labelling ----------------------------------------------------------------------------
def find_span(context: Sequence[str], answer: Sequence[str]) -> tuple[int, int] | None:
    """(first, last) token of the first occurrence of ``answer`` in ``context``: an exact
    match first, else one ignoring case; None when the answer does not occur."""
    n = len(answer)
    if n == 0:
        return None
    for fold in (False, True):
        words = [w.lower() for w in context] if fold else list(context)
        target = [w.lower() for w in answer] if fold else list(answer)
        for i in range(len(words) - n + 1):
            if words[i:i + n] == target:
                return i, i + n - 1
    return None


def training_window(context: list[str], span: tuple[int, int], size: int
                    ) -> tuple[list[str], tuple[int, int]]:
    """The context cut to about ``size`` words around the answer, and the span in it:
    size / 2 words before and after the answer when both sides have that many; near an
    edge the short side whole and the other side up to ``size`` minus it (convert_data.py's
    ``cut_context``, in tokens)."""
    start, end = span
    before, after = context[:start], context[end + 1:]
    half = size / 2
    if len(before) >= half and len(after) >= half:
        keep_before, keep_after = int(half), int(half)
    elif len(before) >= half:
        keep_before, keep_after = min(len(before), size - len(after)), len(after)
    elif len(after) >= half:
        keep_before, keep_after = len(before), min(len(after), size - len(before))
    else:
        keep_before, keep_after = len(before), len(after)
    first = start - keep_before
    return context[first:end + 1 + keep_after], (keep_before, keep_before + end - start)


def label(row: Row, train: bool, train_window: int, max_context: int,
          max_question: int) -> QAExample | None:
    """One example of a split after span labelling, windowing and truncation (see the module
    docstring); None for a training question whose answer is not in its context."""
    qid, question, context, answers, answer_tokens, line = row
    span = find_span(context, answer_tokens)
    if train:
        if span is None:
            return None
        context, span = training_window(context, span, train_window)
    else:
        context = context[:max_context]
        span = span if span is not None and span[1] < max_context else None
    return QAExample(qid, question[:max_question], context, answers, span, line)


# -- the published formats ---------------------------------------------------------------------
def read_searchqa(path: str | os.PathLike) -> Iterator[tuple[int, list[str], str, str]]:
    """(line, snippets, question, answer) of every line of a SearchQA txt split."""
    expected = "'<s> snippet </s> ... ||| question ||| answer'"
    for number, line in read_lines(path, "a SearchQA txt split"):
        if not line.strip():
            continue
        parts = line.split("|||")
        if len(parts) != 3:
            raise DataFormatError(path, number, expected, line)
        snippets = [" ".join(s.split()) for s in SNIPPET.findall(parts[0])]
        question, answer = parts[1].strip(), parts[2].strip()
        if not question or not answer:
            raise DataFormatError(path, number, expected + " with a question and an answer",
                                  line)
        yield number, snippets, question, answer


def json_lines(path: str | os.PathLike, what: str) -> Iterator[tuple[int, dict]]:
    """(line, object) of every non-blank line of a JSON Lines file, gzipped when its name
    ends in ``.gz``; a line that is not a JSON object is a DataFormatError naming the line."""
    with open_data(path, what) as raw:
        stream = gzip.GzipFile(fileobj=raw) if str(path).endswith(".gz") else raw
        try:
            for number, data in enumerate(stream, 1):
                if not data.strip():
                    continue
                try:
                    record = json.loads(data.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as err:
                    raise DataFormatError(path, number, what, str(err)) from None
                if not isinstance(record, dict):
                    raise DataFormatError(path, number, what, data.decode("utf-8", "replace"))
                yield number, record
        except (OSError, EOFError) as err:  # not gzip, or cut short
            raise DataFormatError(path, None, f"{what} (gzip)", str(err)) from None


def read_quasar(questions: str | os.PathLike, contexts: str | os.PathLike
                ) -> Iterator[tuple[int, str, str, str, list[str]]]:
    """(line, uid, question, answer, context texts) of a Quasar-T split: its questions file
    and its contexts file, line by line in the same order."""
    q_what = 'a Quasar-T question {"uid", "question", "answer", ...}'
    c_what = 'Quasar-T contexts {"uid", "contexts": [[score, text], ...]}'
    pairs = zip_longest(json_lines(questions, q_what), json_lines(contexts, c_what))
    for count, (question, context) in enumerate(pairs):
        if question is None or context is None:
            path, other = (questions, contexts) if question is None else (contexts, questions)
            raise DataFormatError(path, None, f"one record per record of {other}",
                                  f"{count} records")
        (q_line, q), (c_line, c) = question, context
        for record, keys, path, number, what in (
                (q, ("uid", "question", "answer"), questions, q_line, q_what),
                (c, ("uid", "contexts"), contexts, c_line, c_what)):
            if any(k not in record for k in keys):
                raise DataFormatError(path, number, what, json.dumps(record))
        if q["uid"] != c["uid"]:
            raise DataFormatError(contexts, c_line, f"uid {q['uid']!r} (line {q_line} of "
                                  f"{questions}: the files go in the same order)", c["uid"])
        try:
            texts = [str(text) for _score, text in c["contexts"]]
        except (TypeError, ValueError):
            raise DataFormatError(contexts, c_line, c_what, json.dumps(c)) from None
        yield q_line, str(q["uid"]), str(q["question"]), str(q["answer"]), texts


# -- datasets and batches ----------------------------------------------------------------------
class QADataset(PackedPairs):
    """One split: question i and context i are sequences 2i and 2i+1 of one
    :class:`~datamodules.text.PackedSequences`, with the span, answers, qid, context text and
    source line of each question."""

    def __init__(self, sequences: PackedSequences, spans: Tensor, answers: list[list[str]],
                 qids: list[str], texts: list[str], lines: Tensor, path: str):
        super().__init__(sequences)
        self.spans, self.answers, self.qids, self.texts = spans, answers, qids, texts
        self.lines, self.path = lines, path

    question_ids = PackedPairs.first
    context_ids = PackedPairs.second

    def context_lengths(self) -> list[int]:
        return self.pair_lengths()[:, 1].tolist()


def collate_qa(dataset: QADataset, indices: list[int], pad_id: int) -> dict[str, Any]:
    """The batch of questions ``indices`` (see the module docstring)."""
    question, question_mask = pad([dataset.question_ids(i) for i in indices], pad_id)
    context, context_mask = pad([dataset.context_ids(i) for i in indices], pad_id)
    spans = dataset.spans[indices]  # (B,2)
    return {"question": question, "question_mask": question_mask,  # (B,Lq) (B,Lq)
            "context": context, "context_mask": context_mask,  # (B,Lc) (B,Lc)
            "start": spans[:, 0], "end": spans[:, 1], "index": torch.tensor(indices),
            "context_text": [dataset.texts[i] for i in indices],
            "answers": [dataset.answers[i] for i in indices],
            "qid": [dataset.qids[i] for i in indices]}


@dataclass
class ReadStats:
    questions: int = 0
    dropped_no_answer: int = 0  # training questions whose answer is not in the context
    no_span: int = 0  # evaluation questions without a span in the (truncated) context


class OpenQADataModule(VocabLinks, L.LightningDataModule):
    """What SearchQA and Quasar-T share (see the module docstring).

    Args:
        data_dir: the dataset's folder (default: its folder of the data root,
            ``shared_data_dir() / shared_folder``).
        batch_size: questions per batch (DecaProp: 100).
        train_window: words of a training context kept around the answer (convert_data.py:
            400).
        max_context: tokens of an evaluation context kept (DecaProp's tmax: 1000).
        max_question: tokens of a question kept (DecaProp's qmax: 25).
        lowercase: lowercase the tokens the model reads (the answer strings keep their case).
        max_examples: read only this many questions of each split (a prefix; smoke runs).
        num_workers: DataLoader worker processes.
        seed: shuffling seed; None: the run's seed (datamodules.common.data_seed).
        vectors: a GloVe-format text file; a relative path not found from the working
            directory is taken under the data root (the paper configs' ``glove/...``).
        vectors_dim: their dimension.
        download: let ``prepare_data`` download missing files that have an official URL.
    """

    name: ClassVar[str] = ""
    shared_folder: ClassVar[str] = ""
    dataset: ClassVar[str] = ""  # the dataset registry's entry (datamodules.fetch)

    def __init__(self, data_dir: str | None = None, batch_size: int = 100,
                 train_window: int = 400, max_context: int = 1000, max_question: int = 25,
                 lowercase: bool = True, max_examples: int | None = None, num_workers: int = 0,
                 seed: int | None = None, vectors: str | None = None, vectors_dim: int = 300,
                 download: bool = True):
        super().__init__()
        seed = data_seed(seed)
        self.save_hyperparameters()
        record_data_seed(self, seed)
        owner = type(self).__name__
        check_sizes(owner, batch_size=batch_size, train_window=train_window,
                    max_context=max_context, max_question=max_question,
                    max_examples=max_examples, vectors_dim=vectors_dim)
        check_sizes(owner, least=0, num_workers=num_workers)
        self.data_dir = (Path(data_dir) if data_dir is not None
                         else shared_data_dir() / self.shared_folder)
        self.batch_size, self.train_window = batch_size, train_window
        self.max_context, self.max_question, self.lowercase = max_context, max_question, lowercase
        self.max_examples, self.num_workers, self.seed = max_examples, num_workers, seed
        if vectors is not None and not Path(vectors).is_absolute() and not Path(vectors).exists():
            vectors = str(shared_data_dir() / vectors)  # where datamodules.fetch puts GloVe
        self.vectors, self.vectors_dim, self.download = vectors, vectors_dim, download
        self.datasets: dict[str, QADataset] = {}
        self.read_stats: dict[str, ReadStats] = {}
        self._vocab: Vocab | None = None
        self._embeddings: Tensor | None = None

    # -- what subclasses say
    def files(self, split: str) -> list[Path]:
        """The files one split is read from."""
        raise NotImplementedError

    def read(self, split: str) -> Iterator[Row]:
        """Every question of ``split`` as a :data:`Row`, in file order."""
        raise NotImplementedError

    def read_settings(self) -> dict[str, Any]:
        """Settings of a subclass that change what is read (part of the cache key)."""
        return {}

    # -- files
    def prepare_data(self) -> None:
        """The official files of every split, downloaded where a URL exists (datamodules.
        fetch); otherwise a FileNotFoundError naming the files and how to get them."""
        ensure(self.dataset, self.data_dir, [p for s in SPLITS for p in self.files(s)],
               download=self.download)

    # -- examples, vocabulary, datasets
    def examples(self, split: str, stats: ReadStats) -> Iterator[QAExample]:
        """The labelled examples of ``split`` (see the module docstring), counted in
        ``stats``."""
        rows = self.read(split)
        if self.max_examples:
            rows = islice(rows, self.max_examples)
        for row in rows:
            stats.questions += 1
            example = label(row, split == "train", self.train_window, self.max_context,
                            self.max_question)
            if example is None:
                stats.dropped_no_answer += 1
                continue
            stats.no_span += example.span is None
            yield example

    def _cache_key(self) -> str:
        stamps = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns)
                  for s in SPLITS for p in self.files(s)]
        return settings_key(dataset=self.name, files=stamps, train_window=self.train_window,
                            max_context=self.max_context, max_question=self.max_question,
                            lowercase=self.lowercase, max_examples=self.max_examples,
                            **self.read_settings(), version=1)

    def setup(self, stage: str | None = None) -> None:
        """Read, label and encode every split once (cached under ``cache_dir()``, keyed by
        the files and the settings)."""
        if self.datasets:
            return
        if any(not p.exists() for s in SPLITS for p in self.files(s)):
            self.prepare_data()  # gets them, or names them and how to get them
        state, _ = build_once(cache_dir() / f"open_qa-{self.name}-{self._cache_key()}.pt",
                              self._build, torch.save,
                              partial(torch.load, weights_only=False))  # our own pickle
        self._vocab = Vocab(state["itos"][2:], specials=(PAD, UNK))
        self.read_stats, self.datasets = state["stats"], state["datasets"]
        for split, stats in self.read_stats.items():
            (log.warning if stats.dropped_no_answer else log.info)(
                "%s %s: %d questions; %d training questions without the answer in the context "
                "dropped; %d evaluation questions without a span", self.name, split,
                stats.questions, stats.dropped_no_answer, stats.no_span)

    def _build(self) -> dict[str, Any]:
        examples, stats = {}, {}
        for split in SPLITS:
            stats[split] = ReadStats()
            examples[split] = list(self.examples(split, stats[split]))
            if not examples[split]:
                raise DataFormatError(self.files(split)[0], None,
                                      f"at least one question ({stats[split]})")

        def words(tokens: Iterable[str]) -> list[str]:
            return [t.lower() for t in tokens] if self.lowercase else list(tokens)

        vocab = Vocab.build((words(seq) for split in SPLITS for e in examples[split]
                             for seq in (e.question, e.context)), specials=(PAD, UNK))
        datasets = {}
        for split in SPLITS:
            ex = examples[split]
            sequences = PackedSequences(vocab.encode(words(seq)) for e in ex
                                        for seq in (e.question, e.context))
            spans = torch.tensor([e.span if e.span is not None else (-1, -1) for e in ex],
                                 dtype=torch.long).view(-1, 2)
            datasets[split] = QADataset(sequences, spans, [e.answers for e in ex],
                                        [e.qid for e in ex], [" ".join(e.context) for e in ex],
                                        torch.tensor([e.line for e in ex]),
                                        str(self.files(split)[0]))
        return {"itos": vocab.itos, "stats": stats, "datasets": datasets}

    # -- what the model reads
    @property
    def embeddings(self) -> Tensor | None:
        """(V, vectors_dim) frozen GloVe rows (zero without a vector), or None: no vectors
        file given, or the one given is absent (a warning says how to get it)."""
        if self.vectors is None:
            return None
        if self._embeddings is None:
            from datamodules.glove import HOW_TO_GET, vocab_vectors

            if not Path(self.vectors).exists():
                log.warning("%s: no GloVe vectors at %s: the model trains a randomly "
                            "initialised embedding instead. %s", self.name, self.vectors,
                            HOW_TO_GET)
                return None
            self._embeddings = vocab_vectors(self.vectors, self.vocab, dim=self.vectors_dim,
                                             oov_std=0.0, seed=self.seed).weight
        return self._embeddings

    # -- loaders
    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        self.setup()
        ds = self.datasets[split]
        return bucketed_loader(ds, ds.context_lengths(), self.batch_size,
                               partial(collate_qa, ds, pad_id=self.pad_id), shuffle=shuffle,
                               seed=self.seed, num_workers=self.num_workers, trainer=self.trainer)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


class SearchQADataModule(OpenQADataModule):
    """SearchQA's txt splits ``{train,val,test}.txt`` in ``data_dir`` (default
    ``<data root>/searchqa``; no direct download: the folder of the Google Drive release)."""

    name = "searchqa"
    shared_folder = "searchqa"
    dataset = "searchqa"

    def files(self, split: str) -> list[Path]:
        return [self.data_dir / f"{split}.txt"]

    def read(self, split: str) -> Iterator[Row]:
        for number, snippets, question, answer in read_searchqa(self.files(split)[0]):
            yield (f"searchqa_{split}_{number}", question.split(), " ".join(snippets).split(),
                   [answer], answer.split(), number)


class QuasarTDataModule(OpenQADataModule):
    """Quasar-T's question and context files under ``data_dir`` (default
    ``<data root>/quasar_t``, the layout of http://curtis.ml.cmu.edu/datasets/quasar/
    quasar-t/): ``questions/<split>_questions.json.gz`` and
    ``contexts/<context>/<split>_contexts.json.gz``, split = train, dev (validation), test.

    ``context``: "short" (sentences) or "long" (paragraphs) retrieved contexts; the other
    arguments as :class:`OpenQADataModule`'s."""

    name = "quasar_t"
    shared_folder = "quasar_t"
    dataset = "quasar_t"
    SPLIT_FILES: ClassVar[dict[str, str]] = {"train": "train", "val": "dev", "test": "test"}

    def __init__(self, data_dir: str | None = None, context: Literal["short", "long"] = "short",
                 batch_size: int = 100, train_window: int = 400, max_context: int = 1000,
                 max_question: int = 25, lowercase: bool = True,
                 max_examples: int | None = None, num_workers: int = 0,
                 seed: int | None = None, vectors: str | None = None, vectors_dim: int = 300,
                 download: bool = True):
        if context not in ("short", "long"):
            raise ValueError(f"QuasarTDataModule: context must be 'short' or 'long', "
                             f"got {context!r}")
        self.context = context
        super().__init__(data_dir, batch_size, train_window, max_context, max_question,
                         lowercase, max_examples, num_workers, seed, vectors, vectors_dim,
                         download)

    def read_settings(self) -> dict[str, Any]:
        return {"context": self.context}

    def prepare_data(self) -> None:
        """The release's files, downloaded into its layout (``questions/``,
        ``contexts/<context>/``) when missing (datamodules.fetch)."""
        if self.download:
            for folder in {p.parent for s in SPLITS for p in self.files(s)}:
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError:
                    pass  # the download then names the folder it cannot write in
        super().prepare_data()

    def files(self, split: str) -> list[Path]:
        """The question and context files of ``split``: the release's ``.json.gz``, or the
        gunzipped ``.json`` where only that is there."""
        name = self.SPLIT_FILES[split]
        paths = [self.data_dir / "questions" / f"{name}_questions.json.gz",
                 self.data_dir / "contexts" / self.context / f"{name}_contexts.json.gz"]
        return [p.with_suffix("") if not p.exists() and p.with_suffix("").exists() else p
                for p in paths]

    def read(self, split: str) -> Iterator[Row]:
        rows = list(read_quasar(*self.files(split)))
        n = len(rows)  # the questions, then the answers: one spaCy pass
        short = list(spacy_tokenize([r[2] for r in rows] + [r[3] for r in rows]))
        for k, (number, uid, _question, answer, texts) in enumerate(rows):
            context = [t for sentence in spacy_tokenize(texts) for t in sentence]
            yield uid, short[k], context, [answer], short[n + k], number
