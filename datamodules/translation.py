"""Machine translation and text-to-code data for :class:`lit_models.transformer.TransformerSeq2Seq`:
IWSLT'15 En-Vi (CoDA Table 4), WMT'14 En-De / En-Fr (Differentiable Window Table 1), WMT'16
En-Ro (quantum-statistics attention, Table 1; its IWSLT'15 En-Vi is the module above) and
AlgoLisp program search (CoDA).  The two WMT modules share :class:`WMTDataModule`.

One base class, :class:`TranslationDataModule`, does everything but reading the formats and
building the vocabularies: encoding, length filtering of training pairs, bucketed loaders,
the batch format and what evaluation needs.  Batches (as :mod:`datamodules.mlu`):

- ``src`` (B,Ls) long, ``src_mask`` (B,Ls) bool, True at real tokens;
- ``tgt_in`` (B,Lt) = ``<s>`` + target, ``tgt_out`` (B,Lt) = target + ``</s>``,
  ``tgt_mask`` (B,Lt) bool (the mask of ``tgt_out``);
- ``index`` (B,) long: each example's position in its split (0-based, in the order of the
  split's files), so decoded hypotheses can be put back in file order (batches are bucketed
  by length, not in file order).

Both vocabularies put ``<pad> <unk> <s> </s>`` at ids 0-3 (:data:`datamodules.text.SPECIALS`).

For evaluation every module has ``sources(stage)``, ``references(stage)`` (the references
as the paper's BLEU reads them: pre-tokenized), ``raw_references(stage)`` (detokenized, for
sacreBLEU's own 13a BLEU), ``decode(ids)`` (target ids -> a hypothesis in the form of
``references``), ``detokenize(text)`` (that form -> raw text) and the class attribute
``bleu``: "tokenized", "tokenized+compound_split" (see :mod:`lit_models.bleu`) or None (exact
match only).

Training pairs with an empty side, or longer than ``max_len`` ids on either side, or (with
``max_ratio``) whose length ratio exceeds it, are dropped (or, with ``truncate_long``, long
sides are cut to ``max_len``); the counts per reason are in ``stats`` and logged at WARNING.
Nothing else is ever dropped: malformed input is a :class:`datamodules.common.DataFormatError`
naming the file, the line and what was expected.  Validation and test keep every example.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from abc import abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from datamodules.common import (
    BOS,
    EOS,
    UNK,
    DataFormatError,
    Vocab,
    bucketed_loader,
    cache_dir,
    check_sizes,
    data_seed,
    json_records,
    open_data,
    read_lines,
    record_data_seed,
    require_file,
    seq2seq_batch,
    settings_key,
    shared_data_dir,
)
from datamodules.fetch import ensure, prepare_once
from datamodules.registry import dataset_of
from datamodules.text import (
    SPECIALS,
    PackedPairs,
    PackedSequences,
    Reiterable,
    TextTokenizer,
    WordTokenizer,
    build_tokenizer,
    split_tokens,
)
from fileio import write_once

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
TokenPair = tuple[list[str], list[str]]  # (source tokens, target tokens)


# ---------------------------------------------------------------------------------------
# plain parallel text


def count_lines(path: str | os.PathLike) -> int:
    """Lines of a file as :func:`datamodules.common.read_lines` yields them (a last line
    without a newline counts)."""
    count, last = 0, b"\n"
    with open_data(path) as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def check_same_length(src_path: Path, n_src: int, tgt_path: Path, n_tgt: int,
                      unit: str = "lines") -> None:
    """A DataFormatError naming both files and both counts when they differ, or the source
    when both are empty (a split of no pairs)."""
    if n_src != n_tgt:
        raise DataFormatError(src_path, None, f"as many {unit} as {tgt_path} ({n_tgt} {unit}: "
                              "source and target are aligned by position)", f"{n_src} {unit}")
    if not n_src:
        raise DataFormatError(src_path, None, f"at least one of the {unit} of a parallel "
                              f"corpus (it and {tgt_path} are empty)")


def check_parallel(src_path: Path, tgt_path: Path) -> None:
    """Two line-aligned files: as many lines in each, and at least one."""
    check_same_length(src_path, count_lines(src_path), tgt_path, count_lines(tgt_path))


def read_parallel_lines(src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                        limit: int | None = None) -> Iterator[tuple[int, str, str]]:
    """(1-based line number, source line, target line) of two line-aligned files, the first
    ``limit`` lines (None: all).  The files must have the same number of lines (checked on
    the whole files first, even with a limit; and not be empty)."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    check_parallel(src_path, tgt_path)
    pairs = zip(read_lines(src_path), read_lines(tgt_path))
    for (number, src), (_, tgt) in itertools.islice(pairs, limit):
        yield number, src, tgt


# ---------------------------------------------------------------------------------------
# WMT SGML

