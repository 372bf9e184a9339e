"""What an experiment script's ``--help`` (and its refusal of ``predict``) says of its model,
read from the project's source files without importing them: importing a model class imports
torch and Lightning, ten seconds and more, and the help would wait for them (issue 31 item
9).  Each reading gives what the imported objects give, which tests/experiments/test_startup.py
checks
for every experiment script:

* :func:`mechanism_names`: the names of ``attention.registry.REGISTRY`` in its order: the
  mechanism modules attention/__init__.py registers, each flag class named by its module;
* :func:`mechanism_params`: ``experiments.harness.preflight.mechanism_params`` of the class a path
  names (its attention arguments, typed ``Mechanism``, in its own ``__init__`` and its bases');
* :func:`class_attribute`: a class attribute holding a literal (``predictions_file``), as
  ``getattr`` finds it along the class's bases.

Only the project's own modules are read; a base class from elsewhere (Lightning's, torch's)
is taken to add no attention argument and no such attribute.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from experiments.harness.grid_model import PROJECT_ROOT

#: a class of the project: (module, name)
ClassKey = tuple[str, str]
#: the class every attention argument is typed with (attention.base)
MECHANISM: ClassKey = ("attention.base", "Mechanism")


@cache
def _module_tree(module: str) -> ast.Module | None:
    """The parsed source of a project module (None: not one of the project's files)."""
    base = PROJECT_ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return ast.parse(path.read_text(), filename=str(path))
    return None


def _top_level(tree: ast.Module):
    """The statements of a module run at import (those under ``if``/``try`` too)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            todo[:0] = [*node.body, *getattr(node, "orelse", []),
                        *[s for h in getattr(node, "handlers", []) for s in h.body]]
        else:
            yield node


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an ``from ... import`` in ``module`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not PROJECT_ROOT.joinpath(*parts, "__init__.py").is_file():  # a module: its package
        parts = parts[:-1]
    parts = parts[:len(parts) - node.level + 1]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _resolve(module: str, name: str, seen: frozenset = frozenset()) -> ClassKey | None:
    """Where the name ``name`` of ``module`` is defined: (module, name) of its class or
    function, following imports; (module, name) as imported for a module outside the
    project; None when the module does not bind it."""
    if (module, name) in seen:
        return None
    seen = seen | {(module, name)}
    tree = _module_tree(module)
    if tree is None:
        return (module, name)
    found = None
    for node in _top_level(tree):  # the last binding wins, as at import
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            found = (module, name)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _absolute(module, node)
                    found = (_resolve(source, alias.name, seen)
                             or _submodule(f"{source}.{alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:  # import a.b as name
                    found = _submodule(alias.name)
                elif alias.asname is None and alias.name.split(".")[0] == name:  # import a.b
                    found = _submodule(name)
    return found


def _submodule(module: str) -> ClassKey:
    """A module as a name binds it: (module, "")."""
    return (module, "")


def _expression(module: str, node: ast.expr) -> ClassKey | None:
    """What a name or dotted name (``Mechanism``, ``L.LightningModule``) of ``module`` is."""
    if isinstance(node, ast.Name):
        return _resolve(module, node.id)
    if isinstance(node, ast.Attribute):
        owner = _expression(module, node.value)
        if owner is not None and owner[1] == "":  # an attribute of a module
            return _resolve(owner[0], node.attr) or _submodule(f"{owner[0]}.{node.attr}")
    return None


def _class_def(key: ClassKey) -> ast.ClassDef | None:
    tree = _module_tree(key[0])
    if tree is None:
        return None
    found = None
    for node in _top_level(tree):
        if isinstance(node, ast.ClassDef) and node.name == key[1]:
            found = node
    return found


def _bases(key: ClassKey) -> list[ClassKey]:
    """The project classes a project class derives from, in the order written."""
    node = _class_def(key)
    if node is None:
        return []
    bases = [_expression(key[0], b) for b in node.bases]
    return [b for b in bases if b is not None and _class_def(b) is not None]


def _mro(key: ClassKey) -> list[ClassKey]:
    """The project classes of ``key``'s method resolution order (C3, as Python computes it),
    those from elsewhere left out."""
    sequences = [_mro(b) for b in _bases(key)] + [_bases(key)]
    order = [key]
    while any(sequences):
        sequences = [s for s in sequences if s]
        for seq in sequences:
            head = seq[0]
            if not any(head in s[1:] for s in sequences):
                break
        else:
            raise TypeError(f"no consistent method resolution order for {'.'.join(key)}")
        order.append(head)
        sequences = [s[1:] if s[0] == head else s for s in sequences]
    return order


def _class_key(path: str) -> ClassKey:
    module, _, name = path.rpartition(".")
    key = _resolve(module, name)
    if key is None or _class_def(key) is None:
        raise LookupError(f"{path}: no class of that name in the project's source")
    return key


def _is_mechanism(module: str, annotation: ast.expr | None) -> bool:
    """Whether an annotation is ``Mechanism`` or has it among its direct arguments
    (``Mechanism | None``, ``Optional[Mechanism]``): preflight.mechanism_params' test on the
    evaluated hint (``hint is Mechanism or Mechanism in typing.get_args(hint)``)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if _expression(module, annotation) == MECHANISM:
        return True
    members: list[ast.expr] = []
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        todo = [annotation]
        while todo:  # X | Y | Z: typing.get_args flattens the union
            node = todo.pop()
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
                todo += [node.right, node.left]
            else:
                members.append(node)
    elif isinstance(annotation, ast.Subscript):
        inner = annotation.slice
        members = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
    return any(_expression(module, m) == MECHANISM for m in members)


def _init_of(key: ClassKey) -> ast.FunctionDef | None:
    node = _class_def(key)
    found = None
    for statement in node.body if node is not None else []:
        if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
            found = statement
    return found


def mechanism_params(path: str) -> dict[str, str | None]:
    """The attention arguments of the class ``path`` names (``module.Class``), read from the
    source: name -> the name of its default mechanism (None: none), as
    :func:`experiments.harness.preflight.mechanism_params` gives them for the class imported."""
    names = mechanism_names()
    out: dict[str, str | None] = {}
    for key in reversed(_mro(_class_key(path))):
        init = _init_of(key)
        if init is None:
            continue
        a = init.args
        positional = [*a.posonlyargs, *a.args]
        defaults = dict(zip([p.arg for p in positional][len(positional) - len(a.defaults):],
                            a.defaults))
        defaults |= {p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
        params = [*positional, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
                  *([a.kwarg] if a.kwarg else [])]
        for param in params:
            if _is_mechanism(key[0], param.annotation):
                out[param.arg] = _default_mechanism(key[0], defaults.get(param.arg), names)
    return out


def init_params(path: str) -> list[str]:
    """The constructor arguments of the class ``path`` names, read from the source, in the
    order LightningCLI lists them: its own ``__init__``'s, then, when it passes ``**kwargs``
    on (or has no ``__init__``), its bases' (``self`` and the ``*``/``**`` catch-alls left
    out)."""
    out: list[str] = []
    for key in _mro(_class_key(path)):
        init = _init_of(key)
        if init is None:
            continue
        a = init.args
        out += [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)
                if p.arg != "self" and p.arg not in out]
        if a.kwarg is None:
            break
    return out


def _default_mechanism(module: str, default: ast.expr | None, names: list[str]) -> str | None:
    """The registry name of a default built by calling a mechanism class (``softmax()``:
    each flag class is named by its registry name); None for any other default."""
    if isinstance(default, ast.Call):
        called = _expression(module, default.func)
        if called is not None and called[1] in names:
            return called[1]
    return None


def _assigned(key: ClassKey, name: str) -> ast.expr | None:
    """The expression the class body of ``key`` assigns to ``name`` last; None if none."""
    value = None
    for statement in _class_def(key).body:
        if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in statement.targets):
            value = statement.value
        elif (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
              and statement.target.id == name and statement.value is not None):
            value = statement.value
    return value


