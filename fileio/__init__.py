"""Files that several processes may want at once: the one way the suite writes a cache or
result file, and builds a cache entry once.

- :func:`write_atomic`: the content goes to a temporary file of a unique name in the same
  folder, which then replaces the file (``os.replace``, atomic within a file system): a
  reader finds the old file or the new one whole, never a part; two processes writing the
  same file at once both succeed, and the file is whole (the one replaced last).
- :func:`file_lock`: an exclusive lock (``fcntl.flock`` on ``.<name>.lock`` beside the
  file) that other processes wait for; re-entrant within a process.
- :func:`write_once` / :func:`build_once`: a cache entry written by one process under its
  lock; the others wait, then read the file it wrote (the downloads of datamodules/fetch.py
  take the same lock).
- :func:`folder_problem`: why a folder cannot be made or written (a root the environment
  names, a path argument), so a command says it in one line before it starts.
- :func:`checkpoint_step`: the training step in a Lightning checkpoint's file name, read
  by the launcher's resume and by checkpoint averaging alike.

Grid cells run at once and DDP ranks each build the vocabularies, BPE models and tensors
they read; without the lock each would build them, and with one shared temporary name the
first rename took the file from under the second.

This package imports only the standard library, so datamodules/, lit_models/,
experiments/ and benchmarks/ may all import it (attention/ imports only torch).
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one process per cache folder)
    fcntl = None

T = TypeVar("T")
#: the step in a ModelCheckpoint file name: ``epoch=3-step=1200.ckpt``, ``step=1200-v1.ckpt``
CHECKPOINT_STEP = re.compile(r"(?:^|-)step=(\d+)(?:-|$)")
#: what :func:`write_atomic` writes: text (UTF-8), bytes, or a function writing a given path
Content = str | bytes | Callable[[Path], object]


def write_atomic(path: str | os.PathLike, content: Content, encoding: str = "utf-8") -> Path:
    """Write ``content`` to ``path`` through a temporary file of a unique name in the same
    folder that then replaces ``path``; returns ``path``.  ``content``: a str (written in
    ``encoding``), bytes, or a function that writes the file at the path it is given (e.g.
    ``lambda tmp: torch.save(obj, tmp)``).  If writing fails, the temporary file is removed
    and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unique_temporary(path)
    try:
        if callable(content):
            content(tmp)
        else:
            with open(tmp, "w" if isinstance(content, str) else "wb",
                      **({"encoding": encoding} if isinstance(content, str) else {})) as f:
                f.write(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The N of ``step=N`` in a ModelCheckpoint file name (``epoch=0-step=42000.ckpt``,
    ``step=5-v1.ckpt``), None for other names (``last.ckpt``, ``averaged-last5.ckpt``)."""
    match = CHECKPOINT_STEP.search(Path(path).stem)
    return int(match.group(1)) if match else None


def _unique_temporary(path: Path) -> Path:
    """An empty new file ``.<name>.<pid>-<random>.tmp`` beside ``path``, created by this
    process alone (O_EXCL; mode 0666 less the umask, as ``open`` would give ``path``)."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


_held: dict[str, int] = {}  # lock files this process holds (re-entered, not re-locked)


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of ``path``: ``.<name>.lock`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextmanager
def file_lock(path: str | os.PathLike, waiting: str = "") -> Iterator[None]:
    """Hold an exclusive lock for ``path`` (fcntl.flock on :func:`lock_path`): other
    processes wait here until it is released; ``waiting``, when given, is printed to stderr
    by a process that has to wait.  Re-entrant within a process.  A folder where the lock
    file cannot be made raises the OSError before anything runs under the lock."""
    lock = lock_path(path)
    key = str(lock.absolute())
    if key in _held or fcntl is None:
        _held[key] = _held.get(key, 0) + 1
        try:
            yield
        finally:
            _held[key] -= 1
            if not _held[key]:
                del _held[key]
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                print(waiting, file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
    finally:
        os.close(fd)  # releases the lock


def write_once(path: str | os.PathLike, content: Content) -> bool:
    """Write ``path`` (:func:`write_atomic`) unless it exists, under its lock: of several
    processes asking at once one writes it, the others wait and find it there.  Whether
    this process wrote it."""
    path = Path(path)
    if path.exists():
        return False
    with file_lock(path):
        if path.exists():
            return False  # another process wrote it while this one waited
        write_atomic(path, content)
        return True


def build_once(path: str | os.PathLike, build: Callable[[], T],
               save: Callable[[T, Path], object], load: Callable[[Path], T]) -> tuple[T, bool]:
    """The cache entry at ``path``: ``load(path)`` when it is there; else ``build()``,
    saved by ``save(value, temporary path)`` through :func:`write_once`, so one process
    builds it while the others wait and then load the file it wrote.  Returns the value and
    whether this process built it."""
    built: list[T] = []

    def write(tmp: Path) -> None:
        built.append(build())
        save(built[0], tmp)

    if write_once(path, write):
        return built[0], True
    return load(Path(path)), False


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why the folder ``folder`` cannot be created or written, as one phrase naming the path
    (``/proc/x: cannot create it (No such file or directory)``); None when it can.  It is
    made (with its parents) and a file is created in it and removed: permission bits do not
    tell (a root process passes ``os.access`` on a read-only or virtual file system)."""
    path = Path(folder)
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"{path}: cannot be a folder ({blocker} is a file)"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"{path}: cannot create it ({err.strerror or err})"
    probe = path / f".write-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as err:
        return f"{path}: cannot write in it ({err.strerror or err})"
    return None
