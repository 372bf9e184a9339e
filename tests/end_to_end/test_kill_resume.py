"""A long run survives being stopped (issue 29 item 4): a grid cell stopped by SIGTERM in a
training step, a validation or the test after fit, or killed while a checkpoint is being
written, restarts with ``grid --skip-done`` and ends with the metrics, weights and
predictions of an uninterrupted run; a checkpoint cut short is never resumed from
(experiments/harness/checkpoints.py).  Kill points are found by watching the cell's files: its
metrics.csv (flushed every 5 steps and when a fit ends), its checkpoints folder (a
checkpoint at step 10 is written just before the validation of step 10); a checkpoint's
write is held half done by a start-up hook (tests/hooks/hold_checkpoint) for the kill."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from experiments.harness.checkpoints import (
    AtomicCheckpointIO,
    checkpoint_problem,
    resumable_checkpoint,
    validation_due,
)
from experiments.harness.replaced import set_aside, settle
from tests.conftest import run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "coda_mlu.py"
#: the smoke cell (20 steps, a checkpoint and a validation every 10) with a validation of 32
#: batches and a test of 16, long enough to be stopped inside either
EXTRA = ["--model.dropout=0.1", "--run.wandb=false", "--data.val_size=2048",
         "--trainer.limit_val_batches=32", "--data.test_size=1024"]
GRID = ["grid", "table6", "--smoke", "--cells", "transformer"]
CELL = Path("coda_mlu") / "table6-smoke" / "transformer-seed0"
#: the last line of a fit stopped by SIGTERM (it exits with status 1, not Lightning's 0)
STOPPED = ("coda_mlu.py: stopped by SIGTERM before the end; its latest checkpoint resumes it "
           "(grid --skip-done, or fit --ckpt_path)")


# -- what a run ends with ---------------------------------------------------------------------
def metric_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a metrics.csv without the columns that time or measure the machine
    (steps per second, wall seconds, memory), rows left empty dropped.  A test row keeps no
    step: a fit resumed from its last step's checkpoint ends at once, and Lightning labels
    the test after it epoch 0, step 19 instead of epoch 1, step 20."""
    with open(path, newline="") as f:
        rows = [{k: v for k, v in row.items() if v not in ("", None) and k != "epoch"
                 and "second" not in k and "memory" not in k} for row in csv.DictReader(f)]
    rows = [row for row in rows if set(row) - {"step"}]
    return [{k: v for k, v in row.items() if k != "step"} if any(k.startswith("test/")
            for k in row) else row for row in rows]


def outcome(cell: Path) -> dict:
    """What an uninterrupted run and a stopped-and-resumed one must share."""
    # the checkpoint of the last step (a resume that passed over a broken last.ckpt removed
    # it, and a fit resumed at its last step ends at once, writing no checkpoint)
    state = torch.load(cell / "checkpoints" / "epoch=0-step=20.ckpt", map_location="cpu",
                       weights_only=False)["state_dict"]
    return {"rows": metric_rows(cell / "metrics.csv"),
            "weights": {k: v.tolist() for k, v in state.items()},
            "predictions": (cell / "predictions-test.jsonl").read_text()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The cell run once without a stop."""
    tmp = tmp_path_factory.mktemp("reference")
    run(SCRIPT, [*GRID, "--", *EXTRA], environment(tmp))
    return outcome(tmp / "runs" / CELL)


def environment(tmp: Path) -> dict:
    """conftest's ``env`` for a folder of any scope (the reference is run once per module)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    e.update(ATTNREPRO_RUNS=str(tmp / "runs"), ATTNREPRO_CACHE=str(tmp / "cache"),
             HOME=str(tmp), ATTNREPRO_THREADS="1")
    return e


# -- stopping a cell at a chosen moment -------------------------------------------------------
def logged_steps(cell: Path) -> set[int]:
    try:
        with open(cell / "metrics.csv", newline="") as f:
            return {int(r["step"]) for r in csv.DictReader(f) if r.get("step")}
    except (OSError, ValueError, KeyError):
        return set()


def checkpoint_names(cell: Path) -> set[str]:
    try:
        return {p.name for p in (cell / "checkpoints").iterdir()}
    except OSError:
        return set()


