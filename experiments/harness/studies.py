"""What every figure study of experiments/harness/figures.py shares: its step count and threads from
the environment, the folder it writes into (never a tracked file), a short CPU training run
without logger or checkpoint, measurements taken at given steps in eval mode, and the line a
notebook prints for the test that finds its committed outputs stale (:func:`print_check`)."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch

from experiments.harness.cli import silence_lightning_tips
from experiments.harness.grid_model import runs_root


def env_steps(variable: str, default: int) -> int:
    """The number of training steps: ``$variable`` when set (the tests' short setting)."""
    return int(os.environ.get(variable, str(default)))


def use_threads() -> int:
    """torch's intra-op threads from $ATTNREPRO_THREADS (unset: torch's default)."""
    if os.environ.get("ATTNREPRO_THREADS"):
        torch.set_num_threads(int(os.environ["ATTNREPRO_THREADS"]))
    return torch.get_num_threads()


def study_dir(study: str) -> Path:
    """Where a notebook's study writes: ``<runs>/figures/<study>`` (git-ignored)."""
    path = runs_root() / "figures" / study
    path.mkdir(parents=True, exist_ok=True)
    return path


class RecordAt(L.Callback):
    """``measure(model)`` after the given optimizer steps, in eval mode, into ``records``."""

    def __init__(self, steps: Iterable[int], measure: Callable):
        self.steps, self.measure, self.records = set(steps), measure, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step in self.steps and trainer.global_step not in self.records:
            self.records[trainer.global_step] = evaluated(self.measure, pl_module)


def evaluated(measure: Callable, model: torch.nn.Module):
    """``measure(model)`` in eval mode without gradients, the mode restored after it."""
    mode = model.training
    model.eval()
    with torch.no_grad():
        out = measure(model)
    model.train(mode)
    return out


#: the optimizer steps whose training loss :func:`first_losses` records: on every CPU measured
#: the first five Adam steps give the same numbers within 1e-3 (docs/reproducibility.md,
#: 'Across hosts'), later ones drift apart
FIRST_STEPS = 5
_recording: list[list[dict[int, float]]] = []  # the lists of the open first_losses() blocks


class FirstLosses(L.Callback):
    """The training loss of each of the first ``FIRST_STEPS`` optimizer steps (the loss of
    the batch that step trains on, before its update), by step."""

    def __init__(self):
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step <= FIRST_STEPS:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self.losses[trainer.global_step] = float(loss)


@contextmanager
def first_losses() -> Iterator[list[dict[int, float]]]:
    """Within the block, every :func:`train_briefly` run appends its :class:`FirstLosses`
    (step -> loss) to the list yielded, in the order the models are trained."""
    runs: list[dict[int, float]] = []
    _recording.append(runs)
    try:
        yield runs
    finally:
        _recording.remove(runs)


#: Lightning's rank-zero INFO lines ("GPU available: False", "`Trainer.fit` stopped")
LIGHTNING_INFO = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


@contextmanager
def _quiet(names: Iterable[str], level: int) -> Iterator[None]:
    """The loggers ``names`` drop records below ``level`` in the block, as before after it: a
    study's output is its figures and numbers, not what it expects to be told."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, before in zip(loggers, levels):
            logger.setLevel(before)


def train_briefly(model: L.LightningModule, data: L.LightningDataModule, steps: int,
                  callbacks: Iterable[L.Callback] = ()) -> L.LightningModule:
    """``steps`` optimizer steps on the CPU, no validation, logger or checkpoint."""
    silence_lightning_tips()
    if steps > 0:
        losses = FirstLosses()
        with _quiet(LIGHTNING_INFO, logging.WARNING):
            L.Trainer(max_steps=steps, accelerator="cpu", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0,
                      callbacks=[*callbacks, losses]).fit(model, datamodule=data)
        for runs in _recording:
            runs.append(losses.losses)
    return model


#: starts the line of :func:`print_check`; tests/docs/test_notebooks.py finds it in a
#: notebook's committed outputs and in its own short rerun
CHECK = "Checked by tests/docs/test_notebooks.py against a short rerun:"


def print_check(**parts) -> None:
    """Print what a short rerun of the notebook must give again, as one line of JSON after
    ``CHECK``: numbers rounded to 4 decimals, mappings with their keys as strings."""

    def plain(x):
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return round(x, 4) if isinstance(x, float) else x

    print(CHECK, json.dumps(plain(parts), sort_keys=True, ensure_ascii=False))


def prepared(data: L.LightningDataModule) -> L.LightningDataModule:
    """The DataModule with its files read (and fetched when absent) and its fit splits set up.
    Its warnings about the data read are not shown (the studies read fixed files whose
    counts they state, e.g. the SNLI dev prefix's pairs without a gold label); errors are."""
    with _quiet(["datamodules"], logging.ERROR):
        data.prepare_data()
        data.setup("fit")
    return data


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path


def compact_png(path: Path) -> bytes:
    """The PNG at ``path`` with a palette of 256 colours: what a notebook shows and stores,
    about a third of matplotlib's RGBA bytes for a plot. The palette covers the image's
    colour range (maximum coverage), so a colour map's gradient keeps its steps within a
    few levels of 255, where the median cut spends its colours on the many pixels of a few
    colours and bands a colour bar."""
    from PIL import Image  # matplotlib's own dependency

    out = io.BytesIO()
    with Image.open(path) as image:
        image.convert("RGB").quantize(256, method=Image.Quantize.MAXCOVERAGE,
                                      dither=Image.Dither.NONE).save(out, "PNG", optimize=True)
    return out.getvalue()
