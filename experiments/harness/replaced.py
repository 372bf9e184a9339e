"""A run folder that a new start replaces is set aside, never deleted first: renamed beside
it (``<cell>-seed<k>.replaced-<time>``, a name no reader takes for a run), kept until the
new run has finished, then removed; put back when the new run fails before it trained a
step (its configuration or data refused it: nothing of it is worth more than the old run),
kept and said when it fails later.  A resume (``--skip-done``) that found no checkpoint to
go on from keeps the stopped run for good (``<cell>-seed<k>.stopped-<time>``, for a ``fit
--ckpt_path`` by hand).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from experiments.harness.checkpoints import checkpoints_latest_first


def _beside(run_dir: Path, what: str) -> Path:
    """A free name beside ``run_dir``: ``<name>.<what>-<time>``, ``-2``, ``-3``... after it."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1, 1000):
        aside = run_dir.with_name(f"{run_dir.name}.{what}-{stamp}{'' if n == 1 else f'-{n}'}")
        if not aside.exists():
            return aside
    raise FileExistsError(f"no free name {run_dir.name}.{what}-{stamp}-N beside {run_dir}")


def set_aside(run_dir: Path, label: str, resume: bool) -> Path | None:
    """Clear a run's folder for a fresh start.  A resume that found no checkpoint to go on
    from keeps the stopped run (and its checkpoints) as ``<name>.stopped-<time>``, said in
    one line, and returns None; any other folder is renamed ``<name>.replaced-<time>`` and
    returned, for :func:`settle` once the new run has ended.  None when there is no folder."""
    if not run_dir.exists():
        return None
    if resume and checkpoints_latest_first(run_dir):
        aside = _beside(run_dir, "stopped")
        run_dir.rename(aside)
        print(f"  {label}: no checkpoint to resume from; its stopped run is kept in {aside} "
              "(its checkpoints with it); starting over", flush=True)
        return None
    aside = _beside(run_dir, "replaced")
    run_dir.rename(aside)
    return aside


def trained(run_dir: Path) -> bool:
    """Whether a run got as far as training: it logged a metrics row or left a checkpoint."""
    metrics = run_dir / "metrics.csv"
    return bool(checkpoints_latest_first(run_dir)) or (
        metrics.is_file() and len(metrics.read_text(errors="replace").splitlines()) > 1)


def settle(run_dir: Path, aside: Path | None, failed: bool) -> str | None:
    """After the run that replaced ``aside`` ended: finished, the old run is removed (None);
    failed before it trained, its folder goes to ``<name>.failed-<time>`` and the old run
    back in place; failed later, the old run stays aside.  Returns the line that says
    which (None when there is nothing to say)."""
    if aside is None or not aside.exists():
        return None
    if not failed:
        shutil.rmtree(aside, ignore_errors=True)
        return None
    if not trained(run_dir):
        attempt = _beside(run_dir, "failed")
        run_dir.rename(attempt)
        aside.rename(run_dir)
        return (f"the previous run is back in {run_dir}; this attempt's log: "
                f"{attempt / 'output.log'}")
    return f"the run it replaced is kept in {aside}"
