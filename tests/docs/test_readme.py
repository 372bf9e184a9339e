"""The README stays true: its mechanism table is the registry's, every script and grid its
feature table names exists, its two set-up commands are Makefile targets, the import arrows
of its Layout are the imports in the code, and its links and those of docs/ resolve."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from attention.registry import context_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_mechanism_table_is_the_registrys():
    assert context_table() in README


def test_feature_table_names_existing_scripts_and_grids():
    named = re.findall(r"`(\w+)\.py (\w+)`", README)
    assert len(named) >= 8
    for script, grid in named:
        experiment = importlib.import_module(f"experiments.{script}").EXPERIMENT
        assert grid in experiment.grids, (script, grid)


def test_quickstart_commands_are_make_targets():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in README
        assert re.search(rf"^{target}:", makefile, re.M)
    assert "PLACEHOLDER" not in README and "DEMO_SCALE" not in README and "RESULTS\n" not in README


def test_the_demo_prints_committed_files():
    """The committed results `make demo` prints after its own run (the 20,000-step curves,
    the 100K-step runs) exist: a renamed results file breaks the demo here,
    not on a user's first run."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    printed = re.findall(r"cat (results/\S+)", recipe)
    assert printed, "the demo prints no committed result"
    for path in printed:
        assert (ROOT / path).is_file(), f"make demo prints {path}, which does not exist"


# -- the layout: the import arrows the README states are the imports in the code --------------
PACKAGES = ("attention", "fileio", "datamodules", "lit_models", "experiments", "benchmarks",
            "notebooks")


def test_every_package_is_in_the_layout():
    """Every top-level folder of tracked Python code or notebooks (tests/ aside) is one of
    PACKAGES, so a new package cannot be left out of the README's arrows."""
    listed = subprocess.run(["git", "ls-files", "*.py", "*.ipynb"], cwd=ROOT, text=True,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    folders = {Path(f).parts[0] for f in listed.stdout.splitlines() if len(Path(f).parts) > 1}
    assert folders - {"tests"} == set(PACKAGES)


def _imported_modules(source: str) -> set[str]:
    """Top-level names of every absolute import in ``source`` (at any depth of the file)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _notebook_code(path: Path) -> str:
    """The code cells of a notebook, IPython magics and shell lines left out."""
    cells = json.loads(path.read_text())["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            lines += [line for line in source.splitlines()
                      if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def package_imports() -> dict[str, set[str]]:
    """For each package, the other packages its files import."""
    edges = {package: set() for package in PACKAGES}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix == ".py":
                source = path.read_text()
            elif path.suffix == ".ipynb" and ".ipynb_checkpoints" not in path.parts:
                source = _notebook_code(path)
            else:
                continue
            try:
                imported = _imported_modules(source)
            except SyntaxError as e:
                raise AssertionError(f"{path.relative_to(ROOT)} does not parse: {e}") from e
            edges[package] |= (imported & set(PACKAGES)) - {package}
    return edges


def readme_arrows() -> dict[str, set[str]]:
    """The arrows of the README's Layout section: ``    package -> a, b`` or ``-> nothing``."""
    layout = README.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    arrows = {}
    for source, targets in re.findall(r"^ {4}(\w+) +-> +(.+)$", layout, re.M):
        assert source not in arrows, f"README: two arrow lines for {source}"
        names = [t.strip() for t in targets.split(",")]
        arrows[source] = set() if names == ["nothing"] else set(names)
    return arrows


def test_layout_comes_first():
    assert re.findall(r"^## (.+)$", README, re.M)[0] == "Layout"


def test_layout_arrows_are_the_imports():
    arrows, imports = readme_arrows(), package_imports()
    assert set(arrows) == set(PACKAGES), "README's Layout needs one arrow line per package"
    for package in PACKAGES:
        assert arrows[package] <= set(PACKAGES), (package, arrows[package])
        assert arrows[package] == imports[package], (
            f"README says {package} -> {sorted(arrows[package])}, the code imports "
            f"{sorted(imports[package])}")


def test_package_imports_are_read():
    # the parser sees what the code holds: lit_models' modules import attention
    assert "attention" in package_imports()["lit_models"]
    assert _imported_modules("import a.b\nfrom c.d import e\nfrom . import f\n") == {"a", "c"}


# -- links between the README and docs/ -------------------------------------------------------
def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def test_links_point_to_existing_files_and_headings():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(pages) > 5
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.relative_to(ROOT)}: link to missing {target}"
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked.read_text()), \
                    f"{page.relative_to(ROOT)}: no heading for #{anchor} in {path or page.name}"