def cell_of(grid: subprocess.Popen) -> int | None:
    """The pid of the grid's cell: its child process (None before it starts)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == grid.pid:
                    return int(entry.name)
            except (OSError, IndexError, ValueError):
                continue
    return None


def start_grid(env: dict, skip_done: bool) -> subprocess.Popen:
    args = [*GRID, *(["--skip-done"] if skip_done else []), "--", *EXTRA]
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(grid: subprocess.Popen, moment: Callable[[], bool], what: str,
             poll: float = 0.02) -> None:
    deadline = time.time() + 240
    while not moment():
        if grid.poll() is not None:
            out = grid.stdout.read()
            raise AssertionError(f"the grid ended before {what}:\n{out[-3000:]}")
        assert time.time() < deadline, f"no {what} within 240 s"
        time.sleep(poll)


def stop_grid(grid: subprocess.Popen, named: str) -> str:
    """SIGTERM to the grid, which stops its cell (SIGTERM to the cell's process group) and
    names it as ``named`` says: what the next ``--skip-done`` will do with it."""
    grid.send_signal(signal.SIGTERM)
    out, _ = grid.communicate(timeout=120)
    assert grid.returncode == 1, out[-3000:]
    assert f"  {named}" in out.splitlines(), out[-3000:]
    return out


#: the folder whose sitecustomize.py holds a process in its first checkpoint write
HOLD = Path(__file__).resolve().parents[1] / "hooks" / "hold_checkpoint"


def kill_mid_checkpoint(env: dict, cell: Path, marker: Path) -> str:
    """SIGKILL the cell while one of its checkpoints is being written: the grid starts with
    tests/hooks/hold_checkpoint on its PYTHONPATH, which leaves the cell's first checkpoint
    write half done in its temporary file and holds it there (a moment chosen, not caught:
    polling for a short write misses it on a loaded machine); the grid then reports the cell
    failed.  Returns the name of the temporary file."""
    held = {**env, "ATTNREPRO_TEST_HOLD_CHECKPOINT": str(marker),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HOLD), env.get("PYTHONPATH")]))}
    grid = start_grid(held, skip_done=True)
    wait_for(grid, marker.exists, "a checkpoint being written")
    partial = Path(marker.read_text())
    assert partial.parent == cell / "checkpoints" and partial.exists()
    os.kill(cell_of(grid), signal.SIGKILL)
    out, _ = grid.communicate(timeout=120)
    assert grid.returncode == 1 and "FAILED transformer seed 0" in out, out[-3000:]
    return partial.name


@pytest.mark.slow
def test_a_cell_stopped_at_every_kind_of_moment_ends_as_an_uninterrupted_run(tmp_path,
                                                                               reference):
    """One cell stopped four times, each restart (``grid --skip-done``) stopped at the next
    moment: in the validation of step 10, in a training step after it, while the checkpoint
    of step 20 is written (SIGKILL), in the test after fit; then its last checkpoint is cut
    short (a copy or sync interrupted), and the fifth start resumes from the one before and
    finishes."""
    env = environment(tmp_path)
    cell = tmp_path / "runs" / CELL

    # 1. in the validation of step 10: its checkpoint is written just before it
    grid = start_grid(env, skip_done=False)
    wait_for(grid, lambda: "epoch=0-step=10.ckpt" in checkpoint_names(cell),
             "the checkpoint of step 10")
    # its checkpoint of step 10 is whole, but the metrics after it are not on disk: the grid
    # says the cell restarts, as the next --skip-done does (step 2)
    stop_grid(grid, "stopped without a checkpoint: transformer seed 0 (restarts from step 0)")
    assert (cell / "output.log").read_text().rstrip().endswith(STOPPED)
    assert not any(k.startswith("val/") for row in metric_rows(cell / "metrics.csv")
                   for k in row)  # stopped before its row was written

    # 2. in a training step after that validation (steps 15-20), SIGTERM to the cell alone
    # (a cluster stopping every process of a job): the grid reports it failed, not done.
    # This restart started over, the validation of step 10 never having finished
    grid = start_grid(env, skip_done=True)
    wait_for(grid, lambda: 14 in logged_steps(cell), "the metrics of step 14")
    os.kill(cell_of(grid), signal.SIGTERM)
    said, _ = grid.communicate(timeout=120)
    assert grid.returncode == 1 and "FAILED transformer seed 0" in said, said[-3000:]
    assert said.rstrip().endswith(f"1 run(s) failed: {cell}")
    assert f"    {STOPPED}" in said  # the last lines of its output.log
    assert ("epoch=0-step=10.ckpt: the metrics after its step 10 were not written (stopped "
            "before the next row or its validation's row reached metrics.csv); no earlier "
            "checkpoint: starting over") in said
    # the checkpoint passed over is not deleted: the stopped run is set aside beside the cell
    aside = [d for d in cell.parent.iterdir() if d.name.startswith(f"{cell.name}.stopped-")]
    assert len(aside) == 1 and (aside[0] / "checkpoints" / "epoch=0-step=10.ckpt").exists()
    assert (f"  transformer seed 0: no checkpoint to resume from; its stopped run is kept in "
            f"{aside[0]} (its checkpoints with it); starting over") in said

    # 3. killed while a checkpoint of step 20 is written
    partial = kill_mid_checkpoint(env, cell, tmp_path / "held")  # from last.ckpt, of step 10
    assert partial.startswith((".epoch=0-step=20.ckpt.", ".last.ckpt."))  # beside its name
    assert all(checkpoint_problem(p) is None for p in (cell / "checkpoints").glob("*.ckpt"))

    # 4. in the test after fit: the fit's last rows are flushed when it ends
    grid = start_grid(env, skip_done=True)
    wait_for(grid, lambda: 20 in logged_steps(cell), "the end of the fit")
    said = stop_grid(grid, "stopped with a checkpoint: transformer seed 0 (resumes from step 20)")
    assert "resuming transformer seed 0 from last.ckpt (stopped before)" in said

    # 5. the last checkpoint cut short: refused by fit --ckpt_path, passed over by the grid
    last = cell / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:len(last.read_bytes()) // 2])
    refused = subprocess.run([sys.executable, str(SCRIPT), "fit", "--config",
                              str(ROOT / "experiments/configs/coda_mlu/smoke.yaml"),
                              f"--ckpt_path={last}", "--run.wandb=false"], env=env, cwd=ROOT,
                             capture_output=True, text=True)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"coda_mlu.py: --ckpt_path {last}: not a whole checkpoint (BadZipFile: File is not a "
        "zip file)")
    said = run(SCRIPT, [*GRID, "--skip-done", "--", *EXTRA], env)
    assert (f"  {last}: not a whole checkpoint (BadZipFile: File is not a zip file); resuming "
            "from epoch=0-step=20.ckpt instead") in said
    assert "resuming transformer seed 0 from epoch=0-step=20.ckpt (stopped before)" in said
    assert "done transformer seed 0" in said
    assert not last.exists()  # passed over, removed
    got = outcome(cell)
    assert got["rows"] == reference["rows"]
    assert got["weights"] == reference["weights"]
    assert got["predictions"] == reference["predictions"]


# -- checkpoints written whole, checked before a resume ---------------------------------------
def test_a_checkpoint_is_written_beside_its_name_and_replaces_it_whole(tmp_path, monkeypatch):
    """The temporary file is in the checkpoint's own folder (a rename, never a copy across
    file systems, whatever $TMPDIR is), and a save that fails leaves the previous
    checkpoint as it was."""
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, path)
    seen = []
    real_save = torch.save

    def failing(obj, f):
        seen.append(Path(f))
        real_save(obj, f)
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing)
    monkeypatch.setenv("TMPDIR", "/dev/shm")
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert seen[0].parent == path.parent and seen[0].name.startswith(".last.ckpt.")
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]
    assert torch.load(path, weights_only=True)["global_step"] == 1


def write_checkpoint(path: Path, step: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "w": torch.arange(1000.0)}, path)
    return path


def test_a_broken_checkpoint_is_skipped_for_the_one_before_in_one_line(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    write_checkpoint(folder / "epoch=0-step=10.ckpt", 10)
    step20 = write_checkpoint(folder / "epoch=0-step=20.ckpt", 20)
    last = write_checkpoint(folder / "last.ckpt", 20)
    (tmp_path / "run" / "metrics.csv").write_text("epoch,step,train/loss\n0,24,2.5\n")
    said = []
    assert resumable_checkpoint(tmp_path / "run", said.append) == last and not said
    last.write_bytes(last.read_bytes()[:1500])  # cut short
    data = bytearray(step20.read_bytes())
    data[1200] ^= 0xFF  # one byte of a tensor changed
    step20.write_bytes(bytes(data))
    assert resumable_checkpoint(tmp_path / "run", said.append).name == "epoch=0-step=10.ckpt"
    assert said == [
        f"  {last}: not a whole checkpoint (BadZipFile: File is not a zip file); resuming "
        "from epoch=0-step=20.ckpt instead",
        f"  {step20}: not a whole checkpoint (member epoch=0-step=20/data/0 does not "
        "match its CRC); resuming from epoch=0-step=10.ckpt instead"]
    (folder / "epoch=0-step=10.ckpt").write_bytes(b"")
    said.clear()
    assert resumable_checkpoint(tmp_path / "run", said.append) is None
    assert said[-1].endswith("no earlier checkpoint: starting over")


def test_a_checkpoint_whose_later_metrics_never_reached_the_disk_is_passed_over(tmp_path):
    """Lightning writes the checkpoint of step 10 before that batch's row and the
    validation of step 10, and skips both when it resumes from it: resumed from only once
    metrics.csv holds a later row or that validation's row (step 9)."""
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    write_checkpoint(folder / "epoch=0-step=10.ckpt", 10)
    write_checkpoint(folder / "epoch=0-step=20.ckpt", 20)
    write_checkpoint(folder / "last.ckpt", 20)
    metrics = run_dir / "metrics.csv"
    header = "epoch,step,train/loss,val/loss\n"
    said = []
    for rows, chosen in [("0,4,2.9,\n0,9,2.7,\n0,14,2.6,\n0,19,2.5,\n", "epoch=0-step=10.ckpt"),
                         ("0,19,2.5,\n0,19,,2.4\n", "last.ckpt"),  # validation of step 20
                         ("0,19,2.5,\n0,20,,\n", "last.ckpt")]:  # the fit's last row
        metrics.write_text(header + rows)
        said.clear()
        assert resumable_checkpoint(run_dir, said.append).name == chosen
    metrics.write_text(header + "0,4,2.9,\n0,9,2.7,\n0,14,2.6,\n0,19,2.5,\n")
    resumable_checkpoint(run_dir, said.append)
    assert said[-2:] == [
        f"  {folder / 'last.ckpt'}: the metrics after its step 20 were not written (stopped "
        "before the next row or its validation's row reached metrics.csv); resuming from "
        "epoch=0-step=20.ckpt instead",
        f"  {folder / 'epoch=0-step=20.ckpt'}: the metrics after its step 20 were not written "
        "(stopped before the next row or its validation's row reached metrics.csv); resuming "
        "from epoch=0-step=10.ckpt instead"]
    metrics.unlink()
    assert resumable_checkpoint(run_dir) is None


