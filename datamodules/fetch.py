"""Getting the data: one download-and-cache layer for every DataModule, and its command.

A registry (:data:`DATASETS`) names, per dataset, the official URL(s), the file each download
gives, the folder it goes to under the data root and, where one is published, the sha256 of
each download (None: unknown, so not verified; the field is there for maintainers to fill
in).  What every DataModule's ``prepare_data`` calls (:func:`ensure`):

- files already there are never downloaded again; a missing one is downloaded from the
  registry's URL (the DataModule's ``url`` / ``archive_url`` when it names another one);
- streaming download with a progress bar (tqdm, else a line every few seconds), resumed
  from ``<name>.part`` (an HTTP Range request) and renamed to ``<name>`` only when complete;
- sha256 (and size) checked where known: a mismatch deletes the partial file and raises
  :class:`ChecksumError`;
- archives (zip, tar.gz, gz) are unpacked into the dataset's folder and kept next to it;
- a lock (``fcntl.flock`` on ``.<name>.lock`` beside the file) held while downloading and
  unpacking, so two DDP ranks or two grid cells never download the same file twice: the
  second waits, then finds the files there;
- offline, or when a URL fails: ONE :class:`DownloadError` (a FileNotFoundError) naming the
  dataset, the URL and the exact local path where to put the file by hand.

The data root is ``--data_dir``, else ``$ATTNREPRO_DATA``, else ``../shared/data`` beside the
project (:func:`shared_data_dir`, the DataModules' default).  Each dataset has its folder
there, the one its DataModule reads by default (``snli``, ``aclImdb``, ``iwslt15_en_vi``...).

Command::

    python -m datamodules.fetch <dataset|all> [...] [--data_dir DIR]   # download and unpack
    python -m datamodules.fetch --status [<dataset|all> ...] [--data_dir DIR]

The status gives, per dataset and file: ``present`` (sha256 verified), ``unverified`` (present,
no sha256 known), ``missing`` or ``corrupt`` (sha256 mismatch); files unpacked from an archive
or made by hand carry no checksum of their own (``present`` = the file exists).

This module imports neither torch nor the DataModules, so the command starts fast; the
DataModules import it.  Experiment code calls :func:`prepare` on a DataModule before
anything reads its files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.client
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import fileio
from fileio import lock_path

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1 << 16


def shared_data_dir() -> Path:
    """The real published data beside the project (``../shared/data``), or $ATTNREPRO_DATA."""
    return Path(os.environ.get("ATTNREPRO_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def data_root(data_dir: str | os.PathLike | None = None) -> Path:
    """Where the datasets' folders are: ``data_dir`` if given, else :func:`shared_data_dir`."""
    return Path(data_dir) if data_dir is not None else shared_data_dir()


# ---------------------------------------------------------------------------------- errors

class FetchError(Exception):
    """Getting data failed; the message is one line meant for the user (no traceback)."""


class DownloadError(FetchError, FileNotFoundError):
    """A download failed (offline, a dead URL, an unwritable folder): names the dataset, the
    URL and the local path to put the file at by hand."""


class ChecksumError(FetchError, ValueError):
    """A downloaded file does not have the registry's sha256 (or size); it was deleted."""


# -------------------------------------------------------------------------------- registry

HF_SHA = "sha256 as published by HF datasets (dataset_infos.json)"


@dataclass(frozen=True)
class Download:
    """One file to download.

    ``name``: the local file name in the dataset's folder (default: the URL's last part).
    ``archive``: unpack it after download (zip, tar, tar.gz or gz) into the dataset's folder:
    keeping its layout, or only the contents of its folder ``strip``, or only ``members``
    ((member, local path) pairs).  ``provides``: the files (or folders) relative to the
    dataset's folder that the download gives (default: ``name`` for a plain file).
    ``sha256`` / ``size``: of the download, where known (None: not verified)."""

    url: str
    name: str = ""
    sha256: str | None = None
    size: int | None = None
    archive: bool = False
    strip: str = ""
    members: tuple[tuple[str, str], ...] = ()
    provides: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", self.url.split("?")[0].rstrip("/").rsplit("/", 1)[1])
        if not self.provides:
            given = tuple(local for _, local in self.members) if self.members else (self.name,)
            object.__setattr__(self, "provides", given)


