"""``fit``, ``validate`` and ``test``: LightningCLI with the suite's run options (``--run.*``),
loggers (experiments/harness/loggers.py), argument links that fetch the data first, and one-line
errors (experiments/harness/errors.py).  After ``fit``, ``--run.test_after_fit true`` tests the
final weights, or with ``--run.average_last N`` the average of the last N checkpoints.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from datetime import datetime
from functools import partial
from pathlib import Path

from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from experiments.harness.checkpoints import AtomicCheckpointIO, checkpoint_problem
from experiments.harness.command_line import CLI_COMMANDS, RUN_OPTIONS, CommandLine
from experiments.harness.errors import (
    ConfigError,
    DataErrorInLink,
    closest_options,
    compact_error,
    data_error_in,
    data_errors,
    data_message,
    debug,
    unwrapped,
)
from experiments.harness.grid_model import Experiment, RunFolderBusy, claim_run, runs_root
from experiments.harness.loggers import finish_wandb, log_predictions, make_loggers
from experiments.harness.preflight import check_folder, missing_dataset_message, root_note
from experiments.harness.progress import ProgressLines, progress_bar, shows_bar
from lit_models.base import NonFiniteLossError

warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


def run_cli(experiment: Experiment, argv: list[str] | None, line: CommandLine | None = None):
    """LightningCLI for one run; returns the CLI object (tests inspect it).  ``argv`` None:
    the process's command line; ``line``: the command line as the checks before read it."""
    threads = os.environ.get("ATTNREPRO_THREADS")
    if threads:
        if not threads.isdecimal() or int(threads) < 1:
            raise SystemExit(f"{experiment.name}.py: ATTNREPRO_THREADS (torch threads of the "
                             f"run, what grid --threads sets) must be a positive integer, got "
                             f"{threads!r}")
        import torch

        torch.set_num_threads(int(threads))
    silence_lightning_tips()
    line = line or CommandLine.parse(sys.argv[1:] if argv is None else argv)
    try:
        return ExperimentCLI(
            experiment, *experiment.imported_classes(),
            subclass_mode_model=experiment.subclass_mode_model,
            subclass_mode_data=experiment.subclass_mode_data,
            auto_configure_optimizers=False, args=argv,
            parser_class=parser_class(experiment, line),
            save_config_kwargs={"overwrite": True},
            # every DataModule of the suite shards its length-bucketed batches across
            # processes itself (datamodules.common.BucketBatchSampler), so Lightning must
            # not add a sampler
            trainer_defaults={"use_distributed_sampler": False},
        )
    except (*data_errors(), DataErrorInLink) as caught:  # the data: one line
        err = caught.error if isinstance(caught, DataErrorInLink) else caught
        if debug():
            raise err from err.__cause__  # its own traceback: where the reader found it
        raise SystemExit(f"{experiment.name}.py: {data_message(err)}") from err
    except ConfigError as err:
        if debug():
            raise
        raise SystemExit(f"{experiment.name}.py: invalid configuration: {err} "
                         f"(ATTNREPRO_DEBUG=1 shows the traceback)") from err
    except NonFiniteLossError as err:  # the step and the last finite loss, in one line
        if debug():
            raise
        raise SystemExit(f"{experiment.name}.py: {err}") from err
    except SIGTERMException:
        # Lightning stops at the end of the batch on SIGTERM with SystemExit(), status 0: a
        # stopped run must not pass for a finished one (its grid would report it done)
        raise SystemExit(f"{experiment.name}.py: stopped by SIGTERM before the end; its latest "
                         "checkpoint resumes it (grid --skip-done, or fit --ckpt_path)") from None