def test_a_checkpoint_between_validations_resumes_once_its_own_batch_row_is_on_disk(tmp_path):
    """Seen in a 100K-step run (validation every 5,000 steps, a checkpoint every 1,000, rows
    every 100): stopped after the checkpoint of step 42,000 and its batch's row (step
    41,999) reached the disk, before the row of step 42,099.  No validation falls at step
    42,000, so nothing is lost by resuming from it; at step 45,000 the validation's row is
    still needed; with a cadence the saved config does not state, the later row is."""
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    (run_dir / "config.yaml").parent.mkdir(parents=True)
    config = "trainer:\n  max_steps: 100000\n  val_check_interval: 5000\n" \
             "  check_val_every_n_epoch: null\n"
    (run_dir / "config.yaml").write_text(config)
    metrics = run_dir / "metrics.csv"
    header = "epoch,step,train/loss,val/em\n"
    rows = "".join(f"0,{s},2.5,\n" for s in range(39999, 42000, 100)) + "0,39999,,60.0\n"
    metrics.write_text(header + rows)
    write_checkpoint(folder / "epoch=0-step=41000.ckpt", 41000)
    write_checkpoint(folder / "epoch=0-step=42000.ckpt", 42000)
    write_checkpoint(folder / "last.ckpt", 42000)
    said = []
    assert resumable_checkpoint(run_dir, said.append).name == "last.ckpt" and not said

    for path in folder.iterdir():
        path.unlink()
    write_checkpoint(folder / "epoch=0-step=44000.ckpt", 44000)
    write_checkpoint(folder / "last.ckpt", 45000)
    metrics.write_text(header + "".join(f"0,{s},2.5,\n" for s in range(43999, 45000, 100)))
    assert resumable_checkpoint(run_dir, said.append).name == "epoch=0-step=44000.ckpt"
    assert said == [f"  {folder / 'last.ckpt'}: the metrics after its step 45000 were not "
                    "written (stopped before the next row or its validation's row reached "
                    "metrics.csv); resuming from epoch=0-step=44000.ckpt instead"]
    metrics.write_text(metrics.read_text() + "0,44999,,61.0\n")  # the validation's row
    assert resumable_checkpoint(run_dir).name == "last.ckpt"

    (run_dir / "config.yaml").write_text(config.replace("null", "1"))  # once per epoch
    metrics.write_text(header + "".join(f"0,{s},2.5,\n" for s in range(41999, 44100, 100)))
    assert resumable_checkpoint(run_dir).name == "epoch=0-step=44000.ckpt"  # a later row
    metrics.write_text(header + "".join(f"0,{s},2.5,\n" for s in range(41999, 44000, 100)))
    assert resumable_checkpoint(run_dir) is None  # its own row is there, its cadence unknown