_SEG = re.compile(r"^\s*<seg\b([^>]*)>(.*)</seg>\s*$", re.IGNORECASE)
_SEG_OPEN = re.compile(r"<seg\b", re.IGNORECASE)
_DOC = re.compile(r"^\s*<doc\b([^>]*)>", re.IGNORECASE)
_ATTR = re.compile(r"""(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)'|(\S+))""")
#: the entities mteval-v13a.pl (WMT's scorer, NormalizeText) unescapes, in its order
MTEVAL_ENTITIES = (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"))


@dataclass(frozen=True)
class Segment:
    """One ``<seg>`` of a WMT SGML file: its document id, segment id, text and line."""

    doc: str
    id: str
    text: str
    line: int


def _attributes(text: str) -> dict[str, str]:
    return {m.group(1).lower(): next(g for g in m.groups()[1:] if g is not None)
            for m in _ATTR.finditer(text)}


def unescape_sgml(text: str) -> str:
    """``&quot; &amp; &lt; &gt;`` -> ``" & < >``, one after the other as mteval-v13a.pl
    does (the WMT'14 test files write a bare ``&`` and no entities at all)."""
    for entity, char in MTEVAL_ENTITIES:
        text = text.replace(entity, char)
    return text


def read_sgml_segments(path: str | os.PathLike) -> list[Segment]:
    """The ``<seg>`` elements of a WMT SGML file (the pre-2021 "fake SGML": one segment per
    line, not well-formed XML), in file order.

    The text is what sacreBLEU and Moses' input-from-sgm.perl take from ``<seg ...>text</seg>``
    (white space stripped at both ends and runs of it collapsed to one space), with the
    entities mteval-v13a.pl unescapes (:func:`unescape_sgml`).  A line holding ``<seg`` that
    is not one whole ``<seg ...>text</seg>`` is a DataFormatError naming file and line, and
    so is a file without segments.
    """
    segments, doc = [], ""
    for number, line in read_lines(path):
        if m := _DOC.match(line):
            doc = _attributes(m.group(1)).get("docid", "")
            continue
        if not _SEG_OPEN.search(line):
            continue
        m = _SEG.match(line)
        if m is None or _SEG_OPEN.search(m.group(2)):
            raise DataFormatError(path, number, 'one whole <seg id="N">text</seg> per line', line)
        text = unescape_sgml(re.sub(r"\s+", " ", m.group(2)).strip())
        segments.append(Segment(doc, _attributes(m.group(1)).get("id", ""), text, number))
    if not segments:
        raise DataFormatError(path, None, "at least one <seg> line (a WMT SGML file)")
    return segments


def read_sgml(path: str | os.PathLike) -> list[str]:
    """The segment texts of a WMT SGML file, in order (see :func:`read_sgml_segments`)."""
    return [s.text for s in read_sgml_segments(path)]


def read_text_pairs(src_path: Path, tgt_path: Path) -> list[tuple[str, str]]:
    """Aligned (source, target) texts of an evaluation set: both ``.sgm`` (their segments,
    which must pair document and segment ids one to one) or both plain text (lines)."""
    sgml = [p.suffix.lower() == ".sgm" for p in (src_path, tgt_path)]
    if sgml[0] != sgml[1]:
        raise DataFormatError(src_path, None, f"the format of {tgt_path}: both SGML (.sgm) "
                              "or both plain text")
    if not sgml[0]:
        return [(s, t) for _, s, t in read_parallel_lines(src_path, tgt_path)]
    src, tgt = read_sgml_segments(src_path), read_sgml_segments(tgt_path)
    check_same_length(src_path, len(src), tgt_path, len(tgt), unit="segments")
    for s, t in zip(src, tgt):
        if (s.doc, s.id) != (t.doc, t.id):
            raise DataFormatError(tgt_path, t.line, f"the segment of {src_path}:{s.line} "
                                  f"(docid {s.doc!r}, seg id {s.id!r})",
                                  f"docid {t.doc!r}, seg id {t.id!r}")
    return [(s.text, t.text) for s, t in zip(src, tgt)]


# ---------------------------------------------------------------------------------------
# Moses tokenization (sacremoses), as fairseq's examples/translation/prepare-wmt14en2de.sh


@lru_cache(maxsize=8)
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@lru_cache(maxsize=8)
def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


@lru_cache(maxsize=8)
def _moses_normalizer(lang: str):
    from sacremoses import MosesPunctNormalizer

    return MosesPunctNormalizer(lang=lang, perl_parity=True)


def moses_tokenize(text: str, lang: str) -> list[str]:
    """``tokenizer.perl -a -l lang``: Moses tokenization with aggressive hyphen splitting
    (``rich-text`` -> ``rich @-@ text``) and the script's escaping (``&`` -> ``&amp;``,
    ``'`` -> ``&apos;``, ``"`` -> ``&quot;``, ``<``/``>`` -> ``&lt;``/``&gt;``,
    ``[``/``]`` -> ``&#91;``/``&#93;``, ``|`` -> ``&#124;``)."""
    return split_tokens(_moses_tokenizer(lang).tokenize(
        text, aggressive_dash_splits=True, escape=True, return_str=True))


def moses_tokenize_test(text: str, lang: str) -> list[str]:
    """fairseq's test-set line: ``sed "s/’/'/g" | tokenizer.perl -a -l lang``."""
    return moses_tokenize(text.replace("\u2019", "'"), lang)


@lru_cache(maxsize=1)
def _non_printing():
    import regex  # a dependency of sacremoses; ``re`` has no \p{...} classes

    return regex.compile(r"\p{C}")


def moses_tokenize_train(text: str, lang: str) -> list[str]:
    """fairseq's training line: ``normalize-punctuation.perl lang |
    remove-non-printing-char.perl | tokenizer.perl -a -l lang`` (the second replaces every
    Unicode "other" character, ``\\p{C}``, by a space)."""
    return moses_tokenize(_non_printing().sub(" ", _moses_normalizer(lang).normalize(text)), lang)


def moses_detokenize(text: str, lang: str) -> str:
    """sacremoses' MosesDetokenizer for ``lang`` (which also unescapes Moses' entities)."""
    return _moses_detokenizer(lang).detokenize(split_tokens(text))


# ---------------------------------------------------------------------------------------
# encoded pairs and batches


@dataclass
class SplitText:
    """One split as text, in file order: the tokens the vocabularies encode and, for
    evaluation splits, the texts per example."""

    pairs: Iterable[TokenPair]  # a list, or a Reiterable that re-reads the files
    sources: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    raw_references: list[str] = field(default_factory=list)


class ParallelDataset(PackedPairs):
    """The encoded pairs of a split: source i and target i (without ``<s>``/``</s>``) are
    sequences 2i and 2i+1 of one :class:`~datamodules.text.PackedSequences`; ``index[i]``
    is the pair's position in its split."""

    def __init__(self, triples: Iterable[tuple[int, Sequence[int], Sequence[int]]]):
        index: list[int] = []

        def sequences():
            for i, src, tgt in triples:
                index.append(i)
                yield src
                yield tgt

        super().__init__(PackedSequences(sequences()))
        self.index = torch.tensor(index, dtype=torch.long)

    src = PackedPairs.first
    tgt = PackedPairs.second

    def lengths(self) -> list[int]:
        """Source plus target length of every pair (the bucketing key)."""
        return self.pair_lengths().sum(1).tolist()


def collate_translation(dataset: ParallelDataset, indices: list[int], pad_id: int,
                        bos_id: int, eos_id: int) -> dict[str, Tensor]:
    """The batch of TransformerSeq2Seq (see the module docstring)."""
    bos, eos = torch.tensor([bos_id]), torch.tensor([eos_id])
    return seq2seq_batch([dataset.src(i) for i in indices],
                         [torch.cat([bos, dataset.tgt(i).long(), eos]) for i in indices],
                         pad_id, dataset.index[indices])


# ---------------------------------------------------------------------------------------
# the base DataModule


class TranslationDataModule(L.LightningDataModule):
    """What the seq2seq text DataModules share (see the module docstring).

    Subclasses set ``name`` (cache and log prefix), ``bleu``, ``directions`` (the allowed
    (source, target) pairs) and ``shared_folder``, and implement :meth:`split_files` (the
    files a split reads, with what each is), :meth:`read_split` (tokens and texts in file
    order) and :meth:`build_tokenizers`.  The tokenizers are built on first use of
    ``src_vocab_size`` / ``tgt_vocab_size`` / ``pad_id`` / ``bos_id`` / ``eos_id`` (so
    LightningCLI can link them to the model) or in ``setup``.

    Args:
        data_dir: the folder of the files (file names may also be absolute paths); None: the
            dataset's folder of the shared data (``shared_data_dir() / shared_folder``).
        source, target: the direction, one of ``directions``.
        batch_size: pairs per training batch; ``eval_batch_size`` (None: the same) for
            validation and test.
        max_len: training pairs with more than ``max_len`` ids on either side (without
            ``<s>``/``</s>``) are dropped (0 or None: no limit); ``truncate_long``: cut the
            long side to ``max_len`` instead.  Pairs with an empty side are always dropped
            from training.
        max_ratio: drop training pairs whose longer side has more than ``max_ratio`` times
            the ids of the shorter (None: no such filter).
        train_size: read only the first N training pairs (before filtering; small runs).
        num_workers: DataLoader worker processes.  seed: shuffling seed (None: the run's
            seed, datamodules.common.data_seed).

    With several processes (DDP) set the trainer's ``use_distributed_sampler=False``: the
    bucketing batch sampler takes each rank's share itself.
    """

    name: ClassVar[str] = "translation"
    bleu: ClassVar[str | None] = "tokenized"
    directions: ClassVar[tuple[tuple[str, str], ...]] = ()
    shared_folder: ClassVar[str] = ""
    download: bool = True  # prepare_data may download missing release files (False: never)

    def __init__(self, data_dir: str | None = None, source: str = "", target: str = "",
                 batch_size: int = 64, eval_batch_size: int | None = None,
                 max_len: int | None = None, max_ratio: float | None = None,
                 truncate_long: bool = False, train_size: int | None = None,
                 num_workers: int = 0, seed: int | None = None):
        super().__init__()
        seed = data_seed(seed)  # None: the run's seed
        self.save_hyperparameters()  # with the subclass's arguments, for the loggers
        record_data_seed(self, seed)
        if (source, target) not in self.directions:
            raise ValueError(f"{type(self).__name__}: source={source!r}, target={target!r} is "
                             f"not one of the directions {self.directions}")
        owner = type(self).__name__
        check_sizes(owner, batch_size=batch_size, eval_batch_size=eval_batch_size,
                    train_size=train_size)
        check_sizes(owner, least=0, hint=" (0 or None: no limit)", max_len=max_len)
        check_sizes(owner, least=0, num_workers=num_workers)
        if max_ratio is not None and max_ratio < 1:
            raise ValueError(f"max_ratio must be at least 1 or None, got {max_ratio}")
        if truncate_long and not max_len:
            raise ValueError("truncate_long needs a max_len")
        if data_dir is None:
            data_dir = str(shared_data_dir() / self.shared_folder)
        self.data_dir = Path(data_dir)
        self.source, self.target = source, target
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.max_len, self.max_ratio, self.truncate_long = max_len or None, max_ratio, truncate_long
        self.train_size, self.num_workers, self.seed = train_size, num_workers, seed
        self.datasets: dict[str, ParallelDataset] = {}
        #: per split: "examples" kept, and for train the pairs "empty", "too_long",
        #: "ratio" (dropped) and "truncated"
        self.stats: dict[str, dict[str, int]] = {}
        self._tokenizers: tuple[TextTokenizer, TextTokenizer] | None = None
        self._texts: dict[str, SplitText] = {}

    # ---- what subclasses provide

    @abstractmethod
    def split_files(self, split: str) -> list[tuple[Path, str]]:
        """(path, what it is and where it comes from) of every file ``split`` reads."""

    @abstractmethod
    def read_split(self, split: str, limit: int | None) -> SplitText:
        """The split's tokens (and texts, for val/test) in file order; ``limit``: only the
        first pairs (train)."""

    @abstractmethod
    def build_tokenizers(self) -> tuple[TextTokenizer, TextTokenizer]:
        """(source, target) tokenizers, ``<pad> <unk> <s> </s>`` at ids 0-3 in both."""

    # ---- files and text

    def path(self, name: str) -> Path:
        """A configured file name under ``data_dir`` (absolute names stay as they are)."""
        return self.data_dir / name

    def _require(self, split: str) -> None:
        for path, what in self.split_files(split):
            require_file(path, f"{type(self).__name__} {what}")

    def _present(self, split: str) -> bool:
        return all(path.exists() for path, _ in self.split_files(split))

    def split_text(self, split: str) -> SplitText:
        """The split as text (evaluation splits are read once and kept)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split in self._texts:
            return self._texts[split]
        self._require(split)
        text = self.read_split(split, self.train_size if split == "train" else None)
        if split != "train":
            text.pairs = list(text.pairs)
            counts = {len(text.pairs), len(text.sources), len(text.references),
                      len(text.raw_references)}
            if len(counts) != 1:
                raise RuntimeError(f"{type(self).__name__}.read_split({split!r}) gave "
                                   "different numbers of pairs and texts")
        if isinstance(text.pairs, list):  # (a Reiterable re-reads its files instead)
            self._texts[split] = text
        return text

    def _eval_split(self, stage: str) -> SplitText:
        if stage not in ("val", "test"):
            raise ValueError(f"stage must be 'val' or 'test', got {stage!r}")
        return self.split_text(stage)

    # ---- what evaluation reads

    def sources(self, stage: str) -> list[str]:
        """The source text of every example of ``stage`` ("val"/"test"), in split order."""
        return list(self._eval_split(stage).sources)

    def references(self, stage: str) -> list[str]:
        """The reference of every example, in split order, as the paper's BLEU reads it
        (pre-tokenized; see the subclass)."""
        return list(self._eval_split(stage).references)

    def raw_references(self, stage: str) -> list[str]:
        """The detokenized references, for sacreBLEU's own 13a BLEU."""
        return list(self._eval_split(stage).raw_references)

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids -> the hypothesis in the form of ``references``: stops at ``</s>``,
        drops ``<s>`` and ``<pad>``, keeps ``<unk>`` as the word ``<unk>``; BPE pieces are
        merged back into words; words joined by one space."""
        tokenizer, kept = self.tgt_tokenizer, []
        specials = (tokenizer.pad_id, tokenizer.bos_id)
        for i in ids:
            i = int(i)
            if i == tokenizer.eos_id:
                break
            if i not in specials:
                kept.append(i)
        if isinstance(tokenizer, WordTokenizer):
            return " ".join(tokenizer.id_to_token(i) for i in kept)
        # BPE: the pieces glued, "</w>" marking word ends (an <unk> piece stays visible)
        return " ".join(split_tokens(tokenizer.tokenizer.decode(kept, skip_special_tokens=False)))

    def detokenize(self, text: str) -> str:
        """Text in the form of ``references`` -> raw text: sacremoses' MosesDetokenizer of
        the target language (which also unescapes ``&apos;``, ``&quot;``, ...)."""
        return moses_detokenize(text, self.target)

    # ---- vocabularies

    @property
    def tokenizers(self) -> tuple[TextTokenizer, TextTokenizer]:
        if self._tokenizers is None:
            tokenizers = self.build_tokenizers()
            for side, tokenizer in zip(("source", "target"), tokenizers):
                for i, special in enumerate(SPECIALS):
                    if tokenizer.token_to_id(special) != i:
                        raise ValueError(f"{self.name} {side} vocabulary: {special!r} is not "
                                         f"id {i}")
            self._tokenizers = tokenizers
            log.info("%s %s-%s: vocabularies of %d / %d ids", self.name, self.source,
                     self.target, tokenizers[0].vocab_size, tokenizers[1].vocab_size)
        return self._tokenizers

    @property
    def src_tokenizer(self) -> TextTokenizer:
        return self.tokenizers[0]

    @property
    def tgt_tokenizer(self) -> TextTokenizer:
        return self.tokenizers[1]

    @property
    def src_vocab_size(self) -> int:
        return self.src_tokenizer.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt_tokenizer.vocab_size

    @property
    def pad_id(self) -> int:
        return self.tgt_tokenizer.pad_id

    @property
    def bos_id(self) -> int:
        return self.tgt_tokenizer.bos_id

    @property
    def eos_id(self) -> int:
        return self.tgt_tokenizer.eos_id

    # ---- encoding

    def _keep(self, src: list[int], tgt: list[int],
              counts: Counter) -> tuple[list[int], list[int]] | None:
        """The training length rules: the pair as kept (maybe truncated) or None."""
        if not src or not tgt:
            counts["empty"] += 1
            return None
        if self.max_len and max(len(src), len(tgt)) > self.max_len:
            if not self.truncate_long:
                counts["too_long"] += 1
                return None
            counts["truncated"] += 1
            src, tgt = src[:self.max_len], tgt[:self.max_len]
        if self.max_ratio and max(len(src), len(tgt)) > self.max_ratio * min(len(src), len(tgt)):
            counts["ratio"] += 1
            return None
        return src, tgt

    def encode(self, split: str) -> ParallelDataset:
        """The split's pairs as ids (training pairs filtered, see the class docstring)."""
        text = self.split_text(split)
        src_tok, tgt_tok = self.tokenizers
        counts: Counter = Counter()

        def triples():
            numbered = enumerate(text.pairs)
            while chunk := list(itertools.islice(numbered, 4096)):
                src_ids = src_tok.encode_batch([s for _, (s, _) in chunk])
                tgt_ids = tgt_tok.encode_batch([t for _, (_, t) in chunk])
                for (i, _), src, tgt in zip(chunk, src_ids, tgt_ids):
                    counts["read"] += 1
                    if split == "train":
                        kept = self._keep(src, tgt, counts)
                        if kept is None:
                            continue
                        src, tgt = kept
                    elif not src:
                        counts["empty_source"] += 1
                    yield i, src, tgt

        data = ParallelDataset(triples())
        if split == "train":
            self._texts.pop("train", None)  # the training words are not needed any more
        if not len(data):  # (the readers refuse empty files: all were filtered out)
            files = ", ".join(str(path) for path, _ in self.split_files(split))
            raise DataFormatError(files, None, f"{self.name} {split} pairs left after the "
                                  f"length filters (max_len={self.max_len}, max_ratio="
                                  f"{self.max_ratio})", f"none of {counts['read']} "
                                  f"({dict(counts)})")
        self.stats[split] = {"examples": len(data), **{k: v for k, v in counts.items()
                                                       if k != "read"}}
        dropped = {k: counts[k] for k in ("empty", "too_long", "ratio") if counts[k]}
        if dropped or counts["truncated"]:
            log.warning("%s %s: %d of %d pairs dropped (%s), %d truncated to max_len=%s",
                        self.name, split, sum(dropped.values()), counts["read"],
                        ", ".join(f"{k}: {v}" for k, v in dropped.items()) or "none",
                        counts["truncated"], self.max_len)
        if counts["empty_source"]:
            log.warning("%s %s: %d examples with an empty source (kept)", self.name, split,
                        counts["empty_source"])
        return data

    # ---- Lightning hooks

    @prepare_once
    def prepare_data(self, extra: Sequence[Path] = ()) -> None:
        """Download the missing files that a download of the dataset's release gives
        (datamodules.fetch: locked, resumed, checked), into ``data_dir``; files that none
        gives (WMT training text, other names) are left to ``setup``, which names them.  A
        test file that cannot be downloaded is a warning only (``setup`` reads the test split
        when it is there).  ``extra``: further files needed (vocabularies)."""
        entry = dataset_of(self)
        if entry is None:
            return
        needed = [path for split in ("train", "val") for path, _ in self.split_files(split)]
        ensure(entry.key, self.data_dir, needed + list(extra),
               optional=[path for path, _ in self.split_files("test")],
               download=self.download, strict=False)

    def setup(self, stage: str | None = None) -> None:
        """fit: train and val; validate: val; test and predict: test; None: train, val and
        test when its files are present."""
        splits = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"],
                  "predict": ["test"]}.get(stage or "")
        if splits is None:
            splits = ["train", "val"] + (["test"] if self._present("test") else [])
        for split in splits:
            if split not in self.datasets:
                self.datasets[split] = self.encode(split)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.datasets:
            self.datasets[split] = self.encode(split)
        data = self.datasets[split]
        collate = partial(collate_translation, data, pad_id=self.pad_id, bos_id=self.bos_id,
                          eos_id=self.eos_id)
        return bucketed_loader(data, data.lengths(),
                               self.batch_size if shuffle else self.eval_batch_size, collate,
                               shuffle=shuffle, seed=self.seed, num_workers=self.num_workers,
                               trainer=self.trainer)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