class CompactParser(LightningArgumentParser):
    """An argument error in two lines (the message, with the closest valid options for a
    misspelt one, and where the help is) instead of the whole usage first."""

    #: the experiment and the command line of the run (:func:`parser_class` sets them)
    experiment: Experiment
    line: CommandLine

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or debug():
            return super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        # the script's name, also when main() is called in-process
        prog = " ".join([f"{self.experiment.name}.py",
                         *parser.prog.replace(" [options]", "").split()[1:]])
        message = compact_error(message, self.experiment, self.line)
        sys.stderr.write(f"{prog}: error: {message}{closest_options(parser, message)}\n"
                         f"(every option: {prog} --help full)\n")
        self.exit(2)


    def format_help(self) -> str:
        """argparse's help with a short usage: the usage of ``fit`` lists every option of the
        trainer, the model and the data (about 120 lines) before the same options grouped."""
        usage, blank, rest = super().format_help().partition("\n\n")
        if usage.count("\n") < 3:
            return usage + blank + rest
        prog = " ".join([f"{self.experiment.name}.py",
                         *self.prog.replace(" [options]", "").split()[1:]])
        return (f"usage: {prog} [-c CONFIG ...] [--<group>.<option> VALUE ...] [--print_config]\n"
                "(the options below, by group; the values a command line resolves to, configs "
                f"merged: {prog} -c CONFIG ... --print_config){blank}{rest}")


def parser_class(experiment: Experiment, line: CommandLine) -> type[CompactParser]:
    """A :class:`CompactParser` class of this run: jsonargparse builds the parsers of
    subcommands, nested classes and ``--*.help`` as ``type(parser)(...)``, so what an error
    message names travels with the class, not the instance."""
    return type("CompactParser", (CompactParser,), {"experiment": experiment, "line": line})


class ExperimentCLI(LightningCLI):
    """LightningCLI with the suite's ``--run.*`` options, loggers, argument links, one-line
    errors and what follows a fit (averaging, testing)."""

    def __init__(self, experiment: Experiment, *args, **kwargs):
        self.experiment = experiment  # before LightningCLI builds the parser and runs
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # no model of the suite implements prediction: test writes what a run predicts
        return {k: v for k, v in LightningCLI.subcommands().items() if k in CLI_COMMANDS}

    def _parse_ckpt_path(self):
        # LightningCLI reads --ckpt_path's hyper-parameters right after parsing (Lightning
        # 2.6): a checkpoint that is not whole (a copy cut short) is one line before that
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and Path(ckpt_path).is_file():
            problem = checkpoint_problem(ckpt_path)
            if problem is not None:
                raise SystemExit(f"{self.experiment.name}.py: --ckpt_path {ckpt_path}: not a "
                                 f"whole checkpoint ({problem})")
        super()._parse_ckpt_path()

    def before_instantiate_classes(self):
        # the abstract DataModule (e.g. --data.data_dir without a dataset config)
        data = self.config[self.subcommand].get("data")
        experiment = self.experiment
        base = experiment.datamodule_class
        if (experiment.subclass_mode_data and experiment.dataset_names()
                and getattr(data, "class_path", None) == f"{base.__module__}."
                                                         f"{base.__qualname__}"):
            configs = [str(getattr(p, "relative", p))  # as the user typed it
                       for p in self.config[self.subcommand].get("config") or []]
            raise SystemExit(missing_dataset_message(experiment, self.subcommand, configs))

    def instantiate_classes(self):
        # a value the model's or DataModule's constructor refuses (a size of 0, options
        # that cannot go together): one line, like a malformed file, not the errors of
        # several lines jsonargparse wraps it in; a data error raised under such a
        # wrapper: the data error itself
        try:
            super().instantiate_classes()
        except data_errors():
            raise
        except ValueError as err:
            cause = data_error_in(err)
            if cause is not None:
                raise cause from err
            raise ConfigError(str(unwrapped(err))) from err

    def add_arguments_to_parser(self, parser):
        for name, (kind, default, text) in RUN_OPTIONS.items():
            parser.add_argument(f"--run.{name}", type=kind, default=default, help=text)
        # the same config, seed and thread count give the same numbers: torch refuses any
        # operation without a deterministic implementation (none on the CPU; on CUDA,
        # --trainer.deterministic warn runs them and says which)
        parser.set_defaults({"trainer.deterministic": True})
        prefix = "model.init_args." if self.experiment.subclass_mode_model else "model."
        for source, target in self.experiment.links:
            # the DataModule's files first (download what is missing), then the attribute
            compute = partial(prepared_attribute, source)
            compute.__name__ = f"prepared {source}"  # how --help shows the link
            parser.link_arguments("data", prefix + target, apply_on="instantiate",
                                  compute_fn=compute)

    def instantiate_trainer(self, **kwargs):
        run = self.config[self.subcommand]["run"]
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        if trainer_cfg.get("logger", True) is not False:
            claim_run_folder(self.experiment, run)
            kwargs["logger"] = make_loggers(self.experiment, run, self.model,
                                            self.config[self.subcommand], self.subcommand)
        # a progress bar on a terminal, else lines (experiments/harness/progress.py) unless set
        bar = shows_bar(trainer_cfg.get("enable_progress_bar"))
        kwargs["enable_progress_bar"] = bar
        if run.progress_every is not None and run.progress_every < 0:
            raise SystemExit(f"--run.progress_every must be a number of steps (0: no lines), "
                             f"got {run.progress_every}")
        callbacks = trainer_cfg.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        if not bar and run.progress_every != 0:
            kwargs["callbacks"] = [*callbacks, ProgressLines(run.progress_every)]
        elif bar and not any(isinstance(c, ProgressBar) for c in callbacks):
            kwargs["callbacks"] = [*callbacks, progress_bar()]  # not 'Epoch 0/-2'
        plugins = trainer_cfg.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            # checkpoints written whole or not at all (experiments/harness/checkpoints.py)
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        return super().instantiate_trainer(**kwargs)

    def before_fit(self):
        check_average_last(self.trainer, self.config["fit"]["run"])

    def after_fit(self):
        run = self.config["fit"]["run"]
        ckpt_path = run.test_ckpt
        if run.average_last:
            ckpt_path = average_after_fit(self.trainer, run.average_last)
        if run.test_after_fit:
            started = time.time()
            # this run's own checkpoints: their hyper-parameters hold the attention
            # objects, which torch's weights-only loader refuses
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path,
                              weights_only=False if ckpt_path else None)
            log_predictions(self.trainer, since=started)
        finish_wandb()

    def after_validate(self):
        finish_wandb()

    def before_test(self):
        self.test_started = time.time()

    def after_test(self):
        log_predictions(self.trainer, since=getattr(self, "test_started", None))
        finish_wandb()


