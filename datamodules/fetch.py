"""Getting the data: one download-and-cache layer for every DataModule, and its command.

The registry (datamodules/registry.py, :data:`~datamodules.registry.DATASETS`) names, per
dataset, the official URL(s), the files each download gives, their folder under the data
root and their sha256 where published; a DataModule names its entry in its ``dataset``
attribute.  What every DataModule's ``prepare_data`` calls (:func:`ensure`):

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
    python -m datamodules.fetch --status [<dataset|all> ...] [--details] [--data_dir DIR]
    python -m datamodules.fetch --check <dataset> [...] [--data_dir DIR]

The status of every dataset (no names, or ``all``) is a line counting them by state, then one
line each: ``complete`` (the whole release), ``usable`` (not complete, but the files a shipped
config reads are there: the registry's ``parts``), ``incomplete``, ``missing``, ``corrupt``
or ``by hand``; with ``--details``, or for datasets named, it gives per dataset and file:
``present`` (sha256 verified), ``unverified`` (present, no sha256 known), ``missing`` or
``corrupt`` (sha256 mismatch); files unpacked from an archive or made by hand carry no
checksum of their own (``present`` = the file exists).  ``--status`` reports (exit status
0); ``--check`` is the question "can these datasets be read?": the same report, exit
status 1 unless each named dataset is complete or usable.

This module imports neither torch nor the DataModules, so the command starts fast; the
DataModules import it.  Experiment code calls :func:`prepare` on a DataModule before
anything reads its files.
"""

from __future__ import annotations

import argparse
import functools
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
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import fileio
from datamodules.registry import DATASETS, Dataset, Download
from fileio import lock_path

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1 << 16


