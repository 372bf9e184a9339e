"""One-line errors: what a command ends with when the input is wrong, instead of a traceback
or jsonargparse's errors of several lines.  An argument error names the flag, the value and
what it takes (:func:`compact_error`) and the closest valid options (:func:`closest_options`);
a data error names the file (:func:`data_message`); a value a constructor refuses is a
:class:`ConfigError`.  ``ATTNREPRO_DEBUG=1`` keeps the tracebacks (:func:`debug`).
"""

from __future__ import annotations

import ast
import os
import re

from experiments.harness.command_line import CommandLine
from experiments.harness.grid_model import Experiment, shown_path


def compact_error(message: str, experiment: Experiment, line: CommandLine) -> str:
    """jsonargparse's argument errors in one line where they take several: a value outside
    an option's choices names the flag, the value and the choices (not the tree of every
    Union subtype tried), a value of the wrong type the types taken, and a config file that
    does not exist names the experiment's configs; a key no option takes names the config
    file of the command ``line`` that holds it.  Any other message is returned as it is."""
    message = _subclass_option_error(message, line)
    unknown = re.search(r"does not accept (?:option|key) '([\w.]+)'", message)
    if unknown:
        holders = line.configs_with_key(unknown.group(1).split("."))
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


def _subclass_option_error(message: str, line: CommandLine) -> str:
    """An option the class of a subclass-mode argument (``--model=DecompAtt``) does not take,
    in the words jsonargparse uses for any other argument: ``unrecognized arguments:
    --model.dropoutt 0.1`` on the command line, ``Subcommand 'fit' does not accept option
    'model.dropoutt'`` in a config file (jsonargparse says "expected null, got NestedArg(...)":
    the None of ``Optional[<class>]`` is the last type it tried).  Any other message as it is."""
    key = re.search(r'Parser key "([\w.]+)"', message)
    option = re.search(r"Option '(\w+)' is not accepted", message)
    given = re.search(r"Given value: (.*)", message)
    if not (key and option and given):
        return message
    value = given.group(1).strip()
    nested = re.fullmatch(r"NestedArg\(key='([\w.]+)', val='(.*)'\)", value)
    if nested:
        return f"unrecognized arguments: --{key.group(1)}.{nested.group(1)} {nested.group(2)}"
    try:
        given_value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return message
    path = _path_to(given_value, option.group(1))
    if path is None:
        return message
    command = line.command or "fit"
    return (f"Subcommand '{command}' does not accept option "
            f"'{'.'.join([key.group(1), *path])}'")


def _path_to(node, name: str) -> list[str] | None:
    """The keys leading to ``name`` in nested mappings (``['init_args', 'dropoutt']``)."""
    if not isinstance(node, dict):
        return None
    if name in node:
        return [name]
    for k, v in node.items():
        below = _path_to(v, name)
        if below is not None:
            return [str(k), *below]
    return None


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
            known.update(_subclass_options(action))
            stack.extend(getattr(action, "_name_parser_map", {}).values())
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.75)
        if close:
            hints.append(f"{name}: did you mean {' or '.join('--' + c for c in close)}?")
    return ("; " + "; ".join(hints)) if hints else ""


def _subclass_options(action) -> set[str]:
    """The options of a subclass-mode argument (``--model`` typed ``Optional[DecompAtt]``):
    ``<dest>.<parameter>`` and ``<dest>.init_args.<parameter>`` for every constructor
    parameter of its classes, their subclasses (``--model=Mixture``) and their bases."""
    import inspect
    import typing

    hint = getattr(action, "_typehint", None)
    if hint is None or action.dest.endswith(".help"):  # --model.help CLASS prints its options
        return set()
    classes = [c for c in (typing.get_args(hint) or (hint,))
               if isinstance(c, type) and c is not type(None)]
    seen: set[type] = set()
    while classes:
        cls = classes.pop()
        if cls not in seen:
            seen.add(cls)
            classes.extend(cls.__subclasses__())
    names: set[str] = set()
    for cls in seen:
        for base in cls.__mro__:
            init = base.__dict__.get("__init__")
            try:
                params = inspect.signature(init).parameters.values() if init else ()
            except (TypeError, ValueError):
                continue
            names.update(p.name for p in params if p.name != "self" and p.kind in (
                p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return {f"{action.dest}{sep}{n}" for n in names for sep in (".", ".init_args.")}


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
    compute_fn of link ... failed: ..."); experiments.harness.cli.prepared_attribute carries
    its data errors past it, any other file read while the classes are built is found here."""
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
    carried to experiments.harness.cli.run_cli past jsonargparse, which catches every
    Exception of a link and, to word its own message, calls ``str(datamodule)``:
    LightningDataModule's calls every dataloader, so the files would be read three times
    more before the error."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error
