"""The command line of an experiment script: its commands, the command line of a LightningCLI
command read once (its options and the YAML of every config file it names) for the checks
that run before LightningCLI parses it, and the argparse parsers of the commands the suite
adds (grid, cell, sweep, report).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml

from experiments.harness.grid_model import Experiment, shown_path

CLI_COMMANDS = {
    "fit": "train one model (LightningCLI: every model and data argument is a flag)",
    "validate": "evaluate a checkpoint (--ckpt_path) on the validation split",
    "test": "evaluate a checkpoint (--ckpt_path) on the test split",
}
RUNNER_COMMANDS = {
    "grid": "run every cell and seed of a grid (a paper table) locally: fit, then test",
    "cell": "run one cell and seed of a grid (what a W&B sweep agent calls)",
    "sweep": "write the W&B sweep YAML of a grid (to runs/<experiment>/sweeps/)",
    "report": "print a grid's table from the CSV logs: the paper's numbers beside ours",
    "keep": "copy a grid's finished runs into a folder to commit (the input text left out, "
            "its token count kept)",
}
COMMANDS = {**CLI_COMMANDS, **RUNNER_COMMANDS}
#: the options of a run beside the model's, the data's and the trainer's: --run.<name>
RUN_OPTIONS = {
    "group": (str, "adhoc", "run group: runs/<experiment>/<group>/, the W&B group"),
    "name": (str | None, None, "run name (default: a time stamp)"),
    "grid": (str | None, None, "the grid (paper table) of the run, set by grid/cell: the W&B "
                               "config's grid"),
    "cell": (str | None, None, "the grid's cell (table row) of the run, set by grid/cell: the "
                               "W&B config's cell"),
    "test_after_fit": (bool, False, "after fit, test on the test split"),
    "test_ckpt": (str | None, None, "checkpoint to test after fit: None = final weights, "
                                    "'best' = the best monitored checkpoint"),
    "average_last": (int | None, None, "after fit, average the last N step checkpoints into "
                                       "checkpoints/averaged-last<N>.ckpt and test on it "
                                       "(None/0: off)"),
    "wandb": (bool, True, "log to W&B (offline without an API key)"),
    "progress_every": (int | None, None, "without a progress bar (not on a terminal, or "
                                         "--trainer.enable_progress_bar false): a line every N "
                                         "optimiser steps (None: about 100 a run; 0: none)"),
}
#: the flags that name a config file (LightningCLI's parser takes both)
CONFIG_FLAGS = ("--config", "-c")


class Option(NamedTuple):
    """One ``--flag value`` / ``--flag=value`` / ``-c value`` of a command line."""

    flag: str
    value: str | None  # None: a flag without a value
    shown: str  # as typed, for messages


def load_yaml(path: str | Path) -> dict:
    """The mapping a YAML file holds; {} for a file that cannot be read or is no mapping."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


@dataclass(frozen=True)
class CommandLine:
    """The arguments of a LightningCLI command (``fit``, ``validate``, ``test``), tokenised once:
    its options in order and the YAML of each config file it names, read once."""

    args: tuple[str, ...]
    options: tuple[Option, ...]
    configs: dict[str, dict]  # config file as typed -> its mapping ({}: unreadable)
    command: str | None = None  # fit, validate or test, when the caller knows it

    @classmethod
    def parse(cls, args: list[str] | tuple[str, ...], command: str | None = None) -> CommandLine:
        options = []
        i = 0
        while i < len(args):
            token = args[i]
            i += 1
            if not token.startswith("-"):
                continue
            flag, eq, value = token.partition("=")
            if not eq:
                if i < len(args) and not args[i].startswith("--"):
                    value = args[i]
                    i += 1
                else:
                    value = None
            options.append(Option(flag, value,
                                  token if eq or value is None else f"{token} {value}"))
        configs = {o.value: load_yaml(o.value) for o in options
                   if o.flag in CONFIG_FLAGS and o.value}
        if command is None:  # a whole command line: its command first
            command = next((a for a in args[:1] if a in CLI_COMMANDS), None)
        return cls(tuple(args), tuple(options), configs, command)

    @classmethod
    def of(cls, args: CommandLine | list[str]) -> CommandLine:
        return args if isinstance(args, CommandLine) else cls.parse(args)

    @property
    def config_files(self) -> list[str]:
        """The files given to ``--config`` / ``-c``, in order, as typed."""
        return [o.value for o in self.options if o.flag in CONFIG_FLAGS and o.value]

    @property
    def flags(self) -> set[str]:
        return {o.flag for o in self.options}

    def asks_for_help(self) -> bool:
        return any(a in ("-h", "--help") or a.split("=", 1)[0].endswith(".help")
                   for a in self.args)

    def configs_with_key(self, keys: list[str]) -> list[str]:
        """The config files that hold the nested key ``keys`` (e.g. ``model.dropoutt``)."""
        return [path for path in self.config_files if _has_key(self.configs[path], keys)]


def _has_key(node, keys: list[str]) -> bool:
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


