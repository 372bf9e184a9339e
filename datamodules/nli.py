"""Natural language inference data: SNLI, MultiNLI, SciTail and Dialogue NLI.

CoDA Table 3 (docs/papers.md#coda) trains DecompAtt on all four; the decomposable
attention write-up (docs/papers.md) on SNLI.  Each dataset is read in its published format:

- SNLI 1.0 (Bowman et al. 2015) and MultiNLI 1.0 (Williams et al. 2018): ``.jsonl`` (one
  JSON object per line) or ``.txt`` (tab-separated with a header row; rows may omit the
  trailing annotator-label columns), both read by :func:`read_nli`.  GLUE's MNLI ``.tsv``
  has the same columns and is read as ``.txt``.  ``gold_label`` "-" means the annotators
  reached no consensus: such pairs are dropped and counted (``ReadStats.dropped_no_gold``).
- SciTail 1.1 (Khot et al. 2018): ``tsv_format`` (premise \\t hypothesis \\t entails|neutral,
  no header) or ``snli_format`` (SNLI-style JSON lines, entailment|neutral).
- Dialogue NLI (Welleck et al. 2019): ``dialogue_nli_{train,dev,test}.jsonl``, which
  despite the name hold ONE JSON list of records ``{"id", "dtype", "label", "sentence1",
  "sentence2", "triple1", "triple2"}`` with label positive|neutral|negative (one record
  per line is read too).

Labels: entailment=0, neutral=1, contradiction=2.  SciTail has two classes, entails
(=entailment, 0) and neutral (1).  Dialogue NLI's positive/neutral/negative map to
entailment/neutral/contradiction (as in the authors' ParlAI release).

Tokens: ``tokenizer="parse"`` takes the leaves of the binary parse (the published
``sentence{1,2}_binary_parse`` with its brackets dropped; PTB escapes such as ``-LRB-``
and the quotes `````` and ``''`` are kept as the parser wrote them) where the format has
one; formats without parses (SciTail tsv, Dialogue NLI) and ``tokenizer="spacy"`` use
spaCy's blank English tokenizer on ``sentence{1,2}`` (whitespace tokens dropped).  A pair
whose premise or hypothesis has no token is dropped and counted (``dropped_empty``).
A malformed line or a label outside the dataset's set raises DataFormatError naming the
file and line.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import islice
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
    json_records,
    nonempty,
    pad,
    read_lines,
    read_text,
    record_data_seed,
    require_file,
    settings_key,
    shared_data_dir,
)
from datamodules.fetch import ensure, prepare_once
from datamodules.registry import Dataset as Release
from datamodules.registry import Download, dataset_of, url_of
from datamodules.text import PackedPairs, PackedSequences, spacy_tokenize
from fileio import build_once

log = logging.getLogger(__name__)

Tokenizer = Literal["parse", "spacy"]
NLIFormat = Literal["jsonl", "txt"]  # SNLI's and MultiNLI's two published formats
Row = tuple[int, Callable[[str], Any]]  # (1-based line, field name -> value) of a record
RowReader = Callable[[str | os.PathLike, tuple[str, ...]], Iterator[Row]]  # (path, fields)

NLI_LABELS = ("entailment", "neutral", "contradiction")
NO_GOLD = "-"  # SNLI/MultiNLI gold_label when the annotators reached no consensus
SNLI_LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
SCITAIL_LABELS = ("entailment", "neutral")
SCITAIL_TSV_LABELS = {"entails": 0, "neutral": 1}
SCITAIL_SNLI_LABELS = {"entailment": 0, "neutral": 1}
DNLI_LABELS = {"positive": 0, "neutral": 1, "negative": 2}


class NLIExample(NamedTuple):
    premise: list[str]
    hypothesis: list[str]
    label: int
    line: int  # 1-based line of the record in its file
    group: int = -1  # ranking data: the pair's question / context (-1: none, as in NLI)


@dataclass
class ReadStats:
    """What a reader read and what it dropped, by reason: nothing is dropped uncounted."""

    examples: int = 0
    dropped_no_gold: int = 0
    dropped_empty: int = 0


# ----------------------------------------------------------------------------- tokens

def parse_tokens(binary_parse: str) -> list[str]:
    """The leaves of a binary parse: ``( ( Two women ) ( are ... ) )`` -> Two women are ..."""
    return [t for t in binary_parse.split() if t != "(" and t != ")"]


def spacy_pair(premise: str, hypothesis: str) -> tuple[list[str], list[str]]:
    """Both sentences by spaCy's blank English tokenizer (datamodules.text.spacy_tokenize)."""
    first, second = spacy_tokenize((premise, hypothesis))
    return first, second


def _example(premise: list[str], hypothesis: list[str], label: int, line: int,
             lowercase: bool, stats: ReadStats) -> NLIExample | None:
    if not premise or not hypothesis:
        stats.dropped_empty += 1
        return None
    if lowercase:
        premise, hypothesis = [t.lower() for t in premise], [t.lower() for t in hypothesis]
    stats.examples += 1
    return NLIExample(premise, hypothesis, label, line)


def _label(raw: Any, labels: Mapping[str, int], no_gold: bool, path, line: int,
           stats: ReadStats) -> int | None:
    """The class id of a raw label; None (counted) for SNLI's "-"; else DataFormatError."""
    if no_gold and raw == NO_GOLD:
        stats.dropped_no_gold += 1
        return None
    if raw not in labels:
        allowed = " | ".join([*labels, *([NO_GOLD] if no_gold else [])])
        raise DataFormatError(path, line, f"a label in {allowed}", repr(raw))
    return labels[raw]


def _pair_tokens(get: Callable[[str], Any], tokenizer: Tokenizer) -> tuple[list, list]:
    """Premise and hypothesis tokens of an SNLI-style record (``get`` reads a field)."""
    if tokenizer == "parse":
        return (parse_tokens(get("sentence1_binary_parse")),
                parse_tokens(get("sentence2_binary_parse")))
    return spacy_pair(get("sentence1"), get("sentence2"))


def _fields(tokenizer: Tokenizer) -> tuple[str, ...]:
    text = ("sentence1_binary_parse", "sentence2_binary_parse") if tokenizer == "parse" \
        else ("sentence1", "sentence2")
    return ("gold_label", *text)


# ----------------------------------------------------------------------------- readers

def _jsonl_rows(path: str | os.PathLike, fields: tuple[str, ...]) -> Iterator[Row]:
    """One JSON object per line; a field that is missing or not a string is an error."""
    what = "a JSON object with string fields " + ", ".join(fields)
    for number, _, record in nonempty(json_records(path, what), path,
                                      "at least one JSON object line"):

        def get(name: str, record=record, number=number) -> str:
            value = record.get(name)
            if not isinstance(value, str):
                raise DataFormatError(path, number, what, f"{name}={value!r}")
            return value

        yield number, get


def _txt_rows(path: str | os.PathLike, fields: tuple[str, ...]) -> Iterator[Row]:
    """Tab-separated, columns named by the header row; a row may omit trailing columns
    after the ones read."""
    lines = read_lines(path)
    _, header = next(lines, (1, None))
    if header is None:
        raise DataFormatError(path, None, "a tab-separated header row and at least one row")
    columns = header.split("\t")
    if not set(fields) <= set(columns):
        raise DataFormatError(path, 1, "a tab-separated header with columns "
                              + ", ".join(fields), header)
    index = {name: columns.index(name) for name in fields}
    least = max(index.values()) + 1
    for number, line in nonempty(lines, path, "at least one row after the header"):
        if not line.strip():
            continue
        values = line.split("\t")
        if not least <= len(values) <= len(columns):
            raise DataFormatError(path, number, f"{least} to {len(columns)} tab-separated "
                                  f"fields (header: {header})", f"{len(values)} fields")
        yield number, lambda name, values=values: values[index[name]]


NLI_FORMATS: dict[str, RowReader] = {"jsonl": _jsonl_rows, "txt": _txt_rows}


def _format_rows(format: str, dataset: str = "NLI") -> RowReader:
    """The row reader of an SNLI-style ``format``; another format is a ValueError."""
    if format not in NLI_FORMATS:
        raise ValueError(f"{dataset} format must be {' or '.join(map(repr, NLI_FORMATS))}, "
                         f"got {format!r}")
    return NLI_FORMATS[format]


