"""Files two processes may write at once (issue 29 item 2), each tested with two processes
started at the same moment (a barrier): a run folder (one writer, by a lock; a run of the
same second gets a folder of its own), the lock files themselves, the sweep YAML (written
whole), the C++ kernels built into a cold extension cache, inductor's cold kernel cache and
W&B's offline folders.  The DataModules' caches: tests/fileio/test_cache_race.py; checkpoints:
tests/end_to_end/test_kill_resume.py."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from experiments import coda_mlu
from experiments.harness.grid_model import RunFolderBusy, claim_run, lock_holder, run_lock
from experiments.harness.runner import main as run_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "coda_mlu.py"
FORK = multiprocessing.get_context("fork")  # the workers share this module's functions
#: fresh interpreters, for what a forked worker would inherit from the tests run before it in
#: the same pytest process (a kernel library already loaded, a compiled kernel in memory)
SPAWN = multiprocessing.get_context("spawn")


def at_once(worker, args_of: list[tuple], timeout: float = 300, context=FORK) -> list:
    """Run ``worker(barrier, *args)`` in one process per ``args_of`` entry, all released
    from one barrier together; their results, in order (a worker that raised fails the test
    with its error)."""
    barrier, results = context.Barrier(len(args_of)), context.Queue()
    procs = [context.Process(target=_report, args=(results, i, worker, barrier, args))
             for i, args in enumerate(args_of)]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=timeout) for _ in procs)
    for proc in procs:
        proc.join(timeout)
    errors = [v for v in got.values() if isinstance(v, str) and v.startswith("worker failed")]
    assert not errors, errors
    return [got[i] for i in range(len(args_of))]


def _report(results, i: int, worker, barrier, args: tuple) -> None:
    try:
        results.put((i, worker(barrier, *args)))
    except BaseException as err:  # noqa: BLE001 - handed to the test
        barrier.abort()
        results.put((i, f"worker failed: {type(err).__name__}: {err}"))


# -- run folders and their locks --------------------------------------------------------------
def take_lock(barrier, root: Path) -> bool:
    barrier.wait()
    handle = run_lock(root, "transformer-seed0")
    barrier.wait()  # both have tried before either lets go
    return handle is not None


def test_of_two_processes_asking_for_one_run_lock_at_once_one_gets_it(tmp_path):
    """A grid's lock on a cell and seed (``.<run>.lock``): one holder, whoever asks first."""
    assert sorted(at_once(take_lock, [(tmp_path,), (tmp_path,)])) == [False, True]


def claim(barrier, root: Path, name: str | None) -> str:
    barrier.wait()
    try:
        got = claim_run(root, name, "20261126-074500")
    except RunFolderBusy as err:
        got = str(err)
    barrier.wait()
    return got


def test_two_runs_started_in_the_same_second_write_two_folders(tmp_path):
    """``fit`` without --run.name is named by its start time: the second run of that second
    gets ``<time>-2`` (both wrote into ``<time>`` before)."""
    names = at_once(claim, [(tmp_path, None), (tmp_path, None)])
    assert sorted(names) == ["20261126-074500", "20261126-074500-2"]
    (tmp_path / "20261126-074500").mkdir()  # a finished run of that second is left alone
    assert at_once(claim, [(tmp_path, None)]) == ["20261126-074500-2"]


def test_two_runs_of_one_name_at_once_one_is_refused_in_one_line(tmp_path):
    got = at_once(claim, [(tmp_path, "r"), (tmp_path, "r")])
    assert "r" in got
    (refused,) = [g for g in got if g != "r"]
    assert refused.startswith(f"run folder {tmp_path / 'r'} is being written by pid ")
    assert refused.endswith("; wait for it to end or choose another --run.name")


