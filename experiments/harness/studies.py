"""What every figure study of experiments/harness/figures.py shares: its step count and threads from
the environment, the folder it writes into (never a tracked file), a short CPU training run
without logger or checkpoint, and measurements taken at given steps in eval mode."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
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


def train_briefly(model: L.LightningModule, data: L.LightningDataModule, steps: int,
                  callbacks: Iterable[L.Callback] = ()) -> L.LightningModule:
    """``steps`` optimizer steps on the CPU, no validation, logger or checkpoint."""
    silence_lightning_tips()
    if steps > 0:
        L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                  callbacks=list(callbacks)).fit(model, datamodule=data)
    return model


def prepared(data: L.LightningDataModule) -> L.LightningDataModule:
    """The DataModule with its files read (and fetched when absent) and its fit splits set up."""
    data.prepare_data()
    data.setup("fit")
    return data


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path
