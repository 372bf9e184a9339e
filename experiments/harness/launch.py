"""``grid``, ``cell`` and ``sweep``: the runs of a grid.  Every cell and seed is the same ``fit``
command a user would type (:func:`cell_command`), started as a process of its own in its run
folder (``runs/<experiment>/<grid>-<config>/<cell>-seed<k>/``, its output in ``output.log``);
``grid`` runs them locally, ``--jobs`` at a time, showing each running cell's progress from
its log (experiments/harness/watch.py), ``cell`` runs one (what a W&B sweep agent calls) and
``sweep`` writes the W&B sweep YAML of the grid.  Ctrl-C or SIGTERM stops a grid: its running
cells get :data:`STOP_GRACE` seconds to stop, then each job is named by what its run folder
holds (:func:`stopped_summary`) with the ``--skip-done`` command that goes on
(:func:`resume_command`).
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

import yaml

from experiments.harness.checkpoints import (
    checkpoint_global_step,
    checkpoints_latest_first,
    resumable_checkpoint,
)
from experiments.harness.command_line import chosen_config, grid_parser, split_extra
from experiments.harness.grid_model import (
    PROJECT_ROOT,
    Cell,
    Experiment,
    Grid,
    group_name,
    lock_holder,
    run_lock,
    run_name,
    runs_root,
    shown_path,
)
from experiments.harness.preflight import check_cells, check_folder, root_note
from experiments.harness.replaced import set_aside, settle
from experiments.harness.runs import read_run_metrics, run_finished
from experiments.harness.watch import CellWatch, StatusLines, duration, watcher
from fileio import checkpoint_step, write_atomic


class Job(NamedTuple):
    """One cell and seed of a grid: one run."""

    cell: Cell
    seed: int

    @property
    def name(self) -> str:
        return run_name(self.cell, self.seed)

    @property
    def label(self) -> str:
        return f"{self.cell.name} seed {self.seed}"


@dataclass
class Launched:
    """A job's run once started: its process, the log it writes and, under ``grid``, the lock
    it holds on its run folder."""

    job: Job
    proc: subprocess.Popen
    log: IO[str]
    run_dir: Path
    lock: IO[str] | None = None
    started: float = field(default_factory=time.time)
    replaced: Path | None = None  # the folder it replaced, set aside (harness/replaced.py)

    def close(self) -> None:
        self.log.close()
        if self.lock is not None:
            self.lock.close()


def cell_command(experiment: Experiment, grid: Grid, cell: Cell, seed: int, config: str,
                 extra: list[str] = ()) -> list[str]:
    """The ``fit`` command of one cell and seed: what the user would type."""
    script = experiment.script or PROJECT_ROOT / "experiments" / f"{experiment.name}.py"
    path = experiment.config_path(config)
    args = [a.replace("{config}", str(path.with_suffix(""))) for a in cell.args]
    return [sys.executable, str(script), "fit", "--config", str(path),
            *args, f"--seed_everything={seed}", f"--run.group={group_name(grid, config)}",
            f"--run.name={run_name(cell, seed)}", f"--run.grid={grid.name}",
            f"--run.cell={cell.name}", "--run.test_after_fit=true", *extra]


@dataclass
class GridRun:
    """What the runs of one ``grid`` or ``cell`` command share."""

    experiment: Experiment
    grid: Grid
    config: str
    extra: list[str]
    threads: int | None = None  # torch threads per run (None: torch's default)
    resume: bool = False  # --skip-done: a stopped run goes on from its latest checkpoint
    # --force: the runs that had finished when the grid listed its jobs, to be replaced; any
    # other run found finished when its turn comes was finished meanwhile by another process
    replacing: frozenset[str] = frozenset()

    @property
    def folder(self) -> Path:
        return self.experiment.grid_folder(self.grid, self.config)

    def finished(self, job: Job) -> bool:
        """Whether the job's run folder holds the metrics of a run that ended
        (experiments.harness.runs.finishing_metrics)."""
        return run_finished(self.folder / job.name, self.grid, job.cell)

    def command(self, job: Job) -> list[str]:
        return cell_command(self.experiment, self.grid, job.cell, job.seed, self.config,
                            self.extra)

    def launch(self, job: Job) -> Launched:
        """Start a job's run: from scratch, or (``resume``: a rerun with --skip-done) from the
        latest checkpoint a stopped run of it left, in the same folder and W&B run."""
        run_dir = self.folder / job.name
        checkpoint = latest_checkpoint(run_dir) if self.resume else None
        replaced = None
        if checkpoint is None:  # a cell run starts fresh; what was there is set aside
            replaced = set_aside(run_dir, job.label, self.resume)
        else:  # those passed over (cut short, or ahead of their metrics) are written again
            for path in checkpoints_latest_first(run_dir):
                if path == checkpoint:
                    break
                path.unlink()
        run_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.threads:
            env["ATTNREPRO_THREADS"] = str(self.threads)
        log = open(run_dir / "output.log", "a" if checkpoint else "w")
        cmd = self.command(job)
        if checkpoint is not None:
            cmd.append(f"--ckpt_path={checkpoint}")
            log.write(f"\n[grid] resumed from {checkpoint}\n")
            log.flush()
        # its own process group: stopping the grid stops the cell and whatever it started (DDP)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=PROJECT_ROOT, start_new_session=True)
        return Launched(job, proc, log, run_dir, replaced=replaced)


def latest_checkpoint(run_dir: Path, say=None) -> Path | None:
    """The checkpoint a stopped run resumes from: ``last.ckpt``, else the one of the highest
    ``step=N`` in its name, skipping a file that is not a whole checkpoint (one line each to
    ``say``: experiments.harness.checkpoints.resumable_checkpoint); None without one."""
    return resumable_checkpoint(run_dir, say)


class GridDone(NamedTuple):
    """A grid whose cells have run: what failed or was not run, one text each, and whether
    a W&B summary run is due (a run finished here, or none was left to run)."""

    grid: Grid
    config: str
    problems: list[str]
    summary: bool = True


def chosen_cells(grid: Grid, names: list[str] | None, prog: str) -> list[Cell]:
    """The cells ``--cells`` names (every cell of the grid without it), each once: a name
    given twice is run once, said in one line."""
    if not names:
        return grid.cells
    twice = [n for n in dict.fromkeys(names) if names.count(n) > 1]
    if twice:
        print(f"{prog}: --cells names {', '.join(twice)} more than once; each cell runs once",
              flush=True)
    return [grid.cell(n) for n in dict.fromkeys(names)]


def run_grid(experiment: Experiment, argv: list[str]) -> GridDone | None:
    """``grid``: every cell and seed of the grid, ``--jobs`` at a time; None for a
    ``--dry-run`` (the commands printed, nothing run)."""
    argv, extra = split_extra(argv)
    args = grid_parser(experiment, "grid").parse_args(argv)
    grid = experiment.grid(args.grid)
    config = chosen_config(experiment, args)
    prog = f"{experiment.name}.py grid"
    cells = chosen_cells(grid, args.cells, prog)
    threads = args.threads or (max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1
                               else None)
    run = GridRun(experiment, grid, config, extra, threads, resume=args.skip_done)
    jobs = [Job(c, s) for s in range(args.seeds) for c in cells]
    todo = _not_done(run, jobs) if args.skip_done else list(jobs)
    if args.dry_run:
        for job in todo:
            print(" ".join(run.command(job)))
        return None
    check_cells(experiment, prog, config, [c for c in cells if any(j.cell is c for j in todo)])
    finished = [job for job in todo if run.finished(job)]
    if args.force:  # replaced when their turn comes; no other finished run is
        run.replacing = frozenset(job.name for job in finished)
    elif finished:  # a finished run is replaced only when asked
        raise SystemExit(f"{experiment.name}.py grid: {len(finished)} run(s) in {run.folder} "
                         f"finished before: {', '.join(job.label for job in finished)}; "
                         "--skip-done keeps them (and runs the others), --force replaces them")
    stopped = [] if args.force or args.skip_done else stopped_runs(run, todo)
    if stopped:  # nor is the checkpoint of a stopped one thrown away unasked
        raise SystemExit(f"{experiment.name}.py grid: {len(stopped)} run(s) in {run.folder} "
                         f"stopped before with checkpoints: "
                         f"{', '.join(f'{job.label} (step {step:,})' for job, step in stopped)}; "
                         "--skip-done resumes them (and keeps the finished ones), --force "
                         "starts them again")
    print(f"{experiment.name} grid {grid.name} ({grid.title}), config {config}: "
          f"{len(todo)} runs, {args.jobs} at a time"
          f"{f', {threads} thread(s) each' if threads else ''}; logs in {run.folder}",
          flush=True)
    outcome = GridOutcome()
    stop = StopRequest()
    start = time.time()
    previous = {sig: signal.signal(sig, stop.ask) for sig in (signal.SIGINT, signal.SIGTERM)}
    ran = len(todo)
    try:
        with watcher(args.status_every) as watch:
            try:
                _run_jobs(run, args.jobs, todo, outcome, watch, stop)
            finally:  # stopped, or an error here: no cell is left running on its own
                if outcome.running:
                    _stop_cells(outcome.running, stop)
        if stop.signal is not None:  # the run folders read while their locks are held
            print(stopped_summary(run, jobs, outcome, stop, time.time() - start), flush=True)
            print(f"resume with:  {resume_command(run, args)}", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for launched in outcome.running:
            launched.close()
    if stop.signal is not None:
        raise SystemExit(1)
    print(f"grid finished in {duration(time.time() - start)}", flush=True)
    failed, held = outcome.failed, outcome.held
    problems = [f"{len(failed)} run(s) failed: " + ", ".join(map(str, failed))] if failed else []
    if held:
        problems.append(f"{len(held)} run(s) not run, another grid was running them: "
                        + ", ".join(map(str, held))
                        + " (rerun with --skip-done once it has finished)")
    # no summary run when cells were due and none finished here (all failed or held)
    return GridDone(grid, config, problems, summary=ran == 0 or len(failed) + len(held) < ran)


@dataclass
class GridOutcome:
    """Where a grid's jobs are: started and not yet ended (``running``, for the caller to
    stop), the folders of those that failed, of those another grid runs (``held``)."""

    running: list[Launched] = field(default_factory=list)
    started: set[str] = field(default_factory=set)  # the names of the jobs started
    failed: list[Path] = field(default_factory=list)
    held: list[Path] = field(default_factory=list)


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM to the grid, as a signal handler: the grid stops starting
    cells and stops the running ones; a second one cuts their grace short."""

    def __init__(self):
        self.signal: int | None = None
        self.again = False
        self.event = threading.Event()

    def ask(self, signum, frame) -> None:
        if self.signal is not None:
            self.again = True
        self.signal = signum
        self.event.set()