# ---------------------------------------------------------------------------------------
# IWSLT'15 En-Vi (Stanford release)

STANFORD_URL = "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/"
STANFORD_SPECIALS = (UNK, BOS, EOS)  # the first three lines of the Stanford vocab files


def read_stanford_vocab(path: str | os.PathLike) -> Vocab:
    """A Stanford NMT vocabulary file (one word per line, the first three ``<unk> <s> </s>``)
    as a :class:`~datamodules.common.Vocab` with the suite's ids: ``<pad>`` 0, ``<unk>`` 1,
    ``<s>`` 2, ``</s>`` 3 and the word of file line n (1-based) at id n, i.e. every Stanford
    id (0-based line) plus one, ``<pad>`` taking 0.  A word given twice, an empty line or a
    line with a space (no token of the space-separated data could match it) is an error."""
    words: list[str] = []
    seen = set(SPECIALS)
    for number, word in read_lines(path):
        if number <= len(STANFORD_SPECIALS):
            if word != STANFORD_SPECIALS[number - 1]:
                raise DataFormatError(path, number, f"{STANFORD_SPECIALS[number - 1]!r} (a "
                                      "Stanford vocab file starts with <unk>, <s>, </s>)", word)
            continue
        if not word or " " in word:
            raise DataFormatError(path, number, "one word per line", word)
        if word in seen:
            raise DataFormatError(path, number, "each word once (ids follow line numbers)", word)
        seen.add(word)
        words.append(word)
    if not words:
        raise DataFormatError(path, None, "<unk>, <s>, </s> and at least one word")
    return Vocab(words, specials=SPECIALS, unk=UNK)