def read_nli(path: str | os.PathLike, format: NLIFormat = "jsonl",
             labels: Mapping[str, int] = SNLI_LABELS, tokenizer: Tokenizer = "parse",
             lowercase: bool = False, stats: ReadStats | None = None) -> Iterator[NLIExample]:
    """The pairs of a file in one of SNLI's two published formats (SNLI, MultiNLI, GLUE
    MNLI's ``.tsv``, SciTail's snli_format): ``format`` "jsonl" (one JSON object per line)
    or "txt" (tab-separated with a header row).  Each record gives ``gold_label`` and the
    two sentences (parses or text, by ``tokenizer``); gold label "-" is dropped and
    counted in ``stats``, blank lines are skipped."""
    rows = _format_rows(format)
    stats = stats if stats is not None else ReadStats()
    for number, get in rows(path, _fields(tokenizer)):
        label = _label(get("gold_label"), labels, True, path, number, stats)
        if label is not None:
            example = _example(*_pair_tokens(get, tokenizer), label, number, lowercase, stats)
            if example is not None:
                yield example


def read_nli_jsonl(path: str | os.PathLike, labels: Mapping[str, int] = SNLI_LABELS,
                   tokenizer: Tokenizer = "parse", lowercase: bool = False,
                   stats: ReadStats | None = None) -> Iterator[NLIExample]:
    """:func:`read_nli` of a ``.jsonl`` file."""
    return read_nli(path, "jsonl", labels, tokenizer, lowercase, stats)


def read_nli_txt(path: str | os.PathLike, labels: Mapping[str, int] = SNLI_LABELS,
                 tokenizer: Tokenizer = "parse", lowercase: bool = False,
                 stats: ReadStats | None = None) -> Iterator[NLIExample]:
    """:func:`read_nli` of a ``.txt`` file (or GLUE MNLI ``.tsv``)."""
    return read_nli(path, "txt", labels, tokenizer, lowercase, stats)


def read_scitail_tsv(path: str | os.PathLike, lowercase: bool = False,
                     stats: ReadStats | None = None) -> Iterator[NLIExample]:
    """SciTail ``tsv_format``: premise \\t hypothesis \\t entails|neutral, no header
    (spaCy tokens: the format has no parses)."""
    stats = stats if stats is not None else ReadStats()
    for number, line in nonempty(read_lines(path), path, "at least one line 'premise<TAB>"
                                 "hypothesis<TAB>entails|neutral'"):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise DataFormatError(path, number, "3 tab-separated fields: premise, hypothesis, "
                                  "entails|neutral", f"{len(fields)} fields")
        label = _label(fields[2], SCITAIL_TSV_LABELS, False, path, number, stats)
        example = _example(*spacy_pair(fields[0], fields[1]), label, number, lowercase, stats)
        if example is not None:
            yield example


_WHITESPACE = re.compile(r"[ \t\r\n]*")


def _json_records(path: str | os.PathLike) -> Iterator[tuple[int, int, Any]]:
    """(line, record number, record) of a file holding one JSON list of records, or one
    record per line; a syntax error is reported at its line."""
    text = read_text(path)
    pos = _WHITESPACE.match(text).end()
    if pos == len(text):
        raise DataFormatError(path, None, "a JSON list of records (or one record per line)")
    if text.startswith("{", pos):  # one record per line
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        for count, (number, line) in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFormatError(path, number, f"record {count} in JSON",
                                      f"{err.msg} at column {err.colno}") from None
            yield number, count, record
        return

    def fail(at: int, expected: str) -> DataFormatError:
        return DataFormatError(path, text.count("\n", 0, at) + 1, expected, text[at:at + 40])

    if not text.startswith("[", pos):
        raise fail(pos, "a JSON list of records")
    decoder, line, counted, count = json.JSONDecoder(), 1, 0, 0
    pos = _WHITESPACE.match(text, pos + 1).end()
    while not text.startswith("]", pos):
        if count:
            if not text.startswith(",", pos):
                raise fail(pos, f"',' or ']' after record {count}")
            pos = _WHITESPACE.match(text, pos + 1).end()
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise DataFormatError(path, err.lineno, f"record {count + 1} in JSON",
                                  f"{err.msg} at column {err.colno}") from None
        line += text.count("\n", counted, pos)
        counted, count = pos, count + 1
        yield line, count, record
        pos = _WHITESPACE.match(text, end).end()
    if text[pos + 1:].strip():
        raise fail(pos + 1, "the end of the file after the list of records")


