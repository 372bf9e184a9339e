"""Single-sequence text data: what SST, IMDb, SVA (Linzen) and One Billion Word share.

- word tokenisation: the data's own tokens, or spaCy's blank English tokenizer for raw text
  (:func:`spacy_tokenize`);
- one tokenizer interface over two vocabularies (:class:`TextTokenizer`): word level
  (:class:`datamodules.common.Vocab`, ``min_freq`` / ``max_size``) or BPE (HF ``tokenizers``,
  trained on the training words with a configured vocabulary size).  Both are built once and
  cached under :func:`datamodules.common.cache_dir`, keyed by a digest of the training words
  and the settings (:func:`build_tokenizer`).  Both put ``<pad> <unk> <s> </s>`` at ids 0-3;
- :class:`PackedSequences`: encoded examples stored flat (one int32 tensor and offsets), so a
  few shards of One Billion Word fit in memory;
- :class:`TextDataModule`: the DataModule base (data folder, download-or-explain, tokenizer,
  truncation to ``max_len`` counted per split, bucketed loaders) and
  :class:`TextClassificationDataModule` with batches ``tokens (B,L)``, ``mask (B,L)``,
  ``label (B,)``.  Dataset modules only parse their formats (``read_examples``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache, partial
from pathlib import Path
from typing import ClassVar, Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.common import (
    BOS,
    EOS,
    PAD,
    UNK,
    Vocab,
    bucketed_loader,
    cache_dir,
    check_sizes,
    data_seed,
    nonempty,
    pad,
    settings_key,
    shared_data_dir,
)
from datamodules.fetch import ensure, prepare_once
from datamodules.registry import Dataset as Release
from datamodules.registry import Download, dataset_of
from fileio import build_once, write_atomic

log = logging.getLogger(__name__)

Tokenization = Literal["word", "bpe"]
SPECIALS = (PAD, UNK, BOS, EOS)  # ids 0, 1, 2, 3 in both vocabularies
SPLITS = ("train", "val", "test")
Example = tuple[list[str], int | None]  # (words, label); label None for language modelling
BPE_SUFFIX = "</w>"  # marks the last piece of a word, so decoding restores word boundaries


# ---------------------------------------------------------------------------------------
# word tokenisation


@lru_cache(maxsize=1)
def _spacy_english():
    import spacy

    return spacy.blank("en")  # rule-based tokenizer only: nothing to download


def spacy_tokenize(texts: Iterable[str], batch_size: int = 256) -> Iterator[list[str]]:
    """Words of raw texts by spaCy's blank English tokenizer.  Whitespace tokens (spaCy keeps
    runs of spaces and newlines as tokens) are left out: they carry no word."""
    for doc in _spacy_english().tokenizer.pipe(texts, batch_size=batch_size):
        yield [t.text for t in doc if not t.is_space]


def split_tokens(text: str) -> list[str]:
    """The tokens of pre-tokenised text: separated by ASCII spaces only, so a no-break space
    inside a token (SST writes "8\\xa01/2") stays part of it; repeated spaces add nothing."""
    return [t for t in text.split(" ") if t]


def corpus_digest(sequences: Iterable[Sequence[str]]) -> tuple[str, int]:
    """A sha1 of word sequences (order and boundaries included), to key caches by content,
    and how many sequences there were."""
    h, count = hashlib.sha1(), 0
    for words in sequences:
        h.update("\x1f".join(words).encode())
        h.update(b"\x1e")
        count += 1
    return h.hexdigest(), count


class Reiterable:
    """An iterable that calls ``make()`` for every pass (re-reading files instead of holding
    a large corpus in memory)."""

    def __init__(self, make):
        self.make = make

    def __iter__(self):
        return iter(self.make())


# ---------------------------------------------------------------------------------------
# tokenizers: words -> ids


class TextTokenizer(ABC):
    """Words to ids and back.  ``<pad> <unk> <s> </s>`` are ids 0-3 in every vocabulary."""

    kind: ClassVar[str]
    cache_path: Path | None = None
    from_cache: bool = False  # True when loaded from the cache rather than built

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    @abstractmethod
    def id_to_token(self, i: int) -> str | None:
        """The token (a word, or a BPE piece) of id ``i``; None outside the vocabulary."""

    @abstractmethod
    def encode_batch(self, sequences: Sequence[Sequence[str]]) -> list[list[int]]: ...

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words of ids, specials left out, stopping at the first ``</s>``."""

    def encode(self, words: Sequence[str]) -> list[int]:
        return self.encode_batch([words])[0]

    def _special(self, token: str) -> int:
        i = self.token_to_id(token)
        if i is None:
            raise KeyError(f"{type(self).__name__} has no special token {token!r}")
        return i

    @property
    def pad_id(self) -> int:
        return self._special(PAD)

    @property
    def unk_id(self) -> int:
        return self._special(UNK)

    @property
    def bos_id(self) -> int:
        return self._special(BOS)

    @property
    def eos_id(self) -> int:
        return self._special(EOS)


