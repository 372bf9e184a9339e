"""Mathematical Language Understanding (Wangperawong 2018; CoDA Table 6).

A character-level transduction task.  Each problem assigns two integer variables x and y
(each in [-1000, 1000), assigned in random order) and asks for one expression of two
operands drawn from {x, y} (the same variable may repeat) with an operator from
{+, -, *}; the target is the integer value.  The published training file has one
``problem:answer`` per line, e.g. ``y=691,x=-999,y*x:-690309`` (data/mlu/examples.txt).

The 12M-problem file is not available here, so :func:`generate` draws problems from the
documented distribution (deterministic by seed).  Each problem's split is a function of
the problem string alone (a hash), so train, validation and test are disjoint by problem
string for every seed and size.  :func:`read_problems` reads the published format.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from datamodules.common import (
    BOS,
    EOS,
    PAD,
    UNK,
    DataFormatError,
    Vocab,
    VocabLinks,
    bucketed_loader,
    check_sizes,
    data_seed,
    read_lines,
    record_data_seed,
    require_file,
    seq2seq_batch,
)

LOW, HIGH = -1000, 1000  # each variable in [LOW, HIGH)
OPERATORS = "+-*"
SPLITS = ("train", "val", "test")
# share of the problem space per split (the published data is split about 9:1 train:test)
SPLIT_SHARES = {"train": 0.9, "val": 0.05, "test": 0.05}
CHARACTERS = "0123456789-+*=,xy"

PROBLEM = re.compile(r"^([xy])=(-?\d+),([xy])=(-?\d+),([xy])([-+*])([xy])$")
ANSWER = re.compile(r"^-?\d+$")


@dataclass(frozen=True)
class Problem:
    problem: str  # e.g. "x=85,y=-523,x*y"
    answer: str  # e.g. "-44455"


def evaluate(problem: str) -> int:
    """The value of a problem string; ValueError if it is not of the MLU form."""
    m = PROBLEM.match(problem)
    if not m or m.group(1) == m.group(3):
        raise ValueError(f"not an MLU problem: {problem!r}")
    values = {m.group(1): int(m.group(2)), m.group(3): int(m.group(4))}
    a, op, b = values[m.group(5)], m.group(6), values[m.group(7)]
    return a + b if op == "+" else a - b if op == "-" else a * b


def split_of(problem: str) -> str:
    """The split a problem belongs to, by a stable hash of its string."""
    u = int.from_bytes(hashlib.blake2b(problem.encode(), digest_size=8).digest(), "big") / 2**64
    if u < SPLIT_SHARES["train"]:
        return "train"
    return "val" if u < SPLIT_SHARES["train"] + SPLIT_SHARES["val"] else "test"


def draw(rng: random.Random) -> Problem:
    """One problem from the documented distribution."""
    values = {"x": rng.randrange(LOW, HIGH), "y": rng.randrange(LOW, HIGH)}
    first, second = rng.sample(["x", "y"], 2)  # assignment order
    a, b, op = rng.choice("xy"), rng.choice("xy"), rng.choice(OPERATORS)
    problem = f"{first}={values[first]},{second}={values[second]},{a}{op}{b}"
    return Problem(problem, str(evaluate(problem)))


def generate(sizes: dict[str, int], seed: int = 0) -> dict[str, list[Problem]]:
    """Unique problems per split, ``sizes[split]`` of each, deterministic by seed.
    A problem drawn for a split that is already full is skipped (so bigger sizes extend
    smaller ones: the first n problems of a split do not depend on the other sizes)."""
    unknown = set(sizes) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown MLU splits {sorted(unknown)}; expected {SPLITS}")
    rngs = {s: random.Random(f"mlu-{seed}-{s}") for s in sizes}
    out: dict[str, list[Problem]] = {}
    for split, size in sizes.items():
        seen: set[str] = set()
        problems = []
        while len(problems) < size:
            p = draw(rngs[split])
            if p.problem not in seen and split_of(p.problem) == split:
                seen.add(p.problem)
                problems.append(p)
        out[split] = problems
    return out


def read_problems(path: str | Path) -> list[Problem]:
    """The published ``problem:answer`` format, one per line; every answer is checked, and
    so is the documented range of the two values ([-1000, 1000))."""
    problems = []
    expected = "'<x|y>=<int>,<y|x>=<int>,<x|y><+|-|*><x|y>:<int>'"
    path = require_file(path, "MLU problem file")
    for number, line in read_lines(path, "a problem file"):
        if not line.strip():
            continue
        problem, sep, answer = line.rpartition(":")
        if not sep or not ANSWER.match(answer):
            raise DataFormatError(path, number, expected, line)
        try:
            value = evaluate(problem)
        except ValueError:
            raise DataFormatError(path, number, expected, line) from None
        m = PROBLEM.match(problem)
        for v in (int(m.group(2)), int(m.group(4))):
            if not LOW <= v < HIGH:
                raise DataFormatError(path, number, f"values in [{LOW}, {HIGH})", str(v))
        if value != int(answer):
            raise DataFormatError(path, number, f"answer {value} for {problem!r}", answer)
        problems.append(Problem(problem, answer))
    if not problems:
        raise DataFormatError(path, None, "at least one problem line")
    return problems


def char_vocab() -> Vocab:
    """The character vocabulary shared by problems and answers."""
    return Vocab(list(CHARACTERS), specials=(PAD, UNK, BOS, EOS), unk=None)


class MLUDataset(Dataset):
    def __init__(self, problems: list[Problem], vocab: Vocab):
        self.problems = problems
        self.src = [vocab.encode(p.problem) for p in problems]
        self.tgt = [vocab.encode(p.answer, bos=True, eos=True) for p in problems]

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, i: int) -> int:
        return i


class MLUDataModule(VocabLinks, L.LightningDataModule):
    """Batches: src (B,Ls), src_mask, tgt_in (B,Lt) = <s> answer, tgt_out = answer </s>,
    tgt_mask, index.

    Args:
        train_size, val_size, test_size: problems generated per split.
        generator_seed: generator seed (the splits stay disjoint for every seed); fixed, so every
            training seed sees the same problems.
        seed: the batch-order seed (None: the run's seed, datamodules.common.data_seed).
        train_file, val_file, test_file: read published ``problem:answer`` files instead of
            generating that split.
    """

    dataset = "mlu"  # the datamodules.registry entry (nothing to download)

    def __init__(self, train_size: int = 100_000, val_size: int = 2_000, test_size: int = 10_000,
                 generator_seed: int = 0, seed: int | None = None, batch_size: int = 64,
                 eval_batch_size: int = 512,
                 train_file: str | None = None, val_file: str | None = None,
                 test_file: str | None = None, num_workers: int = 0):
        super().__init__()
        owner = type(self).__name__
        for split, size, file in (("train", train_size, train_file), ("val", val_size, val_file),
                                  ("test", test_size, test_file)):
            if file is None:
                check_sizes(owner, hint=f" (or give {split}_file)", **{f"{split}_size": size})
        check_sizes(owner, batch_size=batch_size, eval_batch_size=eval_batch_size)
        check_sizes(owner, least=0, num_workers=num_workers)
        self.save_hyperparameters()
        record_data_seed(self, data_seed(seed))
        self._vocab = char_vocab()
        self.datasets: dict[str, MLUDataset] = {}

    # properties the models are linked to (and vocab_size, pad_id: VocabLinks)
    @property
    def bos_id(self) -> int:
        return self.vocab.stoi[BOS]

    @property
    def eos_id(self) -> int:
        return self.vocab.stoi[EOS]

    def decode(self, ids) -> str:
        """Ids -> the characters they spell, up to ``</s>``, without special tokens (the form
        of a problem's answer: the per-example predictions file shows it)."""
        return "".join(self.vocab.decode(ids))

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        hp = self.hparams
        files = {"train": hp.train_file, "val": hp.val_file, "test": hp.test_file}
        sizes = {"train": hp.train_size, "val": hp.val_size, "test": hp.test_size}
        generated = generate({s: n for s, n in sizes.items() if not files[s]},
                             seed=hp.generator_seed)
        for split in SPLITS:
            problems = read_problems(files[split]) if files[split] else generated[split]
            self.datasets[split] = MLUDataset(problems, self.vocab)

    def collate(self, dataset: MLUDataset, indices: list[int]) -> dict:
        return seq2seq_batch([dataset.src[i] for i in indices],
                             [dataset.tgt[i] for i in indices], self.pad_id,
                             torch.tensor(indices))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        ds = self.datasets[split]
        bs = self.hparams.batch_size if shuffle else self.hparams.eval_batch_size
        return bucketed_loader(ds, [len(s) + len(t) for s, t in zip(ds.src, ds.tgt)], bs,
                               partial(self.collate, ds), shuffle=shuffle, seed=self.hparams.seed,
                               num_workers=self.hparams.num_workers, trainer=self.trainer)

    def train_dataloader(self):
        return self._loader("train", True)

    def val_dataloader(self):
        return self._loader("val", False)

    def test_dataloader(self):
        return self._loader("test", False)