class IWSLT15DataModule(TranslationDataModule):
    """IWSLT'15 English-Vietnamese as released by the Stanford NMT group (Luong & Manning
    2015), CoDA Table 4: ``{train,tst2012,tst2013}.{en,vi}`` (133,317 / 1,553 / 1,268
    tokenized lines; tst2012 is the dev set, tst2013 the test set) and ``vocab.{en,vi}``
    (17,191 / 7,709 words), from https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/.

    The data is already tokenized (Moses-escaped: ``&apos;``, ``&quot;``): tokens are the
    words between ASCII spaces.  The vocabularies are the release's files: a word not in
    ``vocab.<lang>`` is ``<unk>`` (as in tensorflow/nmt); the file's ``<unk> <s> </s>``
    (Stanford ids 0-2) become ids 1-3 and every other word its Stanford id plus one, with
    ``<pad>`` added at 0 (:func:`read_stanford_vocab`): 17,192 / 7,710 ids.

    ``references``: the Stanford target line as it is in the file (out-of-vocabulary words
    stay words, not ``<unk>``), what CoDA's tokenized BLEU scores.  ``raw_references``: that
    line detokenized by sacremoses' MosesDetokenizer for the target language -- an
    approximation of the raw text, since the release is tokenized only.  ``sources``: the
    source lines as in the file.  ``decode`` gives words joined by a space, ``<unk>`` kept.

    ``max_len`` (default 50 words, tensorflow/nmt's ``standard_hparams/iwslt15.json``:
    ``src_max_len = tgt_max_len = 50``): tensorflow/nmt *truncates* longer training
    sentences to 50 words (``truncate_long=True`` does the same) and drops pairs with an
    empty side; the default here drops the longer pairs (71 of the first 1,000 training
    pairs, besides one with an empty English line).  ``train_prefix`` / ``val_prefix`` /
    ``test_prefix`` / ``vocab_prefix`` name the files (``<prefix>.<lang>``), e.g.
    ``train.first1000`` and ``tst2012`` for val and test with the shared data.  Other
    arguments: :class:`TranslationDataModule`.
    """

    name = "iwslt15"
    dataset = "iwslt15"
    bleu = "tokenized"
    directions = (("en", "vi"), ("vi", "en"))
    shared_folder = "iwslt15_en_vi"
    release_names: ClassVar[dict[str, str]] = {"train": "train", "val": "tst2012",
                                               "test": "tst2013", "vocab": "vocab"}

    def __init__(self, data_dir: str | None = None, source: str = "en", target: str = "vi",
                 train_prefix: str = "train", val_prefix: str = "tst2012",
                 test_prefix: str = "tst2013", vocab_prefix: str = "vocab",
                 max_len: int | None = 50, **kwargs: Any):
        super().__init__(data_dir, source, target, max_len=max_len, **kwargs)
        self.prefixes = {"train": train_prefix, "val": val_prefix, "test": test_prefix,
                         "vocab": vocab_prefix}

    def _file(self, kind: str, lang: str) -> tuple[Path, str]:
        official = f"{self.release_names[kind]}.{lang}"
        role = "vocabulary" if kind == "vocab" else \
            f"{kind} {'source' if lang == self.source else 'target'}"
        return (self.path(f"{self.prefixes[kind]}.{lang}"),
                f"{role} file ({kind}_prefix={self.prefixes[kind]!r}; the Stanford release "
                f"calls it {official}: {STANFORD_URL}{official})")

    def split_files(self, split: str) -> list[tuple[Path, str]]:
        return [self._file(split, self.source), self._file(split, self.target)]

    @prepare_once
    def prepare_data(self) -> None:
        """The release's missing files (:meth:`TranslationDataModule.prepare_data`), the
        vocabulary files too."""
        super().prepare_data(extra=[self._file("vocab", lang)[0]
                                    for lang in (self.source, self.target)])

    def read_split(self, split: str, limit: int | None) -> SplitText:
        (src_path, _), (tgt_path, _) = self.split_files(split)
        if split == "train":
            return SplitText(Reiterable(lambda: (
                (split_tokens(s), split_tokens(t))
                for _, s, t in read_parallel_lines(src_path, tgt_path, limit))))
        lines = [(s, t) for _, s, t in read_parallel_lines(src_path, tgt_path, limit)]
        return SplitText(pairs=[(split_tokens(s), split_tokens(t)) for s, t in lines],
                         sources=[s for s, _ in lines], references=[t for _, t in lines],
                         raw_references=[self.detokenize(t) for _, t in lines])

    def build_tokenizers(self) -> tuple[WordTokenizer, WordTokenizer]:
        out = []
        for lang in (self.source, self.target):
            path, what = self._file("vocab", lang)
            require_file(path, f"{type(self).__name__} {what}")
            out.append(WordTokenizer(read_stanford_vocab(path)))
        return out[0], out[1]