def claim_run_folder(experiment: Experiment, run) -> None:
    """Name the run (``run.name``, a time stamp by default) and lock its folder for this
    process (experiments.harness.grid_model.claim_run): two runs started in the same second get two
    folders, and a run folder another process writes is refused in one line.  The first
    process only (rank 0); the others of a DDP run write no run folder of their own."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) != 0:
        return
    root = runs_root() / experiment.name / run.group
    check_folder(f"{experiment.name}.py", root, root_note("runs"))
    try:
        run.name = claim_run(root, run.name, datetime.now().strftime("%Y%m%d-%H%M%S"))
    except RunFolderBusy as err:
        raise SystemExit(f"{experiment.name}.py: {err}") from None


def prepared_attribute(name: str, datamodule):
    """``datamodule.<name>`` after its files are there (datamodules.fetch.prepare: downloads
    what is missing, once, locked across processes): argument links read the DataModule's
    vocabulary before Lightning would call ``prepare_data``.  A malformed, missing or
    undownloadable file ends the command in one line (:class:`DataErrorInLink`)."""
    from datamodules.fetch import prepare

    try:
        prepare(datamodule)
        return getattr(datamodule, name)
    except data_errors() as err:
        raise DataErrorInLink(err) from None


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


def _not_a_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("\N{ELECTRIC LIGHT BULB} Tip:")


def silence_lightning_tips() -> None:
    """Drop Lightning's advertisements ("💡 Tip: ... litlogger / litmodels"), printed at
    every run by its rank-zero logger with no setting to turn them off (Lightning 2.6;
    Lightning-AI/pytorch-lightning#21294): a filter on that logger for those lines only."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_not_a_tip)  # once: the same function is kept once