def read_dialogue_nli(path: str | os.PathLike, lowercase: bool = False,
                      stats: ReadStats | None = None) -> Iterator[NLIExample]:
    """Dialogue NLI: a JSON list of records with sentence1, sentence2 and label
    positive|neutral|negative (spaCy tokens).  Errors name the line and the record number
    (the published files hold the whole list on one line)."""
    stats = stats if stats is not None else ReadStats()
    records = nonempty(_json_records(path), path, "at least one record in the JSON list")
    for number, count, record in records:
        what = f"record {count} with string fields label, sentence1, sentence2"
        values = [record.get(k) if isinstance(record, dict) else None
                  for k in ("label", "sentence1", "sentence2")]
        if not all(isinstance(v, str) for v in values):
            raise DataFormatError(path, number, what, json.dumps(record))
        if values[0] not in DNLI_LABELS:
            raise DataFormatError(path, number, f"record {count} with label in "
                                  + " | ".join(DNLI_LABELS), repr(values[0]))
        example = _example(*spacy_pair(values[1], values[2]), DNLI_LABELS[values[0]], number,
                           lowercase, stats)
        if example is not None:
            yield example


# ----------------------------------------------------------------------------- datasets

class PairDataset(PackedPairs):
    """The encoded pairs of one split: premise i and hypothesis i are sequences 2i and 2i+1
    of one :class:`~datamodules.text.PackedSequences` (flat int32 ids, so the full SNLI and
    MultiNLI training sets stay small in memory), with their labels and source lines, and
    for ranking data (datamodules/ranking.py) the group (question / context) of each pair:
    ``groups`` (N,) long, or None when the pairs have no groups (NLI)."""

    def __init__(self, sequences: PackedSequences, labels: Tensor, lines: Tensor, path: str,
                 groups: Tensor | None = None):
        if len(sequences) != 2 * len(labels):
            raise ValueError(f"{len(sequences)} sequences for {len(labels)} labelled pairs")
        if groups is not None and len(groups) != len(labels):
            raise ValueError(f"{len(groups)} groups for {len(labels)} labelled pairs")
        super().__init__(sequences)
        self.labels = labels
        self.lines, self.path = lines, path  # source line of each pair, for messages and plots
        self.groups = groups

    premise_ids = PackedPairs.first
    hypothesis_ids = PackedPairs.second

    def bucket_keys(self) -> list[int]:
        """Sort keys for bucketing: premise length, then hypothesis length."""
        lengths = self.pair_lengths()  # (N, 2)
        return (lengths[:, 0] * (int(lengths[:, 1].max()) + 1) + lengths[:, 1]).tolist()


def collate_pairs(dataset: PairDataset, indices: list[int], pad_id: int) -> dict[str, Tensor]:
    """The batch of pairs ``indices``; ranking data adds ``group`` (B,) long."""
    premise, premise_mask = pad([dataset.premise_ids(i) for i in indices], pad_id)
    hypothesis, hypothesis_mask = pad([dataset.hypothesis_ids(i) for i in indices], pad_id)
    batch = {"premise": premise, "premise_mask": premise_mask,  # (B,La) (B,La)
             "hypothesis": hypothesis, "hypothesis_mask": hypothesis_mask,  # (B,Lb) (B,Lb)
             "label": dataset.labels[indices], "index": torch.tensor(indices)}  # (B,) (B,)
    if dataset.groups is not None:
        batch["group"] = dataset.groups[indices]  # (B,)
    return batch


def _interned_pairs(examples: Iterable[NLIExample], table: dict[str, int],
                    path: str) -> PairDataset:
    """A split read in one pass, before the vocabulary exists: tokens become ids into
    ``table`` (shared by the splits), remapped to vocabulary ids later (:func:`_remap`).
    The pairs' groups are kept unless every one is -1 (no groups: NLI)."""
    labels, lines, groups = [], [], []

    def sequences():
        for ex in examples:
            labels.append(ex.label)
            lines.append(ex.line)
            groups.append(ex.group)
            yield [table.setdefault(t, len(table)) for t in ex.premise]
            yield [table.setdefault(t, len(table)) for t in ex.hypothesis]

    packed = PackedSequences(sequences())
    grouped = any(g != -1 for g in groups)
    return PairDataset(packed, torch.tensor(labels, dtype=torch.long),
                       torch.tensor(lines, dtype=torch.long), path,
                       torch.tensor(groups, dtype=torch.long) if grouped else None)


def _remap(dataset: PairDataset, lookup: Tensor) -> PairDataset:
    """``lookup``: (table size,) the vocabulary id of every interned token."""
    dataset.sequences.ids = lookup[dataset.sequences.ids.long()].int()
    return dataset


# ----------------------------------------------------------------------------- DataModules