# ---------------------------------------------------------------------------------------
# WMT news translation: what WMT'14 and WMT'16 share

#: the placeholders a WMT file name may use
FILE_PLACEHOLDERS = ("src", "tgt", "pair")
#: a WMT SGML name ends in ``.<language>.sgm`` (``newstest2014-deen-src.en.sgm``)
_SGML_LANGUAGE = re.compile(r"\.([a-z]{2,3})\.sgm$", re.IGNORECASE)


class WMTDataModule(TranslationDataModule):
    """A WMT news-translation task prepared as fairseq's
    ``examples/translation/prepare-wmt14en2de.sh`` does, with sacremoses and HF ``tokenizers``
    in place of the Moses perl scripts and subword-nmt (:class:`WMT14DataModule`,
    :class:`WMT16EnRoDataModule`):

    - training text ``<train_prefix>.<lang>``: plain parallel text, one raw sentence per line
      (the WMT corpora after SGML stripping, concatenated); each line
      ``normalize-punctuation.perl | remove-non-printing-char.perl | tokenizer.perl -a``
      (:func:`moses_tokenize_train`).  The tokenized text is cached under ``cache_dir()``
      (keyed by the file's path, size and mtime), so the slow Moses pass runs once;
    - validation and test sets: WMT SGML (``.sgm``, read by :func:`read_sgml_segments`,
      source and reference segments checked to pair up) or plain text lines (any other
      name); each segment ``sed "s/’/'/g" | tokenizer.perl -a`` (:func:`moses_tokenize_test`).
      File names may use ``{src}``, ``{tgt}`` and ``{pair}`` (the pair as the release writes
      it, see the subclass); an SGML name ending in ``.<language>.sgm`` must name the
      language of its side (a ``ValueError`` otherwise, before anything is read);
    - one JOINT BPE over source and target training text, so ``src_vocab_size ==
      tgt_vocab_size`` and the model can share embeddings: the BPE of
      :func:`datamodules.text.build_tokenizer` (cached by content), of :meth:`bpe_size` ids;
    - ``max_len`` / ``max_ratio`` over BPE pieces: ``clean-corpus-n.perl`` on the training
      pairs (the subclass's defaults).

    Text of a language can be changed before tokenization by :meth:`prepare` (Romanian
    normalisation, :class:`WMT16EnRoDataModule`); ``references`` and ``raw_references`` then
    hold the changed text.  ``references``: the reference segment Moses-tokenized as above
    (with ``@-@`` and the escaping), the text fairseq scores; ``raw_references``: the segment
    as is, for sacreBLEU.  ``sources``: the source segments.  ``decode`` merges BPE pieces
    back into the Moses-tokenized words.

    ``split_test_for_training`` = N: only for pipeline checks where no training text exists
    (as on this machine): the first N segment pairs of the test files are the training set
    and the remaining ones both the validation and the test set (the training and
    validation files are not read).  Other arguments: :class:`TranslationDataModule`.
    """

    #: the release, for messages ("WMT'14")
    release: ClassVar[str] = "WMT"
    #: per split, what it is (for messages)
    split_roles: ClassVar[dict[str, str]] = {}
    #: per evaluation split: the (source, target) names of the release (with the
    #: placeholders) and where they are, for messages
    release_files: ClassVar[dict[str, tuple[str, str, str]]] = {}

    def __init__(self, data_dir: str | None, source: str, target: str, *, train_prefix: str,
                 val_source_file: str, val_target_file: str, test_source_file: str,
                 test_target_file: str, bpe_vocab_size: int | None,
                 split_test_for_training: int | None, max_len: int | None,
                 max_ratio: float | None, **kwargs: Any):
        super().__init__(data_dir, source, target, max_len=max_len, max_ratio=max_ratio,
                         **kwargs)
        owner = type(self).__name__
        check_sizes(owner, split_test_for_training=split_test_for_training)
        check_sizes(owner, least=len(SPECIALS) + 1, bpe_vocab_size=bpe_vocab_size)
        self.files = {"train": (f"{train_prefix}.{source}", f"{train_prefix}.{target}"),
                      "val": (self._file_name("val_source_file", val_source_file, source),
                              self._file_name("val_target_file", val_target_file, target)),
                      "test": (self._file_name("test_source_file", test_source_file, source),
                               self._file_name("test_target_file", test_target_file, target))}
        self.bpe_vocab_size, self.split_test_for_training = bpe_vocab_size, split_test_for_training

    # ---- what subclasses may change

    def pair_name(self) -> str:
        """The ``{pair}`` of file names: source and target language codes, as WMT'16 names
        its test sets (``newstest2016-enro-src.en.sgm`` / ``newstest2016-roen-src.ro.sgm``)."""
        return self.source + self.target

    def prepare(self, text: str, lang: str) -> str:
        """Raw text of ``lang`` before tokenization (training lines and evaluation segments);
        here unchanged."""
        return text

    def preparation(self, lang: str) -> dict[str, Any]:
        """The settings of :meth:`prepare` for ``lang`` (part of the cache key of the
        tokenized training text; empty when the text is unchanged)."""
        return {}

    def bpe_size(self) -> int:
        """The number of ids of the joint BPE (specials, characters and merges)."""
        if self.bpe_vocab_size is None:
            raise ValueError(f"{type(self).__name__}: bpe_vocab_size is None")
        return self.bpe_vocab_size

    # ---- files

    def _file_name(self, arg: str, pattern: str, lang: str) -> str:
        """``pattern`` with its placeholders filled in, checked (see the class docstring)."""
        names = {"src": self.source, "tgt": self.target, "pair": self.pair_name()}
        try:
            name = pattern.format(**names)
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"{type(self).__name__} {arg}={pattern!r}: a file name may use "
                             f"the placeholders {{src}}, {{tgt}} and {{pair}} only ({err!r})"
                             ) from None
        side = "source" if arg.endswith("source_file") else "target"
        m = _SGML_LANGUAGE.search(name)
        if m and m.group(1).lower() != lang:
            raise ValueError(f"{type(self).__name__} {arg}={pattern!r} names {name!r}, the "
                             f"{m.group(1)} side of a WMT SGML set (.<language>.sgm), but the "
                             f"{side} language is {lang} ({self.source}->{self.target})")
        return name

    def split_files(self, split: str) -> list[tuple[Path, str]]:
        if self.split_test_for_training:
            split = "test"
        out = []
        for i, (side, name) in enumerate(zip(("source", "target"), self.files[split])):
            what = f"{side} {self.split_roles[split]}"
            if split in self.release_files:
                lang = (self.source, self.target)[i]
                official = self.release_files[split][i].format(
                    src=self.source, tgt=self.target, pair=self.pair_name(), lang=lang)
                what += (f", {split}_{side}_file={name!r}; the {self.release} release calls "
                         f"it {official} ({self.release_files[split][2]})")
            out.append((self.path(name), what))
        return out

    # ---- text

    def read_split(self, split: str, limit: int | None) -> SplitText:
        (src_path, _), (tgt_path, _) = self.split_files(split)
        if split == "train" and not self.split_test_for_training:
            src_tok, tgt_tok = self._tokenized_training_text(src_path, tgt_path, limit)
            return SplitText(Reiterable(lambda: (
                (split_tokens(s), split_tokens(t)) for (_, s), (_, t)
                in zip(read_lines(src_tok), read_lines(tgt_tok)))))
        pairs = read_text_pairs(src_path, tgt_path)
        if self.split_test_for_training:
            n = self.split_test_for_training
            if n >= len(pairs):
                raise DataFormatError(src_path, None, f"more than split_test_for_training={n} "
                                      "segment pairs (the rest are validation and test)",
                                      f"{len(pairs)} pairs")
            pairs = pairs[:n][:limit] if split == "train" else pairs[n:]
        pairs = [(self.prepare(s, self.source), self.prepare(t, self.target)) for s, t in pairs]
        tokens = [(moses_tokenize_test(s, self.source), moses_tokenize_test(t, self.target))
                  for s, t in pairs]
        return SplitText(tokens, sources=[s for s, _ in pairs],
                         references=[" ".join(t) for _, t in tokens],
                         raw_references=[t for _, t in pairs])

    def _tokenized_training_text(self, src_path: Path, tgt_path: Path,
                                 limit: int | None) -> tuple[Path, Path]:
        """The Moses-tokenized training files (line n of each = line n of the raw file),
        cached under ``cache_dir()`` by each file's path, size and mtime, ``limit`` and
        :meth:`preparation`."""
        cached = {}
        for path, lang in ((src_path, self.source), (tgt_path, self.target)):
            stat = path.resolve().stat()
            key = settings_key(path=str(path.resolve()), size=stat.st_size,
                               mtime=stat.st_mtime_ns, lang=lang, limit=limit, version=1,
                               **self.preparation(lang))
            cached[path] = (cache_dir() / f"{self.name}-train-{key}.tok.{lang}", lang)
        if not all(out.exists() for out, _ in cached.values()):
            check_parallel(src_path, tgt_path)
        for path, (out, lang) in cached.items():
            write_once(out, partial(self._tokenize_file, path, lang, limit))
        return cached[src_path][0], cached[tgt_path][0]

    def _tokenize_file(self, path: Path, lang: str, limit: int | None, out: Path) -> None:
        log.info("%s: Moses-tokenizing %s into %s (once)", self.name, path, out)
        with open(out, "w", encoding="utf-8") as f:
            for _, line in itertools.islice(read_lines(path), limit):
                f.write(" ".join(moses_tokenize_train(self.prepare(line, lang), lang)) + "\n")

    def training_words(self) -> Reiterable:
        """Every training sentence of both sides as words (what the joint BPE learns from)."""
        return Reiterable(lambda: (words for pair in self.split_text("train").pairs
                                   for words in pair))

    def build_tokenizers(self) -> tuple[TextTokenizer, TextTokenizer]:
        key = f"{self.name}-{self.source}{self.target}"
        bpe = build_tokenizer("bpe", self.training_words(), bpe_vocab_size=self.bpe_size(),
                              name=key)
        return bpe, bpe