#: seconds a stopped cell has to end by itself (Lightning stops at the end of a batch) before
#: it is killed; a second Ctrl-C kills at once
STOP_GRACE = 5.0


def _stop_cells(running: list[Launched], stop: StopRequest) -> None:
    """SIGTERM to every running cell's process group at once, then SIGKILL to those still
    running after :data:`STOP_GRACE` seconds (or at a second Ctrl-C).  Reading a resumable
    checkpoint afterwards needs torch: it is imported meanwhile when there is one to read."""
    if stop.signal is not None and any(checkpoints_latest_first(launched.run_dir)
                                       for launched in running):
        threading.Thread(target=importlib.import_module, args=("torch",), daemon=True).start()
    alive = [launched for launched in running if launched.proc.poll() is None]
    if stop.signal is not None:
        shown = "Ctrl-C (SIGINT)" if stop.signal == signal.SIGINT else "SIGTERM"
        print(f"{shown}: stopping {len(alive)} running cell(s) (Ctrl-C again kills them at "
              "once)", flush=True)
    for launched in alive:
        _signal_group(launched.proc, signal.SIGTERM)
    deadline = time.time() + STOP_GRACE
    while (any(launched.proc.poll() is None for launched in alive) and not stop.again
           and time.time() < deadline):
        time.sleep(0.05)
    for launched in alive:
        if launched.proc.poll() is None:
            _signal_group(launched.proc, signal.SIGKILL)
            launched.proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stopped_summary(run: GridRun, jobs: list[Job], outcome: GridOutcome, stop: StopRequest,
                    took: float) -> str:
    """Where each job of a stopped grid is, read from its run folder once its cell has
    ended, as ``--skip-done`` will find it: finished (kept), stopped with a checkpoint it
    resumes from (its step), stopped without one (starts again), failed before the stop,
    not started, left to another grid."""
    held = set(outcome.held)
    failed = set(outcome.failed)
    groups: dict[str, list[str]] = {}
    for job in jobs:
        run_dir = run.folder / job.name
        if run_dir in held:
            kind, text = "left to another grid running it", job.label
        elif run.finished(job):
            kind, text = "finished", job.label
        elif job.name not in outcome.started:
            kind, text = "not started", job.label
        elif (checkpoint := latest_checkpoint(run_dir)) is not None:
            kind = "failed before the stop" if run_dir in failed else "stopped with a checkpoint"
            text = f"{job.label} (resumes from step {checkpoint_global_step(checkpoint):,})"
        else:
            kind = ("failed before the stop" if run_dir in failed
                    else "stopped without a checkpoint")
            text = f"{job.label} (restarts from step 0)"
        groups.setdefault(kind, []).append(text)
    order = ["finished", "stopped with a checkpoint", "stopped without a checkpoint",
             "failed before the stop", "not started", "left to another grid running it"]
    lines = [f"grid stopped by {signal.Signals(stop.signal).name} after {duration(took)}:"]
    lines += [f"  {kind}: {', '.join(groups[kind])}" for kind in order if kind in groups]
    return "\n".join(lines)


def shown_interpreter() -> str:
    """This Python as a command to type: its path in the project (``.venv/bin/python``),
    else ``python``."""
    interpreter = Path(sys.executable)
    return (str(interpreter.relative_to(PROJECT_ROOT))
            if interpreter.is_relative_to(PROJECT_ROOT) else "python")


def resume_command(run: GridRun, args) -> str:
    """The ``grid --skip-done`` command that goes on with a stopped grid: the same grid,
    config, cells, seeds, jobs, threads and overrides."""
    script = run.experiment.script or PROJECT_ROOT / "experiments" / f"{run.experiment.name}.py"
    cmd = [shown_interpreter(), shown_path(script), "grid", run.grid.name, "--config", run.config]
    if args.cells:
        cmd += ["--cells", *args.cells]
    for flag, value, default in (("--seeds", args.seeds, 1), ("--jobs", args.jobs, 1),
                                 ("--threads", args.threads, None),
                                 ("--status-every", args.status_every, 60)):
        if value != default:
            cmd += [flag, str(value)]
    cmd.append("--skip-done")
    if run.extra:
        cmd += ["--", *run.extra]
    return shlex.join(cmd)


def stopped_runs(run: GridRun, todo: list[Job]) -> list[tuple[Job, int]]:
    """The jobs whose run stopped before its end leaving checkpoints (not one another grid
    is running now), with the step of the latest: a start that is not a resume would
    throw them away."""
    out = []
    for job in todo:
        run_dir = run.folder / job.name
        checkpoints = checkpoints_latest_first(run_dir)
        if not checkpoints or run.finished(job):
            continue
        lock = run_lock(run.folder, job.name)
        if lock is None:  # running in another grid: _run_jobs leaves it alone and says so
            continue
        lock.close()
        steps = [step for path in checkpoints if (step := checkpoint_step(path)) is not None]
        out.append((job, max(steps, default=0)))
    return out