def class_attribute(path: str, name: str, default=None):
    """The literal value of the class attribute ``name`` of the class ``path`` names, from
    the first class of its bases (in resolution order) that assigns it; ``default`` when
    none does."""
    for key in _mro(_class_key(path)):
        value = _assigned(key, name)
        if value is not None:
            return ast.literal_eval(value)
    return default


@cache
def mechanism_names() -> list[str]:
    """The names of ``attention.registry.REGISTRY``, in its order: the modules the loop of
    attention/__init__.py registers (``for _module in (softmax, coda, ...):
    register(...)``), whose flag classes are named by their modules
    (``attention.registry.register`` refuses any other name)."""
    tree = _module_tree("attention")
    for node in _top_level(tree):
        if (isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple)
                and any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "register"
                        for n in ast.walk(node))):
            return [_resolve("attention", e.id)[0].rpartition(".")[2] for e in node.iter.elts]
    raise LookupError(f"{Path('attention/__init__.py')}: no registration loop found")


@cache
def mechanisms_supporting(context: str) -> list[str]:
    """The names of :func:`mechanism_names` whose flag class serves ``context``, as
    ``attention.registry.supporting`` gives them (``Mechanism.supports``): a class of its
    resolution order other than ``attention.base.Mechanism`` defines the context's method,
    and the ``unsupported`` dict (its keys: literal strings) of the first class that assigns
    one does not name the context."""
    out = []
    for name in mechanism_names():
        mro = _mro(_class_key(f"attention.{name}.{name}"))
        defines = any(isinstance(node, ast.FunctionDef) and node.name == context
                      for key in mro if key != MECHANISM for node in _class_def(key).body)
        refused = next((value for key in mro if (value := _assigned(key, "unsupported"))
                        is not None), ast.Dict(keys=[], values=[]))
        if not isinstance(refused, ast.Dict) or not all(
                isinstance(k, ast.Constant) for k in refused.keys):
            raise LookupError(f"attention.{name}.{name}.unsupported: not a dict with literal "
                              "keys; cannot read its contexts from the source")
        if defines and context not in [k.value for k in refused.keys]:
            out.append(name)
    return out
