"""``grid``, ``cell`` and ``sweep``: the runs of a grid.  Every cell and seed is the same ``fit``
command a user would type (:func:`cell_command`), started as a process of its own in its run
folder (``runs/<experiment>/<grid>-<config>/<cell>-seed<k>/``, its output in ``output.log``);
``grid`` runs them locally, ``--jobs`` at a time, ``cell`` runs one (what a W&B sweep agent
calls) and ``sweep`` writes the W&B sweep YAML of the grid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

import yaml

from experiments.harness.checkpoints import checkpoints_latest_first, resumable_checkpoint
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
)
from experiments.harness.preflight import check_cells, check_folder, root_note
from experiments.harness.replaced import set_aside, settle
from experiments.harness.runs import read_run_metrics
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

    @property
    def folder(self) -> Path:
        return self.experiment.grid_folder(self.grid, self.config)

    def finished(self, job: Job) -> bool:
        """Whether the job's run folder holds every metric of the grid (a run that ended)."""
        return all(v is not None for v in
                   read_run_metrics(self.folder / job.name, self.grid).values())

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


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Terminate a cell's process group (SIGTERM, then SIGKILL after ``grace`` seconds)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


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
    todo = [Job(c, s) for s in range(args.seeds) for c in cells]
    if args.skip_done:
        todo = _not_done(run, todo)
    if args.dry_run:
        for job in todo:
            print(" ".join(run.command(job)))
        return None
    check_cells(experiment, prog, config, [c for c in cells if any(j.cell is c for j in todo)])
    finished = [job for job in todo if run.finished(job)] if not args.force else []
    if finished:  # a finished run is replaced only when asked
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
    failed: list[Path] = []
    held: list[Path] = []  # cells another grid was running: not run here, not failed
    running: list[Launched] = []
    start = time.time()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    ran = len(todo)
    try:
        _run_jobs(run, args.jobs, todo, running, failed, held)
    except KeyboardInterrupt:
        for launched in running:
            _stop(launched.proc)
            launched.log.close()
        names = ", ".join(launched.job.label for launched in running) or "none"
        raise SystemExit(f"grid stopped; cells stopped unfinished: {names} (rerun with "
                         "--skip-done to keep the finished ones and resume these from their "
                         "last checkpoint)") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        for launched in running:
            launched.lock.close()
    print(f"grid finished in {time.time() - start:.0f}s", flush=True)
    problems = [f"{len(failed)} run(s) failed: " + ", ".join(map(str, failed))] if failed else []
    if held:
        problems.append(f"{len(held)} run(s) not run, another grid was running them: "
                        + ", ".join(map(str, held))
                        + " (rerun with --skip-done once it has finished)")
    # no summary run when cells were due and none finished here (all failed or held)
    return GridDone(grid, config, problems, summary=ran == 0 or len(failed) + len(held) < ran)


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


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _run_jobs(run: GridRun, jobs: int, todo: list[Job], running: list[Launched],
              failed: list[Path], held: list[Path]) -> None:
    """Run ``todo``, ``jobs`` at a time; ``running`` holds the runs started and not yet
    finished (for the caller to stop), ``failed`` gets the folder of each run that failed,
    ``held`` that of each cell left alone because another grid runs it."""
    while todo or running:
        while todo and len(running) < jobs:
            job = todo.pop(0)
            lock = run_lock(run.folder, job.name)
            if lock is None:  # another grid runs this very cell and seed: leave it alone
                held.append(run.folder / job.name)
                print(f"  NOT RUN {job.label}: another grid is running it "
                      f"({lock_holder(run.folder, job.name)}); rerun with --skip-done "
                      "once it has finished", flush=True)
                continue
            launched = run.launch(job)
            launched.lock = lock
            running.append(launched)
        for launched in list(running):
            if launched.proc.poll() is None:
                continue
            running.remove(launched)
            launched.close()
            _report_finished(run.grid, launched, failed)
        time.sleep(0.2)


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
