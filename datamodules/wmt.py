"""WMT news translation: WMT'14 English-German / English-French (Differentiable Window
Table 1) and WMT'16 English-Romanian (the quantum-statistics attention's Table 1).  What the
two share is :class:`WMTDataModule`: SGML (or plain) validation and test sets, raw training
text Moses-tokenized once into the cache, one joint BPE of both languages; the rest
(batches, filtering, what evaluation needs) is datamodules/translation.py's."""

from __future__ import annotations

import inspect
import itertools
import logging
import re
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from datamodules.common import (
    DataFormatError,
    cache_dir,
    check_sizes,
    read_lines,
    settings_key,
)
from datamodules.text import (
    SPECIALS,
    Reiterable,
    TextTokenizer,
    build_tokenizer,
    split_tokens,
)
from datamodules.translation import (
    SplitText,
    TranslationDataModule,
    check_parallel,
    moses_tokenize_test,
    moses_tokenize_train,
    read_text_pairs,
)
from fileio import write_once

log = logging.getLogger(__name__)


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


def shared_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """Of a subclass's ``__init__`` locals, the arguments of :class:`WMTDataModule` (by
    name): WMT'14 and WMT'16 pass them on without naming each twice."""
    names = inspect.signature(WMTDataModule.__init__).parameters
    return {name: values[name] for name in names if name not in ("self", "kwargs")}


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
        super().__init__(**shared_arguments(locals()), **kwargs)
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
        super().__init__(**shared_arguments(locals()), **kwargs)
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