class NLIDataModule(VocabLinks, L.LightningDataModule):
    """What the four NLI DataModules share.  Batches are dicts: premise (B,La) long,
    premise_mask (B,La) bool (True = real token), hypothesis (B,Lb), hypothesis_mask (B,Lb),
    label (B,) long and index (B,), the pairs' positions in their split's dataset.

    Subclasses name their files per split (``self.files``), the splits validated and tested
    on (``val_splits``, ``test_splits``: one dataloader each, in that order) and
    :meth:`read`.  The vocabulary is built from the training split (after
    ``max_train_examples``) and cached under ``cache_dir()``; ``embeddings`` is the
    (V, vectors_dim) GloVe matrix of ``vectors`` (see datamodules/glove.py) or None.

    With several processes (DDP) set the trainer's ``use_distributed_sampler=False``: the
    bucketing batch sampler takes each rank's share itself.

    Args:
        data_dir: the folder holding the files, or the folder the official archive was
            unpacked into (default: the dataset's folder of the data root,
            ``shared_data_dir() / shared_folder``, where it exists or, for a dataset with
            an official archive, where ``prepare_data`` downloads it; else required).
        batch_size: pairs per batch (training and evaluation).
        tokenizer: "parse" (binary-parse leaves, where the format has parses) or "spacy".
        lowercase: lowercase every token.
        max_train_examples: read only this many training pairs (a prefix; smoke runs).
        min_freq: training-split frequency a word needs to enter the vocabulary.
        num_workers: DataLoader worker processes.
        seed: shuffling seed of the training batches (and of the random OOV vectors);
            None: the run's seed (``seed_everything``; datamodules.common.data_seed).
        vectors: path of a GloVe-format text file for ``embeddings``; a relative path that
            is not there from the working directory is taken under the data root
            ($ATTNREPRO_DATA, default ../shared/data): the paper configs' ``glove/...``.
        vectors_dim: dimension of those vectors.
        download: let ``prepare_data`` download the official archive when files are
            missing, through datamodules.fetch (also the GloVe 840B file ``vectors`` names,
            when it is missing); else it raises FileNotFoundError naming the URL and path.
    """

    label_names: ClassVar[tuple[str, ...]] = NLI_LABELS
    name: ClassVar[str] = "nli"  # cache file prefix
    shared_folder: ClassVar[str] = ""  # the dataset's folder under shared_data_dir()
    url: ClassVar[str] = ""  # the official archive ("" when it cannot be fetched by URL)
    archive_folder: ClassVar[str] = ""  # the archive's top folder, holding the files
    how_to_get: ClassVar[str] = ""
    val_splits: ClassVar[tuple[str, ...]] = ("val",)
    test_splits: ClassVar[tuple[str, ...]] = ("test",)

    def __init__(self, data_dir: str | None = None, batch_size: int = 32,
                 tokenizer: Tokenizer = "parse", lowercase: bool = False,
                 max_train_examples: int | None = None, min_freq: int = 1,
                 num_workers: int = 0, seed: int | None = None, vectors: str | None = None,
                 vectors_dim: int = 300, download: bool = True):
        super().__init__()
        seed = data_seed(seed)  # None: the run's seed
        self.save_hyperparameters()  # with the subclass's arguments, for the loggers
        record_data_seed(self, seed)
        if tokenizer not in ("parse", "spacy"):
            raise ValueError(f"tokenizer must be 'parse' or 'spacy', got {tokenizer!r}")
        owner = type(self).__name__
        check_sizes(owner, batch_size=batch_size, max_train_examples=max_train_examples,
                    min_freq=min_freq, vectors_dim=vectors_dim)
        check_sizes(owner, least=0, num_workers=num_workers)
        if data_dir is None:
            default = shared_data_dir() / self.shared_folder
            if not (self.shared_folder and (default.is_dir() or (download and self.url))):
                raise ValueError(f"{type(self).__name__} needs data_dir (--data.data_dir): the "
                                 f"folder with {self.name} files. {self._how_to_get()}")
            data_dir = str(default)
        self.data_dir = Path(data_dir).absolute()  # messages name the file wherever run from
        self.batch_size, self.tokenizer, self.lowercase = batch_size, tokenizer, lowercase
        self.max_train_examples, self.min_freq = max_train_examples, min_freq
        self.num_workers, self.seed = num_workers, seed
        if vectors is not None and not Path(vectors).is_absolute() and not Path(vectors).exists():
            vectors = str(shared_data_dir() / vectors)  # where datamodules.fetch puts GloVe
        self.vectors, self.vectors_dim, self.download = vectors, vectors_dim, download
        self.files: dict[str, str] = {}  # split -> file name under data_dir (subclasses)
        self.datasets: dict[str, PairDataset] = {}
        self.read_stats: dict[str, ReadStats] = {}
        self._vocab: Vocab | None = None
        self._embeddings: Tensor | None = None

    def read(self, path: Path, stats: ReadStats) -> Iterator[NLIExample]:
        raise NotImplementedError

    def read_split(self, split: str, path: Path, stats: ReadStats) -> Iterator[NLIExample]:
        """The examples of ``split`` (its file is ``path``): :meth:`read`, for subclasses that
        treat the splits differently (datamodules/ranking.py filters evaluation groups)."""
        return self.read(path, stats)

    def vocab_settings(self) -> dict[str, Any]:
        """What else, beyond the settings every module has, changes the training tokens
        (part of the vocabulary cache key; subclasses)."""
        return {}

    # --- files
    def _how_to_get(self) -> str:
        if self.url:
            fetch = (f"python -m datamodules.fetch {self.name} --data_dir DIR"
                     if getattr(self, "download", True)
                     else "--data.download true")
            return f"Download {self.url} and unzip it into data_dir (or: {fetch})."
        return self.how_to_get

    def path(self, split: str) -> Path:
        """The split's file: under data_dir, or under the archive's own top folder there."""
        direct = self.data_dir / self.files[split]
        unpacked = self.data_dir / self.archive_folder / self.files[split]
        return unpacked if self.archive_folder and not direct.exists() and unpacked.exists() \
            else direct

    @prepare_once
    def prepare_data(self) -> None:
        """Download and unpack the official archive when a split file is missing, and the
        GloVe 840B vectors when ``vectors`` names a missing glove.840B.300d.txt
        (datamodules.fetch: locked, resumed, checked; the archive is kept in ``data_dir``
        and unpacked there, so the files land in ``data_dir / archive_folder``)."""
        absent = [s for s in self.files if not self.path(s).exists()]
        if absent:
            if not (self.download and self.url):
                where = ", ".join(sorted({str(self.path(s)) for s in absent}))
                raise FileNotFoundError(f"{self.name} files not found: {where}. "
                                        f"{self._how_to_get()}")
            ensure(self._release(), self.data_dir,
                   [self.data_dir / self.archive_folder / self.files[s] for s in absent],
                   url=self.url, strict=False)
            still = sorted({str(p) for p in map(self.path, absent) if not p.exists()})
            if still:  # files the release does not hold (a sample, a file of one's own)
                inside = (f" (nor under {self.data_dir / self.archive_folder})"
                          if self.archive_folder else "")
                raise FileNotFoundError(
                    f"{self.name} files not found: {', '.join(still)}{inside}; they are not "
                    f"in the release {self.url}: put them there or give their folder with "
                    "--data.data_dir")
        if self.vectors is not None and not Path(self.vectors).exists():
            ensure("glove", Path(self.vectors).parent, [Path(self.vectors)],
                   download=self.download, strict=False)  # another file: vocab_vectors says

    def _release(self) -> str | Release:
        """The dataset's entry of the datamodules.fetch registry (a subclass with its own
        ``url`` and no entry: one made on the spot from ``url`` and ``files``)."""
        entry = dataset_of(self)
        if entry is not None:
            return entry.key
        provides = tuple((Path(self.archive_folder) / f).as_posix() for f in self.files.values())
        return Release(self.name, self.name, self.shared_folder or self.name,
                       (Download(self.url, archive=True, provides=provides),))

    # --- reading, vocabulary, datasets
    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        table: dict[str, int] = {}
        interned: dict[str, PairDataset] = {}
        for split in self.files:
            path = require_file(self.path(split), f"{self.name} {split} file",
                                self._how_to_get())
            stats = self.read_stats[split] = ReadStats()
            examples = self.read_split(split, path, stats)
            if split == "train" and self.max_train_examples:
                examples = islice(examples, self.max_train_examples)
            interned[split] = _interned_pairs(examples, table, str(path))
            if not len(interned[split]):
                raise DataFormatError(path, None, f"at least one labelled pair ({stats})")
            dropped = stats.dropped_no_gold + stats.dropped_empty
            (log.warning if dropped else log.info)(
                "%s %s (%s): %d pairs; dropped %d without gold label, %d empty", self.name,
                split, path, stats.examples, stats.dropped_no_gold, stats.dropped_empty)
        itos = list(table)
        self._vocab = self._load_or_build_vocab(  # premise, hypothesis, ... in file order
            [itos[i] for i in ids.tolist()] for ids, *_ in interned["train"].sequences)
        lookup = torch.tensor([self._vocab[t] for t in itos], dtype=torch.long)
        self.datasets = {split: _remap(data, lookup) for split, data in interned.items()}

    def _load_or_build_vocab(self, train_sequences: Iterable[list[str]]) -> Vocab:
        train = self.path("train").resolve()
        stat = train.stat()
        key = settings_key(dataset=self.name, train=str(train), size=stat.st_size,
                           mtime=stat.st_mtime_ns, tokenizer=self.tokenizer,
                           lowercase=self.lowercase, min_freq=self.min_freq,
                           max_train_examples=self.max_train_examples,
                           **self.vocab_settings())
        vocab, _ = build_once(
            cache_dir() / f"vocab-{self.name}-{key}.json",
            lambda: Vocab.build(train_sequences, min_freq=self.min_freq, specials=(PAD, UNK)),
            Vocab.save, Vocab.load)
        return vocab

    # --- what the models read
    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    @property
    def dropped_no_gold(self) -> dict[str, int]:
        """Pairs without a gold label (SNLI's "-") dropped per split (after ``setup``)."""
        return {split: s.dropped_no_gold for split, s in self.read_stats.items()}

    @property
    def embeddings(self) -> Tensor | None:
        """(V, vectors_dim) float tensor from ``vectors``, or None without a vectors file."""
        if self.vectors is None:
            return None
        if self._embeddings is None:
            from datamodules.glove import vocab_vectors

            self._embeddings = vocab_vectors(self.vectors, self.vocab, dim=self.vectors_dim,
                                             seed=self.seed).weight
        return self._embeddings

    # --- loaders
    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        self.setup()
        ds = self.datasets[split]
        return bucketed_loader(ds, ds.bucket_keys(), self.batch_size,
                               partial(collate_pairs, ds, pad_id=self.pad_id), shuffle=shuffle,
                               seed=self.seed, num_workers=self.num_workers, trainer=self.trainer)

    def _loaders(self, splits: tuple[str, ...]) -> DataLoader | list[DataLoader]:
        loaders = [self._loader(s, shuffle=False) for s in splits]
        return loaders[0] if len(loaders) == 1 else loaders

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._loaders(self.val_splits)

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._loaders(self.test_splits)