@dataclass(frozen=True)
class Dataset:
    """A registry entry: where the dataset's files go (``folder`` under the data root, the
    default folder of its DataModule), the downloads that give them and the files no
    download gives (``manual``, with ``how_to_get``).  ``datamodules``: the classes that read
    it (by name; ``when`` picks among the entries of one class by its settings)."""

    key: str
    title: str
    folder: str
    downloads: tuple[Download, ...] = ()
    manual: tuple[str, ...] = ()
    how_to_get: str = ""
    checksums: str = "no sha256 published: unverified"
    datamodules: tuple[str, ...] = ()
    when: Callable[[Any], bool] | None = field(default=None, compare=False)

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of a complete folder (downloads unpacked, manual files)."""
        return tuple(p for d in self.downloads for p in d.provides) + self.manual

    def provider(self, relative: str) -> int | None:
        """The index of the download that gives ``relative`` (a posix path), or None."""
        for i, d in enumerate(self.downloads):
            if relative in d.provides:
                return i
        return None


def _splits(pattern: str, splits: Sequence[str], formats: Sequence[str] = ("",)) -> tuple:
    return tuple(pattern.format(split=s, fmt=f) for f in formats for s in splits)


STANFORD_NMT = "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/"
IWSLT_SHA = {  # (sha256, bytes) published by HF datasets (mt_eng_vietnamese)
    "train.en": ("c26dfeed74b6bf3752f5ca552f2412456f0de153f7c804df8717931fb3a5c78a", 13603614),
    "train.vi": ("707206edf2dc0280273952c7b70544ea8a1363aa69aaeb9d70514b888dc3067d", 18074646),
    "tst2012.en": ("b8fbcd0d4199d41276421d1f7228298df67dd9e2c5c134c2ee8cdf3ec27801e2", 140250),
    "tst2012.vi": ("01004078b3f36b0c46e81b65fc6851230b3c823405c76d1d82ef3b786b512ff0", 188396),
    "tst2013.en": ("3860ce60bc5b85d96cc2d3d580cf1bc9d62440e939c1b964676d3607c4e8f1df", 132264),
    "tst2013.vi": ("29af16842808da2812b8fd4d47fc05d082ba870e60ab7755090ad04b380994cd", 183855),
}
WMT14 = "http://www.statmt.org/wmt14/"
WMT16 = "http://data.statmt.org/wmt16/translation-task/"
LM1B = "1-billion-word-language-modeling-benchmark-r13output"
DROPBOX = "https://www.dropbox.com/s/"
ALGOLISP = {"train": "qhun6kml9yb2ui9", "dev": "aajkw83j2ps8bzx", "test": "f1x9ybkjpf371cp"}


def _wmt(key: str, year: str, pair: tuple[str, str], dev: str, test: str, dev_url: str,
         test_url: str, test_folder: str, train_how: str, datamodule: str,
         when: Callable[[Any], bool] | None = None) -> Dataset:
    """A WMT task: the dev and test SGML of both directions, taken flat out of the release's
    dev / test archives; the training text is assembled by hand (``manual``)."""
    a, b = pair
    dev_files = [f"{dev}-src.{a}.sgm", f"{dev}-ref.{b}.sgm", f"{dev}-src.{b}.sgm",
                 f"{dev}-ref.{a}.sgm"]
    if year == "16":  # WMT'16 names each direction apart: newsdev2016-enro-src.en.sgm
        dev_files = [f"{dev}-{a}{b}-src.{a}.sgm", f"{dev}-{a}{b}-ref.{b}.sgm",
                     f"{dev}-{b}{a}-src.{b}.sgm", f"{dev}-{b}{a}-ref.{a}.sgm"]
        test_files = [f.replace(dev, test) for f in dev_files]
    else:  # WMT'14 names the pair once: newstest2014-deen-src.en.sgm
        test_files = [f"{test}-{b}{a}-src.{a}.sgm", f"{test}-{b}{a}-ref.{b}.sgm",
                      f"{test}-{b}{a}-src.{b}.sgm", f"{test}-{b}{a}-ref.{a}.sgm"]
    return Dataset(
        key, f"WMT'{year} {a.title()}-{b.title()}: dev/test sets (training text: by hand)",
        key,
        (Download(dev_url, name=f"wmt{year}-dev.tgz", archive=True,
                  members=tuple((f"dev/{f}", f) for f in dev_files)),
         Download(test_url, name=f"wmt{year}-{test_url.rsplit('/', 1)[1]}", archive=True,
                  members=tuple((f"{test_folder}/{f}", f) for f in test_files))),
        manual=(f"train.{a}", f"train.{b}"), how_to_get=train_how,
        datamodules=(datamodule,), when=when)


DATASETS: dict[str, Dataset] = {d.key: d for d in [
    # ---- NLI (datamodules/nli.py): the archive unpacked as it is (snli/snli_1.0/...)
    Dataset("snli", "SNLI 1.0", "snli", (Download(
        "https://nlp.stanford.edu/projects/snli/snli_1.0.zip", archive=True,
        sha256="afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e",
        size=94550081,
        provides=_splits("snli_1.0/snli_1.0_{split}.{fmt}", ("train", "dev", "test"),
                         ("jsonl", "txt"))),), checksums=HF_SHA,
        datamodules=("SNLIDataModule",)),
    Dataset("multinli", "MultiNLI 1.0", "multinli_1.0", (Download(
        "https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip", archive=True,
        sha256="049f507b9e36b1fcb756cfd5aeb3b7a0cfcb84bf023793652987f7e7e0957822",
        size=226850426,
        provides=_splits("multinli_1.0/multinli_1.0_{split}.{fmt}",
                         ("train", "dev_matched", "dev_mismatched"), ("jsonl", "txt"))),),
        checksums=HF_SHA, datamodules=("MultiNLIDataModule",)),
    # HF datasets publish sha256 3fccd373...43d5 (14,174,621 bytes) for the same zip at
    # http://data.allenai.org.s3.amazonaws.com/downloads/SciTailV1.1.zip, not this URL
    Dataset("scitail", "SciTail 1.1", "SciTailV1.1", (Download(
        "https://ai2-public-datasets.s3.amazonaws.com/scitail/SciTailV1.1.zip", archive=True,
        provides=_splits("SciTailV1.1/tsv_format/scitail_1.0_{split}.tsv",
                         ("train", "dev", "test"))
        + _splits("SciTailV1.1/snli_format/scitail_1.0_{split}.txt",
                  ("train", "dev", "test"))),), datamodules=("SciTailDataModule",)),
    Dataset("dialogue_nli", "Dialogue NLI", "dialogue_nli",
            manual=_splits("dialogue_nli_{split}.jsonl", ("train", "dev", "test")),
            how_to_get="no direct URL: dialogue_nli.zip is on Google Drive (id "
                       "1WtbXCv3vPB5ql6w0FVDmAEMmWadbrCuG, https://wellecks.github.io/"
                       "dialogue_nli/); unzip it and put its .jsonl files in this folder",
            checksums="no download", datamodules=("DialogueNLIDataModule",)),
    # ---- ranking (datamodules/ranking.py)
    Dataset("wikiqa", "WikiQA, official release (format='tsv'; pass this folder as data_dir)",
            "wikiqa", (Download(
                "https://download.microsoft.com/download/E/5/F/"
                "E5FCFCEE-7005-4814-853D-DAA7C66507E0/WikiQACorpus.zip", archive=True,
                sha256="467c13f9e104552c0a9c16f41836ca8d89f9c0cc4b6e4355e104d5c3109ffa45",
                size=7094233,
                provides=_splits("WikiQACorpus/WikiQA-{split}.tsv", ("train", "dev", "test"))),),
            checksums=HF_SHA, datamodules=("WikiQADataModule",),
            when=lambda dm: getattr(dm, "format", "") == "tsv"),
    Dataset("wikiqa_filtered", "WikiQA, castorini's filtered version", "wikiqa/filtered",
            manual=tuple(f"{s}/{f}" for s in ("train", "dev", "test")
                         for f in ("a.toks", "b.toks", "sim.txt", "id.txt")),
            how_to_get="no official download: folder WikiQA/ of https://github.com/castorini/"
                       "data (clone it and copy train/, dev/, test/ here)",
            checksums="no download", datamodules=("WikiQADataModule",),
            when=lambda dm: getattr(dm, "format", "") == "filtered"),
    Dataset("trecqa", "TrecQA (jacana format)", "trecqa",
            manual=("TRAIN-ALL.xml", "TRAIN.xml", "DEV.xml", "TEST.xml"),
            how_to_get="no official download left: TrecQA/data/ of https://github.com/"
                       "castorini/data holds these files; copy them here",
            checksums="no download", datamodules=("TrecQADataModule",)),
    Dataset("ubuntu", "Ubuntu Dialogue Corpus v2 (pass this folder as data_dir)", "ubuntu",
            manual=("train.csv", "valid.csv", "test.csv"),
            how_to_get="no single download: build the v2 CSV files with https://github.com/"
                       "rkadlec/ubuntu-ranking-dataset-creator and put them here",
            checksums="no download", datamodules=("UbuntuDataModule",)),
    # ---- single-sequence text (datamodules/text.py): the archive's data folder's contents
    Dataset("imdb", "IMDb Large Movie Review Dataset v1.0", "aclImdb", (Download(
        "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz", archive=True,
        strip="aclImdb",
        sha256="c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe",
        size=84125825,
        provides=("README", "imdb.vocab", "train/neg", "train/pos", "train/unsup",
                  "test/neg", "test/pos")),), checksums=HF_SHA,
        datamodules=("IMDbDataModule",)),
    Dataset("sst", "Stanford Sentiment Treebank, PTB trees (format='ptb')", "sst_ptb", (Download(
        "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip", archive=True,
        strip="trees",
        sha256="5c613a4f673fc74097d523a2c83f38e0cc462984d847b82c7aaf36b01cbbbfcc",
        size=789539, provides=("train.txt", "dev.txt", "test.txt")),), checksums=HF_SHA,
        datamodules=("SSTDataModule",), when=lambda dm: getattr(dm, "format", "") == "ptb"),
    Dataset("sst2", "GLUE SST-2 (SSTDataModule format='glue')", "sst2_glue", (Download(
        "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip", archive=True, strip="SST-2",
        sha256="d67e16fb55739c1b32cdce9877596db1c127dc322d93c082281f64057c16deaa",
        size=7439277, provides=("train.tsv", "dev.tsv", "test.tsv")),), checksums=HF_SHA,
        datamodules=("SSTDataModule",), when=lambda dm: getattr(dm, "format", "") == "glue"),
    Dataset("sva", "Linzen et al. 2016 number prediction (rnn_agr_simple)",
            "linzen_agreement", (Download(
                "http://tallinzen.net/media/rnn_agreement/rnn_agr_simple.tar.gz", archive=True,
                strip="rnn_agr_simple",
                provides=("numpred.train", "numpred.val", "numpred.test")
                + tuple(f"numpred.test.{i}" for i in range(6))),),
            datamodules=("SVADataModule",)),
    Dataset("lm1b", "One Billion Word Benchmark (r13output)", LM1B, (Download(
        f"http://www.statmt.org/lm-benchmark/{LM1B}.tar.gz", archive=True, strip=LM1B,
        sha256="01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e",
        size=1792209805,
        provides=tuple(f"training-monolingual.tokenized.shuffled/news.en-{i:05d}-of-00100"
                       for i in range(1, 100))
        + tuple(f"heldout-monolingual.tokenized.shuffled/news.en.heldout-{i:05d}-of-00050"
                for i in range(50))),), checksums=HF_SHA, datamodules=("LM1BDataModule",)),
    # ---- translation (datamodules/translation.py)
    Dataset("iwslt15", "IWSLT'15 En-Vi, Stanford NMT release", "iwslt15_en_vi", tuple(
        Download(STANFORD_NMT + name, sha256=IWSLT_SHA.get(name, (None, None))[0],
                 size=IWSLT_SHA.get(name, (None, None))[1])
        for name in ("train.en", "train.vi", "tst2012.en", "tst2012.vi", "tst2013.en",
                     "tst2013.vi", "vocab.en", "vocab.vi")),
        checksums=HF_SHA + " (train, tst2012, tst2013); vocab files: unverified",
        datamodules=("IWSLT15DataModule",)),
    _wmt("wmt14_en_de", "14", ("en", "de"), "newstest2013", "newstest2014", WMT14 + "dev.tgz",
         WMT14 + "test-full.tgz", "test-full",
         "no single archive of the training text: build train.en / train.de (Europarl v7 + "
         "Common Crawl + News Commentary v9, raw, one sentence per line) as fairseq's "
         "examples/translation/prepare-wmt14en2de.sh downloads them, and put them here",
         "WMT14DataModule", when=lambda dm: "de" in (dm.source, dm.target)),
    _wmt("wmt14_en_fr", "14", ("en", "fr"), "newstest2013", "newstest2014", WMT14 + "dev.tgz",
         WMT14 + "test-full.tgz", "test-full",
         "no single archive of the training text: build train.en / train.fr (the WMT'14 "
         "En-Fr corpora, raw, one sentence per line) as fairseq's examples/translation/"
         "prepare-wmt14en2fr.sh downloads them, and put them here",
         "WMT14DataModule", when=lambda dm: "fr" in (dm.source, dm.target)),
    _wmt("wmt16_en_ro", "16", ("en", "ro"), "newsdev2016", "newstest2016", WMT16 + "dev.tgz",
         WMT16 + "test.tgz", "test",
         "no single archive of the training text: build train.en / train.ro (Europarl v8 + "
         "SETimes2, raw, one sentence per line) as rsennrich/wmt16-scripts' "
         "download_files.sh does, and put them here", "WMT16EnRoDataModule"),
    Dataset("algolisp", "AlgoLisp metaset3 (tensor2tensor's Dropbox files)", "algolisp", tuple(
        Download(f"{DROPBOX}{ALGOLISP[s]}/metaset3.{s}.jsonl.gz?dl=1", archive=True,
                 provides=(f"metaset3.{s}.jsonl",)) for s in ("train", "dev", "test")),
        datamodules=("AlgoLispDataModule",)),
    # ---- word vectors (datamodules/glove.py; NLI and ranking DataModules' ``vectors``)
    Dataset("glove", "GloVe 840B 300d vectors (the NLI and ranking DataModules' vectors)",
            "glove", (Download(
        "https://nlp.stanford.edu/data/glove.840B.300d.zip", archive=True,
        provides=("glove.840B.300d.txt",)),)),
    Dataset("mlu", "Mathematical Language Understanding", "mlu",
            how_to_get="nothing to download: the problems are generated from the documented "
                       "distribution (datamodules/mlu.py); the published file is not available",
            checksums="no download", datamodules=("MLUDataModule",)),
]}


def url_of(key: str, index: int = 0) -> str:
    """The URL of a dataset's download (for the DataModules' ``url`` attributes)."""
    return DATASETS[key].downloads[index].url


def dataset_of(datamodule: Any) -> Dataset | None:
    """The registry entry a DataModule reads (by its class or a base class, and ``when``)."""
    for cls in type(datamodule).__mro__:
        for entry in DATASETS.values():
            if cls.__name__ in entry.datamodules and (entry.when is None
                                                      or entry.when(datamodule)):
                return entry
    return None


# ------------------------------------------------------------------------------ file locks

@contextmanager
def file_lock(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Hold the lock of ``path`` (:func:`fileio.file_lock`), saying so when waiting for
    another process; a folder where the lock cannot be made is a :class:`DownloadError`."""
    name = what or Path(path).name
    held = ExitStack()
    try:
        held.enter_context(fileio.file_lock(
            path, waiting=f"{name}: waiting for another process to finish {path}"))
    except OSError as err:
        raise DownloadError(f"{name}: cannot write in {lock_path(path).parent} ({err}); "
                            f"put the file at {path} by hand") from None
    with held:
        yield


