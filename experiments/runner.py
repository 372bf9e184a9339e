"""The command contract every experiment script follows.

    <name>.py fit|validate|test --config experiments/configs/<name>/paper.yaml [overrides]
    <name>.py grid <grid> [--smoke | --config NAME] [--seeds N] [--jobs N] [--skip-done]
                      [-- overrides]
    <name>.py cell <grid> --cell NAME --seed N [--config NAME]
    <name>.py sweep <grid> [--config NAME] [--seeds N] [--output PATH]
    <name>.py report [<grid>] [--config NAME]

(``<name>.py`` is ``python experiments/<name>.py``; configs are paper.yaml, smoke.yaml, ...;
``<name>.py --help`` lists the commands, the grids and the configs.)

``fit``/``validate``/``test`` are LightningCLI.  A grid (a paper table) is a list of cells,
each a list of CLI overrides; ``grid`` runs every cell and seed locally, each as the same
``fit`` command a user would type, in one W&B group; ``cell`` runs one of them (what a W&B
sweep agent calls); ``sweep`` writes the W&B sweep YAML for the grid (into
``runs/<experiment>/sweeps/``, never among the configs); ``report`` prints the
paper's table with the paper's numbers beside ours (mean +- std over seeds), read from the
CSV logs, so it works without W&B.

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
:func:`metric_summary`) and the last of each test metric; a test that writes per-example
predictions (``predictions-test*.jsonl``, ``hypotheses-test.jsonl``) logs them as the table
``test/predictions[_<split>]``.  After its cells, ``grid`` logs one more run to the group,
job type ``summary``: the paper's table (``paper_table``: per cell the paper's number, our
mean, std and number of seeds, as ``report`` computes them).
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import logging
import math
import numbers
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import typing
import warnings
from datetime import datetime
from functools import partial
from pathlib import Path

import yaml
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from experiments.grid_model import (
    PROJECT_ROOT,
    Cell,
    Experiment,
    Grid,
    runs_root,
    shown_path,
)

warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


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
        {"grid": run_grid, "cell": run_one_cell, "sweep": write_sweep,
         "report": print_report}[command](experiment, args[1:])
        return
    if command == "predict":
        raise SystemExit(predict_message(experiment))
    if not command.startswith("-") and command not in CLI_COMMANDS:
        raise SystemExit(f"{experiment.name}.py: unknown command {command!r}; commands: "
                         f"{', '.join(COMMANDS)} (see {experiment.name}.py --help)")
    if command in CLI_COMMANDS and not _asks_for_help(args[1:]):
        check_dataset_args(experiment, command, args[1:])
        check_attention_args(experiment, command, args[1:])
    run_cli(experiment, argv)  # None: LightningCLI reads sys.argv itself


# --------------------------------------------------------------------------------------
# the commands, explained: --help, and one-line errors before LightningCLI parses

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
}
COMMANDS = {**CLI_COMMANDS, **RUNNER_COMMANDS}


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _listing(experiment: Experiment, cells: bool = False) -> str:
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


def overview(experiment: Experiment) -> str:
    """``<name>.py --help``: the commands, the grids, the configs, the attention names."""
    prog = f"{experiment.name}.py"
    width = max(map(len, COMMANDS))
    lines = [f"usage: {prog} <command> ...   ({prog} <command> --help: its options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", _listing(experiment)]
    params = mechanism_params(experiment.model_class)
    if params:
        from attention.registry import REGISTRY

        first, *others = params
        also = f"; also {', '.join(f'--model.{p}' for p in others)}" if others else ""
        lines += ["", f"attention (--model.{first} NAME [--model.{first}.OPTION VALUE]{also}):",
                  f"  {', '.join(REGISTRY)}"]
    where = shown_path(experiment.config_dir)
    grid = next(iter(experiment.grids))
    script = f"python experiments/{prog}"
    fit = f"{script} fit --config {where}/smoke.yaml"
    smoke_datasets = experiment.datasets_in(experiment.config_dir / "smoke")
    if smoke_datasets:
        fit += f" --config {where}/smoke/{smoke_datasets[0]}.yaml"
    if params:
        fit += f" --model.{next(iter(params))} {'coda' if 'coda' in REGISTRY else 'softmax'}"
    lines += ["", "examples:", f"  {fit}", f"  {script} grid {grid} --smoke",
              f"  {script} report {grid} --smoke"]
    return "\n".join(lines)


def predict_message(experiment: Experiment) -> str:
    metrics = f"{shown_path(runs_root() / experiment.name)}/<group>/<name>/metrics.csv"
    written = getattr(experiment.model_class, "predictions_file", None)
    writes = (f" and the predictions to {written} beside it" if written
              else " (this model writes no predictions file)")
    return (f"{experiment.name}.py: predict is not offered (no model here implements "
            f"prediction); use test --ckpt_path CKPT, or fit --run.test_after_fit true: the "
            f"test metrics go to {metrics}{writes}")


def _asks_for_help(args: list[str]) -> bool:
    return any(a in ("-h", "--help") or a.split("=", 1)[0].endswith(".help") for a in args)


def _options(args: list[str]):
    """(flag, value, shown) for every ``--flag value`` / ``--flag=value`` / ``-c value`` of
    a command line; value None for a flag without one."""
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
        yield flag, value, token if eq or value is None else f"{token} {value}"


def _config_files(args: list[str]) -> list[str]:
    return [v for f, v, _ in _options(args) if f in ("--config", "-c") and v]


def _load_yaml(path: str) -> dict:
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def check_dataset_args(experiment: Experiment, command: str, args: list[str]) -> None:
    """An experiment whose datasets are configs of their own (``dataset_config``) needs one
    merged after the grid config: without it, say which to add (one line)."""
    if not experiment.subclass_mode_data or not experiment.dataset_names():
        return
    flags = [f for f, _, _ in _options(args)]
    if "--data" in flags or "--data.class_path" in flags:
        return
    configs = _config_files(args)
    for path in configs:
        data = _load_yaml(path).get("data")
        if isinstance(data, str) or (isinstance(data, dict) and "class_path" in data):
            return
    raise SystemExit(missing_dataset_message(experiment, command, configs))


def missing_dataset_message(experiment: Experiment, command: str, configs: list[str]) -> str:
    prog = f"{experiment.name}.py {command}"
    for path in configs:
        folder = Path(path).with_suffix("")
        names = experiment.datasets_in(folder) if folder.is_dir() else []
        if names:
            choice = names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
            return f"{prog} needs a dataset: add --config {folder}/{choice}.yaml"
    where = shown_path(experiment.config_dir)
    known = (f"configs: {', '.join(experiment.configs())}; "
             f"datasets: {', '.join(experiment.dataset_names())}")
    if not configs:
        return (f"{prog} needs a config and a dataset: add --config {where}/<config>.yaml "
                f"--config {where}/<config>/<dataset>.yaml ({known})")
    return f"{prog} needs a dataset: add --config {where}/<config>/<dataset>.yaml ({known})"


def mechanism_params(model_class: type) -> dict[str, str | None]:
    """The model's attention arguments (typed ``Mechanism``, also through ``**kwargs`` to a
    base class): name -> the name of its default mechanism (None: none)."""
    try:
        from attention.base import Mechanism
    except ImportError:  # pragma: no cover - the suite always has it
        return {}
    out: dict[str, str | None] = {}
    for cls in reversed(getattr(model_class, "__mro__", ())):
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        try:
            hints = typing.get_type_hints(init)
            params = inspect.signature(init).parameters
        except Exception:  # noqa: BLE001 - a class without introspectable hints
            continue
        for name, hint in hints.items():
            if hint is Mechanism or Mechanism in typing.get_args(hint):
                default = params[name].default if name in params else None
                out[name] = default.name if isinstance(default, Mechanism) else None
    return out


_UNKNOWN = "?"  # a mechanism the check cannot name (a file, a class outside the registry)


def _mechanism_name(value) -> str | None:
    """The registry name of an attention flag value; raises ValueError with the registry's
    one-line message for an unknown name."""
    from attention.base import Mechanism
    from attention.registry import REGISTRY, unknown_attention, unknown_option

    if value is None or value in ("null", "None"):
        return None
    if isinstance(value, Mechanism):
        return value.name
    if isinstance(value, dict):
        name = value.get("class_path", value.get("name", _UNKNOWN))
        name = _UNKNOWN if name == _UNKNOWN else _mechanism_name(name)
        init_args = value.get("init_args")
        if name in REGISTRY and isinstance(init_args, dict):
            from attention.registry import options_of

            known = options_of(name)
            for option in init_args:
                if known is not None and option not in known:
                    raise ValueError(unknown_option(name, option))
        return name
    if not isinstance(value, str):
        return _UNKNOWN
    text = value.strip()
    if text.startswith("{"):
        try:
            return _mechanism_name(yaml.safe_load(text))
        except yaml.YAMLError:
            return _UNKNOWN
    if text.rsplit(".", 1)[-1] in REGISTRY:
        return text.rsplit(".", 1)[-1]
    if Path(text).is_file():
        return _UNKNOWN  # the mechanism's own config file: LightningCLI reads it
    if "." in text:
        import importlib

        module, _, attr = text.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError):
            cls = None
        if isinstance(cls, type) and issubclass(cls, Mechanism):
            return cls.name if cls.name in REGISTRY else _UNKNOWN
    raise ValueError(unknown_attention(text))


def check_attention_args(experiment: Experiment, command: str, args: list[str]) -> None:
    """The attention flags (``--model.attention NAME``, ``--model.attention.OPTION``, the
    ``attention:`` keys of the configs) against the registry, in command-line order: an
    unknown mechanism or option is one line naming the valid ones."""
    from attention.registry import REGISTRY, options_of, unknown_option

    params = mechanism_params(experiment.model_class)
    if not params:
        return
    # in subclass mode another model class may have other defaults: known once given
    current = {p: _UNKNOWN for p in params} if experiment.subclass_mode_model else dict(params)
    prog = f"{experiment.name}.py {command}"

    def name_of(value, where: str) -> str | None:
        try:
            return _mechanism_name(value)
        except ValueError as e:
            raise SystemExit(f"{prog}: {where}: {e}") from None

    for flag, value, shown in _options(args):
        if flag in ("--config", "-c") and value and Path(value).is_file():
            model = _load_yaml(value).get("model")
            if not isinstance(model, dict):
                continue
            if isinstance(model.get("init_args"), dict):
                model = {**model, **model["init_args"]}
            for param in params:
                if param in model:
                    current[param] = name_of(model[param], f"{value}: model.{param}")
            continue
        if not flag.startswith("--model."):
            continue
        key = flag[len("--model."):].removeprefix("init_args.").split(".")
        if key[0] not in params:
            continue
        param, rest = key[0], key[1:]
        if not rest or rest == ["class_path"]:
            current[param] = name_of(value, shown)
            continue
        option = rest[1] if rest[0] == "init_args" and len(rest) > 1 else rest[0]
        name = current[param]
        if option in ("init_args", "dict_kwargs", "help") or name not in REGISTRY:
            continue
        known = options_of(name)
        if known is not None and option not in known:
            owners = [n for n in REGISTRY if option in (options_of(n) or ())]
            hint = (f"; {option} is an option of {', '.join(owners)}: choose one first "
                    f"(--model.{param} {owners[0]})" if owners else "")
            raise SystemExit(f"{prog}: {flag}: {unknown_option(name, option)}{hint}")


# --------------------------------------------------------------------------------------
# fit | validate | test: LightningCLI with the suite's loggers


def wandb_mode() -> str:
    """``WANDB_MODE`` if set (``disabled``: W&B writes nothing); else online only when an API
    key is configured for the W&B server and the server answers, otherwise offline (the run
    folder keeps the offline run; ``wandb sync`` uploads it later): a run never waits for
    the network or fails for lack of it (measured with wandb 0.31, a key and no network: an
    online ``wandb.init`` waited 101 s and then failed with a CommError)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    host = wandb_host()
    if not (os.environ.get("WANDB_API_KEY") or _netrc_has(host)):
        return "offline"
    if _reachable(host):
        return "online"
    if not _WARNED_OFFLINE:
        _WARNED_OFFLINE.append(host)
        print(f"W&B: {host} is not reachable: logging offline under the run folder "
              "(upload later with `wandb sync`)", file=sys.stderr)
    return "offline"


