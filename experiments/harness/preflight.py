"""The checks a LightningCLI command's command line passes before jsonargparse reads it, each
failing in one line: an experiment whose datasets are configs of their own needs one
(:func:`check_dataset_args`), and the attention flags name registered mechanisms and their
options (:func:`check_attention_args`).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from pathlib import Path

import yaml

from experiments.harness.command_line import CONFIG_FLAGS, CommandLine
from experiments.harness.grid_model import Experiment, shown_path


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
