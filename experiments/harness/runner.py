"""The command contract every experiment script follows.

    <name>.py fit|validate|test --config experiments/configs/<name>/paper.yaml [overrides]
    <name>.py grid <grid> [--smoke | --config NAME] [--seeds N] [--jobs N] [--threads N]
                      [--skip-done | --force] [-- overrides]
    <name>.py cell <grid> --cell NAME --seed N [--config NAME] [--threads N] [--force]
                      [-- overrides]
    <name>.py sweep <grid> [--config NAME] [--seeds N] [--threads N] [--output PATH]
                      [-- overrides]
    <name>.py report [<grid>] [--config NAME] [--curve] [--slices [NAME ...]] [--plot [--out DIR]]
                     [--against DIR]
    <name>.py keep <grid> --to DIR [--config NAME] [--cells ...] [--tokens-from-data] [--force]

(``<name>.py`` is ``python experiments/<name>.py``; configs are paper.yaml, smoke.yaml, ...;
``<name>.py --help`` lists the commands, the grids and the configs.)

``fit``/``validate``/``test`` are LightningCLI.  A grid (a paper table) is a list of cells,
each a list of CLI overrides; ``grid`` runs every cell and seed locally, each as the same
``fit`` command a user would type, in one W&B group; ``cell`` runs one of them (what a W&B
sweep agent calls); ``sweep`` writes the W&B sweep YAML for the grid (into
``runs/<experiment>/sweeps/``, never among the configs); ``report`` prints the
paper's table with the paper's numbers beside ours (mean +- std over seeds), read from the
CSV logs, so it works without W&B; ``--curve`` adds the validation learning curves and
``--plot`` writes them, paper vs ours and the claims as PNGs (experiments/harness/plots.py) into
``runs/<experiment>/<grid>-<config>/plots/`` or ``--out DIR``.  ``--slices [NAME ...]`` tests each
claim again within slices of the test set that the script declares (all of them without a
name; experiments/harness/slice_report.py), and with ``--plot`` draws them.  ``--against
DIR`` tests each cell against itself in another runs root (the same grid made in another
precision or on another machine), seed k with seed k.  ``keep``
copies the finished runs into a folder to commit (experiments/harness/keep.py: the files
``report`` reads, without the input text, with the number of tokens the model read).
``python -m
experiments.claims`` gathers every grid's claims into results/CLAIMS.md.

After ``fit``, ``--run.test_after_fit true`` tests the final weights, or with
``--run.average_last N`` the average of the run's last N step checkpoints
(``checkpoints/averaged-last<N>.ckpt``, lit_models/averaging.py), as both translation papers do.

Runs live in ``runs/<experiment>/<group>/<name>/`` ($ATTNREPRO_RUNS moves ``runs/``): the
CSV metrics, the resolved config, checkpoints and the offline W&B run.  A grid cell's group
is ``<grid>-<config>`` and its name ``<cell>-seed<k>``.

W&B (online with an API key, else offline): every run is in the group
``<experiment>/<group>`` with ``experiment``, ``grid``, ``cell`` and ``seed`` on its config
(grid and cell None outside a grid; the data seed a DataModule records is ``data_seed``), job
type ``train`` (fit, and its test after fit) or ``eval`` (validate, test).  A run's summary
keeps the best of each validation metric (``val/acc`` max, ``val/loss`` min, ...:
experiments.harness.loggers.metric_summary) and the last of each test metric; a test that writes
per-example predictions (``predictions-test*.jsonl``, ``hypotheses-test.jsonl``) logs them as
the table ``test/predictions[_<split>]``.  After its cells, ``grid`` logs one more run to the
group, job type ``summary``: the paper's table (``paper_table``: per cell the paper's number,
our mean, std and number of seeds, as ``report`` computes them) and ``report --plot``'s
figures as the images ``plots/<figure>``.
"""

from __future__ import annotations

import sys

from experiments.harness.command_line import (
    CLI_COMMANDS,
    COMMANDS,
    RUNNER_COMMANDS,
    CommandLine,
    listing,
)
from experiments.harness.grid_model import Experiment, runs_root, shown_path
from experiments.harness.keep import keep_runs
from experiments.harness.launch import run_grid, run_one_cell, write_sweep
from experiments.harness.preflight import (
    attention_flags,
    check_attention_args,
    check_config_given,
    check_dataset_args,
    check_roots,
)
from experiments.harness.report import print_report