class WordTokenizer(TextTokenizer):
    """Word level: one id per word of a :class:`Vocab`; out-of-vocabulary words map to <unk>."""

    kind = "word"

    def __init__(self, vocab: Vocab):
        self.vocab = vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.stoi.get(token)

    def id_to_token(self, i: int) -> str | None:
        return self.vocab.itos[i] if 0 <= i < len(self.vocab.itos) else None

    def encode_batch(self, sequences: Sequence[Sequence[str]]) -> list[list[int]]:
        return [self.vocab.encode(words) for words in sequences]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return self.vocab.decode(ids)

    def save(self, path: Path) -> None:
        self.vocab.save(path)

    @classmethod
    def load(cls, path: Path) -> WordTokenizer:
        return cls(Vocab.load(path))

    @classmethod
    def train(cls, sequences: Iterable[Sequence[str]], min_freq: int = 1,
              max_size: int | None = None) -> WordTokenizer:
        return cls(Vocab.build(sequences, min_freq=min_freq, max_size=max_size,
                               specials=SPECIALS))


class BPETokenizer(TextTokenizer):
    """Byte-pair encoding (HF ``tokenizers``) of words: merges learnt inside words only
    (words never merge across a space), the last piece of a word marked by ``</w>``."""

    kind = "bpe"
    max_cached_words = 1 << 20

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._word_ids: dict[str, list[int]] = {}  # pieces of each word seen so far

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.tokenizer.id_to_token(i)

    def encode_batch(self, sequences: Sequence[Sequence[str]]) -> list[list[int]]:
        # merges never cross a word boundary, so each distinct word is segmented once and
        # remembered (several times faster than encoding every sentence in ``tokenizers``)
        if len(self._word_ids) > self.max_cached_words:
            self._word_ids.clear()
        pieces = self._word_ids
        new = list(dict.fromkeys(w for words in sequences for w in words if w not in pieces))
        if new:
            encodings = self.tokenizer.encode_batch([[w] for w in new], is_pretokenized=True,
                                                    add_special_tokens=False)
            pieces.update(zip(new, (e.ids for e in encodings), strict=True))
        return [[i for w in words for i in pieces[w]] for words in sequences]

    def decode(self, ids: Iterable[int]) -> list[str]:
        ids = list(itertools.takewhile(lambda i: i != self.eos_id, (int(i) for i in ids)))
        return split_tokens(self.tokenizer.decode(ids, skip_special_tokens=True))

    def save(self, path: Path) -> None:
        write_atomic(path, lambda tmp: self.tokenizer.save(str(tmp)))

    @classmethod
    def load(cls, path: Path) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    @classmethod
    def train(cls, sequences: Iterable[Sequence[str]], vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE(unk_token=UNK, end_of_word_suffix=BPE_SUFFIX))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
        tokenizer.decoder = decoders.BPEDecoder(suffix=BPE_SUFFIX)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                      end_of_word_suffix=BPE_SUFFIX, show_progress=False)
        tokenizer.train_from_iterator((" ".join(words) for words in sequences), trainer)
        return cls(canonical_ids(tokenizer))