def test_readme_links_every_docs_page():
    for page in sorted((ROOT / "docs").rglob("*.md")):
        assert f"docs/{page.relative_to(ROOT / 'docs').as_posix()}" in README, page


# -- docs/papers.md and docs/design.md name code that exists ----------------------------------
def _code_names() -> set[str]:
    """Every name the packages define or use: functions, classes, arguments, assignments,
    attributes."""
    names = set()
    for package in ("attention", "lit_models", "datamodules", "experiments"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, ast.arg):
                    names.add(node.arg)
                elif isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
    return names


def _looks_like_code(word: str) -> bool:
    """A function, class or constant name, not a symbol of an equation (`Lq`, `h_j`, `phi_l`)
    or a flag value (`mw`): snake_case of words of 2+ letters, CapWords, or CONSTANT_NAMES."""
    if re.fullmatch(r"[a-z][a-z0-9]+(_[a-z0-9]{2,})+", word):
        return True
    if re.fullmatch(r"[A-Z][a-z0-9]{2,}([A-Z][a-z0-9]*)*", word):
        return True
    return bool(re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+", word))


def test_docs_name_existing_files_and_code():
    names = _code_names()
    packages = r"(?:attention|lit_models|datamodules|experiments)"
    for page in ("papers.md", "design.md"):
        text = (ROOT / "docs" / page).read_text()
        for path in re.findall(rf"`({packages}/[\w/.]+)`", text):
            assert (ROOT / path).exists(), f"docs/{page} names {path}, which does not exist"
        for token in re.findall(r"`([A-Za-z_][\w.]*)`", text):
            if token.split(".")[0] == "torch" or token.endswith((".py", ".md", ".cpp")):
                continue
            for part in filter(_looks_like_code, token.split(".")):
                assert part in names, f"docs/{page} names `{token}`: no {part} in the code"
    assert _looks_like_code("quasi_attention") and _looks_like_code("CodaMultiHead")
    assert not any(map(_looks_like_code, ("Lq", "h_j", "phi_l", "mw", "MQT")))


def test_named_files_exist():
    """Every file of the repository that the README or a docs page names by its path."""
    folders = ("attention|lit_models|datamodules|experiments|benchmarks|fileio|notebooks|tests"
               "|results")
    pattern = rf"(?<![\w/.])((?:{folders})/[\w/.\-]*\.(?:py|ipynb|md|yaml|csv|png|cpp|h|sh))"
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"\]\([^)]*\)", "]", page.read_text())  # links: relative, tested above
        for path in set(re.findall(pattern, text)):
            assert (ROOT / path).exists(), f"{page.relative_to(ROOT)} names {path}: not there"


def test_named_modules_exist():
    """Every `package.module` (and `package.module.Name`) the README or a docs page names: a
    module of the repository, and a name that module defines or imports."""
    pattern = r"(?<![\w.\-/])((?:attention|lit_models|datamodules|experiments|benchmarks|fileio)" \
              r"(?:\.\w+)+)"
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for dotted in set(re.findall(pattern, page.read_text())):
            parts = dotted.split(".")
            for i in range(len(parts), 0, -1):
                base = ROOT.joinpath(*parts[:i])
                module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
                if module.exists():
                    break
            else:
                raise AssertionError(f"{page.relative_to(ROOT)} names {dotted}: no such module")
            for name in parts[i:i + 1]:  # a name defined in or imported by the module
                assert name in _imported_or_defined(module), \
                    f"{page.relative_to(ROOT)} names {dotted}: no {name} in {module.name}"