_WARNED_OFFLINE: list[str] = []


def wandb_host() -> str:
    """The W&B server a run would talk to, as W&B itself resolves it: ``WANDB_BASE_URL``, else
    the host saved by ``wandb login --host`` (its settings file), else its default (which
    changes between W&B releases: api.wandb.ai before, api.forge.coreweave.com in 0.31)."""
    try:
        import wandb

        settings = wandb.Settings(quiet=True)  # W&B's own start prints the files it reads
        # the settings file as wandb.setup() finds it (not started here: it spawns a service)
        config = Path(os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb").expanduser()
        settings.settings_system = str(config / "settings")
        settings.update_from_system_settings()
        settings.update_from_env_vars(dict(os.environ))  # the variables win over the files
        return str(settings.base_url)
    except Exception:  # a W&B release without these methods: the documented variable
        return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def _netrc_has(url: str) -> bool:
    """Whether the netrc file W&B reads (``$NETRC`` or ~/.netrc) holds a key for the server of
    ``url`` (where ``wandb login`` saves it)."""
    import netrc
    from urllib.parse import urlparse

    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return netrc.netrc(str(path)).authenticators(urlparse(url).hostname or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the server of ``url`` opens within ``timeout`` s."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def run_cli(experiment: Experiment, argv: list[str] | None):
    """LightningCLI for one run; returns the CLI object (tests inspect it)."""
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    from lit_models.base import NonFiniteLossError

    threads = os.environ.get("ATTNREPRO_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    silence_lightning_tips()

    class CompactParser(LightningArgumentParser):
        """An argument error in two lines (the message, with the closest valid options for a
        misspelt one, and where the help is) instead of the whole usage first."""

        def error(self, message: str, ex: Exception | None = None):
            if not self.exit_on_error or debug():
                return super().error(message, ex)
            parser = getattr(ex, "subcommand_parser", None) or self
            # the script's name, also when main() is called in-process
            prog = " ".join([f"{experiment.name}.py",
                             *parser.prog.replace(" [options]", "").split()[1:]])
            message = compact_error(message, experiment, sys.argv[1:] if argv is None else argv)
            sys.stderr.write(f"{prog}: error: {message}{closest_options(parser, message)}\n"
                             f"(every option: {prog} --help)\n")
            self.exit(2)

    class ExperimentCLI(LightningCLI):
        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            # no model of the suite implements prediction: test writes what a run predicts
            return {k: v for k, v in LightningCLI.subcommands().items() if k in CLI_COMMANDS}

        def before_instantiate_classes(self):
            # the abstract DataModule (e.g. --data.data_dir without a dataset config)
            data = self.config[self.subcommand].get("data")
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
            parser.add_argument("--run.group", type=str, default="adhoc",
                                help="run group: runs/<experiment>/<group>/, the W&B group")
            parser.add_argument("--run.name", type=str | None, default=None,
                                help="run name (default: a time stamp)")
            parser.add_argument("--run.grid", type=str | None, default=None,
                                help="the grid (paper table) of the run, set by grid/cell: "
                                     "the W&B config's grid")
            parser.add_argument("--run.cell", type=str | None, default=None,
                                help="the grid's cell (table row) of the run, set by "
                                     "grid/cell: the W&B config's cell")
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
            # the same config, seed and thread count give the same numbers: torch refuses any
            # operation without a deterministic implementation (none on the CPU; on CUDA,
            # --trainer.deterministic warn runs them and says which)
            parser.set_defaults({"trainer.deterministic": True})
            prefix = "model.init_args." if experiment.subclass_mode_model else "model."
            for source, target in experiment.links:
                # the DataModule's files first (download what is missing), then the attribute
                parser.link_arguments("data", prefix + target, apply_on="instantiate",
                                      compute_fn=partial(prepared_attribute, source))

        def instantiate_trainer(self, **kwargs):
            run = self.config[self.subcommand]["run"]
            trainer_cfg = self._get(self.config_init, "trainer", default={})
            if trainer_cfg.get("logger", True) is not False:
                kwargs["logger"] = make_loggers(experiment, run, self.model,
                                                self.config[self.subcommand], self.subcommand)
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

    try:
        return ExperimentCLI(
            experiment.model_class, experiment.datamodule_class,
            subclass_mode_model=experiment.subclass_mode_model,
            subclass_mode_data=experiment.subclass_mode_data,
            auto_configure_optimizers=False, args=argv, parser_class=CompactParser,
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


def compact_error(message: str, experiment: Experiment, argv: list[str] = ()) -> str:
    """jsonargparse's argument errors in one line where they take several: a value outside
    an option's choices names the flag, the value and the choices (not the tree of every
    Union subtype tried), a value of the wrong type the types taken, and a config file that
    does not exist names the experiment's configs; a key no option takes names the config
    file of ``argv`` that holds it.  Any other message is returned as it is."""
    unknown = re.search(r"does not accept (?:option|key) '([\w.]+)'", message)
    if unknown:
        holders = [f for f in _config_files(argv) if _has_key(f, unknown.group(1).split("."))]
        if holders:
            message += f" (the key {unknown.group(1)!r} of {', '.join(holders)})"
    choices = re.findall(r"Expected a typing\.Literal\[([^\]]*)\]", message)
    types = re.findall(r"Expected a <class '(\w+)'>", message)
    given = re.search(r"(?:Given|Got) value: (.*)", message)
    if given and (choices or types):  # the flag, the value, and the choices or types taken
        keys = re.findall(r'(?:Parser key|Key) "([\w.]+)"', message)
        flag = "--" + ".".join(keys) if keys else "an option"
        value = given.group(1).strip()
        if choices:
            names = ", ".join(c.strip().strip("'") for c in choices[0].split(","))
            return f"{flag}: {value!r} is not one of {names}"
        taken = [_TYPE_NAMES.get(t, t) for t in dict.fromkeys(types)]
        return f"{flag}: expected {' or '.join(taken)}, got {value!r}"
    missing = re.search(r'Parser key "config": File does not exist: (.*)', message)
    if missing:
        return (f"--config: no such file {missing.group(1).strip()}; the configs of "
                f"{experiment.name}: {', '.join(experiment.configs())} "
                f"({shown_path(experiment.config_dir)}/<config>.yaml, and a dataset of a "
                "multi-dataset config: <config>/<dataset>.yaml)")
    return message


def _config_files(argv) -> list[str]:
    """The files given to ``--config`` in ``argv``, as typed."""
    argv = list(argv)
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"] + [
        a.partition("=")[2] for a in argv if a.startswith("--config=")]


def _has_key(path: str, keys: list[str]) -> bool:
    """Whether the YAML file ``path`` holds the nested key ``keys`` (False if unreadable)."""
    try:
        node = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return False
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


#: how :func:`compact_error` names the types jsonargparse expected
_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false",
               "str": "a string", "NoneType": "null", "dict": "a mapping", "list": "a list"}


def closest_options(parser, message: str) -> str:
    """'; did you mean ...?' naming the valid options closest to the unknown ones in an
    argument error (``--model.dropoutt`` on the command line, ``model.dropoutt`` in a config
    file), from every option of ``parser`` and its subcommands; '' if none is close."""
    import difflib

    unknown = re.findall(r"--([\w.]+)", message.partition("unrecognized arguments:")[2])
    unknown += re.findall(r"does not accept (?:option|key) '([\w.]+)'", message)
    if not unknown:
        return ""
    known: set[str] = set()
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            known.update(o.lstrip("-") for o in action.option_strings if o.startswith("--"))
            stack.extend(getattr(action, "_name_parser_map", {}).values())
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.75)
        if close:
            hints.append(f"{name}: did you mean {' or '.join('--' + c for c in close)}?")
    return ("; " + "; ".join(hints)) if hints else ""


class ConfigError(ValueError):
    """A configuration that the model's or the DataModule's constructor refused."""


def debug() -> bool:
    """``ATTNREPRO_DEBUG=1``: errors of the data and the configuration end in their full
    traceback instead of one line."""
    return os.environ.get("ATTNREPRO_DEBUG", "") not in ("", "0")


def data_errors() -> tuple[type[Exception], ...]:
    """What a command ends with in one line: a malformed, missing or undownloadable file, or
    one the process may not reach (a folder above it unreadable: ``Path.exists`` raises
    PermissionError before any reader can name the file)."""
    from datamodules.common import DataFormatError
    from datamodules.fetch import FetchError

    return (DataFormatError, FetchError, FileNotFoundError, PermissionError,
            IsADirectoryError, NotADirectoryError)


def data_message(err: BaseException) -> str:
    """The one line of a data error: our own errors' messages as they are; an OSError of the
    system (``[Errno 13] Permission denied: '...'``) as the path and what was wrong."""
    from datamodules.common import DataFormatError

    if isinstance(err, OSError) and not isinstance(err, DataFormatError) and err.filename:
        reason = (err.strerror or str(err)).lower()
        if isinstance(err, PermissionError):
            reason += ": this process may not read it, or a folder above it"
        return f"{err.filename}: {reason}"
    return str(err)


def data_error_in(err: BaseException) -> BaseException | None:
    """The data error (:func:`data_errors`) that ``err`` was raised from, however deep in its
    chain of causes, or None: jsonargparse raises errors of its own from what a constructor
    or a link raised ("Does not validate against any of the Union subtypes ...", "Call to
    compute_fn of link ... failed: ..."); :func:`prepared_attribute` carries its data errors
    past it, any other file read while the classes are built is found here."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, data_errors()):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


#: how jsonargparse's errors start when they wrap what a constructor or a link raised
#: (several lines: the link, the DataModule's arguments, every subclass tried)
JSONARGPARSE_WRAPPERS = ("Call to compute_fn of link",
                         "Does not validate against any of the Union subtypes")


def unwrapped(err: BaseException) -> BaseException:
    """What the model's or DataModule's constructor (or an argument link's function)
    raised, without the errors jsonargparse wrapped it in: its message is the one line."""
    while str(err).startswith(JSONARGPARSE_WRAPPERS) and err.__cause__ is not None:
        err = err.__cause__
    return err


class DataErrorInLink(BaseException):
    """A data error (:func:`data_errors`) raised while an argument link read the DataModule,
    carried to :func:`run_cli` past jsonargparse, which catches every Exception of a link
    and, to word its own message, calls ``str(datamodule)``: LightningDataModule's calls
    every dataloader, so the files would be read three times more before the error."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


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


def make_loggers(experiment: Experiment, run, model, config, subcommand: str = "fit") -> list:
    """The run's loggers: CSV (``runs/<experiment>/<group>/<name>/metrics.csv``) and, unless
    ``--run.wandb false``, W&B (:class:`RunLogger`) in the group ``<experiment>/<group>``."""
    name = run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    save_dir = runs_root() / experiment.name
    run_dir = save_dir / run.group / name
    run_dir.mkdir(parents=True, exist_ok=True)
    resumed = resumed_from(config.get("ckpt_path")) if subcommand == "fit" else None
    earlier_rows = []
    if resumed and resumed["run_dir"] == run_dir.resolve():
        # the CSV logger deletes the folder's metrics.csv: keep the rows before the checkpoint
        earlier_rows = metrics_before(run_dir / "metrics.csv", resumed["global_step"])
    loggers = [start_csv_logger(CSVLogger(save_dir=save_dir, name=run.group, version=name))]
    if earlier_rows:
        writer = loggers[0].experiment
        writer.metrics = earlier_rows + writer.metrics
    if run.wandb:
        tags = [experiment.name, run.group] + [m.tag() for m in getattr(model, "mechanisms",
                                                                        {}).values()]
        seed = config.get("seed_everything")
        identity = {"experiment": experiment.name, "grid": run.grid, "cell": run.cell,
                    "seed": seed if isinstance(seed, int) and not isinstance(seed, bool)
                    else None}
        loggers.append(RunLogger(
            identity=identity, project=os.environ.get("WANDB_PROJECT", "attnrepro"),
            group=f"{experiment.name}/{run.group}", name=name, save_dir=str(run_dir),
            job_type="train" if subcommand == "fit" else "eval", mode=wandb_mode(),
            tags=sorted(set(tags)), config={**config.as_dict(), **identity},
            settings=_wandb_settings(),
            # a resumed fit goes on in the W&B run of its checkpoint's run folder
            **({"id": resumed["wandb_id"], "resume": "allow"}
               if resumed and resumed["wandb_id"] else {})))
    return loggers


def resumed_from(ckpt_path) -> dict | None:
    """What a fit resumed from ``ckpt_path`` continues: the checkpoint's ``global_step``, its
    run folder (``<run>/checkpoints/<file>.ckpt``) and the id of that run's latest W&B run
    (None when it had none)."""
    if not ckpt_path or str(ckpt_path) in ("last", "best", "hpc", "registry"):
        return None
    import torch

    path = Path(ckpt_path).resolve()
    step = torch.load(path, map_location="cpu", weights_only=True).get("global_step", 0)
    folder = path.parent.parent
    runs = sorted((folder / "wandb").glob("*run-*-*"), key=lambda d: d.stat().st_mtime)
    runs = [d for d in runs if d.is_dir()]
    return {"global_step": int(step), "run_dir": folder,
            "wandb_id": runs[-1].name.rsplit("-", 1)[1] if runs else None}


def metrics_before(path: Path, global_step: int) -> list[dict]:
    """The rows of a Lightning metrics.csv logged before optimiser step ``global_step`` (a
    row's ``step`` is the number of steps done before it minus one), empty cells dropped."""
    if not path.exists():
        return []
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("step") not in (None, "") and int(float(row["step"])) < global_step:
                rows.append({k: float(v) if k != "epoch" and k != "step" else int(float(v))
                             for k, v in row.items() if v not in ("", None)})
    return rows


def start_csv_logger(logger):
    """The CSV logger with its writer created now, before anything else of the run (W&B)
    writes into the run folder.  Its warning that the folder "exists and is not empty" is
    kept for what it means, the metrics of an earlier run with this name being replaced; a
    folder holding only the grid's ``output.log`` of this run is not that."""
    folder = Path(logger.log_dir)
    earlier = any((folder / f).exists() for f in ("metrics.csv", "hparams.yaml"))
    with warnings.catch_warnings():
        if not earlier:
            warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists "
                                                      r"and is not empty")
        logger.experiment  # noqa: B018 - creates the writer (rank zero only)
    return logger


#: what a W&B run's summary keeps of a validation metric (by the name after ``val/``, or
#: its first part before ``_<suffix>``: ``acc_mismatched``, ``acc_best``, ``loss_<split>``)
BEST = {"max": ("acc", "map", "mrr", "p@1", "bleu", "sacrebleu", "exact_match"),
        "min": ("loss", "perplexity", "ppl")}


def metric_summary(key: str) -> str | None:
    """The W&B summary of a logged metric: ``val/*`` by their best (``max`` or ``min``,
    :data:`BEST`), ``test/*`` by their last; None (W&B's default, the last value) for the
    others and for a value taken at another metric's best (``val/mrr_at_best_map``)."""
    stage, _, name = key.partition("/")
    if stage == "test":
        return "last"
    if stage != "val" or "_at_best" in name:
        return None
    for summary, names in BEST.items():
        if any(name == n or name.startswith(f"{n}_") for n in names):
            return summary
    return None


class RunLogger(WandbLogger):
    """Lightning's WandbLogger with the suite's dashboard: ``identity`` (experiment, grid,
    cell, seed) stays on the run's config (a DataModule's recorded ``seed``, its data seed,
    is logged as ``data_seed``); each metric's summary is defined (:func:`metric_summary`)
    before its first value, by its exact name: Lightning defines the glob ``*`` (the step
    axis) and W&B picks any one of several matching globs, while a name beats a glob."""

    #: the hyper-parameters renamed on W&B when they would overwrite the run's identity
    RENAMED = {"seed": "data_seed"}

    def __init__(self, *args, identity: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # Lightning passes anonymous=None to wandb.init, which W&B warns has no effect
        self._wandb_init.pop("anonymous", None)
        self._identity = dict(identity or {})
        self._summarised: set[str] = set()

    def log_hyperparams(self, params) -> None:
        params = vars(params) if isinstance(params, argparse.Namespace) else dict(params)
        params = {self.RENAMED.get(k, f"hparams/{k}") if k in self._identity else k: v
                  for k, v in params.items()}
        super().log_hyperparams(params)

    def log_metrics(self, metrics, step=None) -> None:
        for key, value in metrics.items():
            if key in self._summarised:
                continue
            self._summarised.add(key)
            summary = metric_summary(key)
            scalar = isinstance(value, numbers.Real) or getattr(value, "ndim", None) == 0
            if summary and scalar and not isinstance(value, bool):
                self.experiment.define_metric(key, summary=summary,
                                              step_metric="trainer/global_step", step_sync=True)
        super().log_metrics(metrics, step)


def _wandb_settings(init_timeout: int = 120):
    import wandb

    return wandb.Settings(init_timeout=init_timeout, silent=True, console="off")


def finish_wandb() -> None:
    import wandb

    if wandb.run is not None:
        wandb.finish()


def _not_a_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("\N{ELECTRIC LIGHT BULB} Tip:")


def silence_lightning_tips() -> None:
    """Drop Lightning's advertisements ("💡 Tip: ... litlogger / litmodels"), printed at
    every run by its rank-zero logger with no setting to turn them off (Lightning 2.6;
    Lightning-AI/pytorch-lightning#21294): a filter on that logger for those lines only."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_not_a_tip)  # once: the same function is kept once


#: the per-example files a test writes into the run folder: DecompAtt's
#: ``predictions-test[_<split>].jsonl``, the seq2seq models' ``hypotheses-test.jsonl``
PREDICTION_FILES = ("predictions-test", "hypotheses-test")
#: rows of a predictions file logged to W&B (the summary says how many the file has)
PREDICTION_ROWS = 10_000


def prediction_files(run_dir: Path, since: float | None = None) -> dict[str, Path]:
    """W&B table key -> predictions file of the run folder (written at or after ``since``):
    ``test/predictions`` for the first split's, ``test/predictions_<split>`` for others."""
    found = {}
    for prefix in PREDICTION_FILES:
        for path in sorted(Path(run_dir).glob(f"{prefix}*.jsonl")):
            if since is not None and path.stat().st_mtime < since - 1:
                continue  # an earlier test's file
            found[f"test/predictions{path.name[len(prefix):-len('.jsonl')]}"] = path
    return found


def read_predictions(path: Path, limit: int = PREDICTION_ROWS) -> tuple[list, list, int]:
    """(columns, rows, total rows) of a JSON-lines file, at most ``limit`` rows: the columns
    are the keys in order of first appearance; nested objects become JSON text."""
    columns: dict[str, None] = {}
    records, total = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            total += 1
            if len(records) < limit:
                record = json.loads(line)
                columns.update(dict.fromkeys(record))
                records.append(record)
    rows = [[json.dumps(v) if isinstance(v, dict) else v for v in (r.get(c) for c in columns)]
            for r in records]
    return list(columns), rows, total


def log_predictions(trainer, since: float | None = None) -> None:
    """After a test: each predictions file it wrote into the run folder as a W&B table
    (:func:`prediction_files`; the first :data:`PREDICTION_ROWS` rows, the summary's
    ``<key>_rows`` and ``<key>_logged_rows`` say how many there are and how many were
    logged).  A table that cannot be logged is a warning, never a failed run."""
    loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
    if not loggers:
        return
    log_dir = trainer.log_dir  # a broadcast under DDP: every process asks
    if not trainer.is_global_zero or not log_dir:
        return
    import wandb

    for key, path in prediction_files(Path(log_dir), since).items():
        try:
            columns, rows, total = read_predictions(path)
            table = wandb.Table(columns=columns, data=rows, allow_mixed_types=True)
            for lg in loggers:
                lg.log_metrics({key: table}, step=trainer.global_step)
                lg.experiment.summary.update({f"{key}_rows": total,
                                              f"{key}_logged_rows": len(rows)})
        except Exception as err:  # noqa: BLE001 - the metrics are logged; the table is extra
            warnings.warn(f"{path.name} not logged to W&B: {type(err).__name__}: {err}",
                          stacklevel=2)


# --------------------------------------------------------------------------------------
# grid | cell | sweep


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser(experiment: Experiment, command: str, cells: bool = False) -> _Parser:
    return _Parser(prog=f"{experiment.name}.py {command}", description=COMMANDS[command],
                   epilog=_listing(experiment, cells=cells),
                   formatter_class=argparse.RawDescriptionHelpFormatter)


def _grid_parser(experiment: Experiment, command: str,
                 with_cell: bool = False) -> argparse.ArgumentParser:
    p = _parser(experiment, command, cells=with_cell)
    p.add_argument("grid", help=f"one of: {', '.join(experiment.grids)} (below)")
    p.add_argument("--config", default="paper",
                   help=f"config name: {', '.join(experiment.configs())} (default: paper)")
    p.add_argument("--smoke", action="store_true", help="shorthand for --config smoke")
    if with_cell:
        p.add_argument("--cell", required=True, help="a cell of the grid (below)")
        p.add_argument("--seed", type=int, default=0, help="the seed (default: 0)")
    else:
        p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per cell")
        p.add_argument("--cells", nargs="*", default=None, help="only these cells")
    if command == "grid":  # how to run them here (a sweep's agents decide for themselves)
        p.add_argument("--jobs", type=int, default=1, help="cells run in parallel")
        p.add_argument("--dry-run", action="store_true", help="print the commands only")
        p.add_argument("--threads", type=int, default=None,
                       help="torch threads per run (default: the cores / --jobs when --jobs > "
                            "1); results depend on it, so fix it to compare machines")
        p.add_argument("--skip-done", action="store_true",
                       help="keep runs whose CSV already holds every metric of the grid; "
                            "resume the others that left a checkpoint from their latest")
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
            f"--run.name={cell.name}-seed{seed}", f"--run.grid={grid.name}",
            f"--run.cell={cell.name}", "--run.test_after_fit=true", *extra]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a stopped run resumes from: ``last.ckpt``, else the one of the highest
    ``step=N`` in its name; None without checkpoints."""
    folder = run_dir / "checkpoints"
    if (folder / "last.ckpt").exists():
        return folder / "last.ckpt"
    steps = {}
    for path in folder.glob("*.ckpt"):
        match = re.search(r"step=(\d+)", path.name)
        if match:
            steps[int(match.group(1))] = path
    return steps[max(steps)] if steps else None


def _launch(experiment, grid, cell, seed, config, extra, threads: int | None,
            resume: bool = False):
    """Start a cell's run: from scratch, or (``resume``: a rerun with --skip-done) from the
    latest checkpoint a stopped run of it left, in the same folder and W&B run."""
    run_dir = runs_root() / experiment.name / f"{grid.name}-{config}" / f"{cell.name}-seed{seed}"
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if checkpoint is None:
        shutil.rmtree(run_dir, ignore_errors=True)  # a cell run starts fresh
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if threads:
        env["ATTNREPRO_THREADS"] = str(threads)
    log = open(run_dir / "output.log", "a" if checkpoint else "w")
    cmd = cell_command(experiment, grid, cell, seed, config, extra)
    if checkpoint is not None:
        cmd.append(f"--ckpt_path={checkpoint}")
        log.write(f"\n[grid] resumed from {checkpoint}\n")
        log.flush()
    # its own process group: stopping the grid stops the cell and whatever it started (DDP)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT,
                            start_new_session=True)
    return proc, log, run_dir


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


def _run_lock(root: Path, run: str):
    """An exclusive lock on one cell-and-seed run of a grid folder (``.<run>.lock``), held
    by the grid that runs it; None when another grid holds it (that grid's pid is in the
    file).  Two grids may share a folder (different cells), never a run."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / f".{run}.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


def _lock_holder(root: Path, run: str) -> str:
    try:
        return (root / f".{run}.lock").read_text().strip() or "another process"
    except OSError:
        return "another process"


def run_grid(experiment: Experiment, argv: list[str]) -> None:
    argv, extra = _split_extra(argv)
    args = _grid_parser(experiment, "grid").parse_args(argv)
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
        for c, s in todo:
            checkpoint = latest_checkpoint(root / f"{c.name}-seed{s}")
            if checkpoint is not None:
                print(f"  resuming {c.name} seed {s} from {checkpoint.name} (stopped before)",
                      flush=True)
    if args.dry_run:
        for c, s in todo:
            print(" ".join(cell_command(experiment, grid, c, s, config, extra)))
        return
    threads = args.threads or (max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1
                               else None)
    print(f"{experiment.name} grid {grid.name} ({grid.title}), config {config}: "
          f"{len(todo)} runs, {args.jobs} at a time"
          f"{f', {threads} thread(s) each' if threads else ''}; logs in "
          f"{runs_root() / experiment.name / f'{grid.name}-{config}'}", flush=True)
    failed, running = [], []
    start = time.time()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        _run_cells(experiment, grid, config, extra, args.jobs, threads, todo, running, failed,
                   resume=args.skip_done)
    except KeyboardInterrupt:
        for item in running:
            _stop(item[3])
            item[4].close()
        names = ", ".join(f"{c.name} seed {s}" for c, s, *_ in running) or "none"
        raise SystemExit(f"grid stopped; cells stopped unfinished: {names} (rerun with "
                         "--skip-done to keep the finished ones and resume these from their "
                         "last checkpoint)") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        for item in running:
            item[6].close()  # the run locks
    print(f"grid finished in {time.time() - start:.0f}s", flush=True)
    log_grid_summary(experiment, grid, config)
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed: " + ", ".join(map(str, failed)))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _run_cells(experiment, grid, config, extra, jobs, threads, todo, running, failed,
               resume: bool = False) -> None:
    while todo or running:
        while todo and len(running) < jobs:
            c, s = todo.pop(0)
            root = runs_root() / experiment.name / f"{grid.name}-{config}"
            lock = _run_lock(root, f"{c.name}-seed{s}")
            if lock is None:  # another grid runs this very cell and seed: leave it alone
                failed.append(root / f"{c.name}-seed{s}")
                print(f"  NOT RUN {c.name} seed {s}: another grid is running it "
                      f"({_lock_holder(root, f'{c.name}-seed{s}')}); rerun with --skip-done "
                      "once it has finished", flush=True)
                continue
            running.append((c, s, time.time(), *_launch(experiment, grid, c, s, config, extra,
                                                         threads, resume), lock))
        for item in list(running):
            c, s, t0, proc, log, run_dir, lock = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            lock.close()
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


