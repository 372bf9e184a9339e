"""experiments/ flows one way: docs/design.md's layers of the paper scripts and their
machinery (experiments/harness/) are the imports in the code, every file on one layer and
every import between two layers stated, and no import circle among experiments/ files
(imports inside functions counted too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
DESIGN = (ROOT / "docs" / "design.md").read_text()


def design_section() -> str:
    return DESIGN.split("\n## The experiments' machinery\n", 1)[1].split("\n## ", 1)[0]


def design_layers() -> dict[str, list[str]]:
    """layer -> its files (paths under experiments/), as docs/design.md lists them: an
    indented line ``<layer>  <file>, <file>, ...`` (a line may go on, indented further)."""
    layers: dict[str, list[str]] = {}
    layer = None
    for line in design_section().splitlines():
        if m := re.fullmatch(r" {4}(\w+) {2,}(\S+\.py,?(?: \S+\.py,?)*)", line):
            layer, files = m.groups()
            assert layer not in layers, f"docs/design.md lists layer {layer} twice"
            layers[layer] = []
        elif layer and (m := re.fullmatch(r" {6,}(\S+\.py,?(?: \S+\.py,?)*)", line)):
            files = m.group(1)
        else:
            layer = None
            continue
        layers[layer] += [f.strip(",") for f in files.split()]
    return layers


def design_arrows() -> dict[str, set[str]]:
    """layer -> the layers its files import, as docs/design.md states them:
    ``<layer> -> a, b`` or ``-> nothing``."""
    arrows = {}
    for source, targets in re.findall(r"^ {4}(\w+) +-> +(.+)$", design_section(), re.M):
        assert source not in arrows, f"docs/design.md: two arrow lines for {source}"
        names = [t.strip() for t in targets.split(",")]
        arrows[source] = set() if names == ["nothing"] else set(names)
    return arrows


def module_file(module: str) -> Path | None:
    """The file of an ``experiments...`` module (a package's __init__.py); None for a
    module outside experiments/ or a name that is no module."""
    if module != "experiments" and not module.startswith("experiments."):
        return None
    base = ROOT.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()),
                None)


def imported_files(path: Path) -> set[Path]:
    """The experiments/ files ``path`` imports, at any depth of the file: ``from
    experiments.harness import runs`` and ``from experiments.harness.runs import x`` are
    both runs.py."""
    files = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            files |= {module_file(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                found = module_file(f"{node.module}.{alias.name}") or module_file(node.module)
                assert found or not node.module.startswith("experiments"), \
                    f"{path}: no module {node.module}"
                files.add(found)
    return files - {None, path}


def experiment_files() -> list[Path]:
    return sorted(p for p in EXPERIMENTS.rglob("*.py") if p.name != "__init__.py")


def import_graph() -> dict[Path, set[Path]]:
    graph = {path: imported_files(path) for path in experiment_files()}
    return {path: {f for f in targets if f.name != "__init__.py"}
            for path, targets in graph.items()}


def circles(graph: dict) -> list[set]:
    """The import circles of ``graph`` (node -> the nodes it imports): every strongly
    connected set of two nodes or more, and a node importing itself."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found: list[set] = []

    def visit(node) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.add(member)
                if member == node:
                    break
            if len(members) > 1 or node in graph.get(node, ()):
                found.append(members)

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"a"}}) == [{"a"}]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_circle_among_experiments_files():
    graph = import_graph()
    assert len(graph) > 30 and any(graph.values())
    found = [sorted(str(p.relative_to(EXPERIMENTS)) for p in members)
             for members in circles(graph)]
    assert not found, f"import circles among experiments/ files: {found}"


def test_function_level_imports_are_read():
    """The graph sees an import inside a function: the runner's of Lightning's CLI, a
    script's of the runner under ``__main__``."""
    graph = import_graph()
    harness = EXPERIMENTS / "harness"
    assert harness / "cli.py" in graph[harness / "runner.py"]  # inside main()
    assert harness / "runner.py" in graph[EXPERIMENTS / "coda_mlu.py"]
    assert harness / "significance.py" in graph[harness / "verdicts.py"]  # a submodule


def test_every_experiments_file_is_on_one_layer():
    listed = [f for files in design_layers().values() for f in files]
    assert len(listed) == len(set(listed)), "docs/design.md lists a file on two layers"
    files = {str(p.relative_to(EXPERIMENTS)) for p in experiment_files()}
    assert set(listed) == files, (f"on no layer: {sorted(files - set(listed))}; "
                                  f"not a file: {sorted(set(listed) - files)}")


def test_layer_arrows_are_the_imports():
    layers = design_layers()
    layer_of = {EXPERIMENTS / f: layer for layer, files in layers.items() for f in files}
    imports: dict[str, set[str]] = {layer: set() for layer in layers}
    for path, targets in import_graph().items():
        imports[layer_of[path]] |= {layer_of[t] for t in targets} - {layer_of[path]}
    arrows = design_arrows()
    assert set(arrows) == set(layers), "docs/design.md needs one arrow line per layer"
    for layer in layers:
        assert arrows[layer] == imports[layer], (
            f"docs/design.md says {layer} -> {sorted(arrows[layer])}, the code imports "
            f"{sorted(imports[layer])}")


def test_the_layers_go_one_way():
    """The stated arrows themselves have no circle: a layer imports only layers below it."""
    assert circles(design_arrows()) == []
