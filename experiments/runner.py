"""The command contract every experiment script follows.

    <name>.py fit|validate|test --config experiments/configs/<name>/paper.yaml [overrides]
    <name>.py grid <grid> [--smoke | --config NAME] [--seeds N] [--jobs N] [--skip-done]
                      [-- overrides]
    <name>.py cell <grid> --cell NAME --seed N [--config NAME]
    <name>.py sweep <grid> [--config NAME] [--seeds N] [--output PATH]
    <name>.py report [<grid>] [--config NAME]

(``<name>.py`` is ``python experiments/<name>.py``; configs are paper.yaml, smoke.yaml, ...)

``fit``/``validate``/``test`` are LightningCLI.  A grid (a paper table) is a list of cells,
each a list of CLI overrides; ``grid`` runs every cell and seed locally, each as the same
``fit`` command a user would type, in one W&B group; ``cell`` runs one of them (what a W&B
sweep agent calls); ``sweep`` writes the W&B sweep YAML for the grid; ``report`` prints the
paper's table with the paper's numbers beside ours (mean +- std over seeds), read from the
CSV logs, so it works without W&B.

After ``fit``, ``--run.test_after_fit true`` tests the final weights, or with
``--run.average_last N`` the average of the run's last N step checkpoints
(``checkpoints/averaged-last<N>.ckpt``, lit_models/averaging.py), as both translation papers do.

Runs live in ``runs/<experiment>/<group>/<name>/`` ($ATTNREPRO_RUNS moves ``runs/``): the
CSV metrics, the resolved config, checkpoints and the offline W&B run.  A grid cell's group
is ``<grid>-<config>`` and its name ``<cell>-seed<k>``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


@dataclass
class Cell:
    """One row of a paper table: the CLI overrides that make it, and the paper's numbers
    (metric label -> number in the paper's units).

    ``{config}`` in an argument stands for the grid config's path without ``.yaml``, so a
    cell can merge a config file of its own for each grid config (a table column on another
    dataset): ``--config={config}/sst.yaml`` reads ``configs/<name>/paper/sst.yaml`` under
    ``--config paper`` and ``configs/<name>/smoke/sst.yaml`` under ``--smoke``.  Write it
    as ``dataset_config("sst")``, the one way a cell says which dataset it runs on.
    """

    name: str
    args: list[str] = field(default_factory=list)
    paper: dict[str, float | None] = field(default_factory=dict)


def dataset_config(name: str) -> list[str]:
    """The override that merges dataset ``name``'s config of the grid config
    (``configs/<experiment>/<config>/<name>.yaml``; see :class:`Cell`)."""
    return [f"--config={{config}}/{name}.yaml"]


@dataclass
class Grid:
    """A paper table as a named grid of flag values."""

    name: str
    title: str
    #: column label -> logged metric key, e.g. {"Acc": "test/exact_match"}; a key
    #: ``hparams/<name>`` reads the run's hparams.yaml (e.g. ``hparams/n_parameters``)
    metrics: dict[str, str]
    cells: list[Cell]
    scale: float = 100.0  # logged fraction -> the paper's units (percent)
    #: per column label, a scale other than ``scale`` (e.g. {"Params (M)": 1e-6})
    scales: dict[str, float] = field(default_factory=dict)
    #: per column label, a baseline cell: the report adds that column divided by the
    #: baseline's, the paper's and ours (e.g. {"Steps/s": "transformer"}: DW's 0.87x)
    relative_to: dict[str, str] = field(default_factory=dict)
    note: str = ""
    goal: str = "maximize"  # of the first metric, for the W&B sweep ("minimize": perplexity)
    #: the validation metric whose learning curve ``report --curve`` tabulates per step
    curve: str | None = None

    def scale_of(self, label: str) -> float:
        return self.scales.get(label, self.scale)

    def cell(self, name: str) -> Cell:
        for c in self.cells:
            if c.name == name:
                return c
        raise SystemExit(f"grid {self.name!r} has no cell {name!r}; cells: "
                         f"{', '.join(c.name for c in self.cells)}")


@dataclass
class Experiment:
    """An experiment script: its LightningModule, DataModule, links between them, and the
    paper's tables as grids."""

    name: str
    model_class: type
    datamodule_class: type
    grids: dict[str, Grid]
    links: list[tuple[str, str]] = field(default_factory=list)  # (data attribute, model arg)
    subclass_mode_model: bool = False
    subclass_mode_data: bool = False  # the config names the DataModule (class_path)
    script: Path | None = None

    @property
    def config_dir(self) -> Path:
        return PROJECT_ROOT / "experiments" / "configs" / self.name

    def config_path(self, config: str) -> Path:
        path = Path(config)
        if path.suffix in (".yaml", ".yml"):
            return path
        path = self.config_dir / f"{config}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in self.config_dir.glob("*.yaml"))
            raise SystemExit(f"no config {config!r} for {self.name}: {path} does not exist; "
                             f"known: {', '.join(known)}")
        return path

    def grid(self, name: str) -> Grid:
        if name not in self.grids:
            raise SystemExit(f"{self.name} has no grid {name!r}; grids: {', '.join(self.grids)}")
        return self.grids[name]

    def main(self, argv: list[str] | None = None) -> None:
        args = sys.argv[1:] if argv is None else argv
        command = args[0] if args else "--help"
        if command in ("grid", "cell", "sweep", "report"):
            {"grid": run_grid, "cell": run_one_cell, "sweep": write_sweep,
             "report": print_report}[command](self, args[1:])
        else:
            run_cli(self, argv)  # None: LightningCLI reads sys.argv itself


# --------------------------------------------------------------------------------------
# fit | validate | test: LightningCLI with the suite's loggers


def runs_root() -> Path:
    return Path(os.environ.get("ATTNREPRO_RUNS", PROJECT_ROOT / "runs"))


def wandb_mode() -> str:
    """online only when an API key is configured; never blocks for lack of network."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def run_cli(experiment: Experiment, argv: list[str] | None):
    """LightningCLI for one run; returns the CLI object (tests inspect it)."""
    from lightning.pytorch.cli import LightningCLI

    threads = os.environ.get("ATTNREPRO_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))

    class ExperimentCLI(LightningCLI):
        def add_arguments_to_parser(self, parser):
            parser.add_argument("--run.group", type=str, default="adhoc",
                                help="run group: runs/<experiment>/<group>/, the W&B group")
            parser.add_argument("--run.name", type=str | None, default=None,
                                help="run name (default: a time stamp)")
            parser.add_argument("--run.test_after_fit", type=bool, default=False,
                                help="after fit, test on the test split")
            parser.add_argument("--run.test_ckpt", type=str | None, default=None,
                                help="checkpoint to test after fit: None = final weights, "
                                     "'best' = the best monitored checkpoint")
            parser.add_argument("--run.average_last", type=int | None, default=None,
                                help="after fit, average the last N step checkpoints into "
                                     "checkpoints/averaged-last<N>.ckpt and test on it "
                                     "(None/0: off)")
            parser.add_argument("--run.wandb", type=bool, default=True,
                                help="log to W&B (offline without an API key)")
            prefix = "model.init_args." if experiment.subclass_mode_model else "model."
            for source, target in experiment.links:
                parser.link_arguments(f"data.{source}", prefix + target, apply_on="instantiate")

        def instantiate_trainer(self, **kwargs):
            run = self.config[self.subcommand]["run"]
            trainer_cfg = self._get(self.config_init, "trainer", default={})
            if trainer_cfg.get("logger", True) is not False:
                kwargs["logger"] = make_loggers(experiment, run, self.model,
                                                self.config[self.subcommand])
            return super().instantiate_trainer(**kwargs)

        def before_fit(self):
            check_average_last(self.trainer, self.config["fit"]["run"])

        def after_fit(self):
            run = self.config["fit"]["run"]
            ckpt_path = run.test_ckpt
            if run.average_last:
                ckpt_path = average_after_fit(self.trainer, run.average_last)
            if run.test_after_fit:
                # this run's own checkpoints: their hyper-parameters hold the attention
                # objects, which torch's weights-only loader refuses
                self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path,
                                  weights_only=False if ckpt_path else None)
            finish_wandb()

        def after_validate(self):
            finish_wandb()

        def after_test(self):
            finish_wandb()

    return ExperimentCLI(
        experiment.model_class, experiment.datamodule_class,
        subclass_mode_model=experiment.subclass_mode_model,
        subclass_mode_data=experiment.subclass_mode_data,
        auto_configure_optimizers=False, args=argv,
        save_config_kwargs={"overwrite": True},
        # every DataModule of the suite shards its length-bucketed batches across processes
        # itself (datamodules.common.BucketBatchSampler), so Lightning must not add a sampler
        trainer_defaults={"use_distributed_sampler": False},
    )


def check_average_last(trainer, run) -> None:
    """Before fit: ``--run.average_last N`` needs every step checkpoint kept, and names the
    checkpoint to test, so it cannot go with ``--run.test_ckpt``."""
    n = run.average_last
    if not n:
        return
    if n < 0:
        raise SystemExit(f"--run.average_last must be a number of checkpoints, got {n}")
    if run.test_ckpt is not None:
        raise SystemExit(f"--run.average_last {n} tests on the average; it cannot go with "
                         f"--run.test_ckpt {run.test_ckpt}")
    callback = trainer.checkpoint_callback
    if callback is None or callback.save_top_k != -1:
        found = "none" if callback is None else f"save_top_k {callback.save_top_k}"
        raise SystemExit(f"--run.average_last {n} averages the last {n} step checkpoints, so "
                         "the trainer needs a ModelCheckpoint keeping them all (save_top_k: -1, "
                         f"e.g. every_n_train_steps); found: {found}")


def average_after_fit(trainer, n: int) -> Path:
    """Average the last ``n`` checkpoints of the run (in the trainer's ModelCheckpoint
    folder) into ``averaged-last<n>.ckpt`` beside them, log which ones, and return its path.
    Rank 0 writes it; the other processes wait for it."""
    from lit_models.averaging import average_last, averaged_name

    folder = Path(trainer.checkpoint_callback.dirpath)
    out = folder / averaged_name(n)
    if trainer.is_global_zero:
        try:
            paths, _ = average_last(folder, n, out)
        except (FileNotFoundError, ValueError) as e:  # too few checkpoints: say so, no trace
            raise SystemExit(f"--run.average_last {n}: {e}") from e
        names = [p.name for p in paths]
        print(f"averaged the last {n} checkpoints of {folder}: {', '.join(names)} -> {out.name}",
              flush=True)
        for logger in trainer.loggers:
            logger.log_hyperparams({"averaged_checkpoints": names})
    trainer.strategy.barrier("average_checkpoints")
    return out


def make_loggers(experiment: Experiment, run, model, config) -> list:
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    name = run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    save_dir = runs_root() / experiment.name
    run_dir = save_dir / run.group / name
    run_dir.mkdir(parents=True, exist_ok=True)
    loggers = [CSVLogger(save_dir=save_dir, name=run.group, version=name)]
    if run.wandb:
        tags = [experiment.name, run.group] + [m.tag() for m in getattr(model, "mechanisms",
                                                                        {}).values()]
        loggers.append(WandbLogger(
            project=os.environ.get("WANDB_PROJECT", "attnrepro"),
            group=f"{experiment.name}/{run.group}", name=name, save_dir=str(run_dir),
            mode=wandb_mode(), tags=sorted(set(tags)), config=config.as_dict(),
            settings=_wandb_settings()))
    return loggers


def _wandb_settings():
    import wandb

    return wandb.Settings(init_timeout=120, silent=True, console="off")


def finish_wandb() -> None:
    import wandb

    if wandb.run is not None:
        wandb.finish()


# --------------------------------------------------------------------------------------
# grid | cell | sweep


def _grid_parser(prog: str, with_cell: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("grid")
    p.add_argument("--config", default="paper", help="config name in experiments/configs/<name>/")
    p.add_argument("--smoke", action="store_true", help="shorthand for --config smoke")
    if with_cell:
        p.add_argument("--cell", required=True)
        p.add_argument("--seed", type=int, default=0)
    else:
        p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per cell")
        p.add_argument("--cells", nargs="*", default=None, help="only these cells")
        p.add_argument("--jobs", type=int, default=1, help="cells run in parallel")
        p.add_argument("--dry-run", action="store_true", help="print the commands only")
        p.add_argument("--skip-done", action="store_true",
                       help="keep runs whose CSV already holds every metric of the grid")
    return p


def _split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def cell_command(experiment: Experiment, grid: Grid, cell: Cell, seed: int, config: str,
                 extra: list[str] = ()) -> list[str]:
    """The ``fit`` command of one cell and seed: what the user would type."""
    script = experiment.script or PROJECT_ROOT / "experiments" / f"{experiment.name}.py"
    path = experiment.config_path(config)
    args = [a.replace("{config}", str(path.with_suffix(""))) for a in cell.args]
    return [sys.executable, str(script), "fit", "--config", str(path),
            *args, f"--seed_everything={seed}", f"--run.group={grid.name}-{config}",
            f"--run.name={cell.name}-seed{seed}", "--run.test_after_fit=true", *extra]


def _launch(experiment, grid, cell, seed, config, extra, threads: int | None):
    run_dir = runs_root() / experiment.name / f"{grid.name}-{config}" / f"{cell.name}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a cell run starts fresh
    run_dir.mkdir(parents=True)
    env = dict(os.environ)
    if threads:
        env["ATTNREPRO_THREADS"] = str(threads)
    log = open(run_dir / "output.log", "w")
    cmd = cell_command(experiment, grid, cell, seed, config, extra)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT)
    return proc, log, run_dir


def run_grid(experiment: Experiment, argv: list[str]) -> None:
    argv, extra = _split_extra(argv)
    args = _grid_parser(f"{experiment.name}.py grid").parse_args(argv)
    config = "smoke" if args.smoke else args.config
    grid = experiment.grid(args.grid)
    experiment.config_path(config)
    cells = [grid.cell(n) for n in args.cells] if args.cells else grid.cells
    todo = [(c, s) for s in range(args.seeds) for c in cells]
    if args.skip_done:
        root = runs_root() / experiment.name / f"{grid.name}-{config}"
        done = [(c, s) for c, s in todo if all(
            v is not None for v in read_run_metrics(root / f"{c.name}-seed{s}", grid).values())]
        for c, s in done:
            print(f"  kept {c.name} seed {s}: finished before", flush=True)
        todo = [t for t in todo if t not in done]
    if args.dry_run:
        for c, s in todo:
            print(" ".join(cell_command(experiment, grid, c, s, config, extra)))
        return
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
    print(f"{experiment.name} grid {grid.name} ({grid.title}), config {config}: "
          f"{len(todo)} runs, {args.jobs} at a time; logs in "
          f"{runs_root() / experiment.name / f'{grid.name}-{config}'}", flush=True)
    failed, running = [], []
    start = time.time()
    while todo or running:
        while todo and len(running) < args.jobs:
            c, s = todo.pop(0)
            running.append((c, s, time.time(), *_launch(experiment, grid, c, s, config, extra,
                                                         threads)))
        for item in list(running):
            c, s, t0, proc, log, run_dir = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            took = time.time() - t0
            if proc.returncode:
                failed.append(run_dir)
                tail = (run_dir / "output.log").read_text().splitlines()[-15:]
                print(f"  FAILED {c.name} seed {s} ({took:.0f}s): {run_dir / 'output.log'}\n    "
                      + "\n    ".join(tail), flush=True)
            else:
                values = read_run_metrics(run_dir, grid)
                shown = ", ".join(f"{k} {v * grid.scale_of(k):.2f}" for k, v in values.items()
                                  if v is not None)
                print(f"  done {c.name} seed {s} ({took:.0f}s): {shown}", flush=True)
        time.sleep(0.2)
    print(f"grid finished in {time.time() - start:.0f}s", flush=True)
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed: " + ", ".join(map(str, failed)))


def run_one_cell(experiment: Experiment, argv: list[str]) -> None:
    argv, extra = _split_extra(argv)
    args = _grid_parser(f"{experiment.name}.py cell", with_cell=True).parse_args(argv)
    config = "smoke" if args.smoke else args.config
    grid = experiment.grid(args.grid)
    proc, log, run_dir = _launch(experiment, grid, grid.cell(args.cell), args.seed, config,
                                 extra, None)
    proc.wait()
    log.close()
    sys.stdout.write((run_dir / "output.log").read_text())
    if proc.returncode:
        raise SystemExit(proc.returncode)


def sweep_config(experiment: Experiment, grid: Grid, config: str, seeds: int) -> dict:
    """A W&B sweep over the same grid: every (cell, seed), run by the ``cell`` command."""
    first_metric = next(iter(grid.metrics.values()))
    script = f"experiments/{experiment.name}.py"
    return {
        "program": script,
        "name": f"{experiment.name}-{grid.name}-{config}",
        "description": grid.title,
        "method": "grid",
        "metric": {"name": first_metric, "goal": grid.goal},
        "parameters": {"cell": {"values": [c.name for c in grid.cells]},
                       "seed": {"values": list(range(seeds))}},
        "command": ["${env}", "${interpreter}", "${program}", "cell", grid.name, "--config",
                    config, "${args}"],
    }


def write_sweep(experiment: Experiment, argv: list[str]) -> None:
    p = _grid_parser(f"{experiment.name}.py sweep")
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    config = "smoke" if args.smoke else args.config
    grid = experiment.grid(args.grid)
    experiment.config_path(config)
    out = Path(args.output or experiment.config_dir / f"sweep-{grid.name}-{config}.yaml")
    out.write_text(yaml.safe_dump(sweep_config(experiment, grid, config, args.seeds),
                                  sort_keys=False))
    print(f"wrote {out}\nrun it with:  wandb sweep {out}   then   wandb agent <sweep id>  "
          f"(on as many machines as you like)")


# --------------------------------------------------------------------------------------
# report


def read_run_metrics(run_dir: Path, grid: Grid) -> dict[str, float | None]:
    """The last logged value of each of the grid's metrics in a run's metrics.csv (the value
    in its hparams.yaml for ``hparams/<name>`` keys), None where there is none."""
    values: dict[str, float | None] = {label: None for label in grid.metrics}
    path = run_dir / "metrics.csv"
    if not path.exists():
        return values
    with open(path) as f:
        for row in csv.DictReader(f):
            for label, key in grid.metrics.items():
                if row.get(key) not in (None, ""):
                    values[label] = float(row[key])
    hparams = run_dir / "hparams.yaml"
    wanted = {label: key.split("/", 1)[1] for label, key in grid.metrics.items()
              if key.startswith("hparams/")}
    if wanted and hparams.exists():
        logged = yaml.safe_load(hparams.read_text()) or {}
        for label, name in wanted.items():
            if isinstance(logged.get(name), (int, float)):
                values[label] = float(logged[name])
    return values


def cell_runs(root: Path, cell: Cell) -> list[Path]:
    """The run folders of ``cell``'s seeds under a grid's folder (not those of another cell
    whose name starts with this one's)."""
    return [d for d in sorted(root.glob(f"{cell.name}-seed*"))
            if d.name[len(cell.name) + 5:].isdigit()]


def collect(experiment: Experiment, grid: Grid, config: str) -> dict[str, dict[str, list[float]]]:
    """cell -> metric label -> values over the seeds found in the CSV logs."""
    root = runs_root() / experiment.name / f"{grid.name}-{config}"
    out: dict[str, dict[str, list[float]]] = {}
    for cell in grid.cells:
        per_metric: dict[str, list[float]] = {label: [] for label in grid.metrics}
        for run_dir in cell_runs(root, cell):
            for label, v in read_run_metrics(run_dir, grid).items():
                if v is not None:
                    per_metric[label].append(v * grid.scale_of(label))
        out[cell.name] = per_metric
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def format_report(experiment: Experiment, grid: Grid, config: str) -> str:
    results = collect(experiment, grid, config)
    lines = [f"### {grid.title}", f"{experiment.name} grid {grid.name}, config {config} "
             f"({experiment.config_path(config).relative_to(PROJECT_ROOT)})", ""]
    header = ["cell"]
    for label in grid.metrics:
        header += [f"paper {label}", f"ours {label}"]
        if label in grid.relative_to:
            header += [f"paper {label} / {grid.relative_to[label]}",
                       f"ours {label} / {grid.relative_to[label]}"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def ratio(value, base) -> str:
        return "-" if value is None or not base else f"{value / base:.2f}x"

    for cell in grid.cells:
        row = [cell.name]
        for label in grid.metrics:
            paper = cell.paper.get(label)
            row.append("-" if paper is None else f"{paper:.2f}")
            vals = results[cell.name][label]
            if not vals:
                row.append("not run")
            else:
                m, s = mean_std(vals)  # sample std; one seed has no spread to show
                spread = f" ± {s:.2f}" if len(vals) > 1 else ""
                row.append(f"{m:.2f}{spread} (n={len(vals)})")
            if label in grid.relative_to:
                base = grid.cell(grid.relative_to[label])
                base_vals = results[base.name][label]
                row += [ratio(paper, base.paper.get(label)),
                        ratio(mean_std(vals)[0] if vals else None,
                              mean_std(base_vals)[0] if base_vals else None)]
        lines.append("| " + " | ".join(row) + " |")
    if grid.note:
        lines += ["", grid.note]
    return "\n".join(lines)


def learning_curves(experiment: Experiment, grid: Grid, config: str
                    ) -> dict[str, dict[int, list[float]]]:
    """cell -> optimiser step -> the grid's ``curve`` metric at that step (in the paper's
    units) over the seeds found in the CSV logs.  Steps are counted as optimiser steps done
    (Lightning logs validation at step - 1)."""
    if grid.curve is None:
        raise SystemExit(f"grid {grid.name!r} names no learning-curve metric (Grid.curve)")
    root = runs_root() / experiment.name / f"{grid.name}-{config}"
    out: dict[str, dict[int, list[float]]] = {}
    for cell in grid.cells:
        steps: dict[int, list[float]] = {}
        for run_dir in cell_runs(root, cell):
            path = run_dir / "metrics.csv"
            if not path.exists():
                continue
            with open(path) as f:
                for row in csv.DictReader(f):
                    if row.get(grid.curve) not in (None, ""):
                        step = int(row["step"]) + 1
                        steps.setdefault(step, []).append(float(row[grid.curve]) * grid.scale)
        out[cell.name] = steps
    return out


def format_curves(experiment: Experiment, grid: Grid, config: str) -> str:
    """The learning curves as a markdown table: one row per step, one column per cell
    (mean over seeds, with n when seeds differ)."""
    curves = learning_curves(experiment, grid, config)
    steps = sorted({s for c in curves.values() for s in c})
    lines = [f"### {grid.title}: learning curves, {grid.curve}",
             f"{experiment.name} grid {grid.name}, config {config}", "",
             "| step | " + " | ".join(curves) + " |", "|---" * (len(curves) + 1) + "|"]
    for step in steps:
        row = []
        for values in (curves[c].get(step) for c in curves):
            if not values:
                row.append("-")
            else:
                row.append(f"{sum(values) / len(values):.2f}"
                           + (f" (n={len(values)})" if len(values) > 1 else ""))
        lines.append(f"| {step} | " + " | ".join(row) + " |")
    if not steps:
        lines.append("| (no validation logged yet) |" + " |" * len(curves))
    return "\n".join(lines)


def print_report(experiment: Experiment, argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog=f"{experiment.name}.py report")
    p.add_argument("grid", nargs="?", default=None)
    p.add_argument("--config", default="paper")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--curve", action="store_true",
                   help="also print the validation learning curves (grids that name one)")
    args = p.parse_args(argv)
    config = "smoke" if args.smoke else args.config
    grids = [experiment.grid(args.grid)] if args.grid else list(experiment.grids.values())
    parts = []
    for g in grids:
        parts.append(format_report(experiment, g, config))
        if args.curve and g.curve is not None:
            parts.append(format_curves(experiment, g, config))
    print("\n\n".join(parts))