# ---------------------------------------------------------------------------------------
# WMT'14 En-De / En-Fr


class WMT14DataModule(WMTDataModule):
    """WMT'14 English-German (Differentiable Window Table 1) or English-French, prepared as
    fairseq's ``examples/translation/prepare-wmt14en2de.sh`` does (:class:`WMTDataModule`):

    - training text ``<train_prefix>.<lang>``: e.g. Europarl + CommonCrawl + News Commentary
      concatenated, raw;
    - validation newstest2013 and test newstest2014: ``{pair}`` is "deen" / "fren" (the
      WMT'14 release names the pair the same in both directions);
    - the joint BPE has ``bpe_vocab_size`` ids including the specials (32,768 as
      Differentiable Window Table 1);
    - ``max_len`` 250 and ``max_ratio`` 1.5 over BPE pieces: fairseq's ``clean-corpus-n.perl
      -ratio 1.5 ... 1 250`` on the training pairs.

    ``bleu``: "tokenized+compound_split" into German (WMT'14 En-De convention), else
    "tokenized".  ``split_test_for_training`` and the other arguments:
    :class:`WMTDataModule`, :class:`TranslationDataModule`.
    """

    name = "wmt14"
    bleu = "tokenized+compound_split"
    directions = (("en", "de"), ("de", "en"), ("en", "fr"), ("fr", "en"))
    shared_folder = "wmt14_en_de"
    release = "WMT'14"
    split_roles = {"train": "training text (plain, one sentence per line)",
                   "val": "validation set (newstest2013: .sgm or plain text)",
                   "test": "test set (newstest2014, .sgm from the WMT'14 test-full.tgz)"}
    release_files = {
        "val": ("dev/newstest2013-src.{src}.sgm", "dev/newstest2013-ref.{tgt}.sgm",
                "http://www.statmt.org/wmt14/dev.tgz"),
        "test": ("test-full/newstest2014-{pair}-src.{src}.sgm",
                 "test-full/newstest2014-{pair}-ref.{tgt}.sgm",
                 "http://www.statmt.org/wmt14/test-full.tgz")}

    @property
    def dataset(self) -> str:
        """The registry entry of the language pair."""
        return "wmt14_en_fr" if "fr" in (self.source, self.target) else "wmt14_en_de"

    def __init__(self, data_dir: str | None = None, source: str = "en", target: str = "de",
                 train_prefix: str = "train",
                 val_source_file: str = "newstest2013-src.{src}.sgm",
                 val_target_file: str = "newstest2013-ref.{tgt}.sgm",
                 test_source_file: str = "newstest2014-{pair}-src.{src}.sgm",
                 test_target_file: str = "newstest2014-{pair}-ref.{tgt}.sgm",
                 bpe_vocab_size: int = 32768, split_test_for_training: int | None = None,
                 max_len: int | None = 250, max_ratio: float | None = 1.5, **kwargs: Any):
        super().__init__(data_dir, source, target, train_prefix=train_prefix,
                         val_source_file=val_source_file, val_target_file=val_target_file,
                         test_source_file=test_source_file, test_target_file=test_target_file,
                         bpe_vocab_size=bpe_vocab_size,
                         split_test_for_training=split_test_for_training, max_len=max_len,
                         max_ratio=max_ratio, **kwargs)
        self.bleu = "tokenized+compound_split" if target == "de" else "tokenized"

    def pair_name(self) -> str:
        return ("de" if "de" in (self.source, self.target) else "fr") + "en"


