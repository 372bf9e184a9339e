"""What every DataModule shares: where data lives, format errors that name file and line,
the one checked way to read a file (:func:`open_data`, :func:`read_lines`,
:func:`read_text`: a missing, unreadable or directory path and bytes that are not UTF-8
each a DataFormatError; :func:`nonempty`: an empty file too), the check of size arguments
(:func:`check_sizes`), vocabularies, padding, length bucketing and the download-or-explain
step.

One implementation of each; the dataset modules only parse their formats.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

# where data lives and how it is downloaded: datamodules/fetch.py (torch-free), re-exported
from datamodules.fetch import PROJECT_ROOT, cache_root, shared_data_dir  # noqa: F401
from fileio import write_atomic

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
T = TypeVar("T")


def cache_dir() -> Path:
    """Where built vocabularies, BPE models and tensors are cached ($ATTNREPRO_CACHE)."""
    path = cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


class DataFormatError(ValueError):
    """A malformed input: the message names the file, the line and what was expected."""

    def __init__(self, path: str | os.PathLike, line: int | None, expected: str, got: str = ""):
        where = f"{path}:{line}" if line is not None else str(path)
        got = got if len(got) <= 120 else got[:117] + "..."
        super().__init__(f"{where}: expected {expected}" + (f", got {got!r}" if got else ""))
        self.path, self.line = str(path), line


class MissingDataFile(DataFormatError, FileNotFoundError):
    """A data file that is not there: one line from the command like any DataFormatError,
    and still a FileNotFoundError for the code that asks for one."""


def check_sizes(owner: str, least: int = 1, hint: str = "", **sizes: int | None) -> None:
    """Refuse, when a DataModule is built, every size below ``least`` (None: not set): a
    batch size of 0 or a negative length would otherwise pass until the first batch is
    drawn, deep inside a loader.  The ValueError names the class, the argument and the
    value, which the command prints as its one line (``invalid configuration: ...``)."""
    for name, value in sizes.items():
        if value is not None and value < least:
            raise ValueError(f"{owner}: {name} must be at least {least}{hint}, got {value}")


def require_file(path: str | os.PathLike, what: str, how: str = "") -> Path:
    """The path if it exists, else a FileNotFoundError that says what it is and how to get it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} not found at {path}" + (f". {how}" if how else ""))
    return path


def open_data(path: str | os.PathLike, what: str = "a file") -> BinaryIO:
    """``path`` opened for reading bytes: the one place every reader opens its files, so a
    missing file, a directory and a file this process may not read each end in one
    DataFormatError naming the path (not an OSError traceback)."""
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise DataFormatError(path, None, f"{what}, not a directory") from None
    except FileNotFoundError:
        raise MissingDataFile(path, None, f"{what} (there is none at this path)") from None
    except PermissionError:
        raise DataFormatError(path, None, f"{what} this process may read (permission "
                              "denied)") from None
    except OSError as err:
        raise DataFormatError(path, None, f"{what} that can be read ({err.strerror})") from None


def _undecodable(path: str | os.PathLike, line: int, raw: bytes) -> DataFormatError:
    return DataFormatError(path, line, "UTF-8 text", repr(raw[:60]))