# ------------------------------------------------------------------------------- download

def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


class _Progress:
    """A tqdm bar on stderr (tqdm is there with Lightning), else a line every few seconds."""

    def __init__(self, name: str, total: int | None, done: int, enabled: bool):
        self.name, self.total, self.done, self.enabled = name, total, done, enabled
        self.bar, self.last = None, time.monotonic()
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, initial=done, unit="B", unit_scale=True,
                        unit_divisor=1024, desc=name, file=sys.stderr, leave=False,
                        mininterval=0.5)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and time.monotonic() - self.last > 5:
            self.last = time.monotonic()
            of = f" of {_mb(self.total)} ({100 * self.done / self.total:.0f}%)" \
                if self.total else ""
            print(f"  {self.name}: {_mb(self.done)}{of}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _reason(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return str(err.reason)
    return str(err) or type(err).__name__


def download_file(url: str, dest: str | os.PathLike, sha256: str | None = None,
                  size: int | None = None, *, dataset: str = "", timeout: float = 30.0,
                  progress: bool = True) -> Path:
    """Download ``url`` to ``dest`` unless it is there (and matches ``sha256`` / ``size``
    where given); returns ``dest``.  Streams into ``<dest>.part``, resuming a partial file
    with an HTTP Range request, under the lock of ``dest``; renames it to ``dest`` when it
    is complete and checked.  A failed download raises :class:`DownloadError` (the partial
    file is kept for the next try), a checksum mismatch :class:`ChecksumError` (the partial
    file is deleted)."""
    dest = Path(dest)
    what = dataset or dest.name
    if dest.exists() and _matches(dest, sha256, size, what):
        return dest
    with file_lock(dest, what):
        if dest.exists() and _matches(dest, sha256, size, what):
            return dest  # another process downloaded it while this one waited
        part = dest.with_name(dest.name + ".part")
        digest = _download_part(url, part, dest, size, what, timeout, progress)
        got = part.stat().st_size
        if (size is not None and got != size) or (sha256 is not None and digest != sha256):
            part.unlink()
            expected = [f"{size} bytes"] if size is not None else []
            expected += [f"sha256 {sha256}"] if sha256 is not None else []
            raise ChecksumError(f"{what}: {url} gave {got} bytes with sha256 {digest}, expected "
                                f"{' and '.join(expected)}; deleted the download ({part}; "
                                f"if the release changed, update datamodules/fetch.py)")
        os.replace(part, dest)
    return dest


def _matches(path: Path, sha256: str | None, size: int | None, what: str) -> bool:
    """Whether a present file is the expected one; a mismatch is deleted (downloaded anew)."""
    if (size is None or path.stat().st_size == size) and (sha256 is None
                                                          or sha256_of(path) == sha256):
        return True
    log.warning("%s: %s does not match its size/sha256: downloading it again", what, path)
    path.unlink()
    return False


class _AnotherRange(Exception):
    pass


def _download_part(url: str, part: Path, dest: Path, size: int | None, what: str,
                   timeout: float, progress: bool) -> str:
    """Complete ``part`` from ``url`` (resumed where it stops); its sha256."""
    offset = part.stat().st_size if part.exists() else 0
    if size is not None and offset > size:
        offset = 0
    hasher = hashlib.sha256()
    if offset:
        with open(part, "rb") as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
    headers = {"User-Agent": "attnrepro-fetch/1 (python-urllib)"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    expected = None
    try:
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                              timeout=timeout)
        except urllib.error.HTTPError as err:
            if err.code == 416 and offset:  # nothing after offset: the part is complete
                return hasher.hexdigest()
            raise
        with response:
            status = getattr(response, "status", None)
            if offset and status == 206 and not response.headers.get(
                    "Content-Range", "").startswith(f"bytes {offset}-"):
                raise _AnotherRange
            if offset and status != 206:  # the server sent the whole file
                offset, hasher = 0, hashlib.sha256()
            length = response.headers.get("Content-Length")
            expected = offset + int(length) if length and length.isdigit() else size
            if progress:
                print(f"{what}: downloading {url} to {dest}"
                      + (f" (resuming at {_mb(offset)})" if offset else ""), file=sys.stderr,
                      flush=True)
            bar = _Progress(dest.name, expected, offset, progress)
            try:
                with open(part, "ab" if offset else "wb") as f:
                    while chunk := response.read(CHUNK):
                        f.write(chunk)
                        hasher.update(chunk)
                        bar.update(len(chunk))
            finally:
                bar.close()
    except _AnotherRange:  # not the range asked for: start again from zero
        part.unlink()
        return _download_part(url, part, dest, size, what, timeout, progress)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        kept = part.exists() and part.stat().st_size > 0
        raise DownloadError(
            f"{what}: could not download {url} ({_reason(err)}); put the file at {dest}"
            + (f" (the partial download {part} is kept: run again to resume)" if kept else "")
        ) from None
    got = part.stat().st_size
    if expected is not None and got < expected:
        raise DownloadError(f"{what}: the download of {url} stopped at {got} of {expected} "
                            f"bytes; run again to resume it ({part}), or put the file at {dest}")
    return hasher.hexdigest()


# -------------------------------------------------------------------------------- unpack

def extract_archive(archive: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Unpack a .zip, .tar(.gz/.bz2/.xz) or single-file .gz archive into ``dest`` (a .gz
    gives ``dest/<name without .gz>``); a member whose path would leave ``dest`` is an
    error."""
    archive, dest = Path(archive), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                if not (dest / member).resolve().is_relative_to(dest.resolve()):
                    raise ValueError(f"{archive}: member {member!r} would leave {dest}")
            z.extractall(dest)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")  # "data": no absolute paths, links out, devices
    else:
        with open(archive, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                raise ValueError(f"{archive}: not a zip, tar or gzip archive")
        name = archive.name.removesuffix(".gz") if archive.name.endswith(".gz") \
            else archive.name + ".out"
        with gzip.open(archive, "rb") as src, open(dest / name, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    return dest


def unpack(archive: str | os.PathLike, target: str | os.PathLike, strip: str = "",
           members: Sequence[tuple[str, str]] = ()) -> None:
    """Unpack ``archive`` into ``target``: everything as laid out in the archive, or the
    contents of its folder ``strip``, or only ``members`` ((member, local path) pairs).  The
    archive is unpacked in a temporary folder inside ``target`` first, so files appear in
    their place only whole (macOS ``__MACOSX`` folders are dropped)."""
    archive, target = Path(archive), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", suffix=".unpacking", dir=target))
    try:
        extract_archive(archive, tmp)
        shutil.rmtree(tmp / "__MACOSX", ignore_errors=True)
        if members:
            for member, local in members:
                source = tmp / member
                if not source.exists():
                    raise FetchError(f"{archive}: no member {member}")
                _move(source, target / local)
            return
        source = tmp / strip if strip else tmp
        if not source.is_dir():
            held = sorted(p.name for p in tmp.iterdir())
            raise FetchError(f"{archive} has no folder {strip}/ (it holds {held})")
        for child in list(source.iterdir()):
            _move(child, target / child.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move(source: Path, dest: Path) -> None:
    """Move a file or folder into place; folders are merged, files replaced."""
    if source.is_dir() and dest.is_dir():
        for child in list(source.iterdir()):
            _move(child, dest / child.name)
        return
    if dest.is_dir():
        shutil.rmtree(dest)
    elif dest.exists() and source.is_dir():
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, dest)


# -------------------------------------------------------------------------------- ensure

def ensure(key: str | Dataset, target: str | os.PathLike, wanted: Iterable[str | os.PathLike], *,
           optional: Iterable[str | os.PathLike] = (), url: str | None = None,
           download: bool = True, strict: bool = True, downloader: Callable | None = None,
           progress: bool = True) -> list[Path]:
    """Make the files ``wanted`` (paths under ``target``, the folder the DataModule reads)
    exist by downloading (and unpacking) the downloads of dataset ``key`` (a registry name,
    or an entry made on the spot) that give them; files already there are left alone.
    Returns the files still missing.

    ``optional``: files tried too, whose failed download is only a warning (a test split
    that is read only when present).  ``url``: the DataModule's own URL for a dataset of one
    download (another URL: its checksum is not known).  ``download`` False: nothing is
    downloaded.  ``strict``: a missing file that no download gives (or ``download`` False)
    raises FileNotFoundError naming it and how to get it; else it is returned.
    ``downloader``: ``(url, dest, sha256=, size=, dataset=, progress=) -> path`` (default
    :func:`download_file`)."""
    target = Path(target)
    wanted = [Path(p) for p in wanted]
    optional = [Path(p) for p in optional if Path(p) not in wanted]
    missing = [p for p in wanted + optional if not p.exists()]
    if not missing:
        return []
    entry = key if isinstance(key, Dataset) else DATASETS[key]
    key = entry.key
    downloads = list(entry.downloads)
    if url and len(downloads) == 1 and url != downloads[0].url:
        downloads[0] = replace(downloads[0], url=url, sha256=None, size=None)
    plan: dict[int, list[Path]] = {}
    for path in missing:
        i = _provider(entry, target, path)
        if i is not None and download:
            plan.setdefault(i, []).append(path)
    get = downloader or download_file
    for i, paths in plan.items():
        try:
            _fetch_one(entry, downloads[i], target, paths, get, progress)
        except DownloadError as err:
            if all(p in optional for p in paths):  # a test split: read only when there
                print(f"warning: {err}", file=sys.stderr, flush=True)
                continue
            raise
    still = [p for p in wanted if not p.exists()]
    if strict and still:
        names = ", ".join(map(str, still[:3])) + (f" and {len(still) - 3} more"
                                                  if len(still) > 3 else "")
        if not download and any(_provider(entry, target, p) is not None for p in still):
            how = "downloading is off (download=False): get " + ", ".join(
                d.url for d in downloads) + f" and unpack it in {target}"
        else:
            how = entry.how_to_get or ("not part of the release " + ", ".join(
                d.url for d in downloads))
        raise FileNotFoundError(f"{key}: {names} not found; {how}")
    return still + [p for p in optional if not p.exists()]


def _provider(entry: Dataset, target: Path, path: Path) -> int | None:
    try:
        relative = PurePosixPath(*path.relative_to(target).parts).as_posix()
    except ValueError:
        return None
    return entry.provider(relative)


def _fetch_one(entry: Dataset, d: Download, target: Path, paths: list[Path],
               get: Callable, progress: bool) -> None:
    dest = target / d.name
    with file_lock(dest, entry.key):
        if all(p.exists() for p in paths):
            return  # another process got them while this one waited
        try:
            got = Path(get(d.url, dest, sha256=d.sha256, size=d.size, dataset=entry.key,
                           progress=progress))
        except DownloadError as err:  # name the files the reader looked for, not only the URL
            missing = [p for p in paths if not p.exists()]
            names = ", ".join(map(str, missing[:2])) + (f" and {len(missing) - 2} more"
                                                        if len(missing) > 2 else "")
            raise DownloadError(f"{err}; it holds the missing {names}") from None
        if d.archive:
            if progress:
                print(f"{entry.key}: unpacking {got.name} into {target}", file=sys.stderr,
                      flush=True)
            unpack(got, target, strip=d.strip, members=d.members)


def prepare(datamodule: Any) -> None:
    """Get a DataModule's files before anything reads them (its vocabulary, the model
    arguments linked to it): its ``prepare_data``, which downloads what is missing through
    :func:`ensure`; once per DataModule object.  Every process may call it: downloads are
    locked, so one process downloads and the others wait, then find the files."""
    if getattr(datamodule, "_fetch_prepared", False):
        return
    prepare_data = getattr(datamodule, "prepare_data", None)
    if callable(prepare_data):
        prepare_data()
    datamodule._fetch_prepared = True


# -------------------------------------------------------------------------------- status

STATES = ("present", "unverified", "missing", "corrupt")
LEGEND = ("states: present = sha256 verified | unverified = present, no sha256 known (None "
          "in the registry)\n        | missing | corrupt = sha256 mismatch\n"
          "files unpacked from an archive or put there by hand carry no checksum of their own: "
          "present = it exists")


@dataclass
class FileStatus:
    path: Path
    state: str  # one of STATES
    kind: str  # "archive" / "download" (a URL; plain file), "unpacked" or "manual"
    url: str = ""
    note: str = ""
    sha256: str | None = None


def file_status(entry: Dataset, root: Path) -> list[FileStatus]:
    """The state of every file of a dataset under the data root."""
    folder = root / entry.folder
    out = []
    for d in entry.downloads:
        dest = folder / d.name
        kept = [folder / p for p in d.provides]
        if dest.exists():
            if d.sha256 is None:
                state = "unverified"
            else:
                state = "present" if sha256_of(dest) == d.sha256 else "corrupt"
        else:
            state = "missing"
        note = ""
        part = dest.with_name(dest.name + ".part")
        if state == "missing" and part.exists():
            note = f"partial download: {_mb(part.stat().st_size)}, resumes"
        elif state == "missing" and d.archive and all(p.exists() for p in kept):
            note = "not needed: unpacked"
        out.append(FileStatus(dest, state, "archive" if d.archive else "download", d.url, note,
                              d.sha256))
        if d.archive:
            out += [FileStatus(p, "present" if p.exists() else "missing", "unpacked")
                    for p in kept]
    out += [FileStatus(folder / p, "present" if (folder / p).exists() else "missing", "manual")
            for p in entry.manual]
    return out


def dataset_state(entry: Dataset, files: list[FileStatus]) -> str:
    if not entry.files:
        return "nothing to download"
    needed = [f for f in files if f.kind != "archive"]  # the data files
    missing = sum(f.state == "missing" for f in needed)
    corrupt = sum(f.state == "corrupt" for f in files)
    words = [f"{missing} of {len(needed)} missing"] * bool(missing) \
        + [f"{corrupt} corrupt"] * bool(corrupt)
    if not words:
        return "complete"
    return ("incomplete" if missing else "corrupt") + f" ({', '.join(words)})"


def format_status(keys: Sequence[str], root: Path) -> tuple[str, bool]:
    """The status report of datasets ``keys`` and whether they are all complete."""
    lines = [f"data root: {root}  (--data_dir, else $ATTNREPRO_DATA, else ../shared/data)",
             LEGEND, ""]
    complete = True
    for key in keys:
        entry = DATASETS[key]
        files = file_status(entry, root)
        state = dataset_state(entry, files)
        complete &= state in ("complete", "nothing to download")
        readers = f" [{', '.join(entry.datamodules)}]" if entry.datamodules else ""
        lines.append(f"{key}: {entry.title}{readers}")
        lines.append(f"  folder {root / entry.folder}: {state}; checksums: {entry.checksums}")
        lines += _file_lines(files, root / entry.folder)
        if entry.how_to_get and (entry.manual or not entry.downloads):
            lines.append(f"  {'by hand' if entry.manual else 'note'}: {entry.how_to_get}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n", complete


def _file_lines(files: list[FileStatus], folder: Path) -> list[str]:
    lines, groups = [], {}
    for f in files:
        relative = f.path.relative_to(folder).as_posix()
        if f.kind == "unpacked" and sum(g.kind == "unpacked" for g in files) > 12:
            parent = relative.rsplit("/", 1)[0] + "/" if "/" in relative else "./"
            groups.setdefault((parent, f.state), []).append(relative)
            continue
        source = {"unpacked": "(unpacked)", "manual": "(by hand)"}.get(
            f.kind, f"<- {f.url}" + ("" if f.sha256 else "  [sha256: None]"))
        note = f"  [{f.note}]" if f.note else ""
        lines.append(f"  {f.state:<10} {relative}  {source}{note}")
    for (parent, state), names in groups.items():
        lines.append(f"  {state:<10} {parent} ({len(names)} files, e.g. {names[0]})  (unpacked)")
    return lines


# ------------------------------------------------------------------------------- command

def fetch_dataset(key: str, root: Path, progress: bool = True) -> list[str]:
    """Download and unpack dataset ``key`` into ``root / folder``; notes on what is left."""
    entry = DATASETS[key]
    folder = root / entry.folder
    if not entry.downloads:
        return [f"{key}: {entry.how_to_get} (folder: {folder})"]
    wanted = [folder / p for d in entry.downloads for p in d.provides]
    ensure(key, folder, wanted, strict=False, progress=progress)
    notes = [f"{key}: {len(wanted)} files in {folder}"]
    manual = [p for p in entry.manual if not (folder / p).exists()]
    if manual:
        notes.append(f"{key}: {', '.join(manual)} still missing: {entry.how_to_get}")
    return notes


def _keys(names: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    if not names or "all" in names:
        return list(DATASETS)
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        parser.error(f"unknown dataset(s) {', '.join(unknown)}; known: all, "
                     + ", ".join(DATASETS))
    return list(dict.fromkeys(names))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m datamodules.fetch",
        description="Download and unpack the datasets into the data root (each into the "
                    "folder its DataModule reads), or report which files are there.",
        epilog="datasets: " + ", ".join(f"{k} ({d.title})" for k, d in DATASETS.items()))
    parser.add_argument("datasets", nargs="*", metavar="dataset",
                        help="registry names, or 'all' (with --status: default all)")
    parser.add_argument("--status", action="store_true",
                        help="report per dataset and file: present / unverified / missing / "
                             "corrupt (exit status 1 unless all are complete)")
    parser.add_argument("--data_dir", default=None,
                        help="the data root (default: $ATTNREPRO_DATA, else ../shared/data)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    root = data_root(args.data_dir)
    if args.status:
        text, complete = format_status(_keys(args.datasets, parser), root)
        sys.stdout.write(text)
        return 0 if complete else 1
    if not args.datasets:
        parser.error("name a dataset (or 'all') to download, or use --status")
    keys = _keys(args.datasets, parser)
    failed = False
    for key in keys:
        if not DATASETS[key].downloads and len(keys) > 1:
            print(f"{key}: skipped, {DATASETS[key].how_to_get}")
            continue
        try:
            for note in fetch_dataset(key, root, progress=not args.quiet):
                print(note)
            failed |= not DATASETS[key].downloads
        except (FetchError, OSError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
