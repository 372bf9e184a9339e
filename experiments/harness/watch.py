"""What a grid shows while its cells run.  Each cell writes its progress into its own
``output.log`` as lines (written by :class:`experiments.harness.progress.ProgressLines`,
formatted here by :func:`step_line` and :func:`validation_line`)::

    step 600/10000  loss 0.6166  1.74 steps/s  ETA 1h29m
    validation at step 500: val/exact_match 0.1510  val/loss 1.2345

``grid`` reads the new lines of each running cell's log (:class:`CellWatch`) and shows them:
on a terminal one live line per running cell (rich's ``Progress``: :class:`LiveLines`),
elsewhere (CI, nohup, a pipe) a status line per running cell every N seconds
(:class:`StatusLines`); a line when a cell starts and one when it ends go above either.
Only the standard library is imported here (a ``fit`` imports the line format, and ``grid``
imports neither torch nor Lightning); rich when a terminal shows the live lines.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_STEP = re.compile(r"step (\d+)(?:/(\d+))?(?:  loss (\S+))?  ([\d.]+) steps/s(?:  ETA (\S+))?")
_VALIDATION = re.compile(r"validation at step (\d+): (.*)")


def duration(seconds: float) -> str:
    """``1h02m``, ``9m52s``, ``41s``."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def step_line(step: int, total: int | None, loss: float | None, rate: float) -> str:
    """A cell's progress line: the step (of the total when known), the latest training loss,
    steps per second and the time left at that pace."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    parts.append(f"{rate:.2f} steps/s")
    if total and rate > 0:
        parts.append(f"ETA {duration((total - step) / rate)}")
    return "  ".join(parts)


def validation_line(step: int, metrics: dict[str, float]) -> str:
    shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
    return f"validation at step {step}: {shown or 'no metrics'}"


@dataclass
class CellWatch:
    """One running cell as its log shows it: the latest progress line and validation."""

    label: str
    log: Path
    metric: str  # the validation metric shown when the cell logs it (val/...)
    started: float = field(default_factory=time.time)
    step: int | None = None
    total: int | None = None
    loss: str | None = None
    rate: str | None = None
    eta: str | None = None
    validation: tuple[int, str, str] | None = None  # (step, metric, value)
    _offset: int = 0
    _rest: bytes = b""

    def read(self) -> None:
        """Take in the lines the cell wrote since the last read (a line cut short waits
        for its end)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:  # not created yet, or gone with its folder
            return
        self._offset += len(data)
        *lines, self._rest = (self._rest + data).split(b"\n")
        for raw in lines:
            self.take(raw.decode("utf-8", "replace").rsplit("\r", 1)[-1].strip())

    def take(self, line: str) -> None:
        if m := _STEP.fullmatch(line):
            step, total, self.loss, self.rate, self.eta = m.groups()
            self.step, self.total = int(step), int(total) if total else None
        elif m := _VALIDATION.fullmatch(line):
            values = dict(zip(*[iter(m.group(2).split())] * 2))
            shown = self.metric if self.metric in values else next(
                (k for k in values if k != "val/loss"), next(iter(values), None))
            if shown is not None:
                self.validation = (int(m.group(1)), shown, values[shown])

    def status(self) -> str:
        """``step 600/10000  loss 0.6166  val/acc 0.6812 (step 500)  1.74 steps/s  ETA 1h29m``,
        or how long it has been starting."""
        if self.step is None:
            return f"starting ({duration(time.time() - self.started)})"
        parts = [f"step {self.step}/{self.total}" if self.total else f"step {self.step}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss}")
        if self.validation is not None:
            step, name, value = self.validation
            parts.append(f"{name} {value} (step {step})")
        if self.total is not None and self.step >= self.total:
            parts.append("training done")  # then the last validation and the test
        else:
            parts.append(f"{self.rate} steps/s")
            if self.eta is not None:
                parts.append(f"ETA {self.eta}")
        return "  ".join(parts)


class StatusLines:
    """Without a terminal: a line when a cell starts, then every ``every`` seconds one status
    line per running cell (``every`` 0: none), each with the grid's time so far::

        [1m00s] transformer seed 0: step 600/4000  loss 0.6166  ...  ETA 32m35s
    """

    def __init__(self, every: float, out=None):
        self.every = every
        self.out = out or sys.stdout
        self.cells: dict[str, CellWatch] = {}
        self.began = time.time()
        self.due = self.began + every

    def __enter__(self) -> StatusLines:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def start(self, key: str, cell: CellWatch) -> None:
        self.cells[key] = cell
        self.say(f"  started {cell.label}: {cell.log}")

    def end(self, key: str) -> None:
        self.cells.pop(key, None)

    def tick(self) -> None:
        now = time.time()
        if not self.every or now < self.due:
            return
        self.due = now + self.every
        for cell in self.cells.values():
            cell.read()
            self.say(f"  [{duration(now - self.began)}] {cell.label}: {cell.status()}")


class LiveLines(StatusLines):
    """On a terminal: one live line per running cell (rich's ``Progress``, redrawn a few
    times a second: the cell, its step of the total as a bar, then :meth:`CellWatch.status`),
    removed when the cell ends; what the grid prints goes above them."""

    def __init__(self, console):
        super().__init__(0, console.file)
        from rich.progress import BarColumn, Progress, TextColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 TextColumn("{task.fields[status]}"), console=console,
                                 refresh_per_second=4, transient=True)
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> LiveLines:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def start(self, key: str, cell: CellWatch) -> None:
        self.cells[key] = cell
        self.tasks[key] = self.progress.add_task(cell.label, total=None, status=cell.status())

    def end(self, key: str) -> None:
        self.cells.pop(key, None)
        if key in self.tasks:
            self.progress.remove_task(self.tasks.pop(key))

    def tick(self) -> None:
        for key, cell in self.cells.items():
            cell.read()
            self.progress.update(self.tasks[key], total=cell.total, completed=cell.step or 0,
                                 status=cell.status())


def watcher(status_every: float, out=None) -> StatusLines:
    """Live lines when ``out`` (default: standard output) is a terminal rich can redraw
    lines on (not ``TERM=dumb``), else status lines every ``status_every`` seconds."""
    out = out or sys.stdout
    if getattr(out, "isatty", lambda: False)():
        from rich.console import Console

        console = Console(file=out)
        if console.is_terminal and not console.is_dumb_terminal:
            return LiveLines(console)
    return StatusLines(status_every, out)