@pytest.mark.parametrize(("trainer", "due"), [
    ({"val_check_interval": 5000, "check_val_every_n_epoch": None, "max_steps": 12345},
     [5000, 10000, 12345]),
    ({"val_check_interval": 10, "check_val_every_n_epoch": None}, [10, 20, 30, 40]),
    ({"val_check_interval": 0.5, "check_val_every_n_epoch": None}, None),  # share of an epoch
    ({"val_check_interval": 10, "check_val_every_n_epoch": 1}, None),
    ({"val_check_interval": True, "check_val_every_n_epoch": None}, None),
    ({}, None)])
def test_the_validation_steps_come_from_the_runs_saved_config(tmp_path, trainer, due):
    import yaml

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainer": trainer}))
    got = validation_due(config)
    assert (None if got is None else [s for s in range(1, 12346) if got(s)][:4]) == due
    assert validation_due(tmp_path / "missing.yaml") is None
    config.write_text("trainer: [unclosed")
    assert validation_due(config) is None


def test_a_fresh_start_after_a_resume_found_nothing_keeps_the_stopped_run(tmp_path, capsys):
    """What ``grid --skip-done`` passed over is renamed aside for good, never deleted; a run
    without checkpoints, or a start without --skip-done, is set aside until the new run
    has finished (experiments/harness/replaced.py)."""
    run_dir = tmp_path / "coda-seed0"
    write_checkpoint(run_dir / "checkpoints" / "last.ckpt", 42000)
    (run_dir / "metrics.csv").write_text("epoch,step\n0,41999\n")
    assert set_aside(run_dir, "coda seed 0", resume=True) is None
    aside = [d for d in tmp_path.iterdir() if d.name.startswith("coda-seed0.stopped-")]
    assert not run_dir.exists() and len(aside) == 1
    assert (aside[0] / "checkpoints" / "last.ckpt").exists()
    assert (aside[0] / "metrics.csv").read_text() == "epoch,step\n0,41999\n"
    assert capsys.readouterr().out == (
        f"  coda seed 0: no checkpoint to resume from; its stopped run is kept in {aside[0]} "
        "(its checkpoints with it); starting over\n")
    for resume, checkpoint in [(True, False), (False, True)]:
        (run_dir / "checkpoints").mkdir(parents=True)
        if checkpoint:
            write_checkpoint(run_dir / "checkpoints" / "last.ckpt", 10)
        replaced = set_aside(run_dir, "coda seed 0", resume=resume)
        assert not run_dir.exists() and replaced.name.startswith("coda-seed0.replaced-")
        run_dir.mkdir()
        assert settle(run_dir, replaced, failed=False) is None and not replaced.exists()
        run_dir.rmdir()
    assert len(list(tmp_path.iterdir())) == 1 and not capsys.readouterr().out