# ---------------------------------------------------------------------------------------
# WMT'16 En-Ro

#: normalise-romanian.py of rsennrich/wmt16-scripts (Barry Haddow): s and t with cedilla
#: (the older, wrong code points) -> with comma below
ROMANIAN_COMMA = str.maketrans({"\u015e": "\u0218", "\u015f": "\u0219",
                                "\u0162": "\u021a", "\u0163": "\u021b"})
#: remove-diacritics.py of the same scripts (after the normalisation): ș ț ă â î -> s t a a i
ROMANIAN_PLAIN = str.maketrans({"\u0218": "S", "\u0219": "s", "\u021a": "T", "\u021b": "t",
                                "\u0102": "A", "\u0103": "a", "\u00c2": "A", "\u00e2": "a",
                                "\u00ce": "I", "\u00ee": "i"})
ROMANIAN_PREPARATION = ("keep", "normalise", "remove_diacritics")


def prepare_romanian(text: str, how: str = "keep") -> str:
    """Romanian text as rsennrich/wmt16-scripts prepares it: ``keep`` (unchanged),
    ``normalise`` (``normalise-romanian.py``: ``ş ţ Ş Ţ`` with cedilla -> ``ș ț Ș Ț`` with
    comma below) or ``remove_diacritics`` (that, then ``remove-diacritics.py``: ``ș ț ă â î``
    and their capitals -> ``s t a a i``)."""
    if how not in ROMANIAN_PREPARATION:
        raise ValueError(f"romanian must be one of {ROMANIAN_PREPARATION}, got {how!r}")
    if how != "keep":
        text = text.translate(ROMANIAN_COMMA)
    if how == "remove_diacritics":
        text = text.translate(ROMANIAN_PLAIN)
    return text


WMT16_URL = "http://data.statmt.org/wmt16/translation-task/"


class WMT16EnRoDataModule(WMTDataModule):
    """WMT'16 English-Romanian in both directions (quantum-statistics attention, Table 1:
    "~400K parallel sentences", "BPE with 32K operations", a shared vocabulary, newsdev2016 /
    newstest2016), prepared as :class:`WMTDataModule` (the WMT'14 module's Moses pipeline):

    - training text ``<train_prefix>.{en,ro}``: plain parallel text, raw, one sentence per
      line: the WMT'16 constrained En-Ro data, Europarl v8 (``europarl-v8.ro-en.{en,ro}``)
      and SETimes2 (``SETIMES2.en-ro.{en,ro}`` / OPUS ``SETIMES.en-ro.{en,ro}``) concatenated,
      as rsennrich/wmt16-scripts' ``download_files.sh`` and tensor2tensor's
      ``translate_enro`` do (about 610K pairs).  The paper's "~400K" is the size of Europarl
      alone: give its files as ``train_prefix`` to train on that;
    - validation newsdev2016 and test newstest2016 (1,999 segments each) as WMT SGML,
      by default the release's names ``newsdev2016-{pair}-src.{src}.sgm`` /
      ``newsdev2016-{pair}-ref.{tgt}.sgm`` (``dev/`` in WMT'16 ``dev.tgz``) and
      ``newstest2016-{pair}-src.{src}.sgm`` / ``newstest2016-{pair}-ref.{tgt}.sgm``
      (``test/`` in ``test.tgz``), where ``{pair}`` is source then target, "enro" or "roen":
      unlike WMT'14 the release names each direction's files apart (the same sentences);
    - a joint BPE of ``bpe_merges`` merges (32,000, as tensorflow/nmt's
      ``scripts/wmt16_en_de.sh`` learns with subword-nmt ``learn_bpe.py -s 32000``): the ids
      are the 4 specials, the characters and word-final characters of the training words
      and one per merge (:meth:`bpe_size`); ``bpe_vocab_size`` instead fixes the ids;
    - ``max_len`` 80 and ``max_ratio`` 9 over BPE pieces: ``clean-corpus-n.perl ... 1 80``
      (its default ratio 9) as wmt16-scripts and tensorflow/nmt prepare the training pairs
      (they count words, here BPE pieces).

    Romanian (``romanian``, every Romanian text: training lines and evaluation segments,
    source or target): the paper says nothing of Romanian-specific preparation, and the code
    it builds on (tensorflow/nmt, whose only WMT script is the 32K-merge recipe above) has
    none, so the default is ``"keep"``: the text as released.  rsennrich/wmt16-scripts'
    preparation (Edinburgh's WMT'16 systems) is available: ``"normalise"`` writes s/t with
    cedilla (ş ţ, common in the older training text) as s/t with comma below (ș ț, the
    correct letters), and ``"remove_diacritics"`` also strips ă â î ș ț to a a i s t
    (:func:`prepare_romanian`), what wmt16-scripts does to the Romanian source of Ro->En.
    With Romanian as the target the references (tokenized and raw) are changed the same way,
    so BLEU compares like with like -- the "normalised, no diacritics" BLEU of the XLM /
    mBART En->Ro evaluation scripts, not comparable with BLEU against the released text.

    ``bleu``: "tokenized" (BLEU on the Moses-tokenized references, both directions).
    ``split_test_for_training`` and the other arguments: :class:`WMTDataModule`,
    :class:`TranslationDataModule`.
    """

    name = "wmt16"
    dataset = "wmt16_en_ro"
    bleu = "tokenized"
    directions = (("en", "ro"), ("ro", "en"))
    shared_folder = "wmt16_en_ro"
    release = "WMT'16"
    split_roles = {"train": "training text (plain, one sentence per line: Europarl v8 + "
                            "SETimes2 concatenated)",
                   "val": "validation set (newsdev2016: .sgm or plain text)",
                   "test": "test set (newstest2016: .sgm or plain text)"}
    release_files = {
        "val": ("dev/newsdev2016-{pair}-src.{src}.sgm", "dev/newsdev2016-{pair}-ref.{tgt}.sgm",
                WMT16_URL + "dev.tgz"),
        "test": ("test/newstest2016-{pair}-src.{src}.sgm",
                 "test/newstest2016-{pair}-ref.{tgt}.sgm", WMT16_URL + "test.tgz")}

    def __init__(self, data_dir: str | None = None, source: str = "en", target: str = "ro",
                 train_prefix: str = "train",
                 val_source_file: str = "newsdev2016-{pair}-src.{src}.sgm",
                 val_target_file: str = "newsdev2016-{pair}-ref.{tgt}.sgm",
                 test_source_file: str = "newstest2016-{pair}-src.{src}.sgm",
                 test_target_file: str = "newstest2016-{pair}-ref.{tgt}.sgm",
                 bpe_merges: int = 32000, bpe_vocab_size: int | None = None,
                 romanian: str = "keep", split_test_for_training: int | None = None,
                 max_len: int | None = 80, max_ratio: float | None = 9.0, **kwargs: Any):
        check_sizes(type(self).__name__, bpe_merges=bpe_merges)
        prepare_romanian("", romanian)  # checks the name
        super().__init__(data_dir, source, target, train_prefix=train_prefix,
                         val_source_file=val_source_file, val_target_file=val_target_file,
                         test_source_file=test_source_file, test_target_file=test_target_file,
                         bpe_vocab_size=bpe_vocab_size,
                         split_test_for_training=split_test_for_training, max_len=max_len,
                         max_ratio=max_ratio, **kwargs)
        self.bpe_merges, self.romanian = bpe_merges, romanian

    def prepare(self, text: str, lang: str) -> str:
        return prepare_romanian(text, self.romanian) if lang == "ro" else text

    def preparation(self, lang: str) -> dict[str, Any]:
        return {"romanian": self.romanian} if lang == "ro" and self.romanian != "keep" else {}

    def bpe_size(self) -> int:
        """``bpe_vocab_size`` when given, else the ids of ``bpe_merges`` merges: HF
        ``tokenizers``' BPE trainer starts from the specials, every character of the training
        words and every word-final character (marked ``</w>``) and adds one id per merge."""
        if self.bpe_vocab_size is not None:
            return self.bpe_vocab_size
        words: set[str] = set()
        for sentence in self.training_words():
            words.update(sentence)
        characters = {c for w in words for c in w}
        finals = {w[-1] for w in words if w}
        return len(SPECIALS) + len(characters) + len(finals) + self.bpe_merges