def _not_done(run: GridRun, todo: list[Job]) -> list[Job]:
    """--skip-done: the jobs whose CSV lacks a metric of the grid (said for each kept run and
    each run that resumes from a checkpoint)."""
    done = [job for job in todo if run.finished(job)]
    for job in done:
        print(f"  kept {job.label}: finished before", flush=True)
    todo = [job for job in todo if job not in done]
    for job in todo:
        checkpoint = latest_checkpoint(run.folder / job.name,
                                       say=lambda line: print(line, flush=True))
        if checkpoint is not None:
            print(f"  resuming {job.label} from {checkpoint.name} (stopped before)", flush=True)
    return todo


def _run_jobs(run: GridRun, jobs: int, todo: list[Job], outcome: GridOutcome,
              watch: StatusLines, stop: StopRequest) -> None:
    """Run ``todo``, ``jobs`` at a time, until every job has ended or a stop is asked
    (``outcome`` says where each job is); ``watch`` shows the running ones."""
    running = outcome.running
    while (todo or running) and stop.signal is None:
        while todo and len(running) < jobs and stop.signal is None:
            job = todo.pop(0)
            lock = run_lock(run.folder, job.name)
            if lock is None:  # another grid runs this very cell and seed: leave it alone
                outcome.held.append(run.folder / job.name)
                print(f"  NOT RUN {job.label}: another grid is running it "
                      f"({lock_holder(run.folder, job.name)}); rerun with --skip-done "
                      "once it has finished", flush=True)
                continue
            if job.name not in run.replacing and run.finished(job):
                # another grid or cell ran it after this grid listed its jobs: a resume
                # from its last checkpoint would test it again, a fresh start replace it
                lock.close()
                print(f"  kept {job.label}: finished meanwhile (another grid or cell ran it "
                      "after this grid listed its runs)", flush=True)
                continue
            launched = run.launch(job)
            launched.lock = lock
            running.append(launched)
            outcome.started.add(job.name)
            watch.start(job.name, CellWatch(job.label, launched.run_dir / "output.log",
                                            validation_metric(run.grid)))
        for launched in list(running):
            if launched.proc.poll() is None:
                continue
            running.remove(launched)
            launched.close()
            watch.end(launched.job.name)
            _report_finished(run.grid, launched, outcome.failed)
        watch.tick()
        stop.event.wait(0.2)


