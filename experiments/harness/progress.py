"""What a run shows while it trains.  On a terminal, Lightning's progress bar; elsewhere (a grid
cell's ``output.log``, a batch job, a pipe) one line every N optimiser steps (the step, the
training loss, steps per second, the time left) and one at each validation (its metrics),
:class:`ProgressLines`.  A bar's carriage returns would fill a log file with one line per
refresh; these lines stay readable there.  ``--trainer.enable_progress_bar true|false``
chooses for itself; ``--run.progress_every N`` sets N (0: no lines).  The lines' format is
experiments/harness/watch.py's, which ``grid`` reads them with.  The bar on a terminal is
Lightning's rich bar, its description the epoch alone when the run is bounded by steps
(:func:`progress_bar`; Lightning's own says ``Epoch 0/-2`` then).
"""

from __future__ import annotations

import math
import sys
import time

from lightning.pytorch.callbacks import Callback, RichProgressBar

from experiments.harness.watch import duration, step_line, validation_line

__all__ = ["LINES_PER_RUN", "ProgressLines", "duration", "progress_bar", "shows_bar"]

#: lines of a run at the default spacing (``--run.progress_every`` unset)
LINES_PER_RUN = 100


def shows_bar(setting: bool | None, stream=None) -> bool:
    """Lightning's progress bar for a run: ``setting`` when given (the trainer's
    ``enable_progress_bar``), else on a terminal only."""
    if setting is not None:
        return bool(setting)
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


class _StepBoundBar(RichProgressBar):
    """Lightning's rich bar, whose training description is ``Epoch <e>/<max_epochs - 1>``:
    ``Epoch 0/-2`` for a run bounded by ``max_steps`` (``max_epochs`` -1).  Here the epoch
    alone then (Lightning 2.6's ``_get_train_description``)."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)


def progress_bar() -> RichProgressBar:
    """The bar of a run on a terminal."""
    return _StepBoundBar()


class ProgressLines(Callback):
    """A line every ``every`` optimiser steps (default: :data:`LINES_PER_RUN` lines over the
    run) and one after each validation, from the first process only::

        step 200/2000  loss 1.8731  3.42 steps/s  ETA 8m46s
        validation at step 200: val/exact_match 0.1250  val/loss 1.7012

    Steps per second are measured since the previous line, wall clock (data loading and
    validation included), so the time left is what the run will take at its current pace."""

    def __init__(self, every: int | None = None, stream=None):
        if every is not None and every < 1:
            raise ValueError(f"progress lines every {every} steps: expected a positive number")
        self.every = every
        self.stream = stream
        self._last: tuple[int, float] | None = None  # (step, time) of the previous line

    def _say(self, trainer, text: str) -> None:
        if trainer.is_global_zero:
            print(text, file=self.stream or sys.stdout, flush=True)

    def total_steps(self, trainer) -> int | None:
        """The run's optimiser steps: ``max_steps``, else Lightning's estimate from the epochs
        and the batches (None when unbounded)."""
        if trainer.max_steps and trainer.max_steps > 0:
            return trainer.max_steps
        try:
            total = trainer.estimated_stepping_batches
        except Exception:  # noqa: BLE001 - no estimate without a sized loader
            return None
        return int(total) if total and math.isfinite(total) else None

    def on_train_start(self, trainer, pl_module) -> None:
        total = self.total_steps(trainer)
        if self.every is None:
            self.every = max(1, total // LINES_PER_RUN) if total else 50
        self._last = (trainer.global_step, time.monotonic())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self._last is None or step == self._last[0] or step % self.every:
            return
        now = time.monotonic()
        rate = (step - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (step, now)
        loss = trainer.callback_metrics.get("train/loss")
        self._say(trainer, step_line(step, self.total_steps(trainer),
                                     None if loss is None else float(loss), rate))

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: v for k, v in sorted(trainer.callback_metrics.items())
                   if k.startswith("val/") and getattr(v, "numel", lambda: 1)() == 1}
        self._say(trainer, validation_line(trainer.global_step,
                                           {k: float(v) for k, v in metrics.items()}))
