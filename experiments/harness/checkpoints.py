"""Checkpoints a stopped run can trust: written whole or not at all, checked before a resume.

Lightning's own save (``lightning.fabric.utilities.cloud_io._atomic_save``, Lightning 2.6)
goes through an fsspec transaction whose local file is first written under the system's
temporary folder (``tempfile.mkstemp()``: ``$TMPDIR`` or /tmp) and then moved to the
checkpoint's name by ``shutil.move``: a rename when both are on one file system, otherwise a
copy into the checkpoint's name, which a process killed during the copy leaves half-written
(and a killed save leaves its whole temporary file in /tmp).  A cluster node's local /tmp
and a shared runs folder are two file systems.  :class:`AtomicCheckpointIO` writes the
temporary file beside the checkpoint (:func:`fileio.write_atomic`), so the last step is
always a rename within one folder: a reader finds the previous checkpoint or the new one,
never a part of one.

:func:`checkpoint_problem` checks a file before a run resumes from it (its zip directory and
every member's CRC, as torch writes them; nothing is unpickled): ``grid --skip-done`` falls
back to the checkpoint before a broken one, and ``fit/validate/test --ckpt_path`` refuses
a broken file, each in one line naming the file.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

from fileio import checkpoint_step, write_atomic


@cache
def _atomic_checkpoint_io() -> type:
    """:class:`AtomicCheckpointIO`, made at its first use: it derives from Lightning's
    ``TorchCheckpointIO``, and ``grid``/``cell`` read checkpoints (the functions below)
    without importing Lightning and torch (issue 31 item 9)."""
    import torch
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        """Lightning's torch checkpoint format, saved to a local path through a temporary file
        in the checkpoint's own folder that then replaces it; other paths (``s3://``, ...) as
        Lightning saves them."""

        def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
            if "://" in str(path) and not str(path).startswith("file://"):
                return super().save_checkpoint(checkpoint, path, storage_options)
            if storage_options is not None:  # what Lightning's own save refuses, refused alike
                return super().save_checkpoint(checkpoint, path, storage_options)
            write_atomic(str(path).removeprefix("file://"),
                         lambda tmp: torch.save(checkpoint, tmp))

    AtomicCheckpointIO.__qualname__ = "AtomicCheckpointIO"  # pickled by its module's name
    return AtomicCheckpointIO


def __getattr__(name: str):
    # ``from experiments.harness.checkpoints import AtomicCheckpointIO`` (PEP 562): made when asked
    if name == "AtomicCheckpointIO":
        return _atomic_checkpoint_io()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a whole torch checkpoint (a zip archive whose every member matches
    its CRC), or None when it is."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        return f"{type(err).__name__}: {err}"
    if bad is not None:
        return f"member {bad} does not match its CRC"
    return None


def resumable_checkpoint(run_dir: Path, say: Callable[[str], object] | None = None
                         ) -> Path | None:
    """The checkpoint a stopped run resumes from: ``last.ckpt``, else the one of the highest
    ``step=N`` in its name, skipping any that is not whole (:func:`checkpoint_problem`) or
    whose metrics are not all on disk (:func:`unlogged_after`); each skipped file is one line
    to ``say``.  None without such a checkpoint (the run starts over)."""
    candidates = checkpoints_latest_first(run_dir)
    logged = logged_steps(run_dir / "metrics.csv")
    due = validation_due(run_dir / "config.yaml")
    for i, path in enumerate(candidates):
        problem = checkpoint_problem(path)
        if problem is None:
            problem = unlogged_after(path, logged, due)
            if problem is None:
                return path
        else:
            problem = f"not a whole checkpoint ({problem})"
        if say is not None:
            instead = (f"resuming from {candidates[i + 1].name} instead" if i + 1 < len(candidates)
                       else "no earlier checkpoint: starting over")
            say(f"  {path}: {problem}; {instead}")
    return None


def checkpoints_latest_first(run_dir: Path) -> list[Path]:
    """A run's checkpoints in the order a resume tries them: ``last.ckpt``, then those named
    ``step=N`` from the highest N down."""
    folder = run_dir / "checkpoints"
    steps = {}
    for path in folder.glob("*.ckpt"):
        step = checkpoint_step(path)
        if step is not None:
            steps[step] = path
    candidates = [folder / "last.ckpt"] if (folder / "last.ckpt").exists() else []
    return candidates + [steps[s] for s in sorted(steps, reverse=True)]


def logged_steps(path: Path) -> tuple[set[int], set[int]]:
    """The steps of a Lightning metrics.csv's rows, and those of its validation rows."""
    steps, validated = set(), set()
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("step") in (None, ""):
                    continue
                step = int(float(row["step"]))
                steps.add(step)
                if any(k.startswith("val/") and v not in ("", None) for k, v in row.items()):
                    validated.add(step)
    except (OSError, ValueError, csv.Error):
        pass
    return steps, validated


def validation_due(config: Path) -> Callable[[int], bool] | None:
    """Whether the fit of a run's saved config.yaml validates at the end of a given step:
    known when it validates every ``trainer.val_check_interval`` steps (an int, with
    ``check_val_every_n_epoch: null``), then also at ``max_steps``; None otherwise (another
    cadence, or no readable config)."""
    import yaml

    try:
        trainer = (yaml.safe_load(config.read_text()) or {}).get("trainer") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    every, max_steps = trainer.get("val_check_interval"), trainer.get("max_steps")
    if (not isinstance(every, int) or isinstance(every, bool) or every < 1
            or trainer.get("check_val_every_n_epoch") is not None):
        return None
    return lambda step: step % every == 0 or step == max_steps


def checkpoint_global_step(path: Path) -> int:
    """The optimiser step a whole checkpoint was saved at (its ``global_step``: what a run
    resumed from it goes on from; ``last.ckpt`` names none)."""
    import torch  # only when there is a checkpoint to read

    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=False)
               .get("global_step", 0))


def unlogged_after(path: Path, logged: tuple[set[int], set[int]],
                   due: Callable[[int], bool] | None = None) -> str | None:
    """Why resuming from the whole checkpoint ``path`` would lose metrics, or None.

    Lightning writes a step checkpoint at the end of its batch, before that batch's metrics
    row (logged at the checkpoint's step minus one) and before a validation due at that
    step, and a fit resumed from it skips that validation and that row (Lightning 2.6: the
    loop counts the validation as done): both must already be in metrics.csv, which holds
    them once it has a row of a later step (rows are written in order) or the validation's
    row (its step is the checkpoint's minus one).  When ``due`` (:func:`validation_due`)
    says no validation falls at that step, the batch's own row is enough.  A run stopped
    before they were written resumes from the checkpoint before instead."""
    step = checkpoint_global_step(path)
    steps, validated = logged
    if step == 0 or any(s >= step for s in steps) or step - 1 in validated:
        return None
    if step - 1 in steps and due is not None and not due(step):
        return None
    return (f"the metrics after its step {step} were not written (stopped before the next "
            "row or its validation's row reached metrics.csv)")