# ---------------------------------------------------------------------------------------
# AlgoLisp


@dataclass(frozen=True)
class AlgoLispExample:
    text: list[str]  # the problem statement's tokens
    program: list[str]  # the flattened ``short_tree``
    line: int


def flatten_program(tree: list, brackets: str = "[]") -> list[str]:
    """A nested-list program as tokens, as tensor2tensor's ``ProgramSearchAlgolisp``
    (data_generators/program_search.py, ``_flatten_target_programs``): every list, the
    outermost one included, becomes ``[`` + its elements flattened + ``]``, e.g.
    ``["invoke1", ["lambda1", "a"], "b"]`` -> ``[ invoke1 [ lambda1 a ] b ]``.
    ``brackets`` = "()" writes the Lisp form instead."""
    tokens = [brackets[0]]
    for node in tree:
        tokens += flatten_program(node, brackets) if isinstance(node, list) else [node]
    tokens.append(brackets[1])
    return tokens


def _is_tree(node: Any) -> bool:
    return isinstance(node, list) and all(
        isinstance(n, str) or _is_tree(n) for n in node)


def read_algolisp(path: str | os.PathLike, brackets: str = "[]") -> list[AlgoLispExample]:
    """AlgoLisp ``metaset3.*.jsonl``: one JSON record per line; ``text`` (the statement's
    tokens) and ``short_tree`` (the program, a nested list of strings) are read, the other
    fields (``tests``, ``args``, ``funcs``, ...) ignored.  Blank lines hold no record and are
    skipped; anything else that is not such a record is a DataFormatError naming file and
    line."""
    examples = []
    for number, _, record in json_records(path, "a JSON object (an AlgoLisp record)"):
        text, tree = record.get("text"), record.get("short_tree")
        if not (isinstance(text, list) and text and all(isinstance(w, str) for w in text)):
            raise DataFormatError(path, number, '"text": a non-empty list of word strings',
                                  repr(text))
        if not (_is_tree(tree) and tree):
            raise DataFormatError(path, number, '"short_tree": a non-empty nested list of '
                                  "strings (the program)", repr(tree))
        examples.append(AlgoLispExample(text, flatten_program(tree, brackets), number))
    if not examples:
        raise DataFormatError(path, None, "at least one AlgoLisp record")
    return examples


class AlgoLispDataModule(TranslationDataModule):
    """AlgoLisp program search (Polosukhin & Skidanov 2018; the ``metaset3`` files of
    tensor2tensor's ``ProgramSearchAlgolisp``): the problem statement's ``text`` tokens to
    the program ``short_tree``, flattened as tensor2tensor does (:func:`flatten_program`:
    ``[ invoke1 [ lambda1 [ if ... ] ] a ]``).  The files are ``metaset3.{train,dev,test}
    .jsonl`` (tensor2tensor downloads them gzipped from Dropbox; gunzip them first).

    Word vocabularies, one for the statements and one for the programs, of every token of
    the training split (cached under ``cache_dir()``); tokens unseen in training are
    ``<unk>``.  The metric is exact match of the program (``bleu`` None): ``references`` and
    ``raw_references`` are the program tokens joined by spaces, ``decode`` gives the same
    form, ``detokenize`` is the identity; ``sources`` are the statements joined by spaces.
    ``max_len`` None: no length filter (pairs with an empty side are still dropped from
    training).  Other arguments: :class:`TranslationDataModule`.
    """

    name = "algolisp"
    dataset = "algolisp"
    bleu = None
    directions = (("text", "program"),)
    shared_folder = "algolisp"

    def __init__(self, data_dir: str | None = None, train_file: str = "metaset3.train.jsonl",
                 val_file: str = "metaset3.dev.jsonl", test_file: str = "metaset3.test.jsonl",
                 brackets: str = "[]", max_len: int | None = None, **kwargs: Any):
        super().__init__(data_dir, "text", "program", max_len=max_len, **kwargs)
        if len(brackets) != 2 or brackets[0] == brackets[1]:
            raise ValueError(f"brackets must be two different characters, got {brackets!r}")
        self.files = {"train": train_file, "val": val_file, "test": test_file}
        self.brackets = brackets

    def split_files(self, split: str) -> list[tuple[Path, str]]:
        return [(self.path(self.files[split]), f"{split} file ({split}_file="
                 f"{self.files[split]!r}; the AlgoLisp release names "
                 f"metaset3.{'dev' if split == 'val' else split}.jsonl)")]

    def read_split(self, split: str, limit: int | None) -> SplitText:
        examples = read_algolisp(self.split_files(split)[0][0], self.brackets)[:limit]
        return SplitText([(e.text, e.program) for e in examples],
                         sources=[" ".join(e.text) for e in examples],
                         references=[" ".join(e.program) for e in examples],
                         raw_references=[" ".join(e.program) for e in examples])

    def build_tokenizers(self) -> tuple[TextTokenizer, TextTokenizer]:
        pairs = self.split_text("train").pairs
        return tuple(build_tokenizer("word", [p[side] for p in pairs], name=f"{self.name}-{kind}")
                     for side, kind in enumerate(("text", "program")))

    def detokenize(self, text: str) -> str:
        return text


