"""IMDb Large Movie Review Dataset v1.0 (Maas et al. 2011): CoDA Table 5 and Differentiable
Window Table 5 (document classification).

Published layout (aclImdb_v1.tar.gz)::

    aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt   one review per file
    aclImdb/train/unsup/<id>_0.txt                      50,000 unlabelled reviews
    (plus imdb.vocab, imdbEr.txt, *Bow.feat and urls_*.txt, not read here)

Label: the folder, neg = 0, pos = 1.  Rating: the file name, 1-4 in neg/, 7-10 in pos/
(the README: neutral ratings are not in the labelled sets), 0 in unsup/; anything else is
a DataFormatError naming the file.

Text: the reviews are raw text with HTML line breaks; every ``<br />`` (also written
``<br>``, ``<br/>``, any case) is replaced by a space before tokenising, because it is
markup, not words (spaCy would cut it into '<', 'br', '/><br', '/>').  Other text is kept
as written.  Words: spaCy's blank English tokenizer (then BPE or a word vocabulary).

Splits: test is aclImdb/test (25,000).  Validation is carved off aclImdb/train: the
25,000 reviews are shuffled by ``val_seed`` (fixed by default, so every training seed
sees the same validation set) and the first ``round(val_fraction * 25,000)`` are
validation; train keeps the rest in that shuffled order, so a ``max_train_examples``
prefix holds both labels.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from datamodules.common import DataFormatError, read_text, record_data_seed, require_file
from datamodules.registry import url_of
from datamodules.text import Example, TextClassificationDataModule, Tokenization, spacy_tokenize

LABELS = ("negative", "positive")
FOLDERS = {"neg": (0, range(1, 5)), "pos": (1, range(7, 11)), "unsup": (None, range(0, 1))}

_FILE_NAME = re.compile(r"^(\d+)_(\d+)\.txt$")
_LINE_BREAK = re.compile(r"<br\s*/?\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class Review:
    text: str  # line breaks replaced by spaces
    label: int | None  # 0 negative, 1 positive, None unlabelled
    rating: int  # stars out of 10 (0: unlabelled)
    id: int
    path: Path


def read_review(path: Path, folder: str) -> Review:
    """One review file of aclImdb/<split>/<folder>/."""
    label, ratings = FOLDERS[folder]
    m = _FILE_NAME.match(path.name)
    if not m:
        raise DataFormatError(path, None, "a review file named <id>_<rating>.txt", path.name)
    rating = int(m.group(2))
    if rating not in ratings:
        raise DataFormatError(path, None, f"a rating {ratings.start}-{ratings.stop - 1} "
                              f"in {folder}/", str(rating))
    text = _LINE_BREAK.sub(" ", read_text(path, "a review file")).strip()
    if not text:
        raise DataFormatError(path, None, "a non-empty review")
    return Review(text, label, rating, int(m.group(1)), path)


def _listing(directory: Path) -> list[Path]:
    """The entries of a review folder; a file in its place or a folder this process may not
    list is a DataFormatError naming it."""
    try:
        return list(directory.iterdir())
    except NotADirectoryError:
        raise DataFormatError(directory, None, "a folder of review files, not a file") from None
    except PermissionError:
        raise DataFormatError(directory, None, "a folder this process may list (permission "
                              "denied)") from None


def read_aclimdb(root: str | Path, split: Literal["train", "test"],
                 folders: tuple[str, ...] = ("neg", "pos")) -> list[Review]:
    """The reviews of aclImdb/<split>/<folder>/ for each folder (neg, pos, unsup), each folder
    in order of review id."""
    if split not in ("train", "test"):
        raise ValueError(f"aclImdb splits are 'train' and 'test', got {split!r}")
    reviews = []
    for folder in folders:
        if folder not in FOLDERS:
            raise ValueError(f"aclImdb folders are {tuple(FOLDERS)}, got {folder!r}")
        directory = require_file(Path(root) / split / folder, f"aclImdb {split}/{folder} folder")
        found = [read_review(path, folder) for path in _listing(directory) if path.is_file()]
        if not found:
            raise DataFormatError(directory, None, "review files <id>_<rating>.txt", "none")
        reviews += sorted(found, key=lambda r: r.id)
    return reviews


def carve_validation(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) indices of ``n`` items: a ``seed``-shuffled order, the first
    ``round(fraction * n)`` for validation."""
    if not 0 <= fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {fraction}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    cut = round(fraction * n)
    return order[cut:], order[:cut]


class IMDbDataModule(TextClassificationDataModule):
    """IMDb sentiment (see the module docstring for the layout, ``<br />`` and the
    validation split).  Tokenisation defaults to BPE, as in CoDA's tiny Transformer."""

    name = "imdb"
    dataset = "imdb"
    shared_subdir = "imdb/aclImdb"
    archive_url = url_of("imdb")  # aclImdb_v1.tar.gz (datamodules.fetch registry)
    archive_subdir = "aclImdb"
    labels = LABELS

    def __init__(self, data_dir: str | None = None, val_fraction: float = 0.1, val_seed: int = 0,
                 tokenization: Tokenization = "bpe", bpe_vocab_size: int = 8192,
                 min_freq: int = 1, max_vocab_size: int | None = None, lowercase: bool = False,
                 batch_size: int = 32, max_len: int | None = 512,
                 max_train_examples: int | None = None, num_workers: int = 0,
                 seed: int | None = None):
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        super().__init__(data_dir, tokenization, bpe_vocab_size, min_freq, max_vocab_size,
                         lowercase, batch_size, max_len, max_train_examples, num_workers, seed)
        self.save_hyperparameters()
        record_data_seed(self, self.seed)
        self.val_fraction, self.val_seed = val_fraction, val_seed
        self.ratings: dict[str, list[int]] = {}  # per split, aligned with the examples

    def split_files(self, split: str) -> list[Path]:
        if split == "val" and self.val_fraction == 0:
            return []  # no validation split
        source = "test" if split == "test" else "train"
        return [self.data_dir / source / folder for folder in ("neg", "pos")]

    def reviews(self, split: str) -> list[Review]:
        """The split's reviews in example order."""
        if split == "test":
            return read_aclimdb(self.data_dir, "test")
        reviews = read_aclimdb(self.data_dir, "train")
        train, val = carve_validation(len(reviews), self.val_fraction, self.val_seed)
        return [reviews[i] for i in (train if split == "train" else val)]

    def read_examples(self, split: str, limit: int | None = None) -> list[Example]:
        reviews = self.reviews(split)[:limit]
        self.ratings[split] = [r.rating for r in reviews]
        words = spacy_tokenize(r.text for r in reviews)
        return [(w, r.label) for w, r in zip(words, reviews, strict=True)]
