"""IWSLT'15 English-Vietnamese, the Stanford NMT release (CoDA Table 4; the
quantum-statistics attention's Table 1): its pre-tokenized text and its vocabulary files,
read by :class:`IWSLT15DataModule` on the shared machinery of datamodules/translation.py
(batches, filtering, what evaluation needs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from datamodules.common import (
    BOS,
    EOS,
    UNK,
    DataFormatError,
    Vocab,
    read_lines,
    require_file,
)
from datamodules.fetch import prepare_once
from datamodules.text import (
    SPECIALS,
    Reiterable,
    WordTokenizer,
    split_tokens,
)
from datamodules.translation import (
    SplitText,
    TranslationDataModule,
    read_parallel_lines,
)

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
