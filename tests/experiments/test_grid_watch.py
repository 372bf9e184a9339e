"""Watching and stopping a grid (issue 49 items 1 and 2).  On a terminal ``grid`` shows one
live line per running cell (its step of the total, latest loss and validation metric,
steps/s, ETA) and a line when a cell ends; without one, a status line per running cell every
``--status-every`` seconds.  Ctrl-C or SIGTERM stops it within a few seconds and names each
cell as its run folder holds it (finished, stopped with the checkpoint ``--skip-done``
resumes from and its step, stopped without one), with the command that resumes.

The cells' paces are set by tests/hooks/slow_steps (a sleep after each optimiser step of the
runs it names), so a cell is at a chosen point when the test looks.  No wall time is
asserted as a measure of speed; the stop has a generous deadline."""

from __future__ import annotations

import csv
import fcntl
import os
import pty
import re
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from experiments.harness.checkpoints import resumable_checkpoint
from experiments.harness.launch import shown_interpreter
from experiments.harness.watch import CellWatch, StatusLines, step_line, validation_line
from tests.conftest import start
from tests.experiments.test_grid_control import cell_pids

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "coda_mlu.py"
SLOW = ROOT / "tests" / "hooks" / "slow_steps"
GRID = "coda_mlu/table6-smoke"


def paced(env: dict, **paces: float) -> dict:
    """``env`` with tests/hooks/slow_steps on the PYTHONPATH: each named run sleeps its pace
    (seconds) after every optimiser step."""
    return {**env, "ATTNREPRO_TEST_SLOW_STEPS": ",".join(f"{k}={v}" for k, v in paces.items()),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SLOW), env.get("PYTHONPATH")]))}


ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[=>78])")


def screen_lines(raw: str) -> list[str]:
    """The lines a terminal was drawn with: escape sequences dropped, split at every carriage
    return and newline."""
    return [line for line in re.split(r"[\r\n]+", ANSI.sub("", raw)) if line.strip()]


def run_in_pty(cmd: list[str], env: dict, timeout: float = 300) -> tuple[int, str]:
    """Run ``cmd`` with a pseudo-terminal of 160 columns as its standard output and error:
    (its exit status, all it wrote)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT,
                            env={**env, "TERM": "xterm", "COLUMNS": "160"},
                            start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.time() + timeout
    try:
        while True:
            assert time.time() < deadline, f"not done within {timeout} s:\n{out[-3000:]}"
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the other side closed: the process has ended
                    break
                if not data:
                    break
                out += data
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)
    return proc.returncode, out.decode("utf-8", "replace")


# -- the lines of a cell, as the grid reads them ---------------------------------------------
def test_a_cells_progress_is_read_from_the_lines_it_writes(tmp_path):
    log = tmp_path / "output.log"
    cell = CellWatch("coda seed 1", log, "val/exact_match", started=time.time() - 12)
    cell.read()  # no log yet
    assert cell.status() == "starting (12s)"
    log.write_text("Seed set to 1\n" + step_line(200, 4000, 1.87312, 3.42) + "\n"
                   + validation_line(200, {"val/exact_match": 0.125, "val/loss": 1.7})
                   + "\n" + step_line(400, 4000, None, 2.0)[:9])  # a line cut short
    cell.read()
    assert cell.status() == ("step 200/4000  loss 1.8731  val/exact_match 0.1250 (step 200)  "
                             "3.42 steps/s  ETA 18m31s")
    with open(log, "a") as f:  # the rest of the line, then a bar's carriage returns
        f.write(step_line(400, 4000, None, 2.0)[9:] + "\nx\rstep 410/4000  2.00 steps/s\n")
    cell.read()
    assert cell.status() == "step 410/4000  val/exact_match 0.1250 (step 200)  2.00 steps/s"
    with open(log, "a") as f:
        f.write(step_line(4000, 4000, 0.5, 2.0) + "\n" + validation_line(4000, {"val/acc": 0.5})
                + "\n")
    cell.read()  # a run without the grid's metric shows its first other than the loss
    assert cell.status() == "step 4000/4000  loss 0.5000  val/acc 0.5000 (step 4000)  " \
                            "training done"


def test_status_lines_come_at_their_interval_only(tmp_path, capsys):
    watch = StatusLines(3600, None)
    watch.start("a", CellWatch("transformer seed 0", tmp_path / "a.log", "val/acc"))
    watch.tick()  # not yet due
    assert capsys.readouterr().out == (f"  started transformer seed 0: {tmp_path / 'a.log'}\n")
    watch.due = time.time() - 1
    watch.tick()
    assert re.fullmatch(r"  \[0s\] transformer seed 0: starting \(0s\)\n", capsys.readouterr().out)
    watch.end("a")
    watch.due = time.time() - 1
    watch.tick()
    assert capsys.readouterr().out == ""
    silent = StatusLines(0, None)  # --status-every 0
    silent.start("a", CellWatch("transformer seed 0", tmp_path / "a.log", "val/acc"))
    silent.due = time.time() - 1
    silent.tick()
    assert capsys.readouterr().out.count("\n") == 1  # the start line alone


def test_status_every_takes_seconds(env):
    refused = subprocess.run([sys.executable, str(SCRIPT), "grid", "table6", "--smoke",
                              "--status-every", "soon"], env=env, cwd=ROOT, text=True,
                             capture_output=True)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "coda_mlu.py grid: argument --status-every: expected an integer >= 0, got 'soon' "
        "(see coda_mlu.py grid --help)"]


# -- watching a grid ------------------------------------------------------------------------
@pytest.mark.slow
def test_a_grid_on_a_terminal_shows_a_live_line_per_running_cell(env, tmp_path):
    """Both cells of the smoke grid at once under a pseudo-terminal: each has a live line
    that moves (several steps of 20 shown, with loss, validation metric, steps/s and ETA),
    then one line when it ends; Lightning's own bar stays off in the cells."""
    code, raw = run_in_pty([sys.executable, str(SCRIPT), "grid", "table6", "--smoke",
                            "--jobs", "2", "--", "--run.wandb=false"],
                           paced(env, **{"transformer-seed0": 0.3, "coda-seed0": 0.3}))
    lines = screen_lines(raw)
    assert code == 0, "\n".join(lines[-30:])
    for label in ("transformer seed 0", "coda seed 0"):
        live = [m for line in lines if (m := re.fullmatch(
            rf"{label} +\S+ step (\d+)/20  loss \d\.\d{{4}}  (?:val/exact_match \d\.\d{{4}} "
            r"\(step \d+\)  )?\d+\.\d\d steps/s  ETA \d+s", line.strip()))]
        assert len({m.group(1) for m in live}) >= 3, f"{label}: {lines[-30:]}"
        assert any("val/exact_match" in m.group(0) for m in live)  # after step 10's validation
        assert sum(line.startswith(f"  done {label} (") for line in lines) == 1
    assert "Epoch" not in raw
    for cell in ("transformer-seed0", "coda-seed0"):
        log = (tmp_path / "runs" / GRID / cell / "output.log").read_text()
        assert "step 20/20" in log and "Epoch" not in log and "\r" not in log