def test_the_run_a_grid_launched_writes_the_folder_its_grid_holds(tmp_path):
    """The grid (or ``cell``) holds the run's lock while its child ``fit`` writes the folder:
    the child's claim is its parent's lock, any other process's is refused."""
    held = run_lock(tmp_path, "r")
    code = ("import sys; from pathlib import Path; "
            "from experiments.harness.grid_model import claim_run, RunFolderBusy\n"
            "try: print(claim_run(Path(sys.argv[1]), 'r', 'x'))\n"
            "except RunFolderBusy as e: print(e)")
    try:
        child = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        grandchild = subprocess.run(
            [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, "
                                   f"'-c', {code!r}, {str(tmp_path)!r}])"],
            cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    finally:
        held.close()
    assert child == "r"
    assert grandchild == (f"run folder {tmp_path / 'r'} is being written by pid {os.getpid()}; "
                          "wait for it to end or choose another --run.name")


def test_cell_leaves_a_run_another_process_is_running_alone(tmp_path, monkeypatch):
    """``cell`` (a W&B sweep agent's command) takes the run's lock as a grid does: a cell and
    seed a grid or another agent is running is refused in one line, its folder untouched."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    folder = tmp_path / "coda_mlu" / "table6-smoke"
    (folder / "transformer-seed0").mkdir(parents=True)
    (folder / "transformer-seed0" / "metrics.csv").write_text("epoch,step\n")
    held = run_lock(folder, "transformer-seed0")
    try:
        with pytest.raises(SystemExit) as stopped:
            run_script(coda_mlu.EXPERIMENT, ["cell", "table6", "--smoke", "--cell", "transformer",
                                      "--seed", "0"])
    finally:
        held.close()
    assert str(stopped.value) == (
        f"coda_mlu.py cell: transformer seed 0 is being run by pid {os.getpid()} in "
        f"{folder / 'transformer-seed0'}; nothing was changed")
    assert (folder / "transformer-seed0" / "metrics.csv").read_text() == "epoch,step\n"


def hold_lock(root: Path, run: str, taken, done) -> None:
    handle = run_lock(root, run)
    taken.set()
    done.wait(300)
    handle.close()


@pytest.mark.slow
def test_fit_refuses_a_run_folder_another_process_writes(env, tmp_path):
    """A ``fit`` of an explicit --run.name that another process (not the grid or ``cell``
    that launched it) is writing."""
    folder = tmp_path / "runs" / "coda_mlu" / "adhoc"
    taken, done = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=hold_lock, args=(folder, "mine", taken, done))
    holder.start()
    try:
        assert taken.wait(60)
        out = subprocess.run([sys.executable, str(SCRIPT), "fit", "--config",
                              str(ROOT / "experiments/configs/coda_mlu/smoke.yaml"),
                              "--run.name", "mine", "--run.wandb", "false"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    finally:
        done.set()
        holder.join(60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        f"coda_mlu.py: run folder {folder / 'mine'} is being written by pid {holder.pid}; "
        "wait for it to end or choose another --run.name")
    assert not (folder / "mine").exists()


@pytest.mark.slow
def test_a_run_left_going_by_a_killed_grid_keeps_its_folder_to_itself(env, tmp_path):
    """A grid killed outright (SIGKILL: no handler stops its cells) leaves its cell running
    in its own session; the cell then holds the run's lock, so a new grid leaves it alone."""
    from tests.conftest import start
    from tests.experiments.test_grid_control import cell_pids

    args = ["grid", "table6", "--smoke", "--cells", "transformer", "--",
            "--trainer.max_steps", "100000", "--run.wandb", "false"]
    grid = start(SCRIPT, args, env)
    folder = tmp_path / "runs" / "coda_mlu" / "table6-smoke"
    try:
        deadline = time.time() + 120
        while not (folder / "transformer-seed0" / "hparams.yaml").exists():  # fit started
            assert time.time() < deadline and grid.poll() is None, "the cell never started"
            time.sleep(0.2)
        grid.kill()
        grid.communicate(timeout=60)
        deadline = time.time() + 10
        while (handle := run_lock(folder, "transformer-seed0")) is not None:
            handle.close()
            assert time.time() < deadline, "nothing holds the run of the killed grid's cell"
            time.sleep(0.1)
        (pid,) = cell_pids("transformer-seed0", env)
        while lock_holder(folder, "transformer-seed0") != f"pid {pid}":  # it writes its pid
            assert time.time() < deadline, lock_holder(folder, "transformer-seed0")
            time.sleep(0.1)
        again = subprocess.run([sys.executable, str(SCRIPT), *args[:5], "--skip-done"],
                               env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert f"  NOT RUN transformer seed 0: another grid is running it (pid {pid})" \
            in again.stdout
    finally:
        for pid in cell_pids("transformer-seed0", env):  # this test's orphan only
            os.kill(pid, signal.SIGKILL)


# -- the sweep YAML ---------------------------------------------------------------------------
def write_sweeps(barrier, out: Path, times: int) -> None:
    import contextlib
    import io

    from experiments.harness.launch import write_sweep

    barrier.wait()
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(times):
            write_sweep(coda_mlu.EXPERIMENT, ["table6", "--smoke", "--output", str(out)])


def test_two_sweep_commands_at_once_leave_a_whole_yaml_that_a_reader_always_finds_whole(
        tmp_path):
    """A sweep YAML rewritten while an agent (or the other command) reads it: every read
    finds the whole file (before, ``write_text`` emptied it first: reads found it empty)."""
    out = tmp_path / "sweep.yaml"
    write_sweeps(FORK.Barrier(1), out, 1)
    whole = out.read_text()
    barrier = FORK.Barrier(3)
    writers = [FORK.Process(target=write_sweeps, args=(barrier, out, 150)) for _ in range(2)]
    for w in writers:
        w.start()
    barrier.wait()
    reads = []
    while any(w.is_alive() for w in writers):
        reads.append(out.read_text())
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert len(reads) > 100 and all(r == whole for r in reads), \
        f"{sum(r != whole for r in reads)} of {len(reads)} reads were not the whole file"
    assert yaml.safe_load(whole)["parameters"]["cell"]["values"][0] == "transformer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]  # no temporary left


# -- compiled kernels under a cold cache ------------------------------------------------------
def build_native(barrier, cache: Path) -> list[float]:
    os.environ["TORCH_EXTENSIONS_DIR"] = str(cache)
    import torch

    from attention import _coda_l1_ext

    barrier.wait()
    assert _coda_l1_ext.library() is not None, "the C++ kernels did not build or load"
    q, k = torch.arange(12.0).reshape(1, 3, 4), torch.ones(1, 2, 4)
    return _coda_l1_ext.distance(q, k).flatten().tolist()


@pytest.mark.slow
def test_two_processes_build_the_cpp_kernels_into_a_cold_cache_at_once(tmp_path):
    """Each compiles to a private file and renames it into place: both load a whole
    library, and the cache holds one library and no temporary file."""
    from attention import _native

    if _native.compiler() is None:
        pytest.skip("no C++ compiler")
    first, second = at_once(build_native, [(tmp_path,), (tmp_path,)], context=SPAWN)
    expected = [sum(abs(i * 4 + t - 1.0) for t in range(4)) for i in range(3) for _ in range(2)]
    assert first == second == expected
    assert [p.suffix for p in (tmp_path / "attnrepro_coda_l1").iterdir()] == [".so"]


def compile_kernel(barrier, cache: Path) -> bool:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    import torch

    from attention import _coda_kernels

    x, y = torch.randn(2, 5, 3, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    barrier.wait()
    kernel = _coda_kernels.l1.fallback
    out = kernel(x, y)
    assert out is not None and not kernel.failed, "inductor did not compile the kernel"
    return torch.allclose(out, _coda_kernels.l1_block(x, y))


@pytest.mark.slow
def test_two_processes_compile_a_kernel_into_a_cold_inductor_cache_at_once(tmp_path):
    """Inductor's own cache (its writes go through temporary files and locks): both
    processes compile the CoDA L1 block kernel and compute it right."""
    assert at_once(compile_kernel, [(tmp_path,), (tmp_path,)], context=SPAWN) == [True, True]


# -- W&B offline folders ----------------------------------------------------------------------
def offline_run(barrier, folder: Path, value: float) -> str:
    import wandb

    from experiments.harness.loggers import wandb_settings

    barrier.wait()
    run = wandb.init(project="attnrepro", mode="offline", dir=str(folder),
                     settings=wandb_settings(init_timeout=120))
    run.log({"x": value})
    run.finish()
    return run.id


@pytest.mark.slow
def test_two_offline_wandb_runs_in_one_folder_at_once_keep_their_own_files(tmp_path,
                                                                           monkeypatch):
    """The grid's summary runs of two grids sharing a folder finish at once: each run gets
    its own offline-run folder (W&B names it by its run id) with its own record file."""
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    ids = at_once(offline_run, [(tmp_path, 1.0), (tmp_path, 2.0)])
    assert len(set(ids)) == 2
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert sorted(r.name.rsplit("-", 1)[1] for r in runs) == sorted(ids)
    assert all(len(list(r.glob("run-*.wandb"))) == 1 for r in runs)