def summary_table(experiment: Experiment, grid: Grid, config: str) -> tuple[list, list]:
    """(columns, rows) of the paper's table as ``report`` reads it from the CSV logs
    (:func:`collect`, :func:`mean_std`): one row per cell, its name, then per metric label
    the paper's number, our mean, our (sample) std and the number of seeds; None where
    there is none (std of one seed)."""
    results = collect(experiment, grid, config)
    columns = ["cell"]
    for label in grid.metrics:
        columns += [f"paper {label}", f"ours {label}", f"ours {label} std", f"ours {label} n"]
    rows = []
    for cell in grid.cells:
        row = [cell.name]
        for label in grid.metrics:
            values = results[cell.name][label]
            mean, std = mean_std(values) if values else (None, None)
            row += [cell.paper.get(label), mean, std if len(values) > 1 else None, len(values)]
        rows.append(row)
    return columns, rows


def log_grid_summary(experiment: Experiment, grid: Grid, config: str) -> None:
    """After a grid's cells: when they logged to W&B, one short run in their group, job
    type ``summary``, with the paper's table (:func:`summary_table`) as ``paper_table``.
    W&B failing to start or to log is one printed line: the grid's runs are done."""
    group = f"{grid.name}-{config}"
    root = runs_root() / experiment.name / group
    if not any((d / "wandb").is_dir() for c in grid.cells for d in cell_runs(root, c)):
        return  # --run.wandb false (or no run finished)
    try:
        import wandb

        columns, rows = summary_table(experiment, grid, config)
        folder = root / "summary"
        folder.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "attnrepro"),
            group=f"{experiment.name}/{group}", name="summary", job_type="summary",
            dir=str(folder), mode=wandb_mode(), tags=[experiment.name, group, "summary"],
            config={"experiment": experiment.name, "grid": grid.name, "cell": None,
                    "seed": None, "grid_config": config, "title": grid.title},
            settings=_wandb_settings(init_timeout=60))
        try:
            run.log({"paper_table": wandb.Table(columns=columns, data=rows)})
        finally:
            run.finish()
        print(f"W&B summary run logged: {folder}", flush=True)
    except Exception as err:  # noqa: BLE001 - never fail a finished grid for W&B
        print(f"W&B summary run not logged: {type(err).__name__}: {err}", flush=True)