@pytest.mark.slow
def test_a_fit_on_a_terminal_shows_lightnings_bar_without_epoch_minus_two(env):
    """`fit` itself on a terminal keeps Lightning's bar; a run bounded by steps (max_epochs
    -1) reads 'Epoch 0', never 'Epoch 0/-2'."""
    code, raw = run_in_pty([sys.executable, str(SCRIPT), "fit", "--config",
                            "experiments/configs/coda_mlu/smoke.yaml", "--run.wandb=false",
                            "--run.name=bar"], env)
    assert code == 0, "\n".join(screen_lines(raw)[-30:])
    assert "Epoch 0 " in ANSI.sub("", raw) and "/-2" not in raw


@pytest.mark.slow
def test_a_grid_without_a_terminal_prints_status_lines_at_its_interval(env):
    grid = start(SCRIPT, ["grid", "table6", "--smoke", "--cells", "coda", "--status-every", "1",
                          "--", "--run.wandb=false"], paced(env, **{"coda-seed0": 0.3}))
    out, _ = grid.communicate(timeout=300)
    assert grid.returncode == 0, out[-3000:]
    assert "\x1b" not in out and "\r" not in out
    lines = out.splitlines()
    assert lines[1] == f"  started coda seed 0: {Path(env['ATTNREPRO_RUNS']) / GRID}/coda-seed0" \
                       "/output.log"
    status = [m for line in lines if (m := re.fullmatch(
        r"  \[\d+s\] coda seed 0: step (\d+)/20  loss \d\.\d{4}  (?:val/exact_match \d\.\d{4} "
        r"\(step \d+\)  )?\d+\.\d\d steps/s  ETA \d+s", line))]
    assert len({m.group(1) for m in status}) >= 3, out[-3000:]
    assert re.search(r"^  done coda seed 0 \(\d+s\): Acc \d+\.\d\d$", out, re.M)