def read_lines(path: str | os.PathLike, what: str = "a file",
               keepends: bool = False) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline, or with it: ``keepends``) of a UTF-8
    text file; bytes that are not UTF-8 are a DataFormatError naming the file and line, and
    a file that cannot be opened one naming the file (:func:`open_data`; ``what`` it should
    be)."""
    with open_data(path, what) as f:
        for number, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _undecodable(path, number, raw) from None
            yield number, text if keepends else text.rstrip("\r\n")


def read_text(path: str | os.PathLike, what: str = "a file") -> str:
    """The whole of a UTF-8 text file (formats that are not read line by line), with the
    errors of :func:`read_lines`: undecodable bytes are reported at their line."""
    with open_data(path, what) as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        start = raw.rfind(b"\n", 0, err.start) + 1
        end = raw.find(b"\n", err.start)
        line = raw[start:] if end < 0 else raw[start:end + 1]
        raise _undecodable(path, raw.count(b"\n", 0, err.start) + 1, line) from None


def nonempty(items: Iterable[T], path: str | os.PathLike, expected: str) -> Iterator[T]:
    """``items`` (what a reader read from ``path``) passed on; none at all is a
    DataFormatError naming the file: an empty file is never a split of zero examples."""
    empty = True
    for item in items:
        empty = False
        yield item
    if empty:
        raise DataFormatError(path, None, expected)


def json_records(path: str | os.PathLike, what: str) -> Iterator[tuple[int, str, dict]]:
    """(line number, line, object) of every non-blank line of a JSON Lines file; a line that
    is not a JSON object is a DataFormatError naming file, line and ``what`` was expected."""
    for number, line in read_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataFormatError(path, number, what, f"invalid JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise DataFormatError(path, number, what, line)
        yield number, line, record


class Vocab:
    """Token <-> id.  Specials come first, in the given order; ``unk`` maps unknown tokens
    (None: unknown tokens are an error)."""

    def __init__(self, tokens: Sequence[str], specials: Sequence[str] = (PAD, UNK, BOS, EOS),
                 unk: str | None = UNK):
        self.itos: list[str] = list(dict.fromkeys([*specials, *tokens]))
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}
        self.specials = tuple(specials)
        if unk is not None and unk not in self.stoi:
            raise ValueError(f"unk token {unk!r} is not among the specials {specials}")
        self.unk = unk

    @classmethod
    def build(cls, sequences: Iterable[Sequence[str]], min_freq: int = 1,
              max_size: int | None = None, **kwargs) -> Vocab:
        """From token sequences: most frequent first (ties by first appearance)."""
        counts = Counter(t for seq in sequences for t in seq)
        tokens = [t for t, c in counts.most_common() if c >= min_freq]
        return cls(tokens[:max_size] if max_size else tokens, **kwargs)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __getitem__(self, token: str) -> int:
        if token in self.stoi:
            return self.stoi[token]
        if self.unk is None:
            raise KeyError(f"token {token!r} is not in the vocabulary and there is no unk")
        return self.stoi[self.unk]

    @property
    def pad_id(self) -> int:
        return self.stoi[PAD]

    def encode(self, tokens: Iterable[str], bos: bool = False, eos: bool = False) -> list[int]:
        ids = [self[t] for t in tokens]
        return ([self.stoi[BOS]] if bos else []) + ids + ([self.stoi[EOS]] if eos else [])

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> list[str]:
        out = []
        for i in ids:
            token = self.itos[int(i)]
            if token == EOS and strip_specials:
                break
            if not (strip_specials and token in self.specials):
                out.append(token)
        return out

    def save(self, path: str | os.PathLike) -> None:
        write_atomic(path, json.dumps({"itos": self.itos, "specials": self.specials,
                                       "unk": self.unk}))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        d = json.loads(Path(path).read_text())
        vocab = cls(d["itos"][len(d["specials"]):], specials=d["specials"], unk=d["unk"])
        return vocab


class VocabLinks:
    """What the models are linked to from a DataModule's vocabulary (mixed in before
    ``LightningDataModule``): ``vocab``, ``self._vocab`` once ``setup`` has built it (asked
    before, it runs ``setup``), ``vocab_size`` and ``pad_id``."""

    _vocab: Vocab | None = None

    @property
    def vocab(self) -> Vocab:
        if self._vocab is None:
            self.setup()
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def pad_id(self) -> int:
        return self.vocab.pad_id


def settings_key(**settings) -> str:
    """A short stable hash of settings, for cache file names."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:12]


def pad(seqs: Sequence[Sequence[int]], pad_id: int, min_len: int = 1) -> tuple[Tensor, Tensor]:
    """(B, L) ids and (B, L) mask (True = real token) from lists of ids."""
    length = max([min_len, *(len(s) for s in seqs)])
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs])
    return ids, torch.arange(length)[None, :] < lengths[:, None]


def seq2seq_batch(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                  pad_id: int, index: Tensor) -> dict[str, Tensor]:
    """The batch every seq2seq model reads (lit_models.seq2seq) from source ids and target
    ids framed as ``<s> ... </s>``: ``src``, ``src_mask``, ``tgt_in`` (= <s> ...),
    ``tgt_out`` (= ... </s>), ``tgt_mask`` and ``index``, each example's position in its
    split."""
    src, src_mask = pad(sources, pad_id)
    tgt, tgt_mask = pad(targets, pad_id)
    return {"src": src, "src_mask": src_mask, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:],
            "tgt_mask": tgt_mask[:, 1:], "index": index}


def data_seed(seed: int | None) -> int:
    """The data-order seed of a DataModule: ``seed`` when given, else the run's seed
    (``seed_everything``'s, which Lightning keeps in ``PL_GLOBAL_SEED``), else 0.  So one
    seed drives initialisation, dropout and the batch order unless a data seed is set on its
    own (``--data.seed N``); DataModules record the seed they use in their hyper-parameters
    (``seed``, logged with the run)."""
    if seed is not None:
        return int(seed)
    return int(os.environ.get("PL_GLOBAL_SEED", "0"))