def run_one_cell(experiment: Experiment, argv: list[str]) -> None:
    argv, extra = _split_extra(argv)
    args = _grid_parser(experiment, "cell", with_cell=True).parse_args(argv)
    config = "smoke" if args.smoke else args.config
    grid = experiment.grid(args.grid)
    experiment.config_path(config)
    proc, log, run_dir = _launch(experiment, grid, grid.cell(args.cell), args.seed, config,
                                 extra, None)
    proc.wait()
    log.close()
    sys.stdout.write((run_dir / "output.log").read_text())
    if proc.returncode:
        raise SystemExit(proc.returncode)


def sweep_config(experiment: Experiment, grid: Grid, config: str, seeds: int,
                 cells: list[str] | None = None) -> dict:
    """A W&B sweep over the same grid: every (cell, seed) (or only ``cells``' seeds), run
    by the ``cell`` command."""
    chosen = [grid.cell(n) for n in cells] if cells else grid.cells
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
                    config, "${args}"],
    }


def sweep_path(experiment: Experiment, grid: Grid, config: str) -> Path:
    """A sweep's default file: beside the runs, never among the configs."""
    return runs_root() / experiment.name / "sweeps" / f"{grid.name}-{config}.yaml"


def write_sweep(experiment: Experiment, argv: list[str]) -> None:
    p = _grid_parser(experiment, "sweep")
    p.add_argument("--output", default=None,
                   help="where to write it (default: runs/<experiment>/sweeps/<grid>-<config>"
                        ".yaml, under $ATTNREPRO_RUNS)")
    args = p.parse_args(argv)
    config = "smoke" if args.smoke else args.config
    grid = experiment.grid(args.grid)
    experiment.config_path(config)
    out = Path(args.output or sweep_path(experiment, grid, config))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(sweep_config(experiment, grid, config, args.seeds,
                                               args.cells), sort_keys=False))
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