def main(experiment: Experiment, argv: list[str] | None = None) -> None:
    """The command of ``argv`` (default: ``sys.argv[1:]``) on ``experiment``."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(overview(experiment))
        if not args:
            raise SystemExit(2)  # a command is needed
        return
    command = args[0]
    if command in RUNNER_COMMANDS:
        {"grid": grid_and_summary, "cell": run_one_cell, "sweep": write_sweep,
         "report": print_report, "keep": keep_runs}[command](experiment, args[1:])
        return
    if command == "predict":
        raise SystemExit(predict_message(experiment))
    if not command.startswith("-") and command not in CLI_COMMANDS:
        raise SystemExit(f"{experiment.name}.py: unknown command {command!r}; commands: "
                         f"{', '.join(COMMANDS)} (see {experiment.name}.py --help)")
    line = CommandLine.parse(args[1:], command if command in CLI_COMMANDS else None)
    if command in CLI_COMMANDS and args[1:] in (["--help"], ["-h"]):
        print(short_help(experiment, command))  # no torch: the full listing takes seconds
        return
    if command in CLI_COMMANDS and args[1:] in (["--help", "full"], ["-h", "full"]):
        if argv is None:  # LightningCLI's listing of every option (it reads sys.argv)
            sys.argv[1:] = [command, "--help"]
        else:
            argv = [command, "--help"]
    elif command in CLI_COMMANDS and not line.asks_for_help():
        check_dataset_args(experiment, command, line)
        check_config_given(experiment, command, line)
        check_attention_args(experiment, command, line)
        check_roots(f"{experiment.name}.py {command}", "cache")
    from experiments.harness.cli import run_cli  # Lightning's CLI: only for fit, validate, test

    run_cli(experiment, argv, line)  # argv None: LightningCLI reads sys.argv itself


def grid_and_summary(experiment: Experiment, argv: list[str]) -> None:
    """``grid``: the cells run (experiments/harness/launch.py), then the grid's W&B summary
    run (none when no cell due finished); what failed or was not run ends the command with
    its message."""
    done = run_grid(experiment, argv)
    if done is None:  # --dry-run
        return
    if done.summary:  # not when every cell due failed or another grid held it
        from experiments.harness.wandb_summary import log_grid_summary  # Lightning's loggers

        log_grid_summary(experiment, done.grid, done.config)
    if done.problems:
        raise SystemExit("; ".join(done.problems))


def overview(experiment: Experiment) -> str:
    """``<name>.py --help``: the commands, the grids, the configs, the attention names."""
    prog = f"{experiment.name}.py"
    width = max(map(len, COMMANDS))
    lines = [f"usage: {prog} <command> ...   ({prog} <command> --help: its options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", listing(experiment)]
    params, mechanisms = attention_flags(experiment)  # no torch while the model is a path
    if params:
        first, *others = params
        also = f"; also {', '.join(f'--model.{p}' for p in others)}" if others else ""
        lines += ["", f"attention (--model.{first} NAME [--model.{first}.OPTION VALUE]{also}):",
                  f"  {', '.join(mechanisms)}"]
    where = shown_path(experiment.config_dir)
    grid = next(iter(experiment.grids))
    script = f"python experiments/{prog}"
    fit = f"{script} fit --config {where}/smoke.yaml"
    smoke_datasets = experiment.datasets_in(experiment.config_dir / "smoke")
    if smoke_datasets:
        fit += f" --config {where}/smoke/{smoke_datasets[0]}.yaml"
    if params:
        fit += f" --model.{next(iter(params))} {'coda' if 'coda' in mechanisms else 'softmax'}"
    lines += ["", "examples:", f"  {fit}", f"  {script} grid {grid} --smoke",
              f"  {script} report {grid} --smoke"]
    return "\n".join(lines)


#: the Trainer options a run most often sets (``--help full`` lists all of them)
TRAINER_OPTIONS = ("max_steps", "max_epochs", "val_check_interval", "check_val_every_n_epoch",
                   "limit_val_batches", "accelerator", "devices", "precision",
                   "accumulate_grad_batches", "gradient_clip_val", "log_every_n_steps")


def short_help(experiment: Experiment, command: str) -> str:
    """``<name>.py fit|validate|test --help``: the configs, each group of options with the
    names it takes (the model's and DataModule's read from their source, no torch: an
    answer at once), and where the full listing is: ``--help full`` (LightningCLI's, every
    option with its type, default and help), ``--<group>.help CLASS`` per class, and
    ``--print_config``."""
    import textwrap

    from experiments.harness.command_line import RUN_OPTIONS
    from experiments.harness.sources import init_params

    prog = f"{experiment.name}.py {command}"
    where = shown_path(experiment.config_dir)
    linked = {target for _, target in experiment.links}

    def group(flag: str, what: str, names) -> list[str]:
        text = f"{what}: {', '.join(names)}" if names else what
        if not text:
            return [f"  {flag}"]
        return textwrap.wrap(text, 100, initial_indent=f"  {flag:<12}",
                             subsequent_indent=" " * 14)

    def cls(role: str) -> tuple[str, list[str]]:
        path = experiment.unimported(role)
        if path is None:
            value = getattr(experiment, role)
            path = f"{value.__module__}.{value.__qualname__}"
        return path, [p for p in init_params(path) if p not in linked]

    model, model_args = cls("model_class")
    data, data_args = cls("datamodule_class")
    datasets = experiment.dataset_names()
    lines = [f"usage: {prog} -c CONFIG [-c CONFIG ...] [--<group>.<option> VALUE ...]",
             CLI_COMMANDS[command], "",
             *textwrap.wrap(f"configs: -c {where}/<config>.yaml, <config> one of: "
                            f"{', '.join(experiment.configs())}", 100, subsequent_indent="  ")]
    if datasets and experiment.subclass_mode_data:
        lines += textwrap.wrap(f"and a dataset's: -c {where}/<config>/<dataset>.yaml, "
                               f"<dataset> one of: {', '.join(datasets)}", 100,
                               initial_indent="  ", subsequent_indent="  ")
    lines += ["", "options by group, --<group>.<option> VALUE (with types, defaults and help: "
              "--help full):"]
    subclasses = " and subclasses" if experiment.subclass_mode_model else ""
    lines += group("--model.*", f"{model}{subclasses}", model_args)
    lines += group("--data.*", (f"the dataset config's DataModule (subclasses of {data})"
                                if experiment.subclass_mode_data else data),
                   [] if experiment.subclass_mode_data else data_args)
    lines += group("--trainer.*", "Lightning's Trainer, e.g.", TRAINER_OPTIONS)
    lines += group("--run.*", "this suite's run options", RUN_OPTIONS)
    lines += group("--seed_everything N, --ckpt_path PATH", "", [])
    params, mechanisms = attention_flags(experiment)
    if params:
        first, *others = params
        also = f" (also {', '.join(f'--model.{p}' for p in others)})" if others else ""
        lines += ["", *textwrap.wrap(
            f"attention: --model.{first} NAME [--model.{first}.OPTION VALUE]{also}; NAME one "
            f"of: {', '.join(mechanisms)}", 100, subsequent_indent="  ")]
    per_class = [f"--model.{next(iter(params))}.help NAME"] if params else []
    per_class += ["--model.help CLASS"] * experiment.subclass_mode_model
    per_class += ["--data.help CLASS"] * experiment.subclass_mode_data
    lines += ["", "more:", f"  {prog} --help full: every option, by group",
              *(f"  {prog} {flag}: the options of one class" for flag in per_class),
              f"  {prog} -c CONFIG ... --print_config: the values it resolves to"]
    return "\n".join(lines)


def predict_message(experiment: Experiment) -> str:
    metrics = f"{shown_path(runs_root() / experiment.name)}/<group>/<name>/metrics.csv"
    path = experiment.unimported("model_class")
    if path is not None:  # read from the source: no torch for a refusal
        from experiments.harness.sources import class_attribute

        written = class_attribute(path, "predictions_file")
    else:
        written = getattr(experiment.model_class, "predictions_file", None)
    writes = (f" and the predictions to {written} beside it" if written
              else " (this model writes no predictions file)")
    return (f"{experiment.name}.py: predict is not offered (no model here implements "
            f"prediction); use test --ckpt_path CKPT, or fit --run.test_after_fit true: the "
            f"test metrics go to {metrics}{writes}")