def validation_metric(grid: Grid) -> str:
    """The validation metric a running cell is shown with: that of the grid's first metric
    (``test/acc`` -> ``val/acc``)."""
    return "val/" + next(iter(grid.metrics.values())).split("/", 1)[-1]


def _report_finished(grid: Grid, launched: Launched, failed: list[Path]) -> None:
    took = time.time() - launched.started
    run_dir, label = launched.run_dir, launched.job.label
    if launched.proc.returncode:
        failed.append(run_dir)
        log = run_dir / "output.log"
        tail = log.read_text().splitlines()[-15:]
        kept = settle(run_dir, launched.replaced, failed=True)
        print(f"  FAILED {label} ({took:.0f}s): {log}{f'; {kept}' if kept else ''}\n    "
              + "\n    ".join(tail), flush=True)
    else:
        settle(run_dir, launched.replaced, failed=False)
        values = read_run_metrics(run_dir, grid)
        shown = ", ".join(f"{k} {v * grid.scale_of(k):.2f}" for k, v in values.items()
                          if v is not None)
        print(f"  done {label} ({took:.0f}s): {shown}", flush=True)


def run_one_cell(experiment: Experiment, argv: list[str]) -> None:
    argv, extra = split_extra(argv)
    args = grid_parser(experiment, "cell", with_cell=True).parse_args(argv)
    grid = experiment.grid(args.grid)
    config = chosen_config(experiment, args)
    run = GridRun(experiment, grid, config, extra, args.threads)
    job = Job(grid.cell(args.cell), args.seed)
    check_cells(experiment, f"{experiment.name}.py cell", config, [job.cell])
    if run.finished(job) and not args.force:  # a finished run is replaced only when asked
        raise SystemExit(f"{experiment.name}.py cell: {job.label} finished before "
                         f"({run.folder / job.name}); it is kept (report reads it): --force "
                         "replaces it")
    lock = run_lock(run.folder, job.name)
    if lock is None:  # a grid or another cell command runs this very cell and seed
        raise SystemExit(f"{experiment.name}.py cell: {job.label} is being run by "
                         f"{lock_holder(run.folder, job.name)} in {run.folder / job.name}; "
                         "nothing was changed")
    if not args.force and checkpoints_latest_first(run.folder / job.name):
        lock.close()
        raise SystemExit(f"{experiment.name}.py cell: {job.label} stopped before with "
                         f"checkpoints ({run.folder / job.name}); `grid {grid.name} --config "
                         f"{config} --cells {job.cell.name}"
                         f"{f' --seeds {job.seed + 1}' if job.seed else ''} --skip-done` "
                         "resumes it, --force starts it again")
    launched = run.launch(job)
    launched.lock = lock
    launched.proc.wait()
    launched.close()
    sys.stdout.write((launched.run_dir / "output.log").read_text())
    kept = settle(launched.run_dir, launched.replaced, failed=launched.proc.returncode != 0)
    if kept:
        print(f"{experiment.name}.py cell: {job.label} failed; {kept}", flush=True)
    if launched.proc.returncode:
        raise SystemExit(launched.proc.returncode)


