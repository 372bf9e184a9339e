"""A grid owns its runs (issue 16): a second grid leaves a cell it is running alone, and
stopping a grid (SIGTERM, Ctrl-C) stops its running cells instead of leaving them
orphaned; ``--skip-done`` then keeps only the finished ones."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from experiments import coda_mlu
from experiments.harness.grid_model import run_lock
from experiments.harness.launch import shown_interpreter
from experiments.harness.runner import main as run_script
from tests.conftest import start

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_grid_leaves_a_running_cell_alone(tmp_path, monkeypatch, capsys):
    """Two grids may share a folder (different cells: tests/end_to_end/test_mt_experiments.py),
    never a run: a cell and seed another grid is running is not touched, and the grid says so."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    folder = tmp_path / "coda_mlu" / "table6-smoke"
    held = run_lock(folder, "transformer-seed0")  # the first grid runs it
    try:
        with pytest.raises(SystemExit) as stopped:
            run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--cells", "transformer"])
        assert (f"  NOT RUN transformer seed 0: another grid is running it (pid {os.getpid()}); "
                "rerun with --skip-done once it has finished") in capsys.readouterr().out
        assert str(stopped.value) == (  # left alone, not failed: the exit says which
            f"1 run(s) not run, another grid was running them: {folder / 'transformer-seed0'}"
            " (rerun with --skip-done once it has finished)")
        assert not (folder / "transformer-seed0").exists()  # nothing overwritten
    finally:
        held.close()
    assert run_lock(folder, "transformer-seed0") is not None  # free once the first is done


def test_a_stopped_run_is_not_thrown_away_without_being_asked(tmp_path, monkeypatch, capsys):
    """A run that stopped leaving checkpoints (hours of a long run) is neither wiped by a
    grid started without --skip-done nor by ``cell``: both refuse, naming it and its step,
    and change nothing; one another grid runs now is left to that grid (NOT RUN)."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    folder = tmp_path / "coda_mlu" / "table6-smoke"
    for name, step in (("transformer-seed0", 42000), ("coda-seed1", 7000)):
        checkpoints = folder / name / "checkpoints"
        checkpoints.mkdir(parents=True)
        (checkpoints / f"epoch=0-step={step}.ckpt").write_bytes(b"weights")
        (checkpoints / "last.ckpt").write_bytes(b"weights")
        (folder / name / "metrics.csv").write_text(f"epoch,step,train/loss\n0,{step - 1},1.0\n")

    def files() -> list[Path]:  # the runs' files (the lock files beside them aside)
        return sorted(p.relative_to(folder) for p in folder.rglob("*")
                      if not p.name.endswith(".lock"))

    before = files()
    with pytest.raises(SystemExit) as refused:
        run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--seeds", "2"])
    assert str(refused.value) == (
        f"coda_mlu.py grid: 2 run(s) in {folder} stopped before with checkpoints: transformer "
        "seed 0 (step 42,000), coda seed 1 (step 7,000); --skip-done resumes them (and keeps "
        "the finished ones), --force starts them again")
    with pytest.raises(SystemExit) as refused:
        run_script(coda_mlu.EXPERIMENT,
                   ["cell", "table6", "--smoke", "--cell", "coda", "--seed", "1"])
    assert str(refused.value) == (
        f"coda_mlu.py cell: coda seed 1 stopped before with checkpoints ({folder / 'coda-seed1'}"
        "); `grid table6 --config smoke --cells coda --seeds 2 --skip-done` resumes it, --force "
        "starts it again")
    held = run_lock(folder, "transformer-seed0")  # another grid resumes this one now
    try:
        with pytest.raises(SystemExit) as refused:
            run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--seeds", "2"])
    finally:
        held.close()
    assert "stopped before with checkpoints: coda seed 1 (step 7,000);" in str(refused.value)
    assert files() == before and len(before) == 10
    assert not capsys.readouterr().out


def cell_pids(name: str, env: dict) -> list[int]:
    """Processes whose command line names the run ``name`` and whose runs folder is the one
    of ``env`` (this test's: another test or a user's grid may run a cell of that name at
    the same moment)."""
    runs = f"ATTNREPRO_RUNS={env['ATTNREPRO_RUNS']}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (f"--run.name={name}".encode() in (entry / "cmdline").read_bytes()
                        and runs in (entry / "environ").read_bytes().split(b"\0")):
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
    while not cell_pids("transformer-seed0", env):
        assert time.time() < deadline and grid.poll() is None, "the cell never started"
        time.sleep(0.5)
    time.sleep(3)  # the cell is training
    grid.send_signal(signal.SIGTERM)
    out, _ = grid.communicate(timeout=60)
    assert grid.returncode == 1
    lines = out.splitlines()
    assert "SIGTERM: stopping 1 running cell(s) (Ctrl-C again kills them at once)" in lines
    assert re.fullmatch(r"  stopped with a checkpoint: transformer seed 0 \(resumes from step "
                        r"[\d,]+\)|  stopped without a checkpoint: transformer seed 0 \(restarts "
                        r"from step 0\)", lines[-2]), lines[-4:]
    assert lines[-1] == (f"resume with:  {shown_interpreter()} experiments/coda_mlu.py grid "
                         "table6 --config "
                         "smoke --cells transformer --skip-done -- --trainer.max_steps 100000 "
                         "--run.wandb false")
    deadline = time.time() + 20
    while cell_pids("transformer-seed0", env) and time.time() < deadline:
        time.sleep(0.5)
    assert not cell_pids("transformer-seed0", env)  # no orphan left


#: a stand-in for a cell's ``fit`` that, while it runs, sees another process finish the
#: other cell's run (a second grid ahead of this one): both folders get the grid's metric
FINISHING_FIT = """
import sys
from pathlib import Path
args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv if a.startswith("--run."))
group = Path({runs!r}) / "coda_mlu" / args["run.group"]
with open({launched!r}, "a") as log:
    log.write(args["run.name"] + "\\n")
for name, value in ((args["run.name"], 5), ({other!r}, 7)):
    (group / name).mkdir(parents=True, exist_ok=True)
    (group / name / "metrics.csv").write_text(f"step,test/exact_match\\n8,0.{{value}}\\n")
"""


def test_a_run_finished_meanwhile_is_kept_not_run_again(tmp_path, monkeypatch, capsys):
    """A run that another grid or cell finished after this grid listed its runs (two grids
    with --skip-done over the same cells, one ahead of the other) is kept when its turn
    comes: not resumed from its last checkpoint (its test run again) nor started afresh."""
    runs, launched = tmp_path / "runs", tmp_path / "launched.txt"
    script = tmp_path / "fit.py"
    script.write_text(FINISHING_FIT.format(runs=str(runs), launched=str(launched),
                                           other="coda-seed0"))
    monkeypatch.setattr(coda_mlu.EXPERIMENT, "script", script)
    monkeypatch.setenv("ATTNREPRO_RUNS", str(runs))
    run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--cells", "transformer",
                                     "coda", "--skip-done"])
    assert launched.read_text() == "transformer-seed0\n"  # coda was not launched
    assert ("  kept coda seed 0: finished meanwhile (another grid or cell ran it after this "
            "grid listed its runs)") in capsys.readouterr().out
    group = runs / "coda_mlu" / "table6-smoke"
    assert (group / "coda-seed0" / "metrics.csv").read_text() == \
        "step,test/exact_match\n8,0.7\n"  # the other process's result, untouched
    # --force replaces the runs that had finished when it listed them, and only those
    launched.unlink()
    run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--cells", "transformer",
                                     "coda", "--force"])
    assert launched.read_text() == "transformer-seed0\ncoda-seed0\n"