#: what every report row shows beside the quality: column -> (logged key, scale, format);
#: mean over the cell's seeds (a column the grid already has as a metric is not repeated)
COST_COLUMNS = {"params (M)": ("hparams/n_parameters", 1e-6, "{:.2f}"),
                "steps/s": ("train/steps_per_second", 1.0, "{:.2f}"),
                "peak MB": ("train/peak_memory_mb", 1.0, "{:.0f}"),
                "wall min": ("train/wall_seconds", 1 / 60, "{:.1f}")}


def cost_values(experiment: Experiment, grid: Grid, config: str) -> dict[str, dict[str, str]]:
    """cell -> cost column -> the mean over its seeds, formatted ("-" where not logged)."""
    costs = {label: key for label, (key, _, _) in COST_COLUMNS.items()
             if key not in grid.metrics.values()}
    probe = Grid(grid.name, grid.title, costs, grid.cells)
    root = runs_root() / experiment.name / f"{grid.name}-{config}"
    out = {}
    for cell in grid.cells:
        values: dict[str, list[float]] = {label: [] for label in costs}
        for run_dir in cell_runs(root, cell):
            for label, v in read_run_metrics(run_dir, probe).items():
                if v is not None:
                    values[label].append(v)
        out[cell.name] = {
            label: (COST_COLUMNS[label][2].format(
                sum(vals) / len(vals) * COST_COLUMNS[label][1]) if vals else "-")
            for label, vals in values.items()}
    return out