def write_sweep(experiment: Experiment, argv: list[str]) -> None:
    argv, extra = split_extra(argv)
    p = grid_parser(experiment, "sweep")
    p.add_argument("--output", default=None,
                   help="where to write it (default: runs/<experiment>/sweeps/<grid>-<config>"
                        ".yaml, under $ATTNREPRO_RUNS)")
    args = p.parse_args(argv)
    grid = experiment.grid(args.grid)
    config = chosen_config(experiment, args)
    out = Path(args.output or sweep_path(experiment, grid, config))
    check_folder(f"{experiment.name}.py sweep", out.parent,
                 "the folder of --output" if args.output else root_note("runs"))
    # whole or not at all: two sweep commands at once, or an agent reading it meanwhile
    write_atomic(out, yaml.safe_dump(sweep_config(experiment, grid, config, args.seeds,
                                                  args.cells, args.threads, extra),
                                     sort_keys=False))
    print(f"wrote {out}\nrun it with:  wandb sweep {out}   then   wandb agent <sweep id>  "
          f"(on as many machines as you like)")


def sweep_config(experiment: Experiment, grid: Grid, config: str, seeds: int,
                 cells: list[str] | None = None, threads: int | None = None,
                 extra: list[str] = ()) -> dict:
    """A W&B sweep over the same grid: every (cell, seed) (or only ``cells``' seeds), run
    by the ``cell`` command (with ``--threads`` and the overrides ``extra``, as ``grid``)."""
    chosen = chosen_cells(grid, cells, f"{experiment.name}.py sweep")
    first_metric = next(iter(grid.metrics.values()))
    script = f"experiments/{experiment.name}.py"
    return {
        "program": script,
        "name": f"{experiment.name}-{grid.name}-{config}",
        "description": grid.title,
        "method": "grid",
        "metric": {"name": first_metric, "goal": grid.goal},
        "parameters": {"cell": {"values": [c.name for c in chosen]},
                       "seed": {"values": list(range(seeds))}},
        "command": ["${env}", "${interpreter}", "${program}", "cell", grid.name, "--config",
                    config, "${args}", *(["--threads", str(threads)] if threads else []),
                    *(["--", *extra] if extra else [])],
    }


def sweep_path(experiment: Experiment, grid: Grid, config: str) -> Path:
    """A sweep's default file: beside the runs, never among the configs."""
    return runs_root() / experiment.name / "sweeps" / f"{group_name(grid, config)}.yaml"
