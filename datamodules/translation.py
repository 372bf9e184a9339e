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
from typing import ClassVar

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from datamodules.common import (
    DataFormatError,
    bucketed_loader,
    check_sizes,
    data_seed,
    open_data,
    read_lines,
    record_data_seed,
    require_file,
    seq2seq_batch,
    shared_data_dir,
)
from datamodules.fetch import ensure, prepare_once
from datamodules.registry import dataset_of
from datamodules.text import (
    SPECIALS,
    PackedPairs,
    PackedSequences,
    TextTokenizer,
    WordTokenizer,
    split_tokens,
)

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
            dataset's folder of the data root (its registry entry's folder, else
            ``shared_data_dir() / shared_folder``).
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
        self.source, self.target = source, target
        if data_dir is None:  # the dataset's folder of the data root (WMT'14: per language pair)
            entry = dataset_of(self)
            data_dir = shared_data_dir() / (entry.folder if entry else self.shared_folder)
        self.data_dir = Path(data_dir).absolute()  # messages name the file wherever run from
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