# -- stopping a grid --------------------------------------------------------------------------
def has_test_metrics(run_dir: Path) -> bool:
    try:
        with open(run_dir / "metrics.csv", newline="") as f:
            return any(row.get("test/exact_match") for row in csv.DictReader(f))
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_names_each_cell_as_its_run_folder_holds_it(env):
    """Four jobs, two at a time: transformer seed 0 finishes, coda seed 0 (2 s a step) has
    passed its checkpoint of step 10, transformer seed 1 (10 s a step, started when the
    first ended) has none, coda seed 1 has not started.  Ctrl-C then stops the grid within
    the deadline (the slow cell killed after its grace), names each, and its resume command
    keeps and resumes exactly those."""
    env = paced(env, **{"coda-seed0": 2, "transformer-seed1": 10})
    folder = Path(env["ATTNREPRO_RUNS"]) / GRID
    grid = start(SCRIPT, ["grid", "table6", "--smoke", "--cells", "transformer", "coda",
                          "--seeds", "2", "--jobs", "2", "--", "--run.wandb=false"], env)
    deadline = time.time() + 300
    while not (has_test_metrics(folder / "transformer-seed0")
               and (folder / "transformer-seed1" / "output.log").exists()
               and resumable_checkpoint(folder / "coda-seed0") is not None):
        assert grid.poll() is None and time.time() < deadline, grid.communicate()[0][-3000:]
        time.sleep(0.2)
    asked = time.time()
    grid.send_signal(signal.SIGINT)
    out, _ = grid.communicate(timeout=60)
    assert time.time() - asked < 20, "the grid took over 20 s to stop"  # a deadline
    assert grid.returncode == 1
    lines = out.splitlines()
    assert "Ctrl-C (SIGINT): stopping 2 running cell(s) (Ctrl-C again kills them at once)" \
        in lines, out[-3000:]
    at = next(i for i, line in enumerate(lines) if line.startswith("grid stopped by SIGINT"))
    assert re.fullmatch(r"grid stopped by SIGINT after \d+(m\d\ds|s):", lines[at])
    assert lines[at + 1:] == [
        "  finished: transformer seed 0",
        "  stopped with a checkpoint: coda seed 0 (resumes from step 10)",
        "  stopped without a checkpoint: transformer seed 1 (restarts from step 0)",
        "  not started: coda seed 1",
        f"resume with:  {shown_interpreter()} experiments/coda_mlu.py grid table6 --config "
        "smoke --cells transformer coda --seeds 2 --jobs 2 --skip-done -- --run.wandb=false"]
    assert (folder / "coda-seed0" / "checkpoints" / "epoch=0-step=10.ckpt").exists()
    assert not (folder / "coda-seed0" / "checkpoints" / "epoch=0-step=20.ckpt").exists()
    assert not list((folder / "transformer-seed1").glob("checkpoints/*.ckpt"))
    for name in ("coda-seed0", "transformer-seed1"):
        assert not cell_pids(name, env)  # stopped, none left running
    resume = shlex.split(lines[-1].removeprefix("resume with:  "))
    resume.insert(resume.index("--"), "--dry-run")  # what it would run, not run
    said = subprocess.run([sys.executable, *resume[1:]], env=env, cwd=ROOT, text=True,
                          capture_output=True)
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines()[:2] == [
        "  kept transformer seed 0: finished before",
        "  resuming coda seed 0 from last.ckpt (stopped before)"]
    commands = said.stdout.splitlines()[2:]
    assert [re.search(r"--run.name=(\S+)", c).group(1) for c in commands] == [
        "coda-seed0", "transformer-seed1", "coda-seed1"]


# -- make demo ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_make_demo_shows_each_cell_live_and_its_time(env, tmp_path):
    """`make demo`'s recipe on a terminal (with the smoke config for speed, DEMO_CONFIG=smoke;
    this interpreter's environment as its .venv, already set up): each cell's live line, then
    the measured time beside the committed run's, which is the README's (test_readme)."""
    from tests.docs.test_readme import demo_time

    stamp = tmp_path / "installed"
    stamp.touch()  # newer than the locks: setup has nothing to do
    code, raw = run_in_pty(["make", "--no-print-directory", "demo", "DEMO_CONFIG=smoke",
                            f"BIN={Path(sys.executable).parent}", f"STAMP={stamp}"],
                           paced(env, **{"transformer-seed0": 0.3, "coda-seed0": 0.3}))
    lines = screen_lines(raw)
    assert code == 0, "\n".join(lines[-30:])
    for label in ("transformer seed 0", "coda seed 0"):
        assert any(re.fullmatch(rf"{label} +\S+ step \d+/20  loss .*  ETA \d+s", line.strip())
                   for line in lines), f"{label}: no live line"
    minutes, seconds = demo_time((ROOT / "results" / "coda_mlu_demo.md").read_text())
    assert re.fullmatch(
        rf"make demo took \d+ min \d+ s here \(config smoke\); the committed run took {minutes} "
        rf"min {seconds} s \(results/coda_mlu_demo.md: 2 cores, config demo\); other work on "
        "the machine adds to it", lines[-1]), lines[-5:]
