"""One Billion Word Benchmark (Chelba et al. 2013): Differentiable Window Table 6
(decoder-only language modelling, perplexity).

Published layout (1-billion-word-language-modeling-benchmark-r13output.tar.gz)::

    training-monolingual.tokenized.shuffled/news.en-00001-of-00100 .. -00099-of-00100
    heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050 .. -00049-of-00050

one tokenized sentence per line, tokens separated by spaces.  (The heldout folder also
holds ``news.en-00000-of-00100``, the whole held-out part before it was cut into the 50
heldout shards; it is not read.)  Train reads training shards 1..``max_train_shards``
(None: all 99); validation and test read the heldout shards listed in ``val_shards`` and
``test_shards`` (defaults: shard 1 for validation and shard 0, the benchmark's usual test
set, for test).  Blank lines are skipped and counted in ``stats["blank_lines"]``.

Vocabulary: word level keeps words seen ``min_freq`` = 3 times or more, the benchmark's
own rule (793,471 words on the full training set); out-of-vocabulary words become <unk>.
With ``max_train_shards`` the vocabulary comes from those shards only.

Batches: ``tokens`` (B,L) = ``<s> w1 .. wn``, ``targets`` (B,L) = ``w1 .. wn </s>`` (the
tokens shifted by one), ``mask`` (B,L) True at real target positions.  ``max_len`` bounds
L: a longer sentence keeps its first ``max_len`` targets (and loses its ``</s>``), counted
in ``stats["truncated"]``.  Shards are read lazily on every pass (never held as words).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from datamodules.common import DataFormatError, pad, read_lines, record_data_seed
from datamodules.registry import url_of
from datamodules.text import Example, Reiterable, TextDataModule, Tokenization, split_tokens

TRAIN_DIR = "training-monolingual.tokenized.shuffled"
HELDOUT_DIR = "heldout-monolingual.tokenized.shuffled"
TRAIN_SHARDS = range(1, 100)
HELDOUT_SHARDS = range(0, 50)


def train_shard(root: str | Path, index: int) -> Path:
    if index not in TRAIN_SHARDS:
        raise ValueError(f"training shards are numbered 1-99, got {index}")
    return Path(root) / TRAIN_DIR / f"news.en-{index:05d}-of-00100"


def heldout_shard(root: str | Path, index: int) -> Path:
    if index not in HELDOUT_SHARDS:
        raise ValueError(f"heldout shards are numbered 0-49, got {index}")
    return Path(root) / HELDOUT_DIR / f"news.en.heldout-{index:05d}-of-00050"


def read_sentences(paths: Sequence[str | Path]) -> Iterator[list[str]]:
    """The tokens of every line of the shards, in order ([] for a blank line).  A shard
    without a sentence is a DataFormatError naming it (a truncated download, not a shard
    of no text)."""
    for path in paths:
        sentences = 0
        for _, text in read_lines(path):
            words = split_tokens(text)
            sentences += bool(words)
            yield words
        if not sentences:
            raise DataFormatError(path, None, "at least one sentence (one per line)")


def collate_lm(batch: Sequence[tuple[Tensor, None, int]], pad_id: int,
               bos_id: int) -> dict[str, Tensor]:
    """``tokens`` = <s> + targets[:-1], ``targets`` = w1..wn </s> (as stored), ``mask`` (B,L)
    True at real target positions, ``index`` (B,) each sentence's position in its split."""
    targets = [ids.long() for ids, _, _ in batch]
    inputs = [torch.cat([ids.new_tensor([bos_id]), ids[:-1]]) for ids in targets]
    tokens, mask = pad(inputs, pad_id)
    targets, _ = pad(targets, pad_id)
    return {"tokens": tokens, "targets": targets, "mask": mask,
            "index": torch.tensor([i for _, _, i in batch], dtype=torch.long)}


class LM1BDataModule(TextDataModule):
    """One Billion Word language modelling (see the module docstring)."""

    name = "lm1b"
    dataset = "lm1b"
    shared_subdir = "1-billion-word-language-modeling-benchmark-r13output"
    archive_url = url_of("lm1b")  # the r13output tar.gz (datamodules.fetch registry)
    archive_subdir = "1-billion-word-language-modeling-benchmark-r13output"
    append_eos = True

    def __init__(self, data_dir: str | None = None, max_train_shards: int | None = None,
                 val_shards: tuple[int, ...] = (1,), test_shards: tuple[int, ...] = (0,),
                 tokenization: Tokenization = "word", bpe_vocab_size: int = 32768,
                 min_freq: int = 3, max_vocab_size: int | None = None, lowercase: bool = False,
                 batch_size: int = 32, max_len: int | None = 256,
                 max_train_examples: int | None = None, num_workers: int = 0,
                 seed: int | None = None):
        if max_train_shards is not None and max_train_shards not in TRAIN_SHARDS:
            raise ValueError(f"max_train_shards must be 1-99 or None, got {max_train_shards}")
        super().__init__(data_dir, tokenization, bpe_vocab_size, min_freq, max_vocab_size,
                         lowercase, batch_size, max_len, max_train_examples, num_workers, seed)
        self.save_hyperparameters()
        record_data_seed(self, self.seed)
        self.shards = {"train": list(TRAIN_SHARDS[: max_train_shards or len(TRAIN_SHARDS)]),
                       "val": list(val_shards), "test": list(test_shards)}
        for split in ("val", "test"):
            for index in self.shards[split]:
                heldout_shard(self.data_dir, index)  # checks the number
        self.stats["blank_lines"] = {}

    def split_files(self, split: str) -> list[Path]:
        shard = train_shard if split == "train" else heldout_shard
        return [shard(self.data_dir, index) for index in self.shards[split]]

    def read_examples(self, split: str, limit: int | None = None) -> Reiterable:
        paths = self.split_files(split)

        def sentences() -> Iterator[Example]:
            self.stats["blank_lines"][split] = 0  # counted again on every pass
            for words in read_sentences(paths):
                if words:
                    yield words, None
                else:
                    self.stats["blank_lines"][split] += 1

        return Reiterable(sentences)

    @property
    def bos_id(self) -> int:
        return self.tokenizer.bos_id

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    def collate_fn(self):
        return partial(collate_lm, pad_id=self.pad_id, bos_id=self.bos_id)