def format_report(experiment: Experiment, grid: Grid, config: str) -> str:
    results = collect(experiment, grid, config)
    costs = cost_values(experiment, grid, config)
    lines = [f"### {grid.title}", f"{experiment.name} grid {grid.name}, config {config} "
             f"({experiment.config_path(config).relative_to(PROJECT_ROOT)})", ""]
    header = ["cell"]
    for label in grid.metrics:
        header += [f"paper {label}", f"ours {label}"]
        if label in grid.relative_to:
            header += [f"paper {label} / {grid.relative_to[label]}",
                       f"ours {label} / {grid.relative_to[label]}"]
    header += list(next(iter(costs.values()), {}))
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
        row += list(costs[cell.name].values())
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cost: mean over the seeds of the parameters, training steps/s (training "
              "steps only), peak memory (CPU: the process's peak resident set) and the wall "
              "time of training (validation included); a run's machine and load set them."]
    if grid.claims:
        lines += ["", format_claims(experiment, grid, config)]
    if grid.note:
        lines += ["", grid.note]
    return "\n".join(lines)


#: resamples of the paired tests in ``report`` (and their random seed: the report is the
#: same every time it is printed)
CLAIM_SAMPLES, CLAIM_SEED = 10_000, 0


def format_claims(experiment: Experiment, grid: Grid, config: str) -> str:
    """Does each gain the paper claims (its ``claims``: baseline -> proposal) hold here?
    For each test metric of the grid with per-example units: the paired comparison over the
    seeds both cells have (seed k with seed k) and the test examples (paired by id) of
    experiments/significance.py, with the paper's difference beside ours."""
    from experiments import significance as sig

    root = runs_root() / experiment.name / f"{grid.name}-{config}"
    labels = {label: key for label, key in grid.metrics.items() if sig.metric_name(key)}
    if not labels:
        return ("Claims: no paired test (this grid's metrics are not test metrics with "
                "per-example predictions).")
    lines = [f"Does the claimed gain hold? Paired over seeds (seed k of the baseline with seed "
             f"k of the proposal: the same seed draws the same initialisation stream and data "
             f"order; seeds are the outer level of the bootstrap) and test examples (paired "
             f"by id, resampled once per replicate for all seeds); 95% percentile interval of "
             f"{CLAIM_SAMPLES:,} paired bootstrap replicates; p from the bootstrap "
             f"(approximate randomisation for MAP / MRR / P@1: units are questions); "
             f"alpha 0.05, no correction for the number of claims "
             f"(experiments/significance.py).", "",
             "| claim | metric | paper diff | ours: baseline -> proposal | ours diff [95% CI] "
             "| p | verdict | seeds x units |", "|---|---|---|---|---|---|---|---|"]
    for baseline, proposal in grid.claims:
        b_cell, p_cell = grid.cell(baseline), grid.cell(proposal)
        claim = f"{proposal} vs {baseline}"
        paper = {label: p_cell.paper[label] - b_cell.paper[label] for label in labels
                 if b_cell.paper.get(label) is not None
                 and p_cell.paper.get(label) is not None}
        # the metrics the paper gives both numbers of (else the grid's first test metric)
        for label in list(paper) or list(labels)[:1]:
            key = labels[label]
            shown = f"{paper[label]:+.2f}" if label in paper else "-"
            found = _paired_units(root, b_cell, p_cell, key)
            if isinstance(found, str):
                lines.append(f"| {claim} | {label} | {shown} | {found} | | | | |")
                continue
            kind, b_stats, p_stats, n_units = found
            name = sig.metric_name(key)[0]
            c = sig.compare(kind, b_stats, p_stats, samples=CLAIM_SAMPLES, seed=CLAIM_SEED,
                            test="randomization" if name in ("map", "mrr", "p@1")
                            else "bootstrap")
            r = c.row()
            verdict = r["verdict"]
            higher = sig.KINDS[kind].higher_is_better
            if paper.get(label, 0) and (paper[label] > 0) != higher:
                # the paper found the proposal worse: does that hold here?
                verdict = {sig.HOLDS: sig.REVERSED, sig.REVERSED: sig.HOLDS}.get(verdict,
                                                                                verdict)
            lines.append(f"| {claim} | {label} | {shown} | {r['baseline']} -> {r['proposal']} "
                         f"| {r['diff']} | {r['p']} ({c.test}) | {verdict} "
                         f"| {c.seeds} x {n_units:,} |")
    lines += ["", "verdict: 'holds' = significant (p < 0.05) in the paper's direction (the "
              "proposal better, or worse where the paper's difference is negative), "
              "'reversed' = significant the other way."]
    return "\n".join(lines)