def _imported_or_defined(module: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def test_claims_counts_are_the_boards():
    """The README's count of the claims board (how many claims of the papers, how many hold,
    are not significant, reversed, measured without a paired test, not run) is the
    committed board's 'all' row."""
    board = (ROOT / "results" / "CLAIMS.md").read_text()
    total, *counts = re.search(r"^\| all \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| "
                               r"(\d+) \|$", board, flags=re.M).groups()
    said = re.sub(r"\s+", " ", README)
    assert f"once however many grids measure it ({total})" in said
    today = said.split("Today: ", 1)[1]
    said_counts = [re.search(pattern, today).group(1) for pattern in
                   (r"^(\d+) hold", r"(\d+) not significant", r"(\d+) reversed",
                    r"(\d+) measured without a paired test", r"(\d+) not run here")]
    assert said_counts == counts


# -- README numbers that name a results file are that file's ---------------------------------
RESULTS = ROOT / "results"


def demo_time(text: str) -> tuple[int, int]:
    """`make demo`'s measured wall time in results/coda_mlu_demo.md: (minutes, seconds)."""
    m, s = re.search(r"^# `make demo` \((\d+) min (\d+) s wall", text, flags=re.M).groups()
    return int(m), int(s)


def make_results_minutes(index: str) -> tuple[int, int]:
    """The least and most minutes of `make results`: the sum over results/README.md's rows of
    each rerun's minutes, ``(N)``, ``(a-b, est.)`` or ``(about N, ...)``; rows of one command
    (CoDA Figure 2's two files) counted once."""
    spans = {}
    for name, minutes in re.findall(r"^\| `([^`]+)` \|.*?`make results` \(([^)]*\d[^)]*)\)",
                                    index, flags=re.M):
        low, high = re.match(r"(?:about )?(\d+)(?:-(\d+))?", minutes).groups()
        spans[name.split("_summary")[0].removesuffix(".png")] = (int(low), int(high or low))
    return sum(lo for lo, _ in spans.values()), sum(hi for _, hi in spans.values())


def seeds_per_cell(folder: Path) -> dict[str, int]:
    """cell -> its number of seeds, in a committed runs folder's grid."""
    runs = [d.name.rsplit("-seed", 1)[0] for d in folder.iterdir() if "-seed" in d.name]
    return {cell: runs.count(cell) for cell in sorted(set(runs))}


def seeds_and_cells(folder: Path) -> tuple[int, int]:
    """(cells, seeds that every cell has) of a committed runs folder's grid."""
    counts = seeds_per_cell(folder)
    return len(counts), min(counts.values())


# the datasets of attention_compare.py's grids: (grid, how the README names it)
COMPARED = (("sst", "SST"), ("imdb", "IMDb"))


def seed_words(n: int) -> str:
    """How the README names the first n seeds: "seed 0", "seeds 0 and 1", "seeds 0, 1 and 2"."""
    return "seed 0" if n == 1 else f"seeds {', '.join(map(str, range(n - 1)))} and {n - 1}"


def test_readme_numbers_are_their_results_files():
    """Each README number that names a results file (and the demo config's header comment,
    which the claims board shows) is what that file holds."""
    said = re.sub(r"\s+", " ", README)
    minutes, seconds = demo_time((RESULTS / "coda_mlu_demo.md").read_text())
    assert f"learning curves: {minutes} min {seconds} s" in said, \
        f"README's quickstart: make demo should say {minutes} min {seconds} s (coda_mlu_demo.md)"
    assert f"It took {minutes} minutes {seconds} seconds" in said, \
        f"README: make demo took {minutes} minutes {seconds} seconds (coda_mlu_demo.md)"
    config = (ROOT / "experiments/configs/coda_mlu/demo.yaml").read_text()
    assert f"in # {minutes} min {seconds} s on 2 cores (results/coda_mlu_demo.md" in \
        re.sub(r"\s+", " ", config), "demo.yaml's header: the time of results/coda_mlu_demo.md"
    low, high = make_results_minutes((RESULTS / "README.md").read_text())
    assert f"about {low}-{high} minutes in all" in said, \
        f"README: make results takes about {low}-{high} minutes by results/README.md"
    _, sst_seeds = seeds_and_cells(RESULTS / "sst_table5_runs/dwin_classification/table5-repro")
    assert f"| DW 5, SST accuracy, {sst_seeds} seeds |" in README, \
        f"README: DW Table 5's SST row has {sst_seeds} seeds in results/sst_table5_runs"
    counts = seeds_per_cell(RESULTS / "imdb_table5_runs/dwin_classification/table5-paper")
    most = max(counts.values())  # "seeds 0 and 1 (relative: seed 0)": the cells with fewer
    fewer = "; ".join(f"{cell.removeprefix('imdb-')}: {seed_words(n)}"
                      for cell, n in counts.items() if n < most)
    label = (f"| DW 5, IMDB accuracy on the complete aclImdb, {len(counts)} of 5 cells, "
             f"{seed_words(most)}{f' ({fewer})' if fewer else ''} |")
    assert label in README, f"README: DW Table 5's IMDB row by the committed runs: {label!r}"
    for data, name in COMPARED:
        for said_here in compared_scale(data, name, seeds_per_cell(
                RESULTS / f"attention_compare_runs/attention_compare/{data}-paper")):
            assert said_here in said, \
                f"README on Which attention?: {said_here!r} (committed runs)"


def compared_scale(data: str, name: str, counts: dict[str, int]) -> tuple[str, ...]:
    """What the README says of a comparison grid's committed seeds: the seeds every cell has
    ("IMDb seed 0 of all 11 cells") and, while a seed is committed for some cells only (a
    session ended between its runs), which cells have more ("(softmax: seeds 0 and 1)");
    the table's accuracy header names the seeds its means are over."""
    least = min(counts.values())
    more = "; ".join(f"{cell.removeprefix(f'{data}-')}: {seed_words(n)}"
                     for cell, n in counts.items() if n > least)
    extra = f" ({more})" if more else ""
    if more:
        header = f"| {name} accuracy (mean of each cell's seeds: {seed_words(least)}; {more}) |"
    else:
        header = f"| {name} accuracy ({'mean of ' if least > 1 else ''}{seed_words(least)}) |"
    return (f"{name} {seed_words(least)} of all {len(counts)} cells{extra}",
            f"{seed_words(least)} of all {len(counts)} {name} cells{extra}", header)


def test_readme_number_readers_read_their_files():
    assert demo_time("# `make demo` (8 min 8 s wall on this machine)\n") == (8, 8)
    index = ("| `a.md` | x | y | `make results` (3-8, est.) |\n| `b.md` | x | y | `make results` "
             "(5) |\n| `f.png` | x | y | `make results` (about 10, by z) |\n| `f_summary.csv` | x |"
             " y | `make results` (about 10, by z) |\n| `c` | x | y | written by `make results` "
             "(absent until its first run) |\n")
    assert make_results_minutes(index) == (18, 23)
    assert [seed_words(n) for n in (1, 2, 3)] == ["seed 0", "seeds 0 and 1", "seeds 0, 1 and 2"]
    assert compared_scale("imdb", "IMDb", {"imdb-a": 2, "imdb-b": 2}) == (
        "IMDb seeds 0 and 1 of all 2 cells", "seeds 0 and 1 of all 2 IMDb cells",
        "| IMDb accuracy (mean of seeds 0 and 1) |")
    assert compared_scale("imdb", "IMDb", {"imdb-a": 1, "imdb-b": 2, "imdb-c": 3}) == (
        "IMDb seed 0 of all 3 cells (b: seeds 0 and 1; c: seeds 0, 1 and 2)",
        "seed 0 of all 3 IMDb cells (b: seeds 0 and 1; c: seeds 0, 1 and 2)",
        "| IMDb accuracy (mean of each cell's seeds: seed 0; b: seeds 0 and 1; c: seeds 0, 1 "
        "and 2) |")


@pytest.mark.parametrize("data,dataset", COMPARED)
def test_which_attention_rows_are_the_comparisons_report(data, dataset):
    """Each row of the README's "Which attention?" table of a dataset (accuracy, paired
    difference to softmax with its interval, training steps/s and tensor memory against
    softmax's, interleaved) is what results/attention_compare.md's report printed."""
    report = (RESULTS / "attention_compare.md").read_text()
    section = README.split("### Which attention?", 1)[1].split("\n#", 1)[0]
    table = re.search(rf"^\| mechanism \| {dataset} accuracy .*\n\|[-| ]+\|\n((?:\|.*\|\n)+)",
                      section, flags=re.M)
    assert table, f"README's Which attention? section has no {dataset} table"
    rows = re.findall(r"^\| `(\S+)` \| ([\d.]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$",
                      table.group(1), flags=re.M)
    assert len(rows) == 11, f"README's Which attention? {dataset} table: one row per cell"
    for cell, accuracy, diff, speed, memory in rows:
        name = f"{data}-{cell}"
        cost = re.search(rf"^\| {re.escape(name)} \| [\d.]+ \| [\d.]+ \| "
                         rf"([\d.]+x \[[\d.]+, [\d.]+\]) \| [\d.]+ \| ([\d.]+x) \|$",
                         report, flags=re.M)
        assert cost, f"no interleaved cost row of {name} in results/attention_compare.md"
        assert (speed.strip(), memory.strip()) == (cost.group(1).strip(),
                                                   cost.group(2).strip()), name
        if cell == "softmax":
            assert re.search(rf"\| {data}-softmax \| - \| {accuracy}( ± [\d.]+)? \(n=\d\) \|",
                             report), f"README's {name} accuracy {accuracy} is not the report's"
            continue
        claim = re.search(rf"^\| {re.escape(name)} vs {data}-softmax \| Acc \| - \| "
                          rf"[\d.]+ -> {accuracy} \| ([^|]+) \|", report, flags=re.M)
        assert claim, f"README's {name} accuracy {accuracy} is not the report's"
        assert diff.strip() == claim.group(1).strip(), name