def record_data_seed(module, seed: int) -> None:
    """Put the data seed in use into a DataModule's hyper-parameters, those the loggers get
    included (``hparams_initial``): under LightningCLI ``save_hyperparameters`` stores the
    parsed arguments (``seed: null``), not the resolved seed."""
    module.hparams["seed"] = seed
    initial = getattr(module, "_hparams_initial", None)
    if initial is not None:
        initial["seed"] = seed


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of indices of similar length (less padding), in a shuffled order per epoch.

    Indices are sorted by length inside pools of ``pool`` batches, cut into batches and the
    batches shuffled; with ``shuffle=False`` batches follow the length order (deterministic
    evaluation).  With several processes each takes every ``num_replicas``-th batch.  In
    training (``shuffle``) the batch count is padded to a multiple of ``num_replicas`` by
    repeating batches, so every rank runs the same number of steps (DDP synchronises their
    gradients); in evaluation nothing is repeated, so metrics gathered from the ranks count
    every example exactly once (ranks may then run one batch more than others; with fewer
    batches than ranks the batches are cut smaller so that every rank has one, and only with
    fewer examples than ranks are some repeated).
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, shuffle: bool = True,
                 seed: int = 0, pool: int = 50, drop_last: bool = False,
                 num_replicas: int = 1, rank: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.lengths, self.batch_size, self.shuffle = list(lengths), batch_size, shuffle
        self.seed, self.pool, self.drop_last = seed, pool, drop_last
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches already taken)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, batches: int) -> None:
        """The next pass over epoch ``epoch`` skips its first ``batches`` batches: those a
        run had trained on when its checkpoint was saved (:class:`ResumableLoader`)."""
        if batches < 0:
            raise ValueError(f"cannot skip {batches} batches")
        self._resume = (epoch, batches)

    def _batches(self) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        rng = random.Random(self.seed + self.epoch)
        if self.shuffle:
            rng.shuffle(order)
        pool_size = self.pool * self.batch_size
        batches = []
        for start in range(0, len(order), pool_size):
            chunk = sorted(order[start:start + pool_size], key=lambda i: self.lengths[i])
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            rng.shuffle(batches)
        if self.num_replicas > 1:
            if not self.shuffle and len(batches) < self.num_replicas <= len(order):
                # fewer batches than processes: smaller ones, so that no process has none
                order = [i for b in batches for i in b]
                size = math.ceil(len(order) / self.num_replicas)
                batches = [order[i:i + size] for i in range(0, len(order), size)]
            if self.shuffle or len(batches) < self.num_replicas:  # (fewer examples than ranks)
                total = math.ceil(len(batches) / self.num_replicas) * self.num_replicas
                batches += batches[: total - len(batches)]
            batches = batches[self.rank::self.num_replicas]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        # Lightning calls set_epoch before every epoch, so each epoch has its own order
        batches = self._batches()
        if self._resume is not None and self._resume[0] == self.epoch:
            batches = batches[self._resume[1]:]
            self._resume = None
        yield from batches

    def __len__(self) -> int:
        if not hasattr(self, "_len"):  # the count does not depend on the order
            self._len = len(self._batches())
        return self._len


class ResumableLoader(DataLoader):
    """A DataLoader over a :class:`BucketBatchSampler` that Lightning can resume in the
    middle of an epoch: its ``state_dict`` (saved in every checkpoint) is the epoch and the
    number of batches the training loop had processed in it, and ``load_state_dict`` makes
    the next pass over that epoch skip them, so a resumed run trains on exactly the batches
    the uninterrupted run would have.  Without a trainer the count is of the batches this
    loader handed out."""

    def __init__(self, *args, trainer: Any = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._trainer, self._handed_out = trainer, 0

    def __iter__(self):
        self._handed_out = 0
        for batch in super().__iter__():
            self._handed_out += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        loop = getattr(getattr(self._trainer, "fit_loop", None), "epoch_loop", None)
        # batches trained on this epoch (the fetcher may already hold the next one)
        taken = loop.batch_progress.current.processed if loop is not None else self._handed_out
        return {"epoch": self.batch_sampler.epoch, "batches": int(taken)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batch_sampler.resume(int(state["epoch"]), int(state["batches"]))


def bucketed_loader(dataset: Dataset, lengths: Sequence[int], batch_size: int,
                    collate_fn: Callable[[list], Any], shuffle: bool, seed: int = 0,
                    num_workers: int = 0, trainer: Any = None) -> DataLoader:
    """The one DataLoader of every DataModule: :class:`BucketBatchSampler` batches of
    ``dataset`` by ``lengths`` (any sort key), each of ``trainer``'s processes taking its
    share (so the trainer wants ``use_distributed_sampler=False``; no trainer: one process),
    worker processes kept from one epoch to the next, resumable mid-epoch
    (:class:`ResumableLoader`).  The loader draws its worker seeds from a generator of its
    own (seeded by ``seed``), never from torch's global one, so creating a loader (as
    validation does between two training steps) leaves the dropout stream alone."""
    replicas, rank = (trainer.world_size, trainer.global_rank) if trainer else (1, 0)
    sampler = BucketBatchSampler(lengths, batch_size, shuffle=shuffle, seed=seed,
                                 num_replicas=replicas, rank=rank)
    return ResumableLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn,
                           num_workers=num_workers, persistent_workers=num_workers > 0,
                           generator=torch.Generator().manual_seed(seed), trainer=trainer)