def canonical_ids(tokenizer):
    """``tokenizer`` (a trained HF BPE) with its vocabulary numbered in an order that does
    not depend on the process: the specials, then the single symbols sorted, then each
    merge's result in the order of the merges.  HF's trainer numbers the symbols that end a
    word (``e</w>``) in the order of a hash map with a per-process seed, so two trainings on
    the same words numbered them differently (measured: IMDb's 8K vocabulary, 321 symbols,
    hardly any at the same id), and every embedding row, initialised by id, with them: the
    same seed did not give the same model in another process.  Segmentation is unchanged
    (the merges and their order are kept; merges of equal counts may still come in another
    order, 2 of 7,867 in that measurement, which changes the pieces of words that both can
    split, rarely)."""
    from tokenizers import Tokenizer

    data = json.loads(tokenizer.to_str())
    model = data["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    results = list(dict.fromkeys(a + b for a, b in merges))
    made = set(results)
    symbols = sorted(t for t in model["vocab"] if t not in made and t not in SPECIALS)
    order = [*SPECIALS, *symbols, *results]
    if sorted(order) != sorted(model["vocab"]):
        raise ValueError("BPE vocabulary: the specials, symbols and merge results do not "
                         "make up the trained vocabulary")
    model["vocab"] = {token: i for i, token in enumerate(order)}
    return Tokenizer.from_str(json.dumps(data))


def build_tokenizer(kind: Tokenization, train_sequences: Iterable[Sequence[str]], *,
                    bpe_vocab_size: int = 8192, min_freq: int = 1, max_size: int | None = None,
                    name: str = "text") -> TextTokenizer:
    """The tokenizer of ``kind`` for these training words, loaded from the cache when it was
    built before for the same words and settings, else built and saved there.

    kind "word": a :class:`Vocab` of words seen ``min_freq`` times or more, the ``max_size``
    most frequent (None: all).  kind "bpe": ``bpe_vocab_size`` ids (specials, characters and
    merges).  The cache file is ``cache_dir()/<name>-<kind>-<key>.json`` where the key is
    :func:`datamodules.common.settings_key` of the words' digest and the settings.
    ``train_sequences`` is read twice when the tokenizer is built (digest, then training):
    a list, or a :class:`Reiterable` that re-reads its files.
    """
    if kind not in ("word", "bpe"):
        raise ValueError(f"tokenization must be 'word' or 'bpe', got {kind!r}")
    digest, count = corpus_digest(train_sequences)
    if count == 0:
        raise ValueError(f"{name}: no training sequences to build a {kind} tokenizer from")
    settings = {"words": digest, "kind": kind, "version": 2}  # 2: canonical BPE ids
    if kind == "word":
        settings.update(min_freq=min_freq, max_size=max_size)
    else:
        if bpe_vocab_size <= len(SPECIALS):
            raise ValueError(f"bpe_vocab_size must exceed {len(SPECIALS)}, got {bpe_vocab_size}")
        settings.update(bpe_vocab_size=bpe_vocab_size)
    path = cache_dir() / f"{name}-{kind}-{settings_key(**settings)}.json"
    cls = WordTokenizer if kind == "word" else BPETokenizer

    def train() -> TextTokenizer:
        if kind == "word":
            return WordTokenizer.train(train_sequences, min_freq, max_size)
        return BPETokenizer.train(train_sequences, bpe_vocab_size)

    tokenizer, built = build_once(path, train, cls.save, cls.load)
    from_cache = not built
    for i, special in enumerate(SPECIALS):
        if tokenizer.token_to_id(special) != i:
            raise ValueError(f"{path}: expected {special!r} at id {i}")
    tokenizer.cache_path, tokenizer.from_cache = path, from_cache
    return tokenizer


# ---------------------------------------------------------------------------------------
# encoded examples


class PackedSequences(Dataset):
    """Variable-length id sequences stored flat: ``ids`` (N_tokens,) int32 and ``offsets``
    (N+1,); item i is ``(ids[offsets[i]:offsets[i+1]], labels[i] or None)``."""

    def __init__(self, sequences: Iterable[Sequence[int]], labels: Sequence[int] | None = None):
        flat, lengths = array("i"), array("q")
        for seq in sequences:
            flat.extend(seq)
            lengths.append(len(seq))
        self.ids = torch.frombuffer(flat, dtype=torch.int32) if flat else torch.zeros(0).int()
        self.offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
        if lengths:
            self.offsets[1:] = torch.frombuffer(lengths, dtype=torch.long).cumsum(0)
        self.labels = None if labels is None else torch.as_tensor(labels, dtype=torch.long)
        if self.labels is not None and len(self.labels) != len(lengths):
            raise ValueError(f"{len(lengths)} sequences but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> tuple[Tensor, int | None, int]:
        """(ids, label or None, i): the position travels with the example, so a batch says
        which examples it holds (``index``: per-example test predictions)."""
        ids = self.ids[self.offsets[i]:self.offsets[i + 1]]
        return ids, (None if self.labels is None else int(self.labels[i])), i

    @property
    def lengths(self) -> list[int]:
        return self.offsets.diff().tolist()


class PackedPairs(Dataset):
    """Pairs of id sequences (premise and hypothesis, source and target) stored as one
    :class:`PackedSequences`: pair i is sequences 2i and 2i+1.  Item i is i: the collate
    function gathers, as the bucketing batch sampler hands out lists of indices."""

    def __init__(self, sequences: PackedSequences):
        if len(sequences) % 2:
            raise ValueError(f"{len(sequences)} sequences do not make pairs")
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences) // 2

    def __getitem__(self, i: int) -> int:
        return i

    def first(self, i: int) -> Tensor:
        return self.sequences[2 * i][0]

    def second(self, i: int) -> Tensor:
        return self.sequences[2 * i + 1][0]

    def pair_lengths(self) -> Tensor:
        """(N, 2) the lengths of the first and second sequence of every pair."""
        return self.sequences.offsets.diff().view(-1, 2)


def collate_classification(batch: Sequence[tuple[Tensor, int, int]],
                           pad_id: int) -> dict[str, Tensor]:
    """``tokens`` (B,L) long, ``mask`` (B,L) bool (True = real token), ``label`` (B,) long,
    ``index`` (B,) each example's position in its split."""
    tokens, mask = pad([ids for ids, _, _ in batch], pad_id)
    return {"tokens": tokens, "mask": mask,
            "label": torch.tensor([label for _, label, _ in batch], dtype=torch.long),
            "index": torch.tensor([i for _, _, i in batch], dtype=torch.long)}


# ---------------------------------------------------------------------------------------
# DataModules


class TextDataModule(L.LightningDataModule):
    """Base of the single-sequence DataModules.

    Subclasses set ``name`` (cache file prefix), ``shared_subdir`` (the folder under the
    shared data), ``archive_url`` / ``archive_subdir`` (the official archive and the data
    folder inside it) and implement :meth:`read_examples` (the split's words and labels, in
    file order, raising DataFormatError for malformed input) and :meth:`split_files`.

    ``data_dir`` None: ``shared_data_dir()/shared_subdir``, the dataset's folder of the data
    root (``$ATTNREPRO_DATA``, default ../shared/data).  ``prepare_data`` downloads the archive
    into ``data_dir`` when configured files are missing (datamodules.fetch; ``download`` False:
    never), or says where to put it when there is no network.  The tokenizer is built from
    the training split (after ``lowercase`` and ``max_train_examples``) on first use of
    ``vocab_size`` / ``pad_id`` / ``tokenizer`` or in ``setup``.  Sequences longer than
    ``max_len`` ids are cut to ``max_len``; how many per split is in ``stats["truncated"]``.
    """

    name: ClassVar[str] = "text"
    shared_subdir: str = ""
    archive_url: str | None = None
    archive_subdir: str = ""
    append_eos: ClassVar[bool] = False  # language modelling: targets end with </s>
    download: bool = True  # prepare_data may download missing files (set False to forbid)

    def __init__(self, data_dir: str | None = None, tokenization: Tokenization = "word",
                 bpe_vocab_size: int = 8192, min_freq: int = 1,
                 max_vocab_size: int | None = None, lowercase: bool = False,
                 batch_size: int = 32, max_len: int | None = 512,
                 max_train_examples: int | None = None, num_workers: int = 0,
                 seed: int | None = None):
        super().__init__()
        if tokenization not in ("word", "bpe"):
            raise ValueError(f"tokenization must be 'word' or 'bpe', got {tokenization!r}")
        owner = type(self).__name__
        check_sizes(owner, min_freq=min_freq, max_vocab_size=max_vocab_size,
                    batch_size=batch_size, max_len=max_len,
                    max_train_examples=max_train_examples)
        check_sizes(owner, least=len(SPECIALS) + 1, bpe_vocab_size=bpe_vocab_size)
        check_sizes(owner, least=0, num_workers=num_workers)
        # absolute: messages name the file wherever the run started
        self.data_dir = (Path(data_dir) if data_dir is not None
                         else self.default_data_dir()).absolute()
        self.tokenization, self.bpe_vocab_size = tokenization, bpe_vocab_size
        self.min_freq, self.max_vocab_size, self.lowercase = min_freq, max_vocab_size, lowercase
        self.batch_size, self.max_len = batch_size, max_len
        self.max_train_examples, self.num_workers = max_train_examples, num_workers
        self.seed = data_seed(seed)  # None: the run's seed
        self.datasets: dict[str, PackedSequences] = {}
        self.stats: dict[str, dict[str, int]] = {"examples": {}, "truncated": {}}
        self._tokenizer: TextTokenizer | None = None
        self._sources: dict[str, Iterable[Example]] = {}

    # ---- where the files are

    def default_data_dir(self) -> Path:
        """The dataset's folder of the data root (``shared_subdir``, where ``python -m
        datamodules.fetch`` puts it), whether it is there yet or not: a download goes there,
        never into the project."""
        return shared_data_dir() / (self.shared_subdir or self.name)

    @abstractmethod
    def split_files(self, split: str) -> list[Path]:
        """The files (or folders) a split reads; [] when the split is not configured."""

    def _missing(self, splits: Iterable[str]) -> list[Path]:
        return [p for s in splits for p in self.split_files(s) if not p.exists()]

    def _require(self, split: str) -> None:
        if not self.split_files(split):
            raise ValueError(f"{type(self).__name__}: no {split} split is configured")
        missing = self._missing([split])
        if missing:
            folder = self.data_dir
            present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            names = ", ".join(map(str, missing[:3])) + (
                f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            how = ""
            if self.archive_url:
                how = f" The official release is {self.archive_url}" + (
                    " (prepare_data() downloads and unpacks it there)."
                    if folder == self.default_data_dir().absolute() else ".")
            raise FileNotFoundError(
                f"{type(self).__name__} {split} data not found: {names} (present in {folder}: "
                f"{present or 'nothing'}).{how}")

    @prepare_once
    def prepare_data(self) -> None:
        """Download the official archive when configured files are missing and unpack its
        data folder (``archive_subdir``) into ``data_dir``, the archive kept there
        (datamodules.fetch: locked, resumed, checked; without network one error names the URL
        and the path to put the archive at).  Files the release does not have (other names)
        are left to ``setup``, which names them; a test split that cannot be downloaded is a
        warning only (``setup`` reads it when it is there)."""
        wanted = [p for s in SPLITS for p in self.split_files(s)]
        if not self._missing(SPLITS):
            return
        test = self.split_files("test")
        entry = dataset_of(self)
        if entry is None and self.archive_url is None:
            return
        if entry is None:  # a subclass with its own archive: an entry made on the spot
            provides = tuple(p.relative_to(self.data_dir).as_posix() for p in wanted
                             if p.is_relative_to(self.data_dir))
            entry = Release(self.name, self.name, self.shared_subdir or self.name, (Download(
                self.archive_url, archive=True, strip=self.archive_subdir, provides=provides),))
        ensure(entry, self.data_dir, [p for p in wanted if p not in test], optional=test,
               url=self.archive_url, download=self.download, strict=False)

    # ---- examples and tokenizer

    @abstractmethod
    def read_examples(self, split: str, limit: int | None = None) -> Iterable[Example]:
        """The split's (words, label) in file order (``limit``: the reader may stop after that
        many).  A list, or a :class:`Reiterable` for corpora too large to hold as words."""

    def examples(self, split: str) -> Iterable[Example]:
        """The split's examples after ``max_train_examples`` and ``lowercase`` (read once
        and kept when the reader returns a list)."""
        if split not in self._sources:
            self._require(split)
            limit = self.max_train_examples if split == "train" else None
            source = self.read_examples(split, limit)
            if isinstance(source, list):
                self._sources[split] = list(self._clean(split, source, limit))
            else:
                self._sources[split] = Reiterable(partial(self._clean, split, source, limit))
        return self._sources[split]

    def _clean(self, split: str, source: Iterable[Example], limit: int | None) -> Iterator[Example]:
        """The examples, lowercased on request; none at all (every one dropped, e.g. SST's
        neutral sentences by ``binary``) is a DataFormatError naming the split's files, not
        a model trained or evaluated on nothing."""
        files = ", ".join(map(str, self.split_files(split)))
        examples = itertools.islice(source, limit)
        for i, (words, label) in enumerate(nonempty(examples, files, f"at least one {split} "
                                                    "example")):
            if not words:
                raise ValueError(f"{type(self).__name__} {split} example {i} has no words "
                                 "(the reader should have named its file and line)")
            yield ([w.lower() for w in words] if self.lowercase else words), label

    @property
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer(
                self.tokenization, Reiterable(lambda: (w for w, _ in self.examples("train"))),
                bpe_vocab_size=self.bpe_vocab_size, min_freq=self.min_freq,
                max_size=self.max_vocab_size, name=self.name)
            log.info("%s: %s tokenizer, %d ids (%s %s)", self.name, self.tokenization,
                     self._tokenizer.vocab_size,
                     "loaded from" if self._tokenizer.from_cache else "saved to",
                     self._tokenizer.cache_path)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    def encode(self, split: str, examples: Iterable[Example]) -> PackedSequences:
        """Ids of every example (with ``</s>`` when ``append_eos``), cut to ``max_len``."""
        tokenizer, labels, counts = self.tokenizer, [], {"examples": 0, "truncated": 0}

        def sequences() -> Iterator[list[int]]:
            source = iter(examples)
            while chunk := list(itertools.islice(source, 4096)):
                labels.extend(label for _, label in chunk)
                for ids in tokenizer.encode_batch([words for words, _ in chunk]):
                    if self.append_eos:
                        ids.append(tokenizer.eos_id)
                    if self.max_len is not None and len(ids) > self.max_len:
                        ids, counts["truncated"] = ids[: self.max_len], counts["truncated"] + 1
                    counts["examples"] += 1
                    yield ids

        packed = PackedSequences(sequences())
        if any(label is not None for label in labels):
            packed.labels = torch.tensor(labels, dtype=torch.long)
        for key, n in counts.items():
            self.stats[key][split] = n
        if counts["truncated"]:
            log.info("%s %s: %d of %d examples cut to max_len=%d", self.name, split,
                     counts["truncated"], counts["examples"], self.max_len)
        return packed

    # ---- Lightning hooks

    def setup(self, stage: str | None = None) -> None:
        """fit: train and val (when configured); validate: val; test and predict: test;
        None: train, val when configured and test when configured and present."""
        splits = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"],
                  "predict": ["test"]}.get(stage or "", None)
        if splits is None:
            splits = ["train", "val"]
            if self.split_files("test") and not self._missing(["test"]):
                splits.append("test")
        if stage in ("fit", None) and not self.split_files("val"):
            splits.remove("val")
        for split in splits:
            if split not in self.datasets:
                self.datasets[split] = self.encode(split, self.examples(split))
                self._sources.pop(split, None)  # the words are not needed any more

    def collate_fn(self):
        return partial(collate_classification, pad_id=self.pad_id)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        data = self.datasets[split]
        return bucketed_loader(data, data.lengths, self.batch_size, self.collate_fn(),
                               shuffle=shuffle, seed=self.seed, num_workers=self.num_workers,
                               trainer=getattr(self, "trainer", None))

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        if not self.split_files("val"):
            return []  # no validation split configured: Lightning skips validation
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


class TextClassificationDataModule(TextDataModule):
    """One sequence, one label: batches ``tokens`` (B,L), ``mask`` (B,L), ``label`` (B,)."""

    labels: tuple[str, ...] = ()  # class names, index = label id

    @property
    def num_classes(self) -> int:
        return len(self.labels)