def _paired_units(root: Path, baseline: Cell, proposal: Cell, key: str):
    """(kind, baseline stats per seed, proposal stats per seed, units) over the seeds both
    cells ran, or why there is no comparison (a short text for the table)."""
    from experiments.significance import run_units

    seeds = {}
    for cell in (baseline, proposal):
        seeds[cell.name] = {int(d.name[len(cell.name) + 5:]): d for d in cell_runs(root, cell)
                            if (d / "metrics.csv").exists()}
    common = sorted(set(seeds[baseline.name]) & set(seeds[proposal.name]))
    if not common:
        return "not run (no seed of both cells)"
    kind, b_stats, p_stats = None, [], []
    for seed in common:
        try:
            b_kind, b_ids, b = run_units(seeds[baseline.name][seed], key)
            kind, p_ids, p = run_units(seeds[proposal.name][seed], key)
        except (FileNotFoundError, ValueError) as err:
            return f"no paired test: {err}".replace("|", "/")
        if b_ids != p_ids:
            return (f"no paired test: seed {seed}: the two runs' test examples differ "
                    f"({len(b_ids)} vs {len(p_ids)} units)")
        b_stats.append(b)
        p_stats.append(p)
    return kind, b_stats, p_stats, len(b_stats[0])


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


def configs_with_runs(experiment: Experiment, grid: Grid) -> list[str]:
    """The configs with at least one run of ``grid`` (folders ``<grid>-<config>``)."""
    root = runs_root() / experiment.name
    longer = [g for g in experiment.grids if g != grid.name and g.startswith(grid.name)]
    found = []
    for folder in sorted(root.glob(f"{grid.name}-*")):
        if not folder.is_dir() or any(folder.name.startswith(f"{g}-") for g in longer):
            continue
        if any(cell_runs(folder, cell) for cell in grid.cells):
            found.append(folder.name[len(grid.name) + 1:])
    return found