# --------------------------------------------------------------------------------------
# grid | cell | sweep | report: argparse


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def listing(experiment: Experiment, cells: bool = False) -> str:
    """The grids (title, cells per seed) and the configs (with their datasets)."""
    width = max((len(g) for g in experiment.grids), default=0)
    lines = ["grids (<grid>; cells per seed):"]
    for name, grid in experiment.grids.items():
        lines.append(f"  {name:<{width}}  {grid.title} ({_cells(len(grid.cells))})")
        if cells:
            lines.append(f"  {'':<{width}}    cells: {', '.join(c.name for c in grid.cells)}")
    where = shown_path(experiment.config_dir)
    configs = experiment.configs()
    datasets = {c: experiment.datasets_in(experiment.config_dir / c) for c in configs}
    lines += ["", f"configs (--config NAME, --smoke = --config smoke; {where}/<config>.yaml):"]
    if any(datasets.values()):
        lines[-1] = lines[-1][:-2] + "), each with its datasets"
        lines.append(f"(a fit merges one: --config {where}/<config>/<dataset>.yaml):")
        cw = max(map(len, configs))
        lines += [f"  {c:<{cw}}  {', '.join(datasets[c]) or '-'}" for c in configs]
    else:
        lines.append(f"  {', '.join(configs)}")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def count(minimum: int):
    """An argparse type: an integer of at least ``minimum`` (a count of seeds, jobs, threads:
    0 runs nothing or waits forever, a negative one fails in every run), refused at parse
    time in one line."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}")
        return value

    parse.__name__ = "count"  # argparse names the type in its own messages
    return parse


def command_parser(experiment: Experiment, command: str, cells: bool = False) -> _Parser:
    """The parser of one of the suite's commands: its description, then the listing."""
    return _Parser(prog=f"{experiment.name}.py {command}", description=COMMANDS[command],
                   epilog=listing(experiment, cells=cells),
                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_config_arguments(parser: argparse.ArgumentParser, experiment: Experiment) -> None:
    """``--config NAME`` and ``--smoke``: which of the experiment's configs a grid runs with."""
    parser.add_argument("--config", default=None,
                        help=f"config name: {', '.join(experiment.configs())} (default: paper)")
    parser.add_argument("--smoke", action="store_true",
                        help="shorthand for --config smoke (not with another --config)")


def chosen_config(experiment: Experiment, args: argparse.Namespace) -> str:
    """The config name of parsed ``--config`` / ``--smoke`` (default: paper); one line when
    the experiment has no such config, or ``--smoke`` comes with another ``--config``."""
    if args.smoke and args.config not in (None, "smoke"):
        raise SystemExit(f"{experiment.name}.py: --smoke means --config smoke; it cannot go "
                         f"with --config {args.config} (give one of them)")
    config = "smoke" if args.smoke else args.config or "paper"
    experiment.config_path(config)
    return config


def grid_parser(experiment: Experiment, command: str,
                with_cell: bool = False) -> argparse.ArgumentParser:
    p = command_parser(experiment, command, cells=True)
    p.add_argument("grid", help=f"one of: {', '.join(experiment.grids)} (below)")
    add_config_arguments(p, experiment)
    if with_cell:
        p.add_argument("--cell", required=True, help="a cell of the grid (below)")
        p.add_argument("--seed", type=count(0), default=0, metavar="N",
                       help="the seed (default: 0)")
    else:
        p.add_argument("--seeds", type=count(1), default=1, metavar="N",
                       help="seeds 0..N-1 per cell (default: 1)")
        p.add_argument("--cells", nargs="*", default=None,
                       help="only these cells (default: every cell, below)")
    p.add_argument("--threads", type=count(1), default=None, metavar="N",
                   help="torch threads per run, $ATTNREPRO_THREADS of each run (default: "
                        + ("the cores / --jobs when --jobs > 1, else " if command == "grid"
                           else "") + "torch's default); results depend on it, so fix it to "
                        "compare machines")
    if command in ("grid", "cell"):
        p.add_argument("--force", action="store_true",
                       help="replace runs that finished before, and start again runs that "
                            "stopped leaving checkpoints (default: refuse, naming them"
                            + ("; --skip-done keeps the first and resumes the others)"
                               if command == "grid" else ")"))
    if command == "grid":  # how to run them here (a sweep's agents decide for themselves)
        p.add_argument("--jobs", type=count(1), default=1, metavar="N",
                       help="cells run in parallel (default: 1)")
        p.add_argument("--dry-run", action="store_true", help="print the commands only")
        p.add_argument("--skip-done", action="store_true",
                       help="keep runs whose CSV already holds every metric of the grid; "
                            "resume the others that left a checkpoint from their latest")
        p.add_argument("--status-every", type=count(0), default=60, metavar="SECONDS",
                       help="without a terminal (CI, nohup, a pipe): a status line per running "
                            "cell every SECONDS (default: 60; 0: none); on a terminal each "
                            "running cell has a live line")
    return p


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the command's own arguments, the overrides after ``--`` for every run)"""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []
