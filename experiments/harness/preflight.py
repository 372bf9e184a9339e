"""The checks a LightningCLI command's command line passes before jsonargparse reads it, each
failing in one line: an experiment whose datasets are configs of their own needs one
(:func:`check_dataset_args`), and the attention flags name registered mechanisms and their
options (:func:`check_attention_args`).  A folder the command writes (the runs root, the
cache, an ``--out``) must be one it can create and write (:func:`check_folder`), and
``grid`` and ``cell`` check every cell they would run (:func:`check_cells`: its config
files, its dataset config, its data) before they change any run folder.
"""

from __future__ import annotations

import importlib
import inspect
import os
import typing
from pathlib import Path

import yaml

from experiments.harness.command_line import CONFIG_FLAGS, CommandLine
from experiments.harness.grid_model import PROJECT_ROOT, Cell, Experiment, runs_root, shown_path
from experiments.harness.scale import data_class_name, merged_settings
from fileio import folder_problem

#: the environment variable that moves each root a command writes, and its default
ROOTS = {"runs": ("ATTNREPRO_RUNS", "the project's runs/"),
         "cache": ("ATTNREPRO_CACHE", "the project's .cache/"),
         "data": ("ATTNREPRO_DATA", "../shared/data")}


def check_folder(prog: str, folder: Path | str, what: str) -> None:
    """A folder the command writes: one line when it cannot be created or written
    (fileio.folder_problem), ``what`` saying which folder it is and what sets it."""
    problem = folder_problem(folder)
    if problem is not None:
        raise SystemExit(f"{prog}: {problem} ({what})")


def root_note(root: str) -> str:
    """Which root a folder is and what sets it: ``the runs root, $ATTNREPRO_RUNS`` when the
    variable is set, else ``the runs root: the project's runs/ ($ATTNREPRO_RUNS moves it)``."""
    variable, default = ROOTS[root]
    if os.environ.get(variable):
        return f"the {root} root, ${variable}"
    return f"the {root} root: {default} (${variable} moves it)"


def check_roots(prog: str, *roots: str) -> None:
    """The roots ``roots`` (of ``runs``, ``cache``) can be created and written, or one line."""
    from datamodules.fetch import cache_root  # no torch: the download layer

    folders = {"runs": runs_root, "cache": cache_root}
    for root in roots:
        check_folder(prog, folders[root](), root_note(root))


def check_cells(experiment: Experiment, prog: str, config: str, cells: list[Cell],
                command: list[str] | None = None) -> None:
    """What a ``fit`` of each cell would check first, before ``grid`` or ``cell`` changes a
    run folder: the config files it merges exist, an experiment of several datasets has
    one, and the data it reads is there or can be downloaded into a folder this process may
    write (:func:`data_problem`); the runs and cache roots can be written.  One line naming
    the cell otherwise."""
    check_roots(prog, "runs", "cache")
    for cell in cells:
        args = [a.replace("{config}", str(experiment.config_path(config).with_suffix("")))
                for a in cell.args]
        line = CommandLine.parse(["--config", str(experiment.config_path(config)), *args],
                                 "fit")
        for path in line.config_files:
            if not Path(path).is_file():
                raise SystemExit(f"{prog}: cell {cell.name}: its config file {shown_path(path)} "
                                 f"does not exist (config {config}); no run was changed")
        try:
            check_dataset_args(experiment, "fit", line)
        except SystemExit as err:
            raise SystemExit(f"{prog}: cell {cell.name}: {err}") from None
        problem = data_problem(experiment, config, cell)
        if problem is not None:
            raise SystemExit(f"{prog}: cell {cell.name}: {problem}; no run was changed")


#: the data settings that name a file under the DataModule's folder
FILE_KEYS = ("train_file", "val_file", "test_file")


def data_problem(experiment: Experiment, config: str, cell: Cell) -> str | None:
    """Why the data a cell reads at ``config`` cannot be had, read from its config files and
    the data registry (datamodules/registry.py) without importing the DataModule; None when
    it can (or the registry knows no files of its DataModule: generated data).  A file the
    settings name (``train_file``...) must be in the DataModule's folder (``data_dir``,
    else its folder under the data root) or be one a download gives; without such names a
    folder that holds none of the release and cannot be downloaded is refused; whatever
    must be downloaded needs a folder this process can create and write.  A DataModule that
    several registry entries serve (the SST trees, GLUE's SST-2) passes when one of them
    does."""
    from datamodules.fetch import data_root
    from datamodules.registry import DATASETS

    name = data_class_name(experiment, config, cell)
    entries = [e for e in DATASETS.values() if name in e.datamodules and e.files]
    if not entries:
        return None
    data = merged_settings(experiment, config, cell).get("data")
    data = data if isinstance(data, dict) else {}
    data = {**data, **(data.get("init_args") or {})}
    given = data.get("data_dir")
    problems = []
    for entry in entries:
        folder = PROJECT_ROOT / given if given else data_root() / entry.folder
        note = f"data_dir of config {config}" if given else root_note("data")
        problems.append(_entry_problem(entry, folder, [data[k] for k in FILE_KEYS
                                                       if isinstance(data.get(k), str)], note))
        if problems[-1] is None:
            return None
    return problems[0]


def _entry_problem(entry, folder: Path, named: list[str], note: str) -> str | None:
    """:func:`data_problem` for one registry entry read from ``folder`` (``note``: what sets
    it)."""
    downloadable = {p for d in entry.downloads for p in d.provides}

    def there(name: str) -> bool:  # under the folder, or where the archive unpacks it
        return (folder / name).exists() or any(
            (folder / p).exists() for p in entry.files if p.endswith(f"/{name}"))

    def given(name: str) -> bool:
        return name in downloadable or any(p.endswith(f"/{name}") for p in downloadable)

    where = f"python -m datamodules.fetch --status {entry.key}"
    if named:
        missing = [n for n in dict.fromkeys(named) if not there(n)]
        absent = [n for n in missing if not given(n)]
        if absent:
            return (f"{folder / absent[0]} is not there and no download gives it "
                    f"({entry.title}: {where}; {note})")
    else:
        missing = [p for p in entry.needed if not (folder / p).exists()]
        if missing and len(missing) == len(entry.files) and not entry.downloads:
            return (f"{folder} holds none of {entry.title} and it cannot be downloaded "
                    f"({entry.how_to_get}; {note})")
    if missing:  # a download first: the folder must take it
        problem = folder_problem(folder)
        if problem is not None:
            return (f"{entry.title} must be downloaded first, but {problem} "
                    f"({note})")
    return None


def check_dataset_args(experiment: Experiment, command: str,
                       args: CommandLine | list[str]) -> None:
    """An experiment whose datasets are configs of their own (``dataset_config``) needs one
    merged after the grid config: without it, say which to add (one line)."""
    if not experiment.subclass_mode_data or not experiment.dataset_names():
        return
    line = CommandLine.of(args)
    if "--data" in line.flags or "--data.class_path" in line.flags:
        return
    for path in line.config_files:
        data = line.configs[path].get("data")
        if isinstance(data, str) or (isinstance(data, dict) and "class_path" in data):
            return
    raise SystemExit(missing_dataset_message(experiment, command, line.config_files))


def check_config_given(experiment: Experiment, command: str,
                       args: CommandLine | list[str]) -> None:
    """A LightningCLI command needs a config file (the paper's settings or another): without
    one, say which configs there are (one line), instead of training on the constructors'
    defaults or jsonargparse's "required: fit.model"."""
    line = CommandLine.of(args)
    if line.config_files:
        return
    where = shown_path(experiment.config_dir)
    raise SystemExit(f"{experiment.name}.py {command} needs a config: add --config "
                     f"{where}/<config>.yaml (configs: {', '.join(experiment.configs())}; "
                     f"e.g. --config {where}/smoke.yaml)")


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


def attention_flags(experiment: Experiment) -> tuple[dict[str, str | None], list[str]]:
    """The model's attention arguments (:func:`mechanism_params`) and the names of the
    registered mechanisms, as ``<name>.py --help`` lists them.  While the model class is
    named by its path and not imported, both are read from the source files
    (experiments/harness/sources.py), so the help imports no torch; once imported, from the
    class and ``attention.registry.REGISTRY`` (tests/experiments/test_startup.py: the two agree)."""
    path = experiment.unimported("model_class")
    if path is not None:
        from experiments.harness import sources

        params = sources.mechanism_params(path)
        return params, sources.mechanism_names() if params else []
    params = mechanism_params(experiment.model_class)
    if not params:
        return params, []
    from attention.registry import REGISTRY

    return params, list(REGISTRY)


_UNKNOWN = "?"  # a mechanism the check cannot name (a file, a class outside the registry)


def mechanism_name(value) -> str | None:
    """The registry name of an attention flag value: a name or class path, read by the
    registry's own :func:`attention.registry.build`; a mapping with ``class_path`` (or
    ``name``) and ``init_args``, or its YAML text; a built mechanism.  :data:`_UNKNOWN` for
    a value the registry cannot name (a config file of its own, a mechanism class outside
    the registry).  Raises ValueError with the registry's one-line message for an unknown
    name or option."""
    from attention.base import Mechanism
    from attention.registry import REGISTRY, build, options_of, unknown_attention, unknown_option

    if value is None or value in ("null", "None"):
        return None
    if isinstance(value, Mechanism):
        return value.name
    if isinstance(value, dict):
        name = value.get("class_path", value.get("name", _UNKNOWN))
        name = _UNKNOWN if name == _UNKNOWN else mechanism_name(name)
        init_args = value.get("init_args")
        if name in REGISTRY and isinstance(init_args, dict):
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
            return mechanism_name(yaml.safe_load(text))
        except yaml.YAMLError:
            return _UNKNOWN
    try:  # a name, or a class path ending in one (attention.coda.coda)
        return build({"class_path": text}).name
    except ValueError:
        pass
    if Path(text).is_file():
        return _UNKNOWN  # the mechanism's own config file: LightningCLI reads it
    cls = _imported_class(text)
    if isinstance(cls, type) and issubclass(cls, Mechanism):
        return cls.name if cls.name in REGISTRY else _UNKNOWN
    raise ValueError(unknown_attention(text))


def _imported_class(class_path: str):
    """What ``module.attr`` names once imported; None when it does not import."""
    module, _, attr = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr) if module else None
    except (ImportError, AttributeError, ValueError):
        return None


def check_attention_args(experiment: Experiment, command: str,
                         args: CommandLine | list[str]) -> None:
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
            return mechanism_name(value)
        except ValueError as e:
            raise SystemExit(f"{prog}: {where}: {e}") from None

    line = CommandLine.of(args)
    for flag, value, shown in line.options:
        if flag in CONFIG_FLAGS and value and Path(value).is_file():
            model = line.configs[value].get("model")
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
