"""GloVe word vectors for a vocabulary (Pennington et al. 2014).

DecompAtt (Parikh et al. 2016; docs/papers.md) and CoDA Table 3 embed words with the
frozen 300-d GloVe 840B vectors.  The file has one word per line followed by its ``dim``
numbers, all separated by single spaces.  A few words of the 840B file contain spaces
themselves, so a line's vector is its LAST ``dim`` fields and its word everything before
them.  A first line of exactly two integers (the word2vec/fastText ``count dim`` header) is
skipped.  Every line's field count is checked; the numbers are parsed only for the words
that are looked up (the 840B file has 2.2M lines).  When a word occurs twice, its first
line wins.

:func:`vocab_vectors` builds the (V, dim) matrix of a :class:`~datamodules.common.Vocab`:

- a word found in the file gets its vector;
- the padding token gets zeros;
- every other word (``<unk>``, other specials, out-of-vocabulary words) gets its own
  random vector N(0, ``oov_std``^2), drawn from a generator seeded by ``seed`` (the same
  rows for the same vocabulary and seed, whatever the file holds); ``oov`` counts the
  non-special words that got one.

A file holding none of the vocabulary's words is a DataFormatError (every row would be
random: another language, casing or tokenization, not GloVe); fewer than ``LOW_COVERAGE``
of them found is a logged warning with the count.

The matrix is cached under :func:`~datamodules.common.cache_dir`, keyed by the vectors
file (path, size, modification time), the vocabulary and the settings above.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from datamodules.common import (
    DataFormatError,
    Vocab,
    cache_dir,
    nonempty,
    read_lines,
    require_file,
    settings_key,
)
from datamodules.registry import url_of
from fileio import build_once

log = logging.getLogger(__name__)

#: below this share of the vocabulary's words found in the vectors file, a warning (none at
#: all is an error: every vector random is not GloVe)
LOW_COVERAGE = 0.5

GLOVE_840B_URL = url_of("glove")  # glove.840B.300d.zip (datamodules.fetch registry)
HOW_TO_GET = (f"Download {GLOVE_840B_URL} (2 GB), unzip it and pass the path of "
              "glove.840B.300d.txt with --data.vectors (`python -m datamodules.fetch glove` "
              "puts it in the data root's glove/ folder)")


def read_glove(path: str | os.PathLike, dim: int = 300,
               words: Container[str] | None = None) -> Iterator[tuple[str, Tensor]]:
    """(word, (dim,) float32 vector) for every line of a GloVe text file, or only for the
    lines whose word is in ``words``.  A line with fewer than ``dim`` numbers or a number
    that does not parse raises DataFormatError naming the file and line."""
    expected = f"a word followed by {dim} space-separated numbers"
    for number, line in nonempty(read_lines(path), path, "at least one line: " + expected):
        line = line.rstrip()
        spaces = line.count(" ")
        if number == 1 and spaces == 1 and all(f.isdigit() for f in line.split(" ")):
            if int(line.split(" ")[1]) != dim:
                raise DataFormatError(path, number, f"vectors of dimension {dim}", line)
            continue  # word2vec-style "count dim" header
        if spaces < dim:
            raise DataFormatError(path, number, expected, f"{spaces} numbers: {line}")
        # a word with spaces (spaces > dim): the vector is the last dim fields
        word = line[: line.index(" ")] if spaces == dim else line.rsplit(" ", dim)[0]
        if not word:
            raise DataFormatError(path, number, expected, f"an empty word: {line}")
        if words is not None and word not in words:
            continue
        try:
            vector = torch.tensor([float(x) for x in line.rsplit(" ", dim)[1:]])
        except ValueError:
            raise DataFormatError(path, number, expected, line) from None
        yield word, vector


@dataclass
class VocabVectors:
    weight: Tensor  # (V, dim) float32
    found: int  # vocabulary words with a vector in the file
    oov: int  # non-special words without one (random rows)


def vocab_vectors(path: str | os.PathLike, vocab: Vocab, dim: int = 300, oov_std: float = 0.1,
                  seed: int = 0, cache: bool = True) -> VocabVectors:
    """The (V, dim) embedding matrix of ``vocab`` from the GloVe file at ``path`` (see the
    module docstring for the treatment of padding, specials and out-of-vocabulary words)."""
    path = require_file(path, "GloVe vectors file", HOW_TO_GET).resolve()
    stat = path.stat()
    vocab_hash = hashlib.sha1("\n".join(vocab.itos).encode()).hexdigest()
    key = settings_key(path=str(path), size=stat.st_size, mtime=stat.st_mtime_ns,
                       vocab=vocab_hash, dim=dim, oov_std=oov_std, seed=seed)
    if not cache:
        return _build_vectors(path, vocab, dim, oov_std, seed)
    result, _ = build_once(cache_dir() / f"vectors-{path.stem}-{key}.pt",
                           lambda: _build_vectors(path, vocab, dim, oov_std, seed),
                           lambda result, tmp: torch.save(vars(result), tmp),
                           lambda cached: VocabVectors(**torch.load(cached, weights_only=True)))
    return result


def _build_vectors(path: Path, vocab: Vocab, dim: int, oov_std: float,
                   seed: int) -> VocabVectors:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(len(vocab), dim, generator=generator) * oov_std  # (V, dim)
    found = torch.zeros(len(vocab), dtype=torch.bool)
    for word, vector in read_glove(path, dim, words=vocab.stoi):
        i = vocab.stoi[word]
        if not found[i]:  # the first line of a repeated word wins
            weight[i], found[i] = vector, True
    weight[vocab.pad_id], found[vocab.pad_id] = 0.0, False
    special = torch.tensor([t in vocab.specials for t in vocab.itos])
    result = VocabVectors(weight, found=int(found.sum()), oov=int((~found & ~special).sum()))
    words = int((~special).sum())  # the vocabulary's words (specials aside)
    hits = words - result.oov
    if words and not hits:
        raise DataFormatError(path, None, "vectors for the vocabulary's words (another "
                              "language, casing or tokenization?)", f"0 of {words} words found")
    low = hits < LOW_COVERAGE * words
    (log.warning if low else log.info)(
        "%s: %d of %d vocabulary words found, %d out of vocabulary (random N(0, %g))%s", path,
        hits, words, result.oov, oov_std ** 2,
        f"; fewer than {LOW_COVERAGE:.0%}: is it the right vectors file?" if low else "")
    return result
