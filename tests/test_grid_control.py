"""A grid owns its run folder and its cells (issue 16): a second grid on the same folder
stops at once, and stopping a grid (SIGTERM, Ctrl-C) stops its running cells instead of
leaving them orphaned; ``--skip-done`` then keeps only the finished ones."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from experiments import coda_mlu
from experiments.runner import _grid_lock
from tests.conftest import start

ROOT = Path(__file__).resolve().parents[1]


def test_a_second_grid_on_the_same_folder_stops_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    folder = tmp_path / "coda_mlu" / "table6-smoke"
    held = _grid_lock(folder)  # the first grid
    try:
        with pytest.raises(SystemExit) as stop:
            coda_mlu.EXPERIMENT.main(["grid", "table6", "--smoke"])
        assert str(stop.value) == (f"another grid is running in {folder} (pid {os.getpid()}); "
                                   "wait for it to finish, or stop it, then rerun with "
                                   "--skip-done")
        assert not any(folder.glob("*-seed*"))  # nothing launched, nothing overwritten
    finally:
        held.close()
    _grid_lock(folder).close()  # free again once the first one is done


def cell_pids(name: str) -> list[int]:
    """Processes whose command line names the run ``name``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"--run.name={name}".encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow
def test_stopping_a_grid_stops_its_cells(env, tmp_path):
    grid = start(ROOT / "experiments" / "coda_mlu.py",
                 ["grid", "table6", "--smoke", "--cells", "transformer", "--",
                  "--trainer.max_steps", "100000", "--run.wandb", "false"], env)
    deadline = time.time() + 120
    while not cell_pids("transformer-seed0"):
        assert time.time() < deadline and grid.poll() is None, "the cell never started"
        time.sleep(0.5)
    time.sleep(3)  # the cell is training
    grid.send_signal(signal.SIGTERM)
    out, _ = grid.communicate(timeout=60)
    assert grid.returncode == 1
    assert out.splitlines()[-1] == ("grid stopped; cells stopped unfinished: transformer seed 0 "
                                    "(rerun with --skip-done to keep the finished ones)")
    deadline = time.time() + 20
    while cell_pids("transformer-seed0") and time.time() < deadline:
        time.sleep(0.5)
    assert not cell_pids("transformer-seed0")  # no orphan left