class SNLIFormatDataModule(NLIDataModule):
    """What SNLI and MultiNLI share: files published in both of SNLI's formats (``format``
    "jsonl" or "txt", read by :func:`read_nli` with SNLI's labels and its "-"), named
    ``published[split]`` with ``{format}`` for the ending unless a ``<split>_file``
    argument names another file."""

    published: ClassVar[dict[str, str]] = {}  # split -> published file name

    def use_files(self, format: NLIFormat, given: Mapping[str, str | None]) -> None:
        """Set ``format`` and ``files``: the ``given`` names, else the published ones."""
        _format_rows(format, type(self).__name__.removesuffix("DataModule"))
        self.format = format
        self.files = {split: given.get(split) or name.format(format=format)
                      for split, name in self.published.items()}

    def read(self, path: Path, stats: ReadStats) -> Iterator[NLIExample]:
        return read_nli(path, self.format, SNLI_LABELS, self.tokenizer, self.lowercase, stats)


class SNLIDataModule(SNLIFormatDataModule):
    """SNLI 1.0 (570K pairs; train / dev / test).  ``format`` picks the published
    ``.jsonl`` or ``.txt`` files; ``train_file``, ``val_file``, ``test_file`` override their
    names (e.g. all three = the shared dev prefix for a smoke run).  Other arguments: see
    :class:`NLIDataModule`."""

    name = "snli"
    dataset = "snli"  # the datamodules.registry entry
    shared_folder = "snli"
    url = url_of("snli")
    archive_folder = "snli_1.0"
    published = {"train": "snli_1.0_train.{format}", "val": "snli_1.0_dev.{format}",
                 "test": "snli_1.0_test.{format}"}

    def __init__(self, format: NLIFormat = "jsonl", train_file: str | None = None,
                 val_file: str | None = None, test_file: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.use_files(format, {"train": train_file, "val": val_file, "test": test_file})


class MultiNLIDataModule(SNLIFormatDataModule):
    """MultiNLI 1.0 (393K training pairs).  Its test sets are unlabelled, so (as in the
    papers) it validates on dev_matched and tests on dev_matched AND dev_mismatched:
    ``test_dataloader`` returns [matched, mismatched] (``test_splits``) so a model can log
    MNLI m / mm.  ``format`` picks ``.jsonl`` or ``.txt``; the GLUE MNLI ``.tsv`` files
    are read by format "txt" too.  Other arguments: see :class:`NLIDataModule`."""

    name = "multinli"
    dataset = "multinli"
    shared_folder = "multinli_1.0"
    url = url_of("multinli")
    archive_folder = "multinli_1.0"
    val_splits = ("matched",)
    test_splits = ("matched", "mismatched")
    published = {"train": "multinli_1.0_train.{format}",
                 "matched": "multinli_1.0_dev_matched.{format}",
                 "mismatched": "multinli_1.0_dev_mismatched.{format}"}

    def __init__(self, format: NLIFormat = "jsonl", train_file: str | None = None,
                 matched_file: str | None = None, mismatched_file: str | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.use_files(format, {"train": train_file, "matched": matched_file,
                                "mismatched": mismatched_file})


class SciTailDataModule(NLIDataModule):
    """SciTail 1.1 (27K pairs, two classes: entailment=0, neutral=1).  ``format`` "tsv"
    reads ``tsv_format/scitail_1.0_*.tsv`` (spaCy tokens), "snli" reads
    ``snli_format/scitail_1.0_*.txt`` (JSON lines with binary parses), under ``data_dir``
    or its ``SciTailV1.1`` folder.  Other arguments: see :class:`NLIDataModule`."""

    name = "scitail"
    dataset = "scitail"
    shared_folder = "SciTailV1.1"
    url = url_of("scitail")
    archive_folder = "SciTailV1.1"
    label_names = SCITAIL_LABELS

    def __init__(self, format: Literal["tsv", "snli"] = "tsv", train_file: str | None = None,
                 val_file: str | None = None, test_file: str | None = None, **kwargs):
        super().__init__(**kwargs)
        if format not in ("tsv", "snli"):
            raise ValueError(f"SciTail format must be 'tsv' or 'snli', got {format!r}")
        self.format = format
        name = "tsv_format/scitail_1.0_{}.tsv" if format == "tsv" \
            else "snli_format/scitail_1.0_{}.txt"
        self.files = {"train": train_file or name.format("train"),
                      "val": val_file or name.format("dev"),
                      "test": test_file or name.format("test")}

    def read(self, path: Path, stats: ReadStats) -> Iterator[NLIExample]:
        if self.format == "tsv":
            return read_scitail_tsv(path, self.lowercase, stats)
        return read_nli(path, "jsonl", SCITAIL_SNLI_LABELS, self.tokenizer, self.lowercase,
                        stats)


class DialogueNLIDataModule(NLIDataModule):
    """Dialogue NLI (Welleck et al. 2019; 310K training pairs): labels positive / neutral /
    negative read as entailment / neutral / contradiction; spaCy tokens (no parses).  The
    release also has ``dialogue_nli_verified_test.jsonl`` (pass it as ``test_file``).
    Other arguments: see :class:`NLIDataModule`."""

    name = "dialogue_nli"
    dataset = "dialogue_nli"
    shared_folder = "dialogue_nli"
    how_to_get = ("Get dialogue_nli.zip from https://wellecks.github.io/dialogue_nli/ "
                  "(Google Drive id 1WtbXCv3vPB5ql6w0FVDmAEMmWadbrCuG, also fetched by ParlAI's "
                  "dialogue_nli task), unzip it and pass the folder holding "
                  "dialogue_nli_train.jsonl with --data.data_dir.")

    def __init__(self, train_file: str = "dialogue_nli_train.jsonl",
                 val_file: str = "dialogue_nli_dev.jsonl",
                 test_file: str = "dialogue_nli_test.jsonl", **kwargs):
        super().__init__(**kwargs)
        self.files = {"train": train_file, "val": val_file, "test": test_file}

    def read(self, path: Path, stats: ReadStats) -> Iterator[NLIExample]:
        return read_dialogue_nli(path, self.lowercase, stats)