def no_runs_message(experiment: Experiment, grid: Grid, config: str) -> str | None:
    """One line when ``grid`` has no runs with ``config`` but has with others; else None."""
    found = configs_with_runs(experiment, grid)
    if not found or config in found:
        return None
    use = " or ".join("--smoke or --config smoke" if c == "smoke" else f"--config {c}"
                      for c in found)
    return f"no runs of {grid.name} with config {config}; runs exist for: {', '.join(found)} " \
           f"(use {use})"


def print_report(experiment: Experiment, argv: list[str]) -> None:
    p = _parser(experiment, "report")
    p.add_argument("grid", nargs="?", default=None,
                   help=f"one of: {', '.join(experiment.grids)} (default: every grid)")
    p.add_argument("--config", default="paper",
                   help=f"config name: {', '.join(experiment.configs())} (default: paper)")
    p.add_argument("--smoke", action="store_true", help="shorthand for --config smoke")
    p.add_argument("--curve", action="store_true",
                   help="also print the validation learning curves (grids that name one)")
    args = p.parse_args(argv)
    config = "smoke" if args.smoke else args.config
    grids = [experiment.grid(args.grid)] if args.grid else list(experiment.grids.values())
    experiment.config_path(config)
    parts = []
    for g in grids:
        missing = no_runs_message(experiment, g, config)
        if missing:
            parts.append(missing)
            continue
        parts.append(format_report(experiment, g, config))
        if args.curve and g.curve is not None:
            parts.append(format_curves(experiment, g, config))
    print("\n\n".join(parts))