def shared_data_dir() -> Path:
    """The real published data beside the project (``../shared/data``), or $ATTNREPRO_DATA."""
    return Path(os.environ.get("ATTNREPRO_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def cache_root() -> Path:
    """Where built vocabularies, BPE models and tensors are cached: ``$ATTNREPRO_CACHE``, else
    the project's ``.cache/`` (datamodules.common.cache_dir makes it)."""
    return Path(os.environ.get("ATTNREPRO_CACHE", PROJECT_ROOT / ".cache"))


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
    created = _first_missing(target)
    try:
        for i, paths in plan.items():
            try:
                _fetch_one(entry, downloads[i], target, paths, get, progress)
            except DownloadError as err:
                if all(p in optional for p in paths):  # a test split: read only when there
                    print(f"warning: {err}", file=sys.stderr, flush=True)
                    continue
                raise
    except BaseException:
        _remove_if_left_empty(created)
        raise
    _remove_if_left_empty(created)  # every download failed was optional: nothing came
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


def _first_missing(folder: Path) -> Path | None:
    """The highest folder of ``folder``'s path that does not exist yet (what a download into
    it creates), or None when ``folder`` exists."""
    folder = folder.absolute()
    if folder.exists():
        return None
    while not folder.parent.exists():
        folder = folder.parent
    return folder


def _remove_if_left_empty(folder: Path | None) -> None:
    """Remove ``folder`` (made by a download that failed) when it holds nothing but lock
    files and empty partial files: a failed download leaves no empty dataset folder behind.
    A partial file with bytes in it stays (the next download resumes it)."""
    if folder is None or not folder.is_dir():
        return
    for path in folder.rglob("*"):
        if path.is_dir():
            continue
        lock = path.name.startswith(".") and path.name.endswith(".lock")
        if not lock and not (path.name.endswith(".part") and path.stat().st_size == 0):
            return
    shutil.rmtree(folder, ignore_errors=True)


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
    :func:`ensure`.  Every process may call it: downloads are locked, so one process
    downloads and the others wait, then find the files."""
    prepare_data = getattr(datamodule, "prepare_data", None)
    if callable(prepare_data):
        prepare_data()


def prepare_once(prepare_data: Callable) -> Callable:
    """A DataModule's ``prepare_data`` that runs once per DataModule object: :func:`prepare`
    calls it before the model is built, Lightning's trainer again before fitting."""
    @functools.wraps(prepare_data)
    def once(datamodule, *args, **kwargs) -> None:
        if getattr(datamodule, "_fetch_prepared", False):
            return
        prepare_data(datamodule, *args, **kwargs)
        datamodule._fetch_prepared = True
    return once


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
    optional: bool = False  # a file no default config reads (Download.optional)


def file_status(entry: Dataset, root: Path) -> list[FileStatus]:
    """The state of every file of a dataset under the data root."""
    folder = root / entry.folder
    out = []
    for d in entry.downloads:
        dest = folder / d.name
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
        elif state == "missing" and d.archive and all(
                (folder / p).exists() for p in d.provides if p not in d.optional):
            note = "not needed: unpacked"
        out.append(FileStatus(dest, state, "archive" if d.archive else "download", d.url, note,
                              d.sha256))
        if d.archive:
            out += [FileStatus(folder / p, "present" if (folder / p).exists() else "missing",
                               "unpacked", optional=p in d.optional,
                               note="optional: read only when a config asks for it"
                               if p in d.optional else "")
                    for p in d.provides]
    out += [FileStatus(folder / p, "present" if (folder / p).exists() else "missing", "manual")
            for p in entry.manual]
    return out


def dataset_state(entry: Dataset, files: list[FileStatus]) -> str:
    if not entry.files:
        return "nothing to download"
    # the data files; an optional one counts only when it is there
    needed = [f for f in files if f.kind != "archive" and not (f.optional and f.state == "missing")]
    missing = sum(f.state == "missing" for f in needed)
    corrupt = sum(f.state == "corrupt" for f in files)
    words = [f"{missing} of {len(needed)} missing"] * bool(missing) \
        + [f"{corrupt} corrupt"] * bool(corrupt)
    if not words:
        return "complete"
    return ("incomplete" if missing else "corrupt") + f" ({', '.join(words)})"


#: how the summary of ``--status`` counts a dataset, in the order it lists them
SUMMARY_STATES = ("complete", "usable", "incomplete", "missing", "corrupt", "by hand")
#: the states of a dataset a DataModule can read (``--check`` passes)
READABLE = ("complete", "usable")


def usable_parts(entry: Dataset, root: Path) -> list[str]:
    """The registry's ``parts`` of a dataset whose files are all under the data root: which
    shipped configs can read it although the release is not all there."""
    folder = root / entry.folder
    return [what for what, files in entry.parts if all((folder / f).exists() for f in files)]


def summary_state(entry: Dataset, files: list[FileStatus], root: Path | None = None) -> str:
    """A dataset in one word of :data:`SUMMARY_STATES`: ``usable`` when it is not complete
    but a shipped config's files (:func:`usable_parts`, under ``root``) are there,
    ``missing`` when none of its data files is there, ``by hand`` when it has no download
    and a file is missing."""
    state = dataset_state(entry, files)
    if state not in ("complete", "nothing to download") and root is not None \
            and not state.startswith("corrupt") and usable_parts(entry, root):
        return "usable"
    if state == "nothing to download":
        return "complete" if all(f.state != "missing" for f in files) else "by hand"
    if state.startswith("incomplete"):
        needed = [f for f in files if f.kind != "archive"]
        if all(f.state == "missing" for f in needed):
            return "by hand" if not entry.downloads else "missing"
    return state.split(" ", 1)[0]


def format_summary(keys: Sequence[str], root: Path) -> tuple[str, bool]:
    """``--status``: one line counting the datasets ``keys`` by state, then one line each
    (incomplete and corrupt ones with :func:`dataset_state`'s counts, usable ones with the
    configs that read them), and how to see every file; and whether each is readable."""
    states = {}
    for key in keys:
        entry = DATASETS[key]
        files = file_status(entry, root)
        word = summary_state(entry, files, root)
        states[key] = (word, f"by {'; '.join(usable_parts(entry, root))}"
                       if word == "usable" else dataset_state(entry, files))
    counts = {s: sum(word == s for word, _ in states.values()) for s in SUMMARY_STATES}
    lines = [f"{len(keys)} dataset{'s' * (len(keys) != 1)} under {root}: "
             + ", ".join(f"{n} {s}" for s, n in counts.items() if n)]
    width = max(map(len, keys))
    for key, (word, state) in states.items():
        detail = state.partition(" ")[2] if word in ("incomplete", "corrupt") else ""
        detail = state if word == "usable" else detail
        lines.append(f"  {key:<{width}}  {word}{f' {detail}' if detail else ''}")
    lines.append("every file (present / unverified / missing / corrupt, and where to get it): "
                 "python -m datamodules.fetch --status --details [<dataset> ...]")
    readable = all(word in READABLE for word, _ in states.values())
    return "\n".join(lines) + "\n", readable


def format_status(keys: Sequence[str], root: Path) -> tuple[str, bool]:
    """The status report of datasets ``keys`` and whether each is readable (complete, or
    usable by a shipped config: :func:`summary_state`)."""
    lines = [f"data root: {root}  (--data_dir, else $ATTNREPRO_DATA, else ../shared/data)",
             LEGEND, ""]
    readable = True
    for key in keys:
        entry = DATASETS[key]
        files = file_status(entry, root)
        state = dataset_state(entry, files)
        readable &= summary_state(entry, files, root) in READABLE
        readers = f" [{', '.join(entry.datamodules)}]" if entry.datamodules else ""
        lines.append(f"{key}: {entry.title}{readers}")
        lines.append(f"  folder {root / entry.folder}: {state}; checksums: {entry.checksums}")
        lines += [f"  usable by {what}" for what in usable_parts(entry, root)
                  if state != "complete"]
        lines += _file_lines(files, root / entry.folder)
        if entry.how_to_get and (entry.manual or not entry.downloads):
            lines.append(f"  {'by hand' if entry.manual else 'note'}: {entry.how_to_get}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n", readable


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
                        help="one line per dataset (complete / usable by a shipped config / "
                             "incomplete / missing / corrupt / by hand) after a line counting "
                             "them; with --details or named datasets, every file: present / "
                             "unverified / missing / corrupt (exit status 0)")
    parser.add_argument("--check", action="store_true",
                        help="the status of the datasets named, exit status 1 unless each is "
                             "complete or usable by a shipped config")
    parser.add_argument("--details", action="store_true",
                        help="with --status: every file of every dataset")
    parser.add_argument("--data_dir", default=None,
                        help="the data root (default: $ATTNREPRO_DATA, else ../shared/data)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    root = data_root(args.data_dir)
    if args.check and not args.datasets:
        parser.error("--check needs the datasets to check (or 'all')")
    if args.status or args.check:
        keys = _keys(args.datasets, parser)
        named = args.datasets and "all" not in args.datasets
        text, readable = (format_status if args.details or (named and not args.check)
                          else format_summary)(keys, root)
        sys.stdout.write(text)
        return 1 if args.check and not readable else 0
    if not args.datasets:
        parser.error("name a dataset (or 'all') to download, or use --status")
    keys = _keys(args.datasets, parser)
    problem = fileio.folder_problem(root)
    if problem is not None:  # before any download: the root must take the files
        print(f"error: {problem} (the data root: --data_dir, else $ATTNREPRO_DATA, else "
              "../shared/data)", file=sys.stderr)
        return 1
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
